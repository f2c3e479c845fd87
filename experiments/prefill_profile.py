"""Where one request's prefill goes on the fast path, on a GPU: the plain and the speculative decoders'
`prefill_s` per request, each runner's `prefill` timed alone (device-synchronised), eagerly and replayed
from its width bucket's CUDA graph (and how far their logits differ), and each session's prefill under
torch.profiler (the ops with the most host and device time). SmolLM2-135M's shapes
with random weights and a two-layer draft cut from it: a prefill's time does not depend on the weights.

    python -m experiments.prefill_profile --out results/prefill_profile_h200.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from flashspec_lab import cli_checks, provenance
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder
from flashspec import models
from flashspec_lab.zoo import distill


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(run, repeats: int) -> list[float]:
    """Milliseconds of `run()` per call, device-synchronised before and after each."""
    times = []
    for _ in range(repeats):
        _sync()
        started = time.perf_counter()
        run()
        _sync()
        times.append(1e3 * (time.perf_counter() - started))
    return times


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--width", type=int, default=256, help="prompt tokens")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--compile", nargs="?", const="default", default=False)
    parser.add_argument("--git-sha", default=None)
    parser.add_argument("--device", default="cuda", help="cuda (what it is for); cpu runs the driver for a check")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU: it times the fast path's prefill there (--device cpu checks the driver)")
    device = torch.device(args.device)
    target, _ = distill.load_teacher("smollm2-shape", device)
    draft = models.draft_from_teacher(target, (0, target.config.num_hidden_layers - 1)).to(device).eval()
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (1, args.width), generator=generator).to(device)
    mask = torch.ones_like(prompt)
    decoders = {"fast_plain": FastPlainDecoder(target, compile=args.compile),
                "fast_speculative": FastSpeculativeDecoder(target, [draft], policy="fixed", gamma=4,
                                                           compile=args.compile)}
    results: dict = {}
    for name, decoder in decoders.items():
        for _ in range(2):  # the session, its graphs and the runners' first calls
            decoder.generate(prompt, max_new_tokens=8, ignore_eos=True)
        prefill = [1e3 * decoder.generate(prompt, max_new_tokens=8, ignore_eos=True).stats.prefill_s
                   for _ in range(args.repeats)]
        session = decoder._session
        runners = {"target": session.target, **{f"draft{i}": d for i, d in enumerate(session.drafts)}}
        results[name] = {
            "prefill_ms_per_request": spread(prefill),
            "runner_prefill_ms": {role: spread(timed(lambda r=r: r.prefill(prompt, mask), args.repeats))
                                  for role, r in runners.items()},
            "runner_prefill_graphed_ms": {
                role: spread(timed(lambda r=r: r.prefill(prompt, mask, graphed=True), args.repeats))
                for role, r in runners.items()},
            "graphed_vs_eager_max_abs_logit_error": {
                role: float((r.prefill(prompt, mask, graphed=True)[0] - r.prefill(prompt, mask)[0]).abs().max())
                for role, r in runners.items()},
            "session_prefill_ms": spread(timed(lambda s=session: s.prefill(prompt, mask, [8], 0, 0), args.repeats)),
        }
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            session.prefill(prompt, mask, [8], 0, 0)
            _sync()
        events = profiler.key_averages()
        rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]
        results[name]["top_host_ops"] = [{"op": e.key, "calls": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3}
                                         for e in rows]
        device_rows = sorted(events, key=lambda e: -getattr(e, "self_device_time_total", 0.0))[:10]
        results[name]["top_device_ops"] = [{"op": e.key, "calls": e.count,
                                            "self_device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3}
                                           for e in device_rows]
        print(name, json.dumps({k: v for k, v in results[name].items() if not k.startswith("top")}, indent=1))
        for row in results[name]["top_host_ops"][:8]:
            print(f"   host {row['self_cpu_ms']:8.2f} ms {row['calls']:5d}x {row['op']}")
        for row in results[name]["top_device_ops"][:5]:
            print(f"   device {row['self_device_ms']:8.2f} ms {row['calls']:5d}x {row['op']}")
    provenance.write_result(args.out, provenance.record("python -m experiments.prefill_profile", args.git_sha),
                            vars(args) | {"target": "smollm2-shape (random weights)", "draft_layers": 2}, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
