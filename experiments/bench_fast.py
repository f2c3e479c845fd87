"""Engine benchmark, side by side in one run: HF plain `generate`, HF assisted generation, FlashSpec's
eager engine, FlashSpec fast plain decoding (same runner and graphs, no drafts) and FlashSpec fast
speculative decoding (a model draft + prompt lookup under Thompson sampling).

Random-weight bf16 models shaped like TinyLlama-1.1B (target) and llama-68m (draft), γ = 4, T = 1.
Every method is warmed up with one full request, then timed `--repeats` times; tok/s reports the
median and the min/max of the repeats. Also: the fast step's anatomy (each captured forward and the
verify timed alone from their own graphs), the cost of a draft switch (a policy that alternates arms
against one that never switches), and the HBM roofline.

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
from flashspec.runner import capture  # noqa: E402


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
                [models.tiny_llama(vocab_size=64, hidden_size=16, num_layers=1, seed=2).to(device, dtype)], None)
    target = models.model_from_config(models.tinyllama_1b_config(), seed=1).to(device, dtype).eval()
    draft = models.model_from_config(models.llama_68m_config(), seed=2).to(device, dtype).eval()
    return target, [draft], None


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
    generation takes the first draft."""
    new = args.new_tokens
    draft = drafts[0]
    config = draft.generation_config
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = args.gamma, "constant"
    config.assistant_confidence_threshold = 0.0
    hf_kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0,
                     pad_token_id=0)
    eager = SpeculativeDecoder(target, [*drafts, PromptLookupDrafter()], policy="thompson", gamma=args.gamma)
    fast = FastSpeculativeDecoder(target, [*drafts, PromptLookupDrafter()], policy="thompson", gamma=args.gamma)
    fast_one = FastSpeculativeDecoder(target, [draft], policy="fixed", gamma=args.gamma)
    plain = FastPlainDecoder(target)
    common = dict(max_new_tokens=new, sampling=params, ignore_eos=True)
    runs = {
        "hf_plain": lambda: (target.generate(prompt, attention_mask=torch.ones_like(prompt), **hf_kwargs), None),
        # HF assisted generation takes one row at a time: the rows run one after another
        "hf_assisted": lambda: ([target.generate(row[None], attention_mask=torch.ones_like(row[None]),
                                                 assistant_model=draft, **hf_kwargs) for row in prompt], None),
        "flashspec_eager": lambda: (None, eager.generate(prompt, seed=0, **common).stats),
        "fast_plain": lambda: (None, plain.generate(prompt, seed=0, **common).stats),
        "fast_speculative": lambda: (None, fast.generate(prompt, seed=0, **common).stats),
        "fast_speculative_one_draft": lambda: (None, fast_one.generate(prompt, seed=0, **common).stats),
    }
    return {name: run for name, run in runs.items() if name not in args.skip}


def anatomy(decoder: FastSpeculativeDecoder, device: torch.device, bucket: int) -> dict[str, Any]:
    """Each piece of the step timed alone from its own CUDA graph, at the step's shapes."""
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
    }
    logits = torch.randn(batch, gamma + 1, target.lm_head.out_features, device=device)
    draft_logits = torch.randn(batch, gamma, target.lm_head.out_features, device=device)
    drafted = torch.randint(0, target.lm_head.out_features, (batch, gamma), device=device)
    from flashspec.kernels import verify_triton

    key = torch.tensor([1, 2], device=device)
    pieces["verify"] = lambda: verify_triton(logits, draft_logits, drafted, session.sampling, key)
    out: dict[str, Any] = {}
    for name, piece in pieces.items():
        graph, _ = capture(piece)
        out[name] = time_calls(graph.replay, repeats=50, warmup=5, device=device)["median_ms"]
    out["sum_of_parts_ms"] = (out["target_forward_q"] + out["draft_window_q"] + (gamma - 1) * out["draft_forward_1"]
                              + out["verify"])
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
                     ("fast_speculative", "flashspec_eager")):
            if a in methods and b in methods:
                ratios[f"{a}/{b}"] = methods[a]["tok_s_median"] / methods[b]["tok_s_median"]
        cell["ratios"] = ratios
        if device.type == "cuda" and "fast_speculative" not in args.skip:
            fast = FastSpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="fixed", gamma=args.gamma)
            common = dict(max_new_tokens=args.new_tokens, sampling=params, ignore_eos=True, seed=0)
            fast.generate(prompt, **common)
            steady = fast.generate(prompt, **common).stats.summary()
            fast.policy = Alternate(2)
            fast.generate(prompt, **common)
            alternating = fast.generate(prompt, **common).stats.summary()
            parts = anatomy(fast, device, bucket=max(fast._session.graphs)[1])
            filled = prompt.shape[1] + args.new_tokens
            weights = floor_bytes(target, batch, filled) + args.gamma * floor_bytes(draft, batch, filled)
            spec = methods["fast_speculative"]
            cell["anatomy_ms"] = parts
            cell["step_ms_fixed_draft_p50"] = 1e3 * steady["p50_step_latency_s"]
            cell["step_ms_alternating_p50"] = 1e3 * alternating["p50_step_latency_s"]
            cell["switch_cost_ms"] = cell["step_ms_alternating_p50"] - cell["step_ms_fixed_draft_p50"]
            cell["step_over_parts"] = cell["step_ms_fixed_draft_p50"] / parts["sum_of_parts_ms"]
            # roofline: tokens per step / (bytes a step must read / copy bandwidth), per row
            cell["roofline_tok_s_per_row"] = (spec["mean_tokens_per_step"] or 1) / (weights / bandwidth)
            cell["roofline_fraction"] = (spec["tok_s_median"] / batch) / cell["roofline_tok_s_per_row"]
            print(f"B={batch} anatomy {json.dumps({k: round(v, 4) for k, v in parts.items()})} "
                  f"step(fixed) {cell['step_ms_fixed_draft_p50']:.3f} ms, alternating "
                  f"{cell['step_ms_alternating_p50']:.3f} ms, step/parts {cell['step_over_parts']:.2f}", flush=True)
        print(f"B={batch} ratios {json.dumps({k: round(v, 2) for k, v in ratios.items()})}", flush=True)
        record["cells"].append(cell)
    if args.out:
        provenance.write_result(args.out, origin, {**vars(args), "device": str(device)}, record)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
