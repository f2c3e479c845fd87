"""End-to-end exactness of the speculative engine (Theorem 1; book/design.md §1).

Tiny random Llama models (V = 16) built from config: the target's exact probability of every
length-3 continuation of a prompt is enumerated, the engine (two model drafts + prompt lookup, an
EXP3 bandit that switches arms, B = 256 rows per call with per-row lengths, T ∈ {0.7, 1.0}, top-p
on and off) generates 16 384 continuations, and a χ² family must accept at level 0.01. The same test
must reject a cherry-picking selector (a negative control that breaks Theorem 1). Greedy decoding must
equal the target's own greedy `generate` token for token for every policy.

Everything is seeded, so each test is deterministic (no flaky 1 % failures).
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import flashspec as fs
from flashspec import bandits
from flashspec.drafters import PromptLookupDrafter
from flashspec import models
from flashspec.engine import SpeculativeDecoder, draft_context
from flashspec_lab.exactness import chi_square_test
from flashspec.models import tiny_llama
from flashspec.sampling import warp_logits

VOCAB = 16
PROMPT = torch.tensor([3, 7, 3, 9])
LENGTH = 3
LEVEL = 0.01
ROWS_PER_CALL = 256
CALLS = 64


@pytest.fixture(scope="module")
def pool():
    """Target, a near-copy draft (accepts often: multi-token steps and bonus tokens), and an
    unrelated small draft (rejects often: residual path)."""
    target = tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=1, initializer_range=0.3, seed=1)
    near = copy.deepcopy(target)
    noise = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in near.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.003 * 0.3)
    far = tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    return target, near, far


def peaked_trio() -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """A target with peaked, context-dependent distributions (a large initializer range), a perturbed copy of it
    (noise of 0.3 on every parameter) and an exact copy: several paths verified together keep the copy's often,
    and a cache that does not hold the kept path shows in the law."""
    target = tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=1, initializer_range=0.8, seed=1)
    perturbed = copy.deepcopy(target)
    noise = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in perturbed.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.3)
    return target, perturbed, copy.deepcopy(target)


def exact_continuations(target: torch.nn.Module, params: fs.SamplingParams) -> np.ndarray:
    """P(x0, x1, x2 | PROMPT) under the warped target, flattened lexicographically ([V**3])."""
    grid = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))
    sequences = torch.cat([PROMPT.expand(VOCAB * VOCAB, -1), grid], dim=1)
    with torch.no_grad():
        probs = warp_logits(target(sequences).logits, params).exp().double()
    start = len(PROMPT) - 1
    first = probs[0, start]
    second = probs[::VOCAB, start + 1]
    third = probs[:, start + 2].view(VOCAB, VOCAB, VOCAB)
    return (first[:, None, None] * second[:, :, None] * third).flatten().numpy()


def fit_p_values(continuations: torch.Tensor, joint: np.ndarray) -> dict[str, float]:
    """χ² p-values of the joint of the 3 tokens and of each position's marginal."""
    cube = joint.reshape(VOCAB, VOCAB, VOCAB)
    marginals = [cube.sum(axis=(1, 2)), cube.sum(axis=(0, 2)), cube.sum(axis=(0, 1))]
    p_values = {"joint": chi_square_test(continuations, joint, VOCAB).p_value}
    for position, marginal in enumerate(marginals):
        p_values[f"token{position}"] = chi_square_test(continuations[:, position : position + 1], marginal, VOCAB).p_value
    return p_values


def passes(p_values: dict[str, float]) -> bool:
    """Family-wise level LEVEL: Bonferroni over the four χ² statistics."""
    return min(p_values.values()) >= LEVEL / len(p_values)


class CherryPickingDecoder(SpeculativeDecoder):
    """Every arm proposes, the target scores each proposal, and the arm whose CURRENT first proposed
    token the target likes most is used: the choice depends on the chosen draft's own sample, which
    breaks Theorem 1 (the negative control of the end-to-end test)."""

    def _choose_and_propose(self, context, cache, state, seed, step):
        proposals = [drafter.propose(draft_context(context, seed, step, arm)) for arm, drafter in enumerate(self.drafts)]
        scores = []
        for proposal in proposals:
            log_probs = warp_logits(self._target_forward(cache, state, proposal.tokens), context.sampling)
            models.crop_cache(cache, state.columns)
            scores.append(log_probs[:, 0].gather(-1, proposal.tokens[:, :1]).exp().sum().item())
        arm = int(np.argmax(scores))
        for other, drafter in enumerate(self.drafts):
            if other != arm:
                drafter.rollback(list(state.lengths))
        return arm, proposals[arm]

    def _update_policy(self, arm, num_accepted, gamma):
        return None


SETTINGS = [
    fs.SamplingParams(temperature=0.7),
    fs.SamplingParams(temperature=1.0),
    fs.SamplingParams(temperature=0.7, top_p=0.8),
    fs.SamplingParams(temperature=1.0, top_p=0.8),
]


@pytest.mark.slow
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-top_p{p.top_p}")
def test_engine_output_matches_exact_target_distribution(pool, params):
    target, near, far = pool
    decoder = SpeculativeDecoder(
        target, [near, far, PromptLookupDrafter()], policy="exp3", gamma=3, policy_kwargs={"seed": 0}
    )
    continuations, arms, kept = [], [], []
    for call in range(CALLS):
        result = decoder.generate(
            PROMPT.expand(ROWS_PER_CALL, -1), max_new_tokens=LENGTH, sampling=params, seed=1000 + call, ignore_eos=True
        )
        continuations.append(result.sequences[:, -LENGTH:])
        arms += result.stats.arm_trace
        kept += [count for step in result.stats.steps for count in step.kept]
    p_values = fit_p_values(torch.cat(continuations), exact_continuations(target, params))
    assert passes(p_values), p_values
    assert len(set(arms)) == 3, f"every arm must be played, trace {arms}"
    assert sum(a != b for a, b in zip(arms, arms[1:])) >= 5, "the bandit must really switch arms"
    assert max(kept) >= 2, "multi-token steps must occur for the test to cover them"


@pytest.mark.slow
def test_cherry_picking_selector_fails_the_same_test(pool):
    """Negative control: one row per call (a batch-wide choice dilutes the per-row bias by 1/B)."""
    target, _, _ = pool
    uniformish = [
        tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.02, seed=seed) for seed in (2, 3)
    ]
    peaked_target = tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=1, initializer_range=0.5, seed=1)
    params = fs.SamplingParams(temperature=1.0)
    decoder = CherryPickingDecoder(
        peaked_target, [*uniformish, PromptLookupDrafter()], policy="exp3", gamma=3, policy_kwargs={"seed": 0}
    )
    continuations = [
        decoder.generate(PROMPT[None], max_new_tokens=LENGTH, sampling=params, seed=1000 + call, ignore_eos=True)
        .sequences[:, -LENGTH:]
        for call in range(400)
    ]
    p_values = fit_p_values(torch.cat(continuations), exact_continuations(peaked_target, params))
    assert not passes(p_values), p_values


LEARNING_POLICIES = sorted(name for name, cls in bandits.POLICIES.items() if not cls.needs_true_values)


@pytest.mark.parametrize("policy", LEARNING_POLICIES)
def test_greedy_equals_target_greedy_generate(pool, policy):
    """T = 0: token for token the target's own greedy generate, with left padding and EOS stops."""
    target, near, far = pool
    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9], [1, 4, 4, 4, 4]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    decoder = SpeculativeDecoder(
        target, [near, far, PromptLookupDrafter()], policy=policy, gamma=4, policy_kwargs={"seed": 0}
    )
    result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=14, sampling=fs.SamplingParams(0.0), seed=3)
    expected = target.generate(
        prompts, attention_mask=mask, max_new_tokens=14, do_sample=False, eos_token_id=2, pad_token_id=2
    )
    assert torch.equal(result.sequences, expected)
    summary = result.stats.summary()
    assert set(result.stats.arm_trace) <= {0, 1, 2} and len(result.stats.arm_trace) == summary["steps"] > 0
    assert sum(arm["selections"] for arm in summary["per_arm"].values()) == summary["steps"]
