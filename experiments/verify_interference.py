"""What the call before it does to one eager verify step: `verify_triton` timed from an idle GPU (L2 flushed,
device synchronised, CUDA events around the call, as `flashspec bench verify` times the eager bars) after
different calls, with the host time of the call itself (perf_counter around it) beside the event time.

The benchmark's paired ratio alternates the honest PyTorch verify and the step; its record shows the step slower
when the honest call ran just before it. This separates the candidate causes: the honest call itself, Python's
garbage collector (collected, or off), a sweep of the CPU caches with no torch in it, and small CPU torch ops
(the dispatcher's own state). Writes JSON.

    python -m experiments.verify_interference --out results/verify_interference_h200.json
"""
from __future__ import annotations

import argparse
import gc
from typing import Callable

import numpy as np
import torch

from flashspec import rng
from flashspec_lab import cli_checks, provenance
from flashspec_lab.baseline import verify_pytorch
from flashspec_lab.bench import _idle_call_clock, _median_spread, make_inputs
from flashspec.kernels import verify_triton
from flashspec.sampling import SamplingParams


def _summary(samples: list[tuple[float, float]]) -> dict:
    """Median and 20th/80th percentiles of the event and host times."""
    out = {}
    for index, name in enumerate(("event_us", "host_us")):
        out[name], out[name + "_spread"] = _median_spread([sample[index] for sample in samples])
    return out


def measure(batch: int, vocab: int, reps: int) -> dict:
    """Each condition: `reps` timed calls, each after its own untimed preceding work."""
    params = SamplingParams(1.0)
    target, draft, tokens = make_inputs(batch, 4, vocab, torch.bfloat16, params, seed=batch * 7 + vocab, device="cuda")
    key = rng.Key.from_seed(12345)
    generator = torch.Generator(device="cuda").manual_seed(5)
    sweep = np.ones(8 << 20)  # 64 MB: more than the host's caches
    small = torch.ones(64)

    def step():
        return verify_triton(target, draft, tokens, params, key)

    def honest():
        return verify_pytorch(target, draft, tokens, params, generator)

    def cpu_torch():  # thirty small CPU torch ops: the dispatcher's work without a GPU
        x = small
        for _ in range(30):
            x = x * 1.0001 + 1.0
        return x

    before: dict[str, Callable[[], object]] = {
        "itself": lambda: None,  # the previous timed call was this one
        "honest": honest,
        "honest_then_gc_collect": lambda: (honest(), gc.collect()),
        "cpu_cache_sweep": lambda: float(sweep.sum()),
        "cpu_torch_ops": cpu_torch,
    }
    timer = _idle_call_clock()
    for _ in range(20):
        step(), honest()
    torch.cuda.synchronize()
    out: dict = {"batch": batch, "vocab": vocab, "reps": reps, "step": {}, "honest": {}}
    for name, fn in (("step", step), ("honest", honest)):
        for label, prior in before.items():
            samples = []
            for _ in range(reps):
                prior()
                samples.append(timer(fn))
            out[name][f"after_{label}"] = _summary(samples)
        gc.disable()  # the collector off for the whole loop: it cannot run inside a timed call
        try:
            samples = []
            for _ in range(reps):
                honest()
                samples.append(timer(fn))
        finally:
            gc.enable()
        out[name]["after_honest_gc_off"] = _summary(samples)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000])
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: the launch path measured here is the compiled kernels'")
    points = [measure(batch, vocab, args.reps) for vocab in args.vocab for batch in args.batch]
    for point in points:
        for name in ("step", "honest"):
            print(f"B={point['batch']} V={point['vocab']} {name}: " + ", ".join(
                f"{label} {row['event_us']:.1f} µs (host {row['host_us']:.1f})" for label, row in point[name].items()))
    provenance.write_result(
        args.out, provenance.record(git_sha=args.git_sha),
        {"experiment": "verify_interference", "batch": args.batch, "vocab": args.vocab, "reps": args.reps,
         "gamma": 4, "dtype": "bfloat16", "temperature": 1.0,
         "notes": "event_us: one call from an idle GPU to its last kernel's end, the host's launch included (L2 "
                  "flushed, device synchronised, CUDA events), as the verify benchmark's eager bars; host_us: "
                  "perf_counter around the call alone. after_X: each timed call preceded by an untimed X (itself: "
                  "the previous timed call); after_honest_gc_off: after the honest call with the garbage collector "
                  "off for the whole loop."},
        {"points": points})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
