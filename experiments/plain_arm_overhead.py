"""What the plain arm costs inside the speculative decoder, against fast plain decoding, on SmolLM2-135M's shape.

The adaptive decoder's plain steps measured about 3 % slower than `FastPlainDecoder`'s on the real model. This driver
separates the causes on random weights of that shape, with a random two-layer draft of the same shape (random models
agree often, so speculation may pay here: the unbudgeted policy's row shows whether it does): fast plain; the
speculative decoder with the plain arm beside a γ = 4 arm but a fixed policy on plain (the session's own cost: its
buffers, bucket choice and commit width); the same with gamma-ts without a budget and with the default budget (the
policy's cost, and its exploration). Each timed repeat serves the same prompts through every decoder in turn, after
an untimed warm-up that captures every graph; the JSON is rewritten after every repeat. `--feature-draft` adds a
feature draft (`flashspec.features.FeatureDraft`, one layer copied from the target, reading states 3, 15 and the
final one, as the real pool's) to every speculative decoder's pool, so their target also writes its states at
every step, plain ones included.

    python experiments/plain_arm_overhead.py --out results/plain_arm_overhead_h100.json
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

import flashspec as fs  # noqa: E402
from flashspec import models  # noqa: E402
from flashspec.features import FeatureDraft  # noqa: E402
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder  # noqa: E402
from flashspec.front import PLAIN  # noqa: E402
from flashspec_lab import cli_checks, peers, provenance  # noqa: E402

DECODERS = ("fast_plain", "plain_arm_fixed", "gamma_ts_no_budget", "gamma_ts_budget")


def make(name: str, target: torch.nn.Module, drafts: list[torch.nn.Module]) -> Any:
    """The decoder `name` of DECODERS; the speculative ones have the arms (draft, 4) per draft and plain (the last)."""
    if name == "fast_plain":
        return FastPlainDecoder(target)
    if name == "plain_arm_fixed":
        return FastSpeculativeDecoder(target, drafts, policy="fixed", gammas=[0, 4],
                                      policy_kwargs={"arm": len(drafts)})
    budget = None if name == "gamma_ts_no_budget" else "auto"
    return FastSpeculativeDecoder(target, drafts, policy="gamma-ts", gammas=[0, 4],
                                  policy_kwargs={"seed": 0, "budget": budget})


def serve(decoder: Any, prompts: list[torch.Tensor], new_tokens: int) -> dict[str, Any]:
    """Every prompt in turn at T = 1 (seed = its index): seconds, steps, tokens and the plain arm's share of steps."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    started = time.perf_counter()
    steps = tokens = plain = 0
    for index, prompt in enumerate(prompts):
        result = decoder.generate(prompt, max_new_tokens=new_tokens, sampling=fs.SamplingParams(1.0), seed=index,
                                  ignore_eos=True)
        trace = result.stats.arm_trace
        steps += len(trace)
        tokens += int(result.num_generated.sum())
        plain += sum(decoder.arms[arm] == PLAIN for arm in trace)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "steps": steps, "tokens": tokens, "tok_s": tokens / seconds,
            "ms_per_step": 1e3 * seconds / steps, "plain_share": plain / steps}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--feature-draft", action="store_true",
                        help="a feature draft beside the token draft in the speculative decoders' pool")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, one repeat: checks it runs")
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    for name in ("requests", "prompt_tokens", "new_tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    device = models.default_device()
    dtype = models.half_dtype(device) if device.type == "cuda" else torch.float32
    shape = peers.smoke_config(models.smollm2_135m_config) if args.smoke else models.smollm2_135m_config()
    draft_shape = peers.smoke_config(models.smollm2_135m_config) if args.smoke else models.smollm2_135m_config(
        num_layers=2)
    target = models.model_from_config(shape, seed=1, dtype=dtype, device=device)
    draft = models.model_from_config(draft_shape, seed=2, dtype=dtype, device=device)
    drafts = [draft]
    if args.feature_draft:
        states = (3, 15, -1) if shape.num_hidden_layers > 15 else (1, -1)  # the smoke shape has 2 layers
        drafts.append(FeatureDraft.from_target(target, (0,), states).to(device=device, dtype=dtype).eval())
    prompts = [peers.prompt_ids(args.prompt_tokens, shape.vocab_size, seed=seed).to(device)
               for seed in range(args.requests)]
    record = provenance.record(git_sha=args.git_sha)
    settings = {**vars(args), "device": str(device), "decoders": list(DECODERS)}
    decoders = {name: make(name, target, drafts) for name in DECODERS}
    results: dict[str, Any] = {"warm_up_s": {}, "runs": {name: [] for name in DECODERS}}
    for name, decoder in decoders.items():  # the untimed stream captures every graph the timed ones replay
        results["warm_up_s"][name] = serve(decoder, prompts, args.new_tokens)["seconds"]
        provenance.write_result(args.out, record, settings, results)
    for _ in range(1 if args.smoke else args.repeats):
        for name, decoder in decoders.items():
            results["runs"][name].append(serve(decoder, prompts, args.new_tokens))
        results["ms_per_step_median"] = {name: statistics.median(run["ms_per_step"] for run in runs)
                                         for name, runs in results["runs"].items() if runs}
        results["tok_s_over_fast_plain"] = {
            name: statistics.median(run["tok_s"] for run in runs) / statistics.median(
                run["tok_s"] for run in results["runs"]["fast_plain"])
            for name, runs in results["runs"].items() if runs}
        provenance.write_result(args.out, record, settings, results)
        print(f"[plain_arm_overhead] ms per step {results['ms_per_step_median']}, "
              f"× fast plain {results['tok_s_over_fast_plain']}", flush=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
