"""What block verification gains over token verification on a real model: tokens per step, paired step by step.

Both methods emit exactly the target's distribution, so the texts they decode follow one law; what differs is how
many drafts a step keeps. Given the first n drafts x_1..x_n of a step's chain, the probability that a method keeps
at least n is known in closed form (`expected_accepted`): prod_{j<=n} min(1, p_j(x_j) / q_j(x_j)) for token
verification, w_n (the capped cumulative ratio) for block verification. Summed over n, each is an unbiased estimate
of the method's expected drafts kept at that step's context, since the draft sampled the chain. So one run of the
eager engine with block verification, recording both sums at every step (`Recorder`, around the engine's own
verify call), compares the two methods on the very same chains: a paired estimate with far less spread than two
separate runs. The run's realised tokens per step are recorded beside them as a check.

`cpu_draft` distils a two-layer draft of SmolLM2 (its first and last layers, `flashspec.models.draft_from_teacher`)
on this machine's offline text for a few minutes: a real draft, weaker than the GPU-trained pool.
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import flashspec as fs
from flashspec import engine
from flashspec.sampling import SamplingParams, warp_logits
from flashspec.verify import draft_log_probs


def expected_accepted(log_p_x: torch.Tensor, log_q_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per chain, the sums over n of P(τ >= n | the first n drafts) under (token, block) verification, [B] each,
    from the target's and the draft's log-probs [B, γ] at the drafted tokens: prod_{j<=n} min(1, p_j/q_j) for token
    verification (then the sum is E[τ | chain]) and w_n = min(w_{n-1} p_n / q_n, 1) for block verification. Over
    chains drawn from the draft, each averages to the method's E[τ]."""
    ratios = (log_p_x - log_q_x).clamp(max=0.0)
    token = torch.cumsum(ratios, dim=1).exp().sum(1)
    sums = torch.cat([torch.zeros_like(log_p_x[:, :1]), torch.cumsum(log_p_x - log_q_x, dim=1)], dim=1)
    block = (sums - torch.cummax(sums, dim=1).values)[:, 1:].exp().sum(1)
    return token, block


@dataclass
class Recorder:
    """The two sums of `expected_accepted` for every verified row, appended as the engine verifies (`record`)."""

    token: list[float] = field(default_factory=list)
    block: list[float] = field(default_factory=list)

    def observe(self, target_logits: torch.Tensor, draft_logits: torch.Tensor | None, tokens: torch.Tensor,
                params: SamplingParams, given: bool) -> None:
        tokens = tokens.long()
        gamma = tokens.shape[1]
        log_p = warp_logits(target_logits, params)[:, :gamma].gather(-1, tokens[..., None])[..., 0]
        log_q = draft_log_probs(draft_logits, tokens, params, target_logits.shape[2], given)
        token, block = expected_accepted(log_p, log_q.gather(-1, tokens[..., None])[..., 0])
        self.token += token.tolist()
        self.block += block.tolist()


@contextlib.contextmanager
def record(recorder: Recorder) -> Iterator[Recorder]:
    """Every verify call of the eager engine also feeds `recorder` (the verification itself is unchanged)."""
    original = engine.verify_with_key

    def verify_with_key(target_logits, draft_logits, draft_tokens, params, key, backend="auto",
                        draft_is_log_probs=False, residual="race", method="token"):
        recorder.observe(target_logits, draft_logits, draft_tokens, params, draft_is_log_probs)
        return original(target_logits, draft_logits, draft_tokens, params, key, backend, draft_is_log_probs,
                        residual, method)

    engine.verify_with_key = verify_with_key
    try:
        yield recorder
    finally:
        engine.verify_with_key = original


def measure_prompt(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor, sampling: SamplingParams,
                   gamma: int, new_tokens: int, seed: int) -> dict[str, Any]:
    """One request of block verification with one draft: its steps, realised tokens per step, and the mean
    expected tokens per step (1 + E[kept]) of either method over its steps."""
    decoder = fs.SpeculativeDecoder(target, [draft], policy="fixed", gamma=gamma, verify_method="block")
    recorder = Recorder()
    started = time.perf_counter()
    with record(recorder):
        result = decoder.generate(ids, max_new_tokens=new_tokens, sampling=sampling, seed=seed)
    steps = len(result.stats.steps)
    return {"steps": steps, "generated": int(result.num_generated.sum()), "seconds": time.perf_counter() - started,
            "realised_tokens_per_step": int(result.num_generated.sum()) / max(steps, 1),
            "token_expected_tokens_per_step": 1 + statistics.fmean(recorder.token),
            "block_expected_tokens_per_step": 1 + statistics.fmean(recorder.block)}


def summarise(cells: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per-prompt means of a category: each method's expected tokens per step, the gain (block - token) with its
    standard error over prompts, and the ratio."""
    token = [cell["token_expected_tokens_per_step"] for cell in cells]
    block = [cell["block_expected_tokens_per_step"] for cell in cells]
    gains = [b - t for b, t in zip(block, token)]
    spread = statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else float("nan")
    return {"prompts": len(cells), "steps": sum(cell["steps"] for cell in cells),
            "token": statistics.fmean(token), "block": statistics.fmean(block), "gain": statistics.fmean(gains),
            "gain_standard_error": spread, "gain_min": min(gains), "ratio": statistics.fmean(block) /
            statistics.fmean(token), "realised_block": statistics.fmean(c["realised_tokens_per_step"] for c in cells)}


def draft_layers(teacher: torch.nn.Module) -> tuple[int, int]:
    """The teacher layers a CPU draft starts from: its first and its last."""
    return 0, teacher.config.num_hidden_layers - 1


FEATURE_LAYERS = (3, 15, -1)  # the target states a CPU feature draft reads (the GPU zoo's smollm2-features)
FEATURE_DEPTHS = 2            # the depths its loss unrolls


def fresh_cpu_draft(teacher: torch.nn.Module, features: bool = False) -> torch.nn.Module:
    """The untrained draft `cpu_draft` distils and `cached_cpu_draft` loads a distilled state into: the teacher's
    first and last layers (`draft_layers`), or with `features` a `flashspec.features.FeatureDraft` of one layer
    started from the teacher's last and fed its states at FEATURE_LAYERS (its new input map random)."""
    from flashspec.features import FeatureDraft
    from flashspec.models import draft_from_teacher

    if features:
        return FeatureDraft.from_target(teacher, (teacher.config.num_hidden_layers - 1,), FEATURE_LAYERS)
    return draft_from_teacher(teacher, draft_layers(teacher))


def cpu_draft(teacher: torch.nn.Module, tokenizer: Any, steps: int, seed: int = 0, chars: int = 400_000,
              progress: bool = False, features: bool = False) -> tuple[torch.nn.Module, list[float]]:
    """A two-layer draft of `teacher` (its first and last layers, embedding frozen) distilled on this machine by
    forward KL for `steps` steps of 8 windows of 128 tokens of the offline prose and Python text
    (`flashspec_lab.corpora`, train split). `features`: the feature draft of `fresh_cpu_draft` instead, trained
    by the zoo's feature loss (`zoo.distill.feature_loss`, FEATURE_DEPTHS deep) on the same windows. Returns the
    draft and its losses."""
    from flashspec_lab import corpora
    from flashspec_lab.zoo import distill
    from flashspec_lab.zoo.config import SIZES
    from flashspec_lab.zoo.training import encode_text, train_model

    config = SIZES["smollm2"].with_overrides(context=128, draft_batch_size=8)
    streams = [encode_text(tokenizer, corpora.assemble_domain(domain, chars).train_text)
               for domain in ("prose", "python")]
    if features:
        torch.manual_seed(seed)  # the feature draft's input map starts random
    draft = fresh_cpu_draft(teacher, features)
    loss = distill.feature_loss(teacher, FEATURE_LAYERS, FEATURE_DEPTHS) if features else distill.kl_to(teacher)
    teacher.eval()
    losses = train_model(draft, streams, steps, config, config.draft_lr, seed, torch.device("cpu"),
                         "features" if features else "distil", progress, config.draft_batch_size, loss=loss)
    return draft.eval(), losses


def cached_cpu_draft(target: torch.nn.Module, tokenizer: Any, steps: int, seed: int,
                     features: bool = False) -> tuple[torch.nn.Module, dict]:
    """The distilled CPU draft of `steps` steps (`cpu_draft`; `features`: the feature draft): from the cache
    ($FLASHSPEC_CACHE/block_gain) when it holds one, else distilled and cached. Returns the draft and a record of
    its distillation."""
    from flashspec import real

    cache = Path(os.environ.get(real.CACHE_ENV, Path.home() / ".cache" / "flashspec")) / "block_gain"
    path = cache / f"smollm2_{'features' if features else 'draft'}_{steps}_{seed}.pt"
    started = time.perf_counter()
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        draft = fresh_cpu_draft(target, features)
        draft.load_state_dict(saved["state"])
        return draft.eval(), {"steps": steps, "losses": saved["losses"], "cached": True}
    draft, losses = cpu_draft(target, tokenizer, steps, seed, progress=True, features=features)
    cache.mkdir(parents=True, exist_ok=True)
    torch.save({"state": draft.state_dict(), "losses": losses}, path)
    return draft, {"steps": steps, "losses": losses, "cached": False, "seconds": time.perf_counter() - started}


def add_real_options(parser: Any, prompts: int, temperatures: list[float], new_tokens: int) -> None:
    """The options the real-model CPU drivers share (output, prompt set, sampling, draft), with their defaults."""
    from flashspec_lab import workloads

    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--categories", nargs="+", default=list(workloads.CATEGORIES), choices=workloads.CATEGORIES)
    parser.add_argument("--prompts", type=int, default=prompts, help="prompts per category (the first of each)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=temperatures)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=new_tokens)
    parser.add_argument("--draft-steps", type=int, default=240, help="distillation steps of the CPU draft")
    parser.add_argument("--seed", type=int, default=0)


def real_pair(args: Any) -> tuple[torch.nn.Module, torch.nn.Module, Any, dict[str, Any]]:
    """SmolLM2 on the CPU, its cached CPU draft, the tokenizer, and the settings every such record shares."""
    from flashspec import real
    from flashspec_lab import workloads

    target, tokenizer = real.load_real("smollm2", device="cpu", dtype=torch.float32)
    draft, draft_record = cached_cpu_draft(target, tokenizer, args.draft_steps, args.seed)
    served = [p for c in args.categories for p in workloads.prompts([c])[: args.prompts]]
    settings = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised, fp32)", "device": "cpu",
                "draft": {"layers": list(draft_layers(target)), **draft_record},
                "categories": args.categories, "prompts_per_category": args.prompts,
                "prompt_set_sha256": workloads.fingerprint(served), "temperatures": args.temperatures,
                "gamma": args.gamma, "new_tokens": args.new_tokens, "seed": args.seed,
                "torch_threads": torch.get_num_threads()}
    return target, draft, tokenizer, settings


def run_prompts(args: Any, tokenizer: Any, out: str, record: dict, settings: dict,
                measure: Any, summarise: Any, describe: Any) -> dict[str, Any]:
    """Every prompt of every category at every temperature through `measure(ids, sampling)`, the summaries per
    category and mixed (`summarise(cells)`), the JSON rewritten after every prompt; `describe(cell)` is its line."""
    from flashspec_lab import provenance, workloads

    results: dict = {"cells": {}, "summary": {}}
    for temperature in args.temperatures:
        label = f"T={temperature:g}"
        results["cells"][label], results["summary"][label] = {}, {}
        for category in args.categories:
            cells = []
            for prompt in workloads.prompts([category])[: args.prompts]:
                cell = measure(workloads.render(tokenizer, prompt), SamplingParams(temperature))
                cells.append({"prompt": prompt.id, **cell})
                results["cells"][label][category] = cells
                results["summary"][label][category] = summarise(cells)
                provenance.write_result(out, record, settings, results)
                print(f"{label} {category} {prompt.id}: {describe(cell)} ({cell['seconds']:.0f} s)", flush=True)
        every = [cell for cells in results["cells"][label].values() for cell in cells]
        results["summary"][label]["mixed"] = summarise(every)
        provenance.write_result(out, record, settings, results)
    return results
