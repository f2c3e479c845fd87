"""The adaptive policy's budget against plain decoding (`GammaThompsonSampling(budget=...)`).

The promise: at the policy's cost estimates, any stretch of steps makes at least (1 - δ) of the tokens plain
steps would have made in the same cost, less `credit` + γ tokens; a draft that pays is still found and kept.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flashspec as fs
from flashspec import bandits, front
from flashspec.engine import SpeculativeDecoder
from flashspec.fast import FastSpeculativeDecoder
from flashspec.models import tiny_llama
from test_engine_exact import CALLS, LENGTH, PROMPT, ROWS_PER_CALL, exact_continuations, fit_p_values, passes
from test_engine_exact import pool as exact_pool_fixture

exact_pool = exact_pool_fixture.__wrapped__  # the exactness suite's target, near-copy and unrelated drafts

GAMMA = 4
ARMS = [(0, GAMMA), (1, GAMMA), (-1, 0)]
COSTS = [1.7, 1.7, 1.0]  # a γ = 4 step costs 1.7 plain steps (the real model's chat set measured 1.6-1.7)


def serve(acceptance: list[float], steps: int, seed: int, lag: int = 0, **options) -> tuple[np.ndarray, np.ndarray]:
    """`steps` steps of the three arms, the drafts accepting each token with `acceptance`; each step is told to
    the policy `lag` selections later, as the fast engine does. Returns (tokens, cost) per step."""
    policy = bandits.make_policy("gamma-ts", len(ARMS), seed=seed, **options)
    policy.bind_arms(ARMS, COSTS)
    rng = np.random.default_rng(seed)
    unread, tokens, costs = [], [], []
    for _ in range(steps):
        arm = int(policy.select())
        accepted = 0
        if ARMS[arm][0] >= 0:
            while accepted < GAMMA and rng.random() < acceptance[ARMS[arm][0]]:
                accepted += 1
        unread.append((arm, accepted))
        tokens.append(accepted + 1)
        costs.append(COSTS[arm])
        if len(unread) > lag:
            read, count = unread.pop(0)
            front.update_policy(policy, read, [count], ARMS[read][1])
    return np.array(tokens, float), np.array(costs)


def worst_shortfall(tokens: np.ndarray, costs: np.ndarray, budget: float) -> float:
    """The most tokens any stretch of steps falls short of (1 - budget) times plain decoding's in its cost."""
    gain = np.concatenate([[0.0], np.cumsum(tokens - (1.0 - budget) * costs)])
    return float(np.max(np.maximum.accumulate(gain) - gain))


@pytest.mark.parametrize("lag", [0, 2])
def test_no_stretch_falls_further_behind_plain_decoding_than_the_budget(lag):
    """Drafts below break-even (1.3 and 1.5 tokens for 1.7 plain steps): over every stretch of 3,000 steps the
    budgeted policy is within credit + γ tokens of (1 - δ) plain decoding; without the budget it is not (the
    test can fail)."""
    for seed in range(3):
        tokens, costs = serve([0.22, 0.36], 3000, seed, lag=lag, budget=0.02)
        assert worst_shortfall(tokens, costs, 0.02) <= 4.0 + GAMMA, seed
        assert tokens.sum() / costs.sum() >= 0.97
        tokens, costs = serve([0.22, 0.36], 3000, seed, lag=lag, budget=None)
        assert worst_shortfall(tokens, costs, 0.02) > 4.0 + GAMMA, seed


def test_a_draft_that_pays_is_found_and_kept_under_the_budget():
    """One draft makes about 3.4 tokens per 1.7 plain steps: the budgeted policy's throughput is within 2 % of the
    unbudgeted one's, and it plays that draft on most steps."""
    free, held = [], []
    for seed in range(4):
        tokens, costs = serve([0.8, 0.2], 1500, seed, budget=None)
        free.append(tokens.sum() / costs.sum())
        tokens, costs = serve([0.8, 0.2], 1500, seed, budget=0.01)
        held.append(tokens.sum() / costs.sum())
    assert np.mean(held) >= 0.98 * np.mean(free) and np.mean(held) > 1.6, (held, free)


def test_auto_budget_binds_only_with_the_plain_arm_and_explicit_budgets_need_it():
    policy = bandits.GammaThompsonSampling(3, seed=0)
    policy.bind_arms(ARMS, COSTS)
    assert policy.budget == bandits.AUTO_BUDGET
    policy.bind_arms([(0, 2), (0, 4), (1, 4)], COSTS)
    assert policy.budget is None
    explicit = bandits.GammaThompsonSampling(3, seed=0, budget=0.05)
    with pytest.raises(ValueError, match=r"budget=0.05 .* the plain arm \(-1, 0\)"):
        explicit.bind_arms([(0, 2), (0, 4), (1, 4)], COSTS)
    with pytest.raises(ValueError, match="budget=0.05 needs the arms bound first"):
        explicit.select()
    explicit.bind_arms(ARMS)
    with pytest.raises(ValueError, match=r"budget=0.05 needs .* with step costs"):
        explicit.select()
    for bad in (0.0, 1.0, -0.1, True, "half"):
        with pytest.raises(ValueError, match="budget must be 'auto'"):
            bandits.GammaThompsonSampling(3, budget=bad)
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="credit must be a finite number of tokens > 0"):
            bandits.GammaThompsonSampling(3, credit=bad)


def test_the_budget_account_survives_a_state_round_trip_and_refuses_bad_counts():
    policy = bandits.GammaThompsonSampling(3, seed=0, budget=0.02, arms=ARMS)
    policy.bind_arms(ARMS, COSTS)
    for _ in range(5):
        arm = int(policy.select())
        policy.update_step(arm, 0, ARMS[arm][1])
    policy.select()  # one step selected and not yet read
    state = policy.state_dict()
    twin = bandits.GammaThompsonSampling(3, seed=1, budget=0.02, arms=ARMS)
    twin.bind_arms(ARMS, COSTS)
    twin.load_state_dict(state)
    assert np.array_equal(twin.banked, policy.banked) and len(twin._pending) == 1
    assert [int(twin.select()) for _ in range(20)] == [int(policy.select()) for _ in range(20)]
    with pytest.raises(ValueError, match=r"num_accepted must be in \[0, gamma=4\]"):
        policy.update_step(0, 5, GAMMA)
    policy.update_shared_step(0, [], GAMMA)  # every row finished: the step only leaves the unread list
    assert len(policy._pending) == 20


def test_the_fast_engine_reads_every_step_it_selected_under_the_budget():
    """Lag 2 and rows finishing at different steps: after each `generate` no selected step is left unread, and the
    account moved (the unrelated draft's steps, at a made-up cost of 1.5 plain steps, lose)."""
    target = tiny_llama(vocab_size=16, hidden_size=16, num_layers=1, initializer_range=0.3, seed=1)
    draft = tiny_llama(vocab_size=16, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    decoder = FastSpeculativeDecoder(target, [draft], policy="gamma-ts", gammas=[0, 2], arm_costs=[1.5, 1.0],
                                     policy_kwargs={"seed": 0, "budget": 0.05})
    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    arms = []
    for max_new in (5, 9):
        result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=max_new,
                                  sampling=fs.SamplingParams(1.0), seed=max_new)
        assert len(decoder.policy._pending) == 0
        arms += result.stats.arm_trace
    assert set(arms) == {0, 1} and decoder.policy.banked[0] < decoder.policy.credit


@pytest.mark.slow
def test_the_budgeted_policy_keeps_the_targets_joint_law():
    """Theorem 1 with the budget deciding: the eager engine over a near and an unrelated draft at γ = 2 and the
    plain arm, costs that put the drafts below break-even, a budget of 0.05 and a posterior reset at every request
    (so the policy keeps exploring and the budget keeps overruling it), 16,384 three-token continuations: the χ²
    family accepts the target's law (its power: the cherry-picking control of `test_engine_exact` fails it)."""
    target, near, far = exact_pool()
    params = fs.SamplingParams(temperature=1.0)
    decoder = SpeculativeDecoder(target, [near, far], policy="gamma-ts", gammas=[0, 2], arm_costs=[3.2, 2.4, 1.0],
                                 policy_kwargs={"seed": 0, "budget": 0.05, "request_decay": 0.0})
    continuations, arms, banked = [], [], []
    for call in range(CALLS):
        result = decoder.generate(PROMPT.expand(ROWS_PER_CALL, -1), max_new_tokens=LENGTH, sampling=params,
                                  seed=1000 + call, ignore_eos=True)
        continuations.append(result.sequences[:, -LENGTH:])
        arms += result.stats.arm_trace
        banked.append(float(decoder.policy.banked[0]))
    p_values = fit_p_values(torch.cat(continuations), exact_continuations(target, params))
    assert passes(p_values), p_values
    assert 2 in arms and {0, 1} & set(arms) and sum(a != b for a, b in zip(arms, arms[1:])) >= 5, arms
    assert min(banked) < 0.5 * decoder.policy.credit, banked  # the budget was what held the drafts back


def test_steps_that_captured_a_graph_do_not_starve_a_draft_that_pays():
    """Measured costs, and the draft arm's first two steps untimed (the engines time no step that captures a graph):
    those steps stay out of the account, so the budget does not wait hundreds of plain steps before trying the
    draft again, and a draft that makes about 4.5 tokens per 1.7 plain steps serves most of the first 200 steps."""
    from flashspec.rewards import StepCosts

    costs = StepCosts(len(ARMS))
    policy = bandits.make_policy("gamma-ts", len(ARMS), seed=0)
    policy.bind_arms(ARMS, costs)
    rng = np.random.default_rng(0)
    untimed, played = {0: 2, 1: 2}, []
    for _ in range(200):
        arm = int(policy.select())
        accepted = 0
        if ARMS[arm][0] >= 0:
            while accepted < GAMMA and rng.random() < (0.95 if arm == 0 else 0.1):
                accepted += 1
        if untimed.get(arm, 0):
            untimed[arm] -= 1
        else:
            costs.observe(arm, COSTS[arm] * 1e-3, False)
        front.update_policy(policy, arm, [accepted], ARMS[arm][1])
        played.append(arm)
    assert policy.budget == bandits.AUTO_BUDGET and played[100:].count(0) >= 90, played
