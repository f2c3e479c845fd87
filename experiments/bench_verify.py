"""``flashspec bench verify``: time one verification step (Triton vs PyTorch vs host loop) on a GPU and write
results/verify_h200.json.

    flashspec bench verify --out results/verify_h200.json [--batch 1 8 64] [--vocab 32000 128256]

The measurements are `flashspec.bench`'s; this driver runs them over the grid of batch sizes and
vocabularies, prints the table, and writes the file after every point, so a crash keeps what ran.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from flashspec import bench, provenance

TARGETS = {"triton_over_floor_max": 2.0, "torch_over_triton_min_for_batch_le_8": 30.0}
NOTES = ("floor_us = max(empty_launch_us, logit_bytes / bandwidth): every logit read once. "
         "two_pass_bytes adds the sampled target and draft row per sequence, which the second "
         "launch re-reads. Times are medians; the Triton step is prepare_verify(...).run() "
         "(verify_triton), triton_api_us is fs.verify(backend='triton') with its argument checks.")


def gpu_record(command: list[str], git_sha: str | None) -> dict[str, Any]:
    """`provenance.record` with the GPU's SM count and memory as torch sees them."""
    record = provenance.record(command, git_sha)
    properties = torch.cuda.get_device_properties(0)
    record["hardware"].update(sm_count=properties.multi_processor_count, gpu_memory_bytes=properties.total_memory)
    return record


def run_verify(args: argparse.Namespace, command: list[str]) -> int:
    if not torch.cuda.is_available():
        print("flashspec bench verify needs a CUDA GPU (it times device kernels)", file=sys.stderr)
        return 2
    started = gpu_record(command, args.git_sha)
    print(json.dumps(started, indent=1))
    settings = {"benchmark": "verify", "batch": args.batch, "vocab": args.vocab, "gamma": args.gamma,
                "host_loop": not args.skip_host_loop, "plan_sweep": not args.skip_sweep, "targets": TARGETS,
                "notes": NOTES}
    results: dict[str, Any] = {"floors": bench.measure_floors(), "correctness": bench.correctness_checks(),
                               "points": [], "table": None, "plan_sweep": None}

    def save() -> None:
        if args.out:
            provenance.write_result(args.out, started, settings, results)

    for check in results["correctness"]:
        print(check)
    for vocab in args.vocab:
        for batch in args.batch:
            point = bench.bench_point(batch, args.gamma, vocab, results["floors"], host_loop=not args.skip_host_loop)
            results["points"].append(point)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in point.items()}, flush=True)
            save()
    table = bench.format_table(results["points"], results["floors"])
    print(table)
    results["table"] = table.splitlines()
    save()
    if not args.skip_sweep:
        results["plan_sweep"] = bench.plan_sweep(64, args.gamma, 128256)
        save()
    checks = results["correctness"]
    mismatched = [c for c in checks if c["check"] == "triton_equals_torch" and c["rows_equal"] != c["rows"]]
    not_one = [c for c in checks if c["check"] == "draft_equals_target_acceptance_rate" and c["acceptance_rate"] != 1.0]
    return 1 if (mismatched or not_one) else 0


def main(argv: list[str] | None = None) -> int:
    """`flashspec bench verify [options]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="flashspec bench verify", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the JSON result here (e.g. results/verify_h200.json)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--skip-host-loop", action="store_true", help="leave out the slow .item() baseline")
    parser.add_argument("--skip-sweep", action="store_true", help="leave out the launch-plan sweep")
    parser.add_argument("--git-sha", default=None, help="commit measured (default: $FLASHSPEC_GIT_SHA or git rev-parse)")
    args = parser.parse_args(argv)
    return run_verify(args, ["flashspec", "bench", "verify", *argv])


if __name__ == "__main__":
    raise SystemExit(main())
