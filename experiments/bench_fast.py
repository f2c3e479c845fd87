"""Engine benchmark, side by side in one run: HF plain `generate`, HF assisted generation, FlashSpec's
eager engine, FlashSpec fast plain decoding (same runner and graphs, no drafts) and FlashSpec fast
speculative decoding (the model drafts + prompt lookup under Thompson sampling), with lazy draft
catch-up and with every draft kept in sync, and with one draft only. `--compile` compiles the fast
methods' dense regions (`flashspec.runner.compile_regions`) before their graphs are captured.

Random-weight bf16 models shaped like TinyLlama-1.1B (target) and llama-68m (draft), γ = 4, T = 1.
Every method is warmed up with one full request, then timed `--repeats` times; tok/s reports the
median and the min/max of the repeats. Also: the fast step's anatomy (each captured forward and the
verify timed alone from their own graphs), the cost of a draft switch (a policy that alternates two
model drafts against one that never switches, in both sync modes), and the HBM roofline.

    python experiments/bench_fast.py --out results/bench_fast_h200.json        # on a GPU
    python experiments/bench_fast.py --smoke                                    # tiny, CPU: checks it runs
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_runner import copy_bandwidth, floor_bytes, time_calls  # noqa: E402

import flashspec as fs  # noqa: E402
from flashspec import models, provenance  # noqa: E402
from flashspec.drafters import PromptLookupDrafter  # noqa: E402
from flashspec.engine import SpeculativeDecoder  # noqa: E402
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder  # noqa: E402
from flashspec.runner import COMPILE_MODES, capture  # noqa: E402


class Alternate:
    """A policy that changes arm every step (the worst case for switching)."""

    def __init__(self, n_arms: int) -> None:
        self.n_arms, self.t = n_arms, 0

    def select(self) -> int:
        self.t += 1
        return self.t % self.n_arms

    def update(self, arm: int, reward: float) -> None:
        return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", nargs="*", default=[], help="methods to leave out")
    parser.add_argument("--pair", choices=["random", "zoo-gpu"], default="random",
                        help="random: TinyLlama-1.1B / llama-68m shapes with random weights; zoo-gpu: the trained GPU zoo "
                             "(target + four drafts, built on first use), prompts from its held-out Python text")
    parser.add_argument("--compile", nargs="?", const="default", default=False, choices=COMPILE_MODES,
                        help="compile the fast methods' dense regions (torch.compile mode, default 'default')")
    parser.add_argument("--hf-assisted-max-batch", type=int, default=8,
                        help="HF assisted generation runs rows one after another: skip it above this batch")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.batches, args.new_tokens, args.prompt_tokens, args.repeats = [1], 12, 8, 1
    return args


def build(args: argparse.Namespace, device: torch.device) -> tuple[torch.nn.Module, list[torch.nn.Module], Any]:
    """(target, model drafts, zoo or None): the first draft is the one HF assisted generation uses."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.pair == "zoo-gpu":
        from flashspec import zoo as zoo_module

        zoo = zoo_module.load_zoo("cpu" if args.smoke else "gpu", device=str(device), dtype=dtype, progress=False)
        names = sorted(zoo.drafts, key=lambda name: name != "draft-general")  # generalist first
        return zoo.target.eval(), [zoo.drafts[name].eval() for name in names], zoo
    if args.smoke:
        return (models.tiny_llama(vocab_size=64, hidden_size=32, num_layers=2, seed=1).to(device, dtype),
                [models.tiny_llama(vocab_size=64, hidden_size=16, num_layers=1, seed=seed).to(device, dtype)
                 for seed in (2, 3)], None)
    target = models.model_from_config(models.tinyllama_1b_config(), seed=1).to(device, dtype).eval()
    drafts = [models.model_from_config(models.llama_68m_config(), seed=seed).to(device, dtype).eval()
              for seed in (2, 3)]
    return target, drafts, None


def timed(run: Any, repeats: int, device: torch.device) -> list[float]:
    """Wall seconds of `run()` per repeat, after one warm-up call."""
    run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def method_runs(target: torch.nn.Module, drafts: list[torch.nn.Module], prompt: torch.Tensor,
                args: argparse.Namespace, params: fs.SamplingParams) -> dict[str, Any]:
    """name -> a function that generates `args.new_tokens` per row and returns (tokens, stats or None).
    The speculative pools are every model draft + prompt lookup under Thompson sampling; HF assisted
    generation and the one-draft method take the first draft."""
    new = args.new_tokens
    draft = drafts[0]
    config = draft.generation_config
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = args.gamma, "constant"
    config.assistant_confidence_threshold = 0.0
    hf_kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0,
                     pad_token_id=0)
    pool = [*drafts, PromptLookupDrafter()]
    eager = SpeculativeDecoder(target, pool, policy="thompson", gamma=args.gamma)
    options = dict(gamma=args.gamma, compile=args.compile)
    fast = FastSpeculativeDecoder(target, pool, policy="thompson", draft_sync="lazy", **options)
    fast_all = FastSpeculativeDecoder(target, pool, policy="thompson", draft_sync="all", **options)
    fast_one = FastSpeculativeDecoder(target, [draft], policy="fixed", **options)
    plain = FastPlainDecoder(target, compile=args.compile)
    common = dict(max_new_tokens=new, sampling=params, ignore_eos=True)
    runs = {
        "hf_plain": lambda: (target.generate(prompt, attention_mask=torch.ones_like(prompt), **hf_kwargs), None),
        # HF assisted generation takes one row at a time: the rows run one after another
        "hf_assisted": lambda: ([target.generate(row[None], attention_mask=torch.ones_like(row[None]),
                                                 assistant_model=draft, **hf_kwargs) for row in prompt], None),
        "flashspec_eager": lambda: (None, eager.generate(prompt, seed=0, **common).stats),
        "fast_plain": lambda: (None, plain.generate(prompt, seed=0, **common).stats),
        "fast_speculative": lambda: (None, fast.generate(prompt, seed=0, **common).stats),
        "fast_speculative_sync_all": lambda: (None, fast_all.generate(prompt, seed=0, **common).stats),
        "fast_speculative_one_draft": lambda: (None, fast_one.generate(prompt, seed=0, **common).stats),
    }
    skip = set(args.skip) | ({"hf_assisted"} if prompt.shape[0] > args.hf_assisted_max_batch else set())
    return {name: run for name, run in runs.items() if name not in skip}


def anatomy(decoder: FastSpeculativeDecoder, device: torch.device, bucket: int) -> dict[str, Any]:
    """Each piece of the step timed alone from its own CUDA graph, at the step's shapes (and the
    16-token catch-up window a draft reads after one step away, at γ = 4)."""
    session = decoder._session
    batch, gamma = session.batch, session.gamma
    target, draft = session.target, session.drafts[0]
    last = (session.buffers.lengths - 1).clamp(min=gamma)
    offsets = torch.arange(gamma + 1, device=device)
    window = last[:, None] - gamma + offsets
    tokens = session.buffers.seq.gather(1, window)
    one = tokens[:, :1].clone()
    pieces = {
        "target_forward_q": lambda: target.forward(tokens, last[:, None] + offsets, bucket),
        "draft_window_q": lambda: draft.forward(tokens, window, bucket, torch.full_like(one, gamma)),
        "draft_forward_1": lambda: draft.forward(one, last[:, None], bucket),
        "target_forward_1": lambda: target.forward(one, last[:, None], bucket),
    }
    span = torch.arange(16, device=device)
    catch_up = (last[:, None] - 15 + span).clamp(min=0)
    catch_tokens = session.buffers.seq.gather(1, catch_up)
    pieces["draft_catch_up_16"] = lambda: draft.forward(catch_tokens, catch_up, bucket, torch.full_like(one, 15))
    logits = torch.randn(batch, gamma + 1, target.lm_head.out_features, device=device)
    draft_logits = torch.randn(batch, gamma, target.lm_head.out_features, device=device)
    drafted = torch.randint(0, target.lm_head.out_features, (batch, gamma), device=device)
    from flashspec.kernels import verify_triton

    key = torch.tensor([1, 2], device=device)
    prefixes = session.prefixes_of(key)  # the step computes these in its prologue
    pieces["verify"] = lambda: verify_triton(logits, draft_logits, drafted, session.sampling, key, prefixes=prefixes)
    out: dict[str, Any] = {}
    for name, piece in pieces.items():
        graph, _ = capture(piece)
        out[name] = time_calls(graph.replay, repeats=50, warmup=5, device=device)["median_ms"]
    out["sum_of_parts_ms"] = (out["target_forward_q"] + out["draft_window_q"] + (gamma - 1) * out["draft_forward_1"]
                              + out["verify"])
    out["sampling_and_commit_not_in_parts"] = True
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    target, drafts, zoo = build(args, device)
    draft = drafts[0]
    params = fs.SamplingParams(temperature=1.0)
    bandwidth = copy_bandwidth(device)
    origin = provenance.record(["python", "experiments/bench_fast.py", *argv], args.git_sha)
    record: dict[str, Any] = {"cells": [], "copy_bandwidth_bytes_per_s": bandwidth}
    vocab = target.lm_head.out_features
    for batch in args.batches:
        if zoo is not None:  # held-out Python prompts of the zoo, cycled to fill the batch
            from flashspec import zoo as zoo_module

            pool = zoo_module.prompt_batch(zoo, "python")
            prompt = pool[torch.arange(batch) % pool.shape[0]].to(device)
        else:
            generator = torch.Generator().manual_seed(batch)
            prompt = torch.randint(3, vocab, (batch, args.prompt_tokens), generator=generator).to(device)
        cell: dict[str, Any] = {"batch": batch, "methods": {}}
        for name, run in method_runs(target, drafts, prompt, args, params).items():
            last_stats: list[Any] = []
            times = timed(lambda: last_stats.append(run()[1]), args.repeats, device)
            tokens = batch * args.new_tokens
            entry: dict[str, Any] = {"seconds": times, "tok_s_median": tokens / statistics.median(times),
                                     "tok_s_min": tokens / max(times), "tok_s_max": tokens / min(times)}
            stats = last_stats[-1]
            if stats is not None:
                summary = stats.summary()
                entry.update({key: summary.get(key) for key in ("acceptance_rate", "token_acceptance",
                                                                "mean_tokens_per_step", "p50_step_latency_s",
                                                                "p99_step_latency_s", "steps", "per_arm")})
            cell["methods"][name] = entry
            print(f"B={batch} {name:17s} {entry['tok_s_median']:9.1f} tok/s "
                  f"[{entry['tok_s_min']:.1f}, {entry['tok_s_max']:.1f}]", flush=True)
        methods = cell["methods"]
        ratios = {}
        for a, b in (("fast_plain", "hf_plain"), ("fast_speculative", "hf_assisted"),
                     ("fast_speculative", "fast_plain"), ("fast_speculative_one_draft", "fast_plain"),
                     ("fast_speculative_sync_all", "fast_plain"), ("fast_speculative", "fast_speculative_sync_all"),
                     ("fast_speculative", "flashspec_eager")):
            if a in methods and b in methods:
                ratios[f"{a}/{b}"] = methods[a]["tok_s_median"] / methods[b]["tok_s_median"]
        cell["ratios"] = ratios
        if device.type == "cuda" and "fast_speculative" not in args.skip:
            common = dict(max_new_tokens=args.new_tokens, sampling=params, ignore_eos=True, seed=0)
            switching = {}
            for sync in ("lazy", "all"):  # two model drafts: fixed on one vs alternating every step
                fast = FastSpeculativeDecoder(target, drafts[:2], policy="fixed", gamma=args.gamma,
                                              draft_sync=sync, compile=args.compile)
                fast.generate(prompt, **common)
                steady = fast.generate(prompt, **common).stats.summary()
                fast.policy = Alternate(2)
                fast.generate(prompt, **common)
                alternating = fast.generate(prompt, **common).stats.summary()
                switching[sync] = {"step_ms_fixed_draft_p50": 1e3 * steady["p50_step_latency_s"],
                                   "step_ms_alternating_p50": 1e3 * alternating["p50_step_latency_s"]}
                switching[sync]["switch_cost_ms"] = (switching[sync]["step_ms_alternating_p50"]
                                                     - switching[sync]["step_ms_fixed_draft_p50"])
            fast = FastSpeculativeDecoder(target, [draft], policy="fixed", gamma=args.gamma, compile=args.compile)
            fast.generate(prompt, **common)
            steady = fast.generate(prompt, **common).stats.summary()
            parts = anatomy(fast, device, bucket=max(fast._session.graphs)[1])
            filled = prompt.shape[1] + args.new_tokens
            weights = floor_bytes(target, batch, filled) + args.gamma * floor_bytes(draft, batch, filled)
            spec = methods["fast_speculative"]
            cell["anatomy_ms"] = parts
            cell["step_ms_fixed_draft_p50"] = 1e3 * steady["p50_step_latency_s"]
            cell["switching_two_drafts"] = switching
            cell["switch_cost_ms"] = switching["lazy"]["switch_cost_ms"]
            cell["step_over_parts"] = cell["step_ms_fixed_draft_p50"] / parts["sum_of_parts_ms"]
            # roofline: tokens per step / (bytes a step must read / copy bandwidth), per row
            cell["roofline_tok_s_per_row"] = (spec["mean_tokens_per_step"] or 1) / (weights / bandwidth)
            cell["roofline_fraction"] = (spec["tok_s_median"] / batch) / cell["roofline_tok_s_per_row"]
            print(f"B={batch} anatomy {json.dumps({k: round(v, 4) for k, v in parts.items()})} "
                  f"step(one draft) {cell['step_ms_fixed_draft_p50']:.3f} ms, step/parts "
                  f"{cell['step_over_parts']:.2f}, switching {json.dumps(switching)}", flush=True)
        print(f"B={batch} ratios {json.dumps({k: round(v, 2) for k, v in ratios.items()})}", flush=True)
        record["cells"].append(cell)
        if args.out:  # after every cell: a run cut short keeps what it measured
            provenance.write_result(args.out, origin, {**vars(args), "device": str(device)}, record)
            print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
