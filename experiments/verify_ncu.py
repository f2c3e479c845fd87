"""Hardware counters of the verify kernels (Nsight Compute): where the warm replay's time goes at each (B, V).

The benchmark times the step; this says why it takes that long. `run` is the program ncu profiles: at each point it
warms and compiles every plan named by `--variants` (and a plain torch read of the same logits, the achievable
bandwidth of a reduction over them) outside any NVTX range, then calls each once inside a range `ncu/<label>`, and
writes a manifest of the labels in launch order with the kernels each launched. `parse` joins ncu's CSV (`--page
details`) with the manifest into JSON: per kernel its duration, DRAM and SM throughput, occupancy, registers,
instructions per logit element and the leading warp stall reasons.

    ncu --log-file raw.csv $(python -m experiments.verify_ncu ncu-args) \\
        python -m experiments.verify_ncu run --manifest m.json
    python -m experiments.verify_ncu parse --csv raw.csv --manifest m.json --out results/verify_ncu_h200.json
"""
from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path
from typing import Callable

import torch

from flashspec import rng
from flashspec_lab import cli_checks, provenance
from flashspec_lab.bench import PLAN_VARIANTS, make_inputs, variant_prepare, variant_step
from flashspec.kernels import prepare_verify, verify_triton
from flashspec_lab.kernels import sass
from flashspec.sampling import SamplingParams

NVTX_RANGE = "ncu"
SCHEDULERS_PER_SM = 4  # warp schedulers of an SM90 multiprocessor, each issuing one warp instruction a cycle
POINTS = ((1, 32000), (8, 32000), (64, 32000), (1, 128256), (8, 128256), (64, 128256))
GAMMA = 4
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
            "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis")
STALLS = ("long_scoreboard", "short_scoreboard", "wait", "barrier", "membar", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "not_selected", "selected", "no_instruction", "dispatch_stall", "drain",
          "branch_resolving", "sleeping", "tex_throttle", "imc_miss", "misc")
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
EXTRA_METRICS = ("smsp__inst_executed.sum", "dram__bytes_read.sum", "lts__t_bytes.sum",
                 *(f"{STALL_PREFIX}{reason}_per_issue_active.ratio" for reason in STALLS))


def ncu_args() -> list[str]:
    """ncu's options for `run`: the NVTX filter, the sections and the extra metrics `parse` reads."""
    args = ["--clock-control", "none", "--nvtx", "--nvtx-include", f"{NVTX_RANGE}/", "--csv", "--page", "details"]
    for section in SECTIONS:
        args += ["--section", section]
    return args + ["--metrics", ",".join(EXTRA_METRICS)]


def run(variants: list[str], manifest_path: str, points=POINTS) -> None:
    """Each point's plans, warmed outside and called once inside an NVTX range; the manifest names them."""
    params = SamplingParams(1.0)
    key = rng.Key.from_seed(12345)
    manifest = []
    for batch, vocab in points:
        inputs = make_inputs(batch, GAMMA, vocab, torch.bfloat16, params, seed=batch * 7 + vocab, device="cuda")
        target, draft, _ = inputs
        calls: list[tuple[str, Callable[[], object], list[str]]] = []
        for name in variants:
            if name == "default":  # the shipped plan: no tuning, so the installed Triton's SHAPE_PLANS decides
                prepare = lambda: prepare_verify(*inputs, params, key)  # noqa: E731
                step = lambda: verify_triton(*inputs, params, key)  # noqa: E731
            else:
                prepare = variant_prepare(inputs, params, key, PLAN_VARIANTS[name])
                step = variant_step(inputs, params, key, PLAN_VARIANTS[name])
            prepared = prepare()
            prepared.run()
            for _ in range(3):
                step()
            calls.append((name, step, [kernel.fn.__name__ for kernel, _, _ in sass.kernel_launches(prepared)]))
        calls.append(("torch_amax_read", lambda: (target.amax(-1), draft.amax(-1)), ["reduce", "reduce"]))
        for _ in range(3):
            calls[-1][1]()
        torch.cuda.synchronize()
        for name, fn, kernels in calls:
            torch.cuda.nvtx.range_push(NVTX_RANGE)  # ncu profiles only the kernels inside this range
            torch.cuda.nvtx.range_push(f"B={batch} V={vocab} {name}")
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            torch.cuda.nvtx.range_pop()
            manifest.append({"batch": batch, "vocab": vocab, "variant": name, "kernels": kernels,
                             "elements": batch * (2 * GAMMA + 1) * vocab})
    Path(manifest_path).parent.mkdir(parents=True, exist_ok=True)
    Path(manifest_path).write_text(json.dumps(manifest, indent=1))


def _number(text: str) -> float | str:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def read_csv(text: str) -> list[dict]:
    """ncu's `--csv --page details` output as one dict of metrics per profiled kernel, in launch order."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the input")
    kernels: dict[int, dict] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        try:
            index = int(row["ID"])
        except (KeyError, ValueError):
            continue
        kernel = kernels.setdefault(index, {"name": row.get("Kernel Name", ""), "block": row.get("Block Size"),
                                            "grid": row.get("Grid Size"), "metrics": {}})
        name = row.get("Metric Name", "")
        unit = row.get("Metric Unit", "")
        kernel["metrics"][f"{name} [{unit}]" if unit else name] = _number(row.get("Metric Value", ""))
    return [kernels[index] for index in sorted(kernels)]


def _metric(metrics: dict, *prefixes: str) -> float | None:
    """The first metric whose name starts with one of the prefixes (names carry their unit in brackets)."""
    for prefix in prefixes:
        for name, value in metrics.items():
            if name.startswith(prefix) and isinstance(value, float):
                return value
    return None


def _duration_us(metrics: dict) -> float | None:
    for name, value in metrics.items():
        if name.startswith("Duration") and isinstance(value, float):
            unit = name[name.find("[") + 1:-1] if "[" in name else "ns"
            return value * {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "nsecond": 1e-3}.get(unit, 1e-3)
    return None


def summarise(kernels: list[dict], manifest: list[dict]) -> list[dict]:
    """Each manifest entry with its kernels' leading metrics; the kernel names must match the manifest's."""
    rows, cursor = [], 0
    for entry in manifest:
        launched = []
        for expected in entry["kernels"]:
            if cursor >= len(kernels):
                raise ValueError(f"ncu profiled fewer kernels than the manifest names (at {entry})")
            kernel = kernels[cursor]
            cursor += 1
            if expected not in kernel["name"]:
                raise ValueError(f"kernel {cursor - 1} is {kernel['name']!r}, the manifest expects {expected!r}")
            metrics = kernel["metrics"]
            stalls = {name.split(" [")[0][len(STALL_PREFIX):].replace("_per_issue_active.ratio", ""): value
                      for name, value in metrics.items()
                      if name.startswith(STALL_PREFIX) and isinstance(value, float)}
            instructions = _metric(metrics, "Executed Instructions [inst]", "smsp__inst_executed.sum")
            frequency, sms = _metric(metrics, "SM Frequency"), _metric(metrics, "# SMs")
            launched.append({
                "name": kernel["name"], "grid": kernel["grid"], "block": kernel["block"],
                "duration_us": _duration_us(metrics),
                "dram_throughput_pct": _metric(metrics, "DRAM Throughput"),
                "memory_throughput_pct": _metric(metrics, "Memory Throughput [%]"),
                "compute_sm_throughput_pct": _metric(metrics, "Compute (SM) Throughput"),
                "achieved_occupancy_pct": _metric(metrics, "Achieved Occupancy"),
                "theoretical_occupancy_pct": _metric(metrics, "Theoretical Occupancy"),
                "registers_per_thread": _metric(metrics, "Registers Per Thread"),
                "waves_per_sm": _metric(metrics, "Waves Per SM"),
                "issue_slots_busy_pct": _metric(metrics, "Issue Slots Busy", "Issued Ipc Active"),
                "eligible_warps_per_scheduler": _metric(metrics, "Eligible Warps Per Scheduler"),
                "dram_bytes_read": _metric(metrics, "dram__bytes_read.sum"),
                "warp_instructions": instructions,
                "thread_instructions_per_element": (instructions * 32 / entry["elements"]
                                                     if instructions else None),
                "sm_frequency_hz": frequency, "sms": sms,
                # the kernel's instructions at one warp instruction per cycle from each of an SM's four schedulers
                "issue_floor_us": (instructions / (sms * SCHEDULERS_PER_SM * frequency) * 1e6
                                   if instructions and sms and frequency else None),
                "top_stalls": dict(sorted(stalls.items(), key=lambda item: -item[1])[:6]),
                "metrics": metrics,
            })
        rows.append({**entry, "launched": launched,
                     "duration_us": sum(k["duration_us"] or 0.0 for k in launched)})
    if cursor != len(kernels):
        raise ValueError(f"ncu profiled {len(kernels)} kernels, the manifest names {cursor}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="the program ncu profiles")
    run_parser.add_argument("--manifest", required=True)
    run_parser.add_argument("--variants", nargs="+", default=["default", "stats_lanes_off", "stats_bv2048_pdl"])
    sub.add_parser("ncu-args", help="print ncu's options for `run`")
    parse_parser = sub.add_parser("parse", help="ncu's CSV and the manifest to JSON")
    parse_parser.add_argument("--csv", required=True)
    parse_parser.add_argument("--manifest", required=True)
    parse_parser.add_argument("--out", required=True)
    parse_parser.add_argument("--git-sha", default=None)
    parse_parser.add_argument("--ncu-command", default=None)
    args = parser.parse_args(argv)
    if args.command in ("run", "parse"):  # run writes the manifest, parse reads it and writes --out
        cli_checks.output_file(parser, "--manifest" if args.command == "run" else "--out",
                               args.manifest if args.command == "run" else args.out)
    if args.command == "ncu-args":
        print(" ".join(ncu_args()))
        return 0
    if args.command == "run":
        unknown = [name for name in args.variants if name != "default" and name not in PLAN_VARIANTS]
        if unknown:
            raise SystemExit(f"--variants: unknown {unknown}; choose 'default' or from {sorted(PLAN_VARIANTS)}")
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA GPU: ncu profiles the compiled kernels")
        run(args.variants, args.manifest)
        return 0
    with open(args.csv) as handle:
        kernels = read_csv(handle.read())
    with open(args.manifest) as handle:
        manifest = json.load(handle)
    rows = summarise(kernels, manifest)
    provenance.write_result(
        args.out,
        provenance.record(args.ncu_command or "ncu ... python -m experiments.verify_ncu run", args.git_sha),
        {"gamma": GAMMA, "dtype": "bfloat16", "temperature": 1.0, "sections": list(SECTIONS),
         "cache_control": "all (caches flushed before each kernel)", "clock_control": "none"},
        rows)
    for row in rows:
        for kernel in row["launched"]:
            print(f"B={row['batch']:3d} V={row['vocab']:6d} {row['variant']:22s} {kernel['name'][:28]:28s} "
                  f"{(kernel['duration_us'] or 0):7.2f} us dram {kernel['dram_throughput_pct']}% "
                  f"sm {kernel['compute_sm_throughput_pct']}% occ {kernel['achieved_occupancy_pct']} "
                  f"inst/elem {kernel['thread_instructions_per_element'] or 0:.1f} stalls {list(kernel['top_stalls'])[:3]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
