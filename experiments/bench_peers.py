"""Peers benchmark: FlashSpec's fast path beside gpt-fast and Hugging Face, same weights, one process per system.

Shapes (random bf16 weights, one seed): TinyLlama-1.1B with a llama-68m draft (plain and speculative, γ = 4),
SmolLM2-135M and Llama-2-7B (plain). T = 1, batch 1, a 32-token prompt, 256 new tokens; each system's first
request compiles, the next `--repeats` are timed (tok/s: median, min, max). The 7B plain step is set against
its HBM floor (weights and K/V at the measured copy bandwidth). See `flashspec_lab.peers`.

    python experiments/bench_peers.py --gpt-fast ~/gpt-fast --out results/peers_h200.json       # on a GPU
    python experiments/bench_peers.py --gpt-fast ~/gpt-fast \\
        --gpt-fast-speculative ~/gpt-fast-e2cfa34 --shapes tinyllama-1.1b                      # + its speculative
    python experiments/bench_peers.py --smoke --systems flashspec hf                             # CPU: it runs

gpt-fast is not vendored: `--gpt-fast` is a checkout of pytorch-labs/gpt-fast (its commit is recorded: its git
HEAD, or for a copy without .git the first word of a `COMMIT` file in it). Its
speculative path fails at batch 1 since its batched-generation change (61c193d); `--gpt-fast-speculative`
takes a checkout of the commit before it (e2cfa34) for the speculative run.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec_lab import cli_checks, peers, provenance  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None, help="JSON file to write (rewritten after every system)")
    parser.add_argument("--shapes", nargs="+", default=list(peers.SHAPES), choices=list(peers.SHAPES))
    parser.add_argument("--systems", nargs="+", default=list(peers.SYSTEMS), choices=list(peers.SYSTEMS))
    parser.add_argument("--gpt-fast", type=Path, default=None, help="a checkout of pytorch-labs/gpt-fast")
    parser.add_argument("--gpt-fast-speculative", type=Path, default=None,
                        help="a checkout of gpt-fast for its speculative run (e2cfa34: its head fails at batch 1)")
    parser.add_argument("--compile", default="default", choices=["default", "max-autotune-no-cudagraphs", "none"],
                        help="FlashSpec's compile mode (none: graphs only); gpt-fast always compiles as its main does")
    parser.add_argument("--compile-scope", default="forward", choices=["forward", "regions"])
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--plain-only", action="store_true", help="leave out the speculative and assisted runs")
    only.add_argument("--speculative-only", action="store_true",
                      help="leave out the plain runs (the speculative and assisted runs alone)")
    parser.add_argument("--stack-every", type=float, default=None, metavar="S",
                        help="each system's process prints its Python stack to stderr every S seconds (where a slow "
                             "first request spends its time, also when its time limit cuts it)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="timed requests after the first (FlashSpec, gpt-fast)")
    parser.add_argument("--hf-repeats", type=int, default=2, help="timed requests after the first (Hugging Face)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one system's process may take")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, one repeat: checks it runs")
    parser.add_argument("--child", nargs=3, metavar=("SYSTEM", "SHAPE", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if args.stack_every is not None and args.stack_every <= 0:
        parser.error(f"--stack-every must be > 0 seconds, got {args.stack_every}")
    for name in ("new_tokens", "prompt_tokens", "gamma", "repeats", "hf_repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for option in ("gpt_fast", "gpt_fast_speculative"):
        path = getattr(args, option)
        if path is not None and not (path / "generate.py").is_file():
            parser.error(f"--{option.replace('_', '-')} {path}: not a gpt-fast checkout (no generate.py)")
    if "gpt-fast" in args.systems and args.gpt_fast is None and args.gpt_fast_speculative is None and not args.child:
        args.systems = [system for system in args.systems if system != "gpt-fast"]
        print("bench_peers: no --gpt-fast checkout given: gpt-fast left out", file=sys.stderr)
    if args.smoke:
        args.new_tokens, args.prompt_tokens, args.repeats, args.hf_repeats = 8, 6, 1, 1
    return args


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    return {"device": "cuda" if torch.cuda.is_available() and not args.smoke else "cpu", "smoke": args.smoke,
            "compile": None if args.compile == "none" else args.compile, "compile_scope": args.compile_scope,
            "plain_only": args.plain_only, "speculative_only": args.speculative_only,
            "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens, "gamma": args.gamma,
            "repeats": args.repeats, "hf_repeats": args.hf_repeats, "temperature": 1.0, "batch": 1,
            "gpt_fast": str(args.gpt_fast) if args.gpt_fast else None,
            "gpt_fast_speculative": str(args.gpt_fast_speculative) if args.gpt_fast_speculative else None}


def child(args: argparse.Namespace) -> int:
    system, shape, out = args.child
    path = Path(out)
    if args.stack_every:
        faulthandler.dump_traceback_later(args.stack_every, repeat=True, file=sys.stderr)
    # written after every method, so the parent keeps what finished if this process runs out of time
    peers.run_system(system, shape, settings_of(args), save=lambda record: path.write_text(json.dumps(record)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    settings = settings_of(args)
    settings["gpt_fast_commit"] = peers.checkout_commit(args.gpt_fast)
    settings["gpt_fast_speculative_commit"] = peers.checkout_commit(args.gpt_fast_speculative)
    record = provenance.record(git_sha=args.git_sha)
    cells: dict[str, dict[str, Any]] = {}
    forwarded = list(argv if argv is not None else sys.argv[1:])
    for shape in args.shapes:
        cells[shape] = {}
        for system in args.systems:
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder) / "child.json"
                command = [sys.executable, str(Path(__file__).resolve()), *forwarded, "--child", system, shape,
                           str(out)]
                print(f"bench_peers: {system} at {shape} ...", file=sys.stderr, flush=True)
                try:
                    # the child's progress and errors go to this process's stderr as they happen
                    done = subprocess.run(command, timeout=args.timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
                    error = None if done.returncode == 0 else f"exit {done.returncode} (its stderr is above)"
                except subprocess.TimeoutExpired:
                    error = f"no result within {args.timeout} s"
                # the methods the child finished, and why the rest are missing
                cells[shape][system] = json.loads(out.read_text()) if out.is_file() else {}
                if error is not None:
                    cells[shape][system].setdefault("error", error)
                elif not cells[shape][system]:
                    cells[shape][system] = {"error": "no method ran (its stderr is above)"}
            print(f"bench_peers: {system} at {shape}: {summary(cells[shape][system])}", file=sys.stderr, flush=True)
            if args.out:
                provenance.write_result(args.out, record, settings, {"cells": cells})
    results = {"cells": cells, **floors(args, settings)}
    if args.out:
        provenance.write_result(args.out, record, settings, results)
    print(json.dumps(results, indent=1))
    return 0


def floors(args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    """The measured copy bandwidth and each shape's one-token HBM floor at the request's mean filled length."""
    if settings["device"] != "cuda":
        return {"copy_bytes_per_s": None, "hbm_floor_ms": {}}
    import torch

    from bench_runner import copy_bandwidth  # noqa: PLC0415 - experiments/, imports torch

    bandwidth = copy_bandwidth(torch.device("cuda"))
    filled = args.prompt_tokens + args.new_tokens // 2
    return {"copy_bytes_per_s": bandwidth,
            "hbm_floor_ms": {shape: peers.hbm_floor_ms(shape, bandwidth, filled) for shape in args.shapes}}


def summary(record: dict[str, Any]) -> str:
    measured = ", ".join(f"{method} {value['tok_s_median']:.0f} tok/s" for method, value in record.items()
                         if isinstance(value, dict) and "tok_s_median" in value)
    if "error" in record:
        return (f"{measured}; " if measured else "") + "error: " + record["error"][:300]
    return measured or json.dumps(record)[:300]


if __name__ == "__main__":
    raise SystemExit(main())
