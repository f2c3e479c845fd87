"""What verifying several drafted chains together gains over one chain, on a real model: drafts kept per step.

At each step of a decode, one draft samples K chains of γ tokens on independent noise, the target scores all of
them (one batched forward, the chains as rows: no tree attention is needed to count tokens), and three estimates
of the expected drafts kept are taken on the same chains: token and block verification of the first chain (closed
form, `flashspec_lab.block_gain.expected_accepted`) and multi-path verification of the first k chains for every
k <= K (`flashspec.paths.verify_paths`, the mean over `draws` independent keys: a Monte Carlo estimate of the
expectation given the chains). Averaged over steps, each is the method's expected drafts kept at the contexts the
decode visits; the decode itself advances by one multi-path draw, which has the target's law like every exact
method, so the contexts are the target's own samples.
"""
from __future__ import annotations

import copy
import statistics
import time
from typing import Any

import torch

from flashspec import rng
from flashspec.paths import verify_paths_reference
from flashspec.sampling import SamplingParams, sample_from_logits, warp_logits
from flashspec_lab.block_gain import expected_accepted


class Context:
    """A model's KV cache of a request's tokens but the last, extended as the request grows (one row)."""

    @torch.no_grad()
    def __init__(self, model: torch.nn.Module, ids: torch.Tensor) -> None:
        from transformers import DynamicCache

        self.model, self.cache = model, DynamicCache()
        if ids.shape[1] > 1:
            model(ids[:, :-1], past_key_values=self.cache, use_cache=True)

    def rows(self, count: int) -> Any:
        """A copy of the cache repeated to `count` rows (the chains of one step)."""
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(count)
        return cache

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor) -> None:
        self.model(tokens, past_key_values=self.cache, use_cache=True)


@torch.no_grad()
def draft_chains(draft: Context, last: torch.Tensor, chains: int, gamma: int, sampling: SamplingParams,
                 key: rng.Key) -> tuple[torch.Tensor, torch.Tensor]:
    """`chains` chains of `gamma` tokens sampled from the draft after its context and `last` [1, 1]: (tokens
    [K, γ], the warped log-probs [K, γ, V] each was drawn from). Chain k draws on row k of the draft stream."""
    cache, step_input = draft.rows(chains), last.expand(chains, 1)
    tokens, log_probs = [], []
    for position in range(gamma):
        logits = draft.model(step_input, past_key_values=cache, use_cache=True).logits[:, -1].float()
        token, warped = sample_from_logits(logits, sampling, key, position=position, stream=rng.STREAM_DRAFT)
        tokens.append(token)
        log_probs.append(warped)
        step_input = token[:, None]
    return torch.stack(tokens, dim=1), torch.stack(log_probs, dim=1)


@torch.no_grad()
def measure_prompt(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor, sampling: SamplingParams,
                   chains: int, gamma: int, new_tokens: int, seed: int, draws: int = 32) -> dict[str, Any]:
    """One request: per step, the expected drafts kept by token and block verification of chain 0 and by
    multi-path verification of chains 0..k-1 (k = 1..`chains`); their means over the request's steps."""
    started = time.perf_counter()
    target_context, draft_context = Context(target, ids), Context(draft, ids)
    last = ids[:, -1:]
    token_kept, block_kept = [], []
    paths_kept: dict[int, list[float]] = {k: [] for k in range(1, chains + 1)}
    generated, step = 0, 0
    while generated < new_tokens:
        tokens, log_q = draft_chains(draft_context, last, chains, gamma, sampling,
                                     rng.Key.from_seed(rng.derive_seed(seed, step)))
        target_logits = target(torch.cat([last.expand(chains, 1), tokens], dim=1),
                               past_key_values=target_context.rows(chains), use_cache=True).logits.float()
        log_p = warp_logits(target_logits[:1], sampling)                              # chain 0: [1, γ+1, V]
        log_p_x = log_p[:, :gamma].gather(-1, tokens[:1, :, None])[..., 0]
        log_q_x = log_q[:1].gather(-1, tokens[:1, :, None])[..., 0]
        token, block = expected_accepted(log_p_x, log_q_x)
        token_kept.append(float(token[0]))
        block_kept.append(float(block[0]))
        replicas = draws if sampling.temperature > 0 else 1
        for k in paths_kept:
            out = verify_paths_reference(
                target_logits[None, :k].expand(replicas, -1, -1, -1), log_q[None, :k].expand(replicas, -1, -1, -1),
                tokens[None, :k].expand(replicas, -1, -1), sampling, rng.Key.from_seed(rng.derive_seed(seed, step, k)),
                draft_is_log_probs=True)
            paths_kept[k].append(float(out.num_accepted.double().mean()))
        kept = int(out.num_accepted[0])                                  # the decode follows one draw of K chains
        emitted = out.tokens[:1, :kept + 1]
        for context in (target_context, draft_context):
            context.extend(torch.cat([last, emitted[:, :kept]], dim=1))
        last = emitted[:, kept:]
        generated += kept + 1
        step += 1
    result = {"steps": step, "generated": generated, "seconds": time.perf_counter() - started,
              "token_expected_tokens_per_step": 1 + statistics.fmean(token_kept),
              "block_expected_tokens_per_step": 1 + statistics.fmean(block_kept)}
    for k, kept_k in paths_kept.items():
        result[f"paths{k}_expected_tokens_per_step"] = 1 + statistics.fmean(kept_k)
    return result


def summarise(cells: list[dict[str, Any]], chains: int) -> dict[str, Any]:
    """Per-prompt means of a category: each method's tokens per step, and multi-path over block verification with
    its standard error over prompts (paired by prompt)."""
    methods = ["token", "block"] + [f"paths{k}" for k in range(1, chains + 1)]
    means = {method: statistics.fmean(cell[f"{method}_expected_tokens_per_step"] for cell in cells)
             for method in methods}
    gains = [cell[f"paths{chains}_expected_tokens_per_step"] - cell["block_expected_tokens_per_step"]
             for cell in cells]
    spread = statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else float("nan")
    return {"prompts": len(cells), "steps": sum(cell["steps"] for cell in cells), **means,
            "paths_over_block": means[f"paths{chains}"] / means["block"],
            "paths_minus_block": statistics.fmean(gains), "paths_minus_block_standard_error": spread}
