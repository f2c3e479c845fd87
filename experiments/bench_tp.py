"""Tensor-parallel benchmark: the fast path with the target's layers sharded over N ranks (`flashspec.tp`).

Random-weight bf16 models shaped like Llama-2-7B (target, sharded: TP = N) and llama-68m (two drafts,
replicated on every rank), γ = 4, T = 1, B in {1, 8}. Methods: fast plain decoding and fast speculative
decoding (both model drafts + prompt lookup under Thompson sampling). Each method is warmed up with one
full request, then timed `--repeats` times; tok/s reports the median and the min/max of the repeats, with
the step latency p50. The step anatomy times the target's one-token and (γ+1)-token forwards, the draft's
forwards and one all-reduce of the hidden state ([B, 1, hidden] and [B, γ+1, hidden]), eagerly and from a
CUDA graph; the target's forward pays 2 all-reduces per layer. Rank 0 writes the JSON after every batch.
With `--graphs auto` the steps (their NCCL all-reduces included) are captured as CUDA graphs; if capturing
fails on a machine, `--graphs off` runs the same steps eagerly. TP = 1 (one process) runs the unsharded
target, as a one-GPU user would. `--compile` compiles each layer's dense regions (`LlamaRunner`'s
`compile=`) before capturing.

    torchrun --nproc-per-node 1 -m flashspec bench tp --out results/bench_tp1_h200.json      # the TP = 1 baseline
    torchrun --nproc-per-node 2 -m flashspec bench tp --out results/bench_tp2_h200x2.json    # 2 GPUs
    torchrun --nproc-per-node 2 -m flashspec bench tp --smoke                                # tiny, CPU, gloo
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_runner import copy_bandwidth, time_calls  # noqa: E402

import flashspec as fs  # noqa: E402
from flashspec import models  # noqa: E402
from flashspec_lab import cli_checks, provenance
from flashspec.drafters import PromptLookupDrafter  # noqa: E402
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder  # noqa: E402
from flashspec.runner import capture  # noqa: E402
from flashspec.tp import TensorParallel, shard_forward_bytes, shard_target, shutdown  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, after checking --out and that torchrun started this process (one per rank)."""
    parser = argparse.ArgumentParser(prog="flashspec bench tp", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="JSON file rank 0 writes")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--graphs", choices=["auto", "off"], default="auto",
                        help="auto: CUDA graphs on CUDA (the step, with its all-reduces, captured); off: eager steps")
    parser.add_argument("--compile", nargs="?", const="default", default=None,
                        choices=["default", "max-autotune-no-cudagraphs"],
                        help="torch.compile each layer's dense regions before capturing the graphs")
    parser.add_argument("--check-every", type=int, default=16, help="steps between the ranks' token-hash checks")
    parser.add_argument("--smoke", action="store_true", help="tiny models on CPU with gloo: checks that it runs")
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    cli_checks.under_torchrun(parser, "flashspec bench tp", argv, ranks=2)
    if args.smoke:
        args.batches, args.new_tokens, args.prompt_tokens, args.repeats = [1, 2], 12, 8, 2
    return args


def build(args: argparse.Namespace, tp: TensorParallel) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """(target, replicated drafts): the same seeds on every rank, so the same weights. The target is
    sharded over the ranks when there are several; with one rank it stays a plain unsharded model."""
    device = tp.device
    if args.smoke:
        target = models.tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=1)
        drafts = [models.tiny_llama(vocab_size=64, hidden_size=16, num_layers=1, seed=seed) for seed in (2, 3)]
    else:
        dtype = torch.bfloat16
        target = models.model_from_config(models.llama_7b_config(), seed=1, dtype=dtype, device=device)
        drafts = [models.model_from_config(models.llama_68m_config(), seed=seed, dtype=dtype, device=device)
                  for seed in (2, 3)]
    target = target.to(device)
    return (shard_target(target, tp) if tp.size > 1 else target), [draft.to(device) for draft in drafts]


def synchronize(tp: TensorParallel) -> None:
    """Wait for this rank's device work, then for every rank (so timings start together)."""
    if tp.device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier(group=tp.guard_group)


def timed(run: Callable[[], Any], repeats: int, tp: TensorParallel) -> list[float]:
    """Wall seconds of `run()` per repeat, after one warm-up call; the ranks start each repeat together."""
    run()
    times = []
    for _ in range(repeats):
        synchronize(tp)
        start = time.perf_counter()
        run()
        if tp.device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def time_piece(fn: Callable[[], Any], tp: TensorParallel, graphed: bool) -> float | str:
    """Median ms of `fn` (from its own CUDA graph when `graphed`); the error text if capturing fails."""
    synchronize(tp)
    try:
        if graphed:
            graph, _ = capture(fn)
            fn = graph.replay
        return time_calls(fn, repeats=50, warmup=5, device=tp.device)["median_ms"]
    except Exception as error:  # noqa: BLE001 - a piece that cannot be captured is reported, not fatal
        return f"failed: {type(error).__name__}: {error}"[:300]


def anatomy(decoder: FastSpeculativeDecoder, model: torch.nn.Module, tp: TensorParallel, gamma: int,
            graphed: bool) -> dict[str, Any]:
    """The step's pieces timed alone at the step's shapes (every rank runs them: the target's collectives
    pair up), and one all-reduce of the hidden state on the tensor-parallel device group."""
    session = decoder._session
    target, draft = session.target, session.drafts[0]
    device = tp.device
    bucket = max(key[2] for key in session.graphs) if session.graphs else 256
    bucket = min(bucket, session.capacity)
    last = (session.buffers.lengths - 1).clamp(min=gamma)
    offsets = torch.arange(gamma + 1, device=device)
    window = last[:, None] - gamma + offsets
    tokens = session.buffers.seq.gather(1, window)
    one = tokens[:, :1].clone()
    hidden = target.embed_tokens.weight.shape[1]
    group = tp.mesh.get_group()
    batch = tokens.shape[0]
    reduced_1 = torch.zeros(batch, 1, hidden, dtype=target.dtype, device=device)
    reduced_q = torch.zeros(batch, gamma + 1, hidden, dtype=target.dtype, device=device)
    per_forward = 2 * len(target.layers)

    def allreduces(tensor: torch.Tensor) -> None:  # one forward's worth, back to back (a graph pays one launch)
        for _ in range(per_forward):
            dist.all_reduce(tensor, group=group)
    pieces = {
        "target_forward_1": lambda: target.forward(one, last[:, None], bucket),
        "target_forward_q": lambda: target.forward(tokens, last[:, None] + offsets, bucket),
        "draft_forward_1": lambda: draft.forward(one, last[:, None], bucket),
        "draft_window_q": lambda: draft.forward(tokens, window, bucket, torch.full_like(one, gamma)),
        "allreduce_hidden_1": lambda: dist.all_reduce(reduced_1, group=group),
        "allreduce_hidden_q": lambda: dist.all_reduce(reduced_q, group=group),
        "allreduces_per_forward_1": lambda: allreduces(reduced_1),
        "allreduces_per_forward_q": lambda: allreduces(reduced_q),
    }
    out: dict[str, Any] = {"bucket": bucket, "graphed": graphed, "allreduces_per_target_forward": per_forward}
    bandwidth = copy_bandwidth(device)
    if bandwidth is not None:  # the HBM floor of this rank's one-token forward: its bytes / copy bandwidth
        filled = int(session.buffers.lengths.max())
        out["copy_bandwidth_GBps"] = bandwidth / 1e9
        element = target.embed_tokens.weight.element_size()
        out["forward_bytes_local"] = shard_forward_bytes(model.config, tp.size, batch, filled, element)
        out["hbm_floor_1"] = 1e3 * out["forward_bytes_local"] / bandwidth
    for name, piece in pieces.items():
        out[name] = time_piece(piece, tp, graphed)
        if graphed and name.startswith("allreduce_hidden"):
            out[f"{name}_eager"] = time_piece(piece, tp, False)
    for suffix in ("1", "q"):  # the forward's collectives, timed together, as a share of the forward
        comm, forward = out[f"allreduces_per_forward_{suffix}"], out[f"target_forward_{suffix}"]
        if isinstance(comm, float) and isinstance(forward, float):
            out[f"allreduce_each_us_{suffix}"] = 1e3 * comm / per_forward
            out[f"allreduce_share_of_target_forward_{suffix}"] = comm / forward
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.smoke:
        torch.set_num_threads(1)
    tp = TensorParallel.from_env(check_every=args.check_every)
    rank0 = tp.rank == 0
    target, drafts = build(args, tp)
    params = fs.SamplingParams(temperature=1.0)
    graphs = None if args.graphs == "auto" else False
    origin = provenance.record(["torchrun", "--nproc-per-node", str(tp.size), "-m", "flashspec", "bench", "tp",
                                *argv], args.git_sha)
    settings = {**vars(args), "tp_size": tp.size, "device": str(tp.device),
                "device_name": torch.cuda.get_device_name(tp.device) if tp.device.type == "cuda" else "cpu",
                "target": "tiny" if args.smoke else "llama_7b_config (bf16, random weights)",
                "drafts": "tiny" if args.smoke else "2 x llama_68m_config (bf16, random weights) + prompt lookup"}
    record: dict[str, Any] = {"cells": []}
    vocab = target.lm_head.out_features
    compile_mode = args.compile or False
    plain = FastPlainDecoder(target, graphs=graphs, tp=tp, compile=compile_mode)
    speculative = FastSpeculativeDecoder(target, [*drafts, PromptLookupDrafter()], policy="thompson",
                                         gamma=args.gamma, graphs=graphs, tp=tp, compile=compile_mode)
    for batch in args.batches:
        generator = torch.Generator().manual_seed(batch)  # the same prompt on every rank
        prompt = torch.randint(3, vocab, (batch, args.prompt_tokens), generator=generator).to(tp.device)
        common = dict(max_new_tokens=args.new_tokens, sampling=params, ignore_eos=True, seed=0)
        cell: dict[str, Any] = {"batch": batch, "methods": {}}
        for name, decoder in (("fast_plain", plain), ("fast_speculative", speculative)):
            last: list[Any] = []
            times = timed(lambda: last.append(decoder.generate(prompt, **common)), args.repeats, tp)
            tokens = batch * args.new_tokens
            summary = last[-1].stats.summary()
            entry = {"seconds": times, "tok_s_median": tokens / statistics.median(times),
                     "tok_s_min": tokens / max(times), "tok_s_max": tokens / min(times),
                     "step_ms_p50": 1e3 * summary["p50_step_latency_s"],
                     **{key: summary.get(key) for key in ("mean_tokens_per_step", "acceptance_rate", "steps",
                                                          "per_arm")}}
            cell["methods"][name] = entry
            if rank0:
                print(f"TP={tp.size} B={batch} {name:17s} {entry['tok_s_median']:9.1f} tok/s "
                      f"[{entry['tok_s_min']:.1f}, {entry['tok_s_max']:.1f}], step p50 {entry['step_ms_p50']:.3f} ms",
                      flush=True)
        methods = cell["methods"]
        cell["speedup_speculative_over_plain"] = (methods["fast_speculative"]["tok_s_median"]
                                                  / methods["fast_plain"]["tok_s_median"])
        use_graphs = tp.device.type == "cuda" and graphs is None
        cell["anatomy_ms"] = anatomy(speculative, target, tp, args.gamma, use_graphs)
        if rank0:
            print(f"TP={tp.size} B={batch} anatomy {json.dumps(cell['anatomy_ms'], default=str)}", flush=True)
        record["cells"].append(cell)
        if args.out and rank0:  # after every cell: a run cut short keeps what it measured
            provenance.write_result(args.out, origin, settings, record)
            print(f"wrote {args.out}", flush=True)
    shutdown(plain, speculative)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
