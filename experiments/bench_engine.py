"""``flashspec bench engine``: FlashSpec vs Hugging Face assisted generation vs plain decoding, side by side in
one run, into results/bench_engine_<device>.json.

    flashspec bench engine                       # the H200 run: B in {1, 8}, γ = 4, 128 new tokens
    flashspec bench engine --tiny --device cpu   # smoke test in seconds (tiny models)

The measurements (models, cells, the median-run rule, the comparisons) are `flashspec_lab.bench_engine`'s.
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from flashspec import models
from flashspec_lab import cli_checks, provenance
from flashspec_lab.bench_engine import (
    METHODS,
    build_models,
    comparisons,
    configure_assistant,
    measure_cell,
    ratios,
)
from flashspec.sampling import SamplingParams


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flashspec bench engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--tiny", action="store_true", help="tiny models, few tokens: a smoke test in seconds")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default 1 8 (tiny: 1 2)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (tiny: 12)")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per cell (default 3; tiny: 1)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs per cell before timing (default 1); on the H200 the first FlashSpec "
                             "cell of a batch size kept speeding up over about five runs")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--dtype", default=None, help="bf16 (default on CUDA) or fp32 (default on CPU)")
    parser.add_argument("--out", default=None, help="JSON path (default results/bench_engine_<device>.json)")
    parser.add_argument("--git-sha", default=None, help="record this SHA when the copy has no .git")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify-backend", default="auto", choices=["auto", "torch", "triton"],
                        help="FlashSpec's verify backend (auto: Triton on CUDA)")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    return args


def main(argv: list[str] | None = None) -> int:
    """`flashspec bench engine [options]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    device = torch.device(args.device) if args.device else models.default_device()
    dtype = models.resolve_dtype(args.dtype) if args.dtype else (models.half_dtype(device) if device.type == "cuda" else torch.float32)
    batch_sizes = args.batch_sizes or ([1, 2] if args.tiny else [1, 8])
    max_new_tokens = args.max_new_tokens or (12 if args.tiny else 128)
    repeats = args.repeats or (1 if args.tiny else 3)
    params = SamplingParams(temperature=args.temperature)
    started = provenance.record(["flashspec", "bench", "engine", *argv], args.git_sha)
    target, draft, shapes = build_models(args.tiny, device, dtype)
    prompts = torch.randint(2, target.config.vocab_size, (max(batch_sizes), args.prompt_length),
                            generator=torch.Generator().manual_seed(args.seed)).to(device)
    settings = {"device": str(device), "gamma": args.gamma, "max_new_tokens": max_new_tokens,
                "prompt_length": args.prompt_length, "temperature": args.temperature, "top_k": 0, "top_p": 1.0,
                "dtype": str(dtype), "repeats": repeats, "warmup": args.warmup, "batch_sizes": batch_sizes,
                "tiny": args.tiny, "weights": "random, built from config", "models": shapes,
                "hf_assistant_generation_config": configure_assistant(draft, args.gamma),
                "flashspec_policy": "thompson", "verify_backend": args.verify_backend,
                "flashspec_pools": {"flashspec": ["draft"], "flashspec_pool": ["draft", "prompt-lookup"]}}
    results: dict[str, Any] = {}
    for batch in batch_sizes:
        cells: dict[str, Any] = {}
        for method in args.methods:
            cells[method] = measure_cell(method, batch, target, draft, prompts, params, args.gamma,
                                         max_new_tokens, repeats, device, args.seed, args.verify_backend,
                                         args.warmup)
            print(f"B={batch} {method}: {summarise(cells[method])}", file=sys.stderr)
        judged = {name: asdict(comparison) for name, comparison in comparisons(cells).items()}
        results[f"B={batch}"] = {"cells": cells, "ratios": ratios(cells), "comparisons": judged}
        for name, comparison in judged.items():
            print(f"B={batch} {name}: {comparison['ratio']:.2f}x, {comparison['verdict']} ({comparison['reason']})",
                  file=sys.stderr)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    default = Path("results") / f"bench_engine_{slug(machine, args.tiny)}.json"
    out = provenance.write_result(Path(args.out) if args.out else default, started, settings, results)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def summarise(cell: dict[str, Any]) -> str:
    """One line of a cell's numbers, for the progress log."""
    cell = cell.get("hf_assisted_sequential", cell)
    parts = [f"{cell['tokens_per_s']:.1f} tok/s", f"{cell['tokens_per_step']:.2f} tokens/step",
             f"p50 step {cell['p50_step_latency_ms']:.2f} ms"]
    if cell.get("acceptance_rate") is not None:
        parts.append(f"acceptance rate {cell['acceptance_rate']:.3f}, token acceptance {cell['token_acceptance']:.3f}")
    return ", ".join(parts)


def slug(machine: str, tiny: bool) -> str:
    """The results file's name part for a machine ("NVIDIA H200" -> "nvidia_h200")."""
    text = re.sub(r"[^a-z0-9]+", "_", machine.lower()).strip("_")
    return f"tiny_{text}" if tiny else text


if __name__ == "__main__":
    raise SystemExit(main())
