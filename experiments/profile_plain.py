"""Kernel-by-kernel profile of the plain decode step: FlashSpec's fast plain step (and its variants) beside gpt-fast's.

One process per (system, shape, variant). The processes of one group start together so they compile side by side;
each times and profiles alone once its group is warm (see `flashspec_lab.step_profile`). The small shapes form one
group; each system at a large shape forms its own (three 7B processes at once do not fit one 80 GB card).

    python experiments/profile_plain.py --gpt-fast ~/gpt-fast --out results/profile_plain_h200.json   # on a GPU
    python experiments/profile_plain.py --smoke --systems flashspec --out /tmp/profile.json           # CPU: it runs
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec_lab import cli_checks, peers, provenance, step_profile  # noqa: E402


LARGE_SHAPES = ("llama-2-7b",)  # one system's processes at a time: their weights and compile workspaces fill a card


def job_groups(jobs: list[tuple[str, str, str]]) -> list[list[tuple[str, str, str]]]:
    """Jobs that run at once: every small-shape job together, then one group per (large shape, system)."""
    small = [job for job in jobs if job[1] not in LARGE_SHAPES]
    large: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for job in jobs:
        if job[1] in LARGE_SHAPES:
            large.setdefault((job[1], job[0]), []).append(job)
    return ([small] if small else []) + list(large.values())


def run_group(group: list[tuple[str, str, str]], forwarded: list[str], timeout: float
              ) -> Iterator[tuple[str, str, str, dict]]:
    """Start the group's processes together (they meet at one barrier) and yield each one's cell as it ends."""
    with tempfile.TemporaryDirectory() as folder:
        children = []
        for system, shape, name in group:
            out = Path(folder) / f"{system}-{shape}-{name}.json"
            command = [sys.executable, str(Path(__file__).resolve()), *forwarded, "--child", system, shape, name,
                       folder, str(len(group)), str(out)]
            children.append((system, shape, name, out, subprocess.Popen(
                command, env={**os.environ, "PYTHONUNBUFFERED": "1"})))
        deadline = time.perf_counter() + timeout
        for system, shape, name, out, child in children:
            try:
                child.wait(timeout=max(1.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            yield system, shape, name, (json.loads(out.read_text()) if out.is_file()
                                        else {"error": f"exit {child.returncode}"})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="JSON file to write (rewritten as processes finish)")
    parser.add_argument("--shapes", nargs="+", default=list(peers.SHAPES), choices=list(peers.SHAPES))
    parser.add_argument("--systems", nargs="+", default=["flashspec", "gpt-fast"], choices=["flashspec", "gpt-fast"])
    parser.add_argument("--variants", nargs="+", default=["default", "math"], choices=step_profile.VARIANTS,
                        help="FlashSpec's forward variants (step_profile.VARIANTS), each a process per shape")
    parser.add_argument("--gpt-fast", type=Path, default=None, help="a checkout of pytorch-labs/gpt-fast")
    parser.add_argument("--compile", default="default", choices=["default", "max-autotune-no-cudagraphs", "none"])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=540, help="seconds the whole run may take")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU: checks it runs")
    parser.add_argument("--child", nargs=6, metavar=("SYSTEM", "SHAPE", "VARIANT", "FOLDER", "PARTIES", "OUT"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if "gpt-fast" in args.systems and args.gpt_fast is None:
        args.systems = [system for system in args.systems if system != "gpt-fast"]
        print("profile_plain: no --gpt-fast checkout given: gpt-fast left out", file=sys.stderr)
    if args.smoke:
        args.new_tokens, args.prompt_tokens, args.repeats = 8, 6, 1
    return args


def settings_of(args: argparse.Namespace) -> dict:
    import torch

    return {"device": "cuda" if torch.cuda.is_available() and not args.smoke else "cpu", "smoke": args.smoke,
            "compile": None if args.compile == "none" else args.compile, "new_tokens": args.new_tokens,
            "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "temperature": 1.0, "batch": 1,
            "gpt_fast": str(args.gpt_fast) if args.gpt_fast else None,
            "gpt_fast_commit": peers.checkout_commit(args.gpt_fast)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        system, shape, name, folder, parties, out = args.child
        step_profile.run_child(system, shape, name, settings_of(args), Path(folder), int(parties), Path(out))
        return 0
    settings = settings_of(args)
    record = provenance.record(git_sha=args.git_sha)
    jobs = [(system, shape, name) for shape in args.shapes for system in args.systems
            for name in (args.variants if system == "flashspec" else ["default"])]
    forwarded = list(argv if argv is not None else sys.argv[1:])
    cells: dict[str, dict] = {}
    groups = job_groups(jobs)
    deadline = time.perf_counter() + args.timeout
    weights = [2.0 if group[0][1] not in LARGE_SHAPES else 1.0 for group in groups]
    for index, group in enumerate(groups):
        # each group gets its share of what is left (the many-process small group twice a large one's), so an
        # early group cannot starve the later ones and time one leaves unused passes on
        share = (deadline - time.perf_counter()) * weights[index] / sum(weights[index:])
        for system, shape, name, cell in run_group(group, forwarded, share):
            cells.setdefault(shape, {})[f"{system}/{name}"] = cell
            print(f"profile_plain: {system}/{name} at {shape}: "
                  f"{cell.get('tok_s_median', cell.get('error', ''))}", file=sys.stderr, flush=True)
            if args.out:
                provenance.write_result(args.out, record, {**settings, "jobs": jobs, "groups": groups},
                                        {"cells": cells})
    for shape, systems in cells.items():
        for label, cell in systems.items():
            if "profile" in cell:
                profile = cell["profile"]
                print(f"{shape:16s} {label:22s} {cell['tok_s_median']:8.1f} tok/s  "
                      f"{profile['kernel_us_per_step']:8.1f} us kernels/step  {profile['kernels_per_step']:6.1f} kernels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
