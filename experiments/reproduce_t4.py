"""``flashspec reproduce t4``: the paper's T4 table measured on the GPU at hand, printed beside the paper's numbers
and written to results/reproduce_t4_<gpu>.json (`flashspec_lab.reproduce` measures).

    flashspec reproduce t4                      # Colab: TinyLlama-1.1B-Chat (NF4) + llama-68m from the hub
    flashspec reproduce t4 --source random      # no hub: the same shapes, random weights (costs real, α not)
    flashspec reproduce t4 --source smollm2     # no hub: the offline SmolLM2-135M-Instruct + prompt lookup
    flashspec reproduce t4 --smoke              # any machine, seconds: tiny models, that the command runs
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from flashspec_lab import provenance, reproduce


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flashspec reproduce t4", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="hub", choices=reproduce.SOURCES,
                        help="where the models come from (hub: TinyLlama-1.1B-Chat and llama-68m)")
    parser.add_argument("--smoke", action="store_true", help="tiny models on any device: --source smoke, few tokens")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per prompt")
    parser.add_argument("--prompts", type=int, default=4, help="chat prompts, each decoded at B = 1")
    parser.add_argument("--repeats", type=int, default=100, help="timed calls per verify measurement")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--out", default=None, help="JSON path (default results/reproduce_t4_<gpu>.json)")
    parser.add_argument("--git-sha", default=None, help="record this SHA when the copy has no .git")
    args = parser.parse_args(argv)
    if args.smoke:
        args.source, args.new_tokens, args.prompts, args.repeats = "smoke", min(args.new_tokens, 12), 1, 3
    for option, value in (("--new-tokens", args.new_tokens), ("--prompts", args.prompts),
                          ("--repeats", args.repeats)):
        if value < 1:
            parser.error(f"{option} must be an int >= 1, got {value}")
    return args


def default_out(gpu: str | None, smoke: bool) -> Path:
    """results/reproduce_t4_<gpu or cpu>[_smoke].json in the checkout."""
    name = re.sub(r"[^a-z0-9]+", "_", (gpu or "cpu").lower()).strip("_")
    return provenance.results_dir() / f"reproduce_t4_{name}{'_smoke' if smoke else ''}.json"


def main(argv: list[str] | None = None) -> int:
    """`flashspec reproduce t4 [options]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.source == "hub":
        print("flashspec: loading TinyLlama-1.1B-Chat (NF4) and llama-68m from the hub; the first run also compiles "
              "the Triton kernels and captures CUDA graphs (minutes; Triton caches the kernels for the next run)",
              file=sys.stderr)
    record = provenance.record(["flashspec", "reproduce", "t4", *argv], git_sha=args.git_sha)
    try:
        measured = reproduce.run(args.source, args.new_tokens, args.prompts, repeats=args.repeats,
                                 device=args.device)
    except ValueError as error:
        print(f"flashspec reproduce t4: error: {error}", file=sys.stderr)
        return 2
    results = measured["results"]
    print(f"{results['models']}")
    print(reproduce.table(results))
    out = Path(args.out) if args.out else default_out(results["gpu"], args.source == "smoke")
    provenance.write_result(out, record, measured["settings"], results)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
