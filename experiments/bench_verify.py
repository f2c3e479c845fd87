"""``flashspec bench verify``: time one verification step (Triton plans vs the PyTorch a user would write vs the
bit-exact reference vs a host loop) on a GPU and write results/verify_h200.json.

    flashspec bench verify --out results/verify_h200.json [--batch 1 8 64] [--vocab 32000 128256]
    flashspec bench verify --smoke --out /tmp/verify_smoke.json     # CPU, TRITON_INTERPRET=1, tiny shapes

The measurements are `flashspec_lab.bench`'s; this driver runs them over the grid of batch sizes and
vocabularies, prints the table, the PASS / MISS verdicts of the targets and the `SHAPE_PLANS` entries to
paste into flashspec/kernels/plan.py, and writes the file after every point, so a crash keeps what ran.
The optional tile sweep is skipped when the run is past --budget-s seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

from flashspec_lab import bench, cli_checks, provenance
from flashspec.kernels.shims import interpreting

TARGETS = bench.TARGETS
NOTES = ("floor_us = max(empty_launch_us, logit_bytes / bandwidth): one empty Triton launch timed like the step "
         "(do_bench, L2 flushed) or every logit read once at the measured copy bandwidth, whichever is larger; "
         "floor_set_by says which. graph_floor_us uses the empty launch's warm graph replay instead. "
         "two_pass_bytes adds the sampled target and draft row per sequence, which the sample pass re-reads. "
         "Times are medians; the Triton step is verify_triton (a warm step launched straight from its binding) "
         "with the default plan "
         "(kernels.plan.SHAPE_PLANS at the measured commit), triton_api_us is fs.verify(backend='triton') with its "
         "argument checks. honest_torch_us is flashspec_lab.baseline.verify_pytorch (softmax, gather, rand, "
         "multinomial), timed the same way (do_bench of one call); honest_race_* is the same with an exponential "
         "race (capturable); torch_us is the bit-exact reference, the correctness oracle. *_latency_us (and a "
         "variant's latency_us): one call from an idle GPU to its last kernel's end, the host's launch included (L2 "
         "flushed and the device synchronised before each call, CUDA events around it); the eager bars are judged "
         "on it where recorded, since do_bench overlaps the host's launch with its L2 flush; *_paired: the honest "
         "baseline's and the step's calls timed so, alternating, the median of the pairs' ratios (the bars' verdict; "
         "_sides_us: each call's own times while paired, _by_order: the ratio by which call ran first); "
         "*_paired_warm / *_paired_cold: the same pairs with each call right after an untimed call of itself, or "
         "right after 64 MB read on the host (both calls finding the host's caches alike; the bars' by_host_state). "
         "variants: every "
         "launch-plan variant (GPU_PLAN overrides; stats_/sample_kernel_warm_us: a two-launch plan's kernels alone); "
         "plan_choice: the fastest by warm graph replay per point. log_probs_*: the default plan given the draft's "
         "warped log-probs (fp32) instead of its logits (draft_is_log_probs: the stats pass streams the target's "
         "logits only); target_only_*: the default plan without draft logits (q one-hot); target_logit_bytes: the "
         "target's share of logit_bytes. one_launch_chain_floor_us: the chain of a step sampling inside its stats "
         "launch (kernels.chain_probe, not a built step).")


def gpu_record(command: list[str], git_sha: str | None) -> dict[str, Any]:
    """`provenance.record` with the GPU's SM count and memory as torch sees them."""
    record = provenance.record(command, git_sha)
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        record["hardware"].update(sm_count=properties.multi_processor_count, gpu_memory_bytes=properties.total_memory)
    return record


def print_verdicts(verdicts: dict) -> None:
    for name, row in verdicts.items():
        cells = ", ".join(f"{label}: {row[label]['verdict']} ({_fmt(row[label]['measured'])})"
                          for label in ("as_run", "with_plan_choice"))
        print(f"target {name} = {row['target']}: {cells}")


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def run_verify(args: argparse.Namespace, command: list[str]) -> int:
    started_at = time.perf_counter()
    if args.smoke:
        if not torch.cuda.is_available() and not interpreting():
            print("flashspec bench verify --smoke without a GPU needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
    elif not torch.cuda.is_available() or interpreting():
        print("flashspec bench verify needs a CUDA GPU with compiled Triton (it times device kernels); "
              "--smoke runs the driver on tiny shapes anywhere", file=sys.stderr)
        return 2
    started = gpu_record(command, args.git_sha)
    print(json.dumps(started, indent=1))
    variants = bench.PLAN_VARIANTS if args.variants is None else {name: bench.PLAN_VARIANTS[name]
                                                                   for name in args.variants}
    settings = {"benchmark": "verify", "batch": args.batch, "vocab": args.vocab, "gamma": args.gamma,
                "host_loop": not args.skip_host_loop, "plan_sweep": not args.skip_sweep, "smoke": args.smoke,
                "plan_variants": variants, "budget_s": args.budget_s, "targets": TARGETS, "notes": NOTES}
    results: dict[str, Any] = {"floors": None, "correctness": None, "points": [], "points_failed": [], "table": None,
                               "verdicts": None, "rejection_verdicts": None, "plan_choice": None, "plan_sweep": None, "elapsed_s": {}}

    def save(phase: str) -> None:
        results["elapsed_s"][phase] = round(time.perf_counter() - started_at, 1)
        if args.out:
            provenance.write_result(args.out, started, settings, results)

    def summarise() -> None:
        bars = bench.verdicts(results["points"])
        results["rejection_verdicts"] = bars.pop("residual_rejection")  # the one-pass step's bars, apart
        results["verdicts"] = bars
        results["plan_choice"] = bench.plan_choice(results["points"])
        results["table"] = bench.format_table(results["points"], results["floors"]).splitlines()

    results["floors"] = bench.measure_floors(copy_numel=1 << 16 if args.smoke else 1 << 30)
    save("floors")
    results["correctness"] = bench.correctness_checks(smoke=args.smoke)
    for check in results["correctness"]:
        print(check)
    save("correctness")
    for vocab in args.vocab:
        for batch in args.batch:
            try:
                point = bench.bench_point(batch, args.gamma, vocab, results["floors"],
                                          host_loop=not args.skip_host_loop, variants=variants)
            except Exception as error:  # noqa: BLE001 -- recorded; the other points still run
                results["points_failed"].append({"batch": batch, "vocab": vocab, "error": f"{type(error).__name__}: {error}"})
                print(f"B={batch} V={vocab} failed: {error}", flush=True)
                save(f"B={batch} V={vocab} (failed)")
                continue
            results["points"].append(point)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in point.items() if k != "variants"},
                  flush=True)
            for name, row in point["variants"].items():
                print(f"  variant {name}: {row}", flush=True)
            summarise()
            save(f"B={batch} V={vocab}")
            print(f"  {time.perf_counter() - started_at:.0f} s elapsed", flush=True)

    def within_budget(phase: str) -> bool:
        elapsed = time.perf_counter() - started_at
        if elapsed > args.budget_s:
            results[f"{phase}_skipped"] = f"skipped: {elapsed:.0f} s elapsed, past the {args.budget_s} s budget"
            print(results[f"{phase}_skipped"], flush=True)
            return False
        return True

    bench.honest_graph_timings(results["points"], "race")  # a few seconds: always
    summarise()
    save("honest_race_graph")
    if not args.skip_sweep and not args.smoke and within_budget("plan_sweep"):
        try:
            results["plan_sweep"] = bench.plan_sweep(64, args.gamma, 128256)
        except Exception as error:  # noqa: BLE001 -- optional: recorded
            results["plan_sweep_error"] = f"{type(error).__name__}: {error}"
        save("plan_sweep")
    bench.honest_graph_timings(results["points"], "multinomial")  # last: a failed capture may leave CUDA state
    summarise()
    save("honest_multinomial_graph")
    print("\n".join(results["table"]))
    print_verdicts(results["verdicts"])
    print("The step with residual='rejection' (one launch, kernels/one_pass.py):")
    print_verdicts(results["rejection_verdicts"])
    print("Launch plans to paste into flashspec/kernels/plan.py (fastest variant per shape):")
    print(results["plan_choice"]["paste"])
    save("done")
    print(f"elapsed {results['elapsed_s']['done']} s")
    return 1 if bench.checks_failed(results["correctness"]) or results["points_failed"] else 0


def main(argv: list[str] | None = None) -> int:
    """`flashspec bench verify [options]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="flashspec bench verify", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON result here (e.g. results/verify_h200.json)")
    parser.add_argument("--batch", type=int, nargs="+", default=None, help="default 1 8 64 (smoke: 1 2)")
    parser.add_argument("--vocab", type=int, nargs="+", default=None, help="default 32000 128256 (smoke: 40)")
    parser.add_argument("--gamma", type=int, default=None, help="default 4 (smoke: 2)")
    parser.add_argument("--skip-host-loop", action="store_true", help="leave out the slow .item() baseline")
    parser.add_argument("--skip-sweep", action="store_true", help="leave out the tile sweep at B=64, V=128256")
    parser.add_argument("--budget-s", type=float, default=170.0,
                        help="the optional tile sweep starts only before this many seconds of the run")
    parser.add_argument("--variants", nargs="+", default=None, metavar="NAME",
                        help="time only these launch-plan variants (default: all of flashspec_lab.bench.PLAN_VARIANTS)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, host-clock times, no graphs: tests the driver without a GPU")
    parser.add_argument("--git-sha", default=None, help="commit measured (default: $FLASHSPEC_GIT_SHA or git rev-parse)")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    unknown = sorted(set(args.variants or ()) - set(bench.PLAN_VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {sorted(bench.PLAN_VARIANTS)}")
    args.batch = args.batch or ([1, 2] if args.smoke else [1, 8, 64])
    args.vocab = args.vocab or ([40] if args.smoke else [32000, 128256])
    args.gamma = args.gamma or (2 if args.smoke else 4)
    return run_verify(args, ["flashspec", "bench", "verify", *argv])


if __name__ == "__main__":
    raise SystemExit(main())
