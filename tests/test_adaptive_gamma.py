"""Adaptive γ: arms are (draft, γ) pairs learning from the throughput reward, on both engines.

The output stays exactly the target's distribution while the policy switches between γ values (χ²
against exact enumeration), greedy equals the target's greedy `generate`, a draft shared by several
arms keeps a correct cache whatever γ each step uses, bad inputs fail with a message naming the
fix, and planted step costs make the bandit prefer the γ that is really faster. The structured policy
(`gamma-ts`: one acceptance posterior per draft, shared by its γ arms, and a cost per arm) measures
every cost first, shares what one γ teaches with the others, finds the fastest arm sooner than
independent arms in simulation, follows planted costs in both engines (as Thompson sampling does), and
prices a change of draft once the engines tell its step costs which steps switched.
"""
from __future__ import annotations

import copy
import math

from collections import Counter

import numpy as np
import pytest
import torch

import flashspec as fs
from flashspec import bandits
from flashspec.drafters import PromptLookupDrafter
from flashspec.engine import SpeculativeDecoder
from flashspec.front import cost_signature
from flashspec.fast import FastSpeculativeDecoder
from flashspec.fast_session import catch_up_tokens
from flashspec.rewards import StepCosts

import test_engine_exact
from test_engine_exact import SETTINGS, exact_continuations, fit_p_values, passes
from test_fast import chi2_calls

pool = test_engine_exact.pool  # the exactness tests' fixture: target, near-copy draft, unrelated draft

ENGINES = {"eager": SpeculativeDecoder, "fast": FastSpeculativeDecoder}
GAMMAS = (1, 2, 4)
PROMPTS = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9], [1, 4, 4, 4, 4]])
MASK = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])


def planted_costs(n_drafts: int, gammas: tuple[int, ...], per_token: float = 0.3) -> list[float]:
    """Fixed arm costs (1 + per_token·γ), so the policy's choices depend on the seed only."""
    return [1.0 + per_token * gamma for _ in range(n_drafts) for gamma in gammas]


class Script:
    """A policy that plays a fixed arm sequence (cyclically) and learns nothing."""

    def __init__(self, arms: list[int]) -> None:
        self.arms, self.t = arms, -1

    def select(self) -> int:
        self.t += 1
        return self.arms[self.t % len(self.arms)]

    def update(self, arm: int, reward: float) -> None:
        assert 0.0 <= reward <= 1.0


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-top_p{p.top_p}")
def test_output_matches_exact_distribution_while_gamma_switches(pool, engine, params):
    target, near, far = pool
    drafts = [near, far, PromptLookupDrafter()]
    decoder = ENGINES[engine](target, drafts, policy="exp3", gammas=GAMMAS, policy_kwargs={"seed": 0},
                              arm_costs=planted_costs(len(drafts), GAMMAS))
    continuations, arms, kept = chi2_calls(decoder, params, calls=48)
    p_values = fit_p_values(continuations, exact_continuations(target, params))
    assert passes(p_values), p_values
    gammas = Counter(decoder.arms[arm][1] for arm in arms)
    drafts_used = {decoder.arms[arm][0] for arm in arms}
    # the eager engine cuts γ by the 3-token budget (at most 2 drafted); the fast path drafts the arm's γ
    assert len(gammas) >= (2 if engine == "eager" else 3), gammas
    assert drafts_used == {0, 1, 2} and max(kept) >= 2, (drafts_used, kept)
    assert sum(a != b for a, b in zip(arms, arms[1:])) >= 20, "the bandit must really switch arms"


@pytest.mark.parametrize("engine", ENGINES)
def test_greedy_equals_target_greedy_generate(pool, engine):
    """Measured costs (wall time): the choices vary with the machine, the greedy tokens never do."""
    target, near, far = pool
    decoder = ENGINES[engine](target, [near, far, PromptLookupDrafter()], policy="thompson", gammas=(1, 3, 6),
                              policy_kwargs={"seed": 0})
    events = []
    result = decoder.generate(PROMPTS, attention_mask=MASK, max_new_tokens=20, sampling=fs.SamplingParams(0.0),
                              on_step=events.append)
    expected = target.generate(PROMPTS, attention_mask=MASK, max_new_tokens=20, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    assert torch.equal(result.sequences, expected)
    summary = result.stats.summary()
    assert list(summary["per_arm"]) == [f"{name}@γ={g}" for name in ("draft0", "draft1", "prompt-lookup")
                                        for g in (1, 3, 6)]
    assert [arm["gamma"] for arm in summary["per_arm"].values()] == [1, 3, 6] * 3
    assert [event.gamma for event in events] == result.stats.gamma_trace
    assert all(step.gamma <= decoder.arms[step.arm][1] for step in result.stats.steps)


def test_shared_draft_cache_stays_complete_across_gammas(pool):
    """A draft's proposals are a function of its cache and the step's key, so runs whose draft caches
    hold the same tokens emit the same tokens. Arms of one draft at γ = 6, 1, 3 (a long step then a
    short one) with long steps of another draft in between (a window of the short γ alone would miss
    tokens): the fast path's lazy catch-ups must give the tokens and per-step counts of its "all"
    mode (every draft re-reads a Γ+1 window each step, never behind), and at T = 0 the per-step
    counts of the eager engine (its own cache bookkeeping)."""
    target, near, far = pool
    # arms: far@1=0, far@3=1, far@6=2, near@1=3, near@3=4, near@6=5
    script = [2, 0, 5, 0, 5, 5, 1, 2, 5, 0, 4, 1, 5, 5, 0, 2, 3, 0]
    runs = {}
    for name, make, kwargs, params in [
            ("lazy", FastSpeculativeDecoder, {"draft_sync": "lazy"}, fs.SamplingParams(1.0)),
            ("all", FastSpeculativeDecoder, {"draft_sync": "all"}, fs.SamplingParams(1.0)),
            ("lazy-greedy", FastSpeculativeDecoder, {"draft_sync": "lazy"}, fs.SamplingParams(0.0)),
            ("eager-greedy", SpeculativeDecoder, {}, fs.SamplingParams(0.0))]:
        decoder = make(target, [far, near], policy=Script(script), gammas=(1, 3, 6), **kwargs)
        result = decoder.generate(PROMPTS, attention_mask=MASK, max_new_tokens=48, ignore_eos=True,
                                  sampling=params, seed=5)
        runs[name] = (result.sequences, [(step.arm, step.gamma, step.num_accepted) for step in result.stats.steps])
        if name == "lazy":
            assert max(decoder._session.catch_ups) > 0
    assert torch.equal(runs["lazy"][0], runs["all"][0]) and runs["lazy"][1] == runs["all"][1]
    # the eager engine drafts fewer than γ near the budget's end: compare the steps both drafted in full
    lazy, eager = runs["lazy-greedy"][1], runs["eager-greedy"][1]
    full = [index for index, (a, b) in enumerate(zip(lazy, eager)) if a[1] == b[1]]
    assert len(full) >= 10 and [lazy[i] for i in full] == [eager[i] for i in full]


def test_catch_up_tokens():
    assert catch_up_tokens(5, 4, 512) == 0     # ran the step before at the same γ: the window covers it
    assert catch_up_tokens(9, 2, 512) == 8     # ran the step before at γ = 8, now γ = 2: 6 tokens missed
    assert catch_up_tokens(3 + 9 + 5, 4, 512) == 16   # away over steps of γ 2, 8, 4: 12 missed
    assert catch_up_tokens(1000, 4, 64) == 64  # capped at the bucket


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_gammas_name_the_fix(pool, engine):
    target, near, _ = pool
    make = ENGINES[engine]
    for gammas, message in [([], "non-empty"), ("2,4", "list of ints"), ([-1, 2], r"ints in \[0, 256\]"),
                            ([2, 300], r"ints in \[0, 256\]"), ([2, 2.5], r"ints in \[0, 256\]"),
                            ([2, True], r"ints in \[0, 256\]"), ([4, 2, 4], "drop the duplicates"),
                            ([0, 2, 0], "drop the duplicates"), ([0], r"a γ >= 1 beside 0, e.g. \[0, 2, 4\]")]:
        with pytest.raises(ValueError, match=message):
            make(target, [near], gammas=gammas)
    with pytest.raises(ValueError, match="pass gammas"):
        make(target, [near], arm_costs=[1.0])
    with pytest.raises(ValueError, match="one cost > 0 per arm"):
        make(target, [near], gammas=[2, 4], arm_costs=[1.0])
    with pytest.raises(ValueError, match="arm_costs must be finite and > 0"):
        make(target, [near], gammas=[2, 4], arm_costs=[1.0, 0.0])
    assert len(make(target, [near, PromptLookupDrafter()], policy="ucb1", gammas=[2, 4, 8]).policy.successes[0]) == 6


def test_step_costs_reward_is_relative_to_the_best_arm():
    """Running medians of cost and moving averages of tokens per arm; a step's tokens per second over twice
    the best arm's estimated rate, so the best arm's steps score near 0.5 and a slower arm's lower."""
    costs = StepCosts(n_arms=2, smoothing=0.5)
    assert costs.window == 3                                   # (2 - 0.5) / 0.5 steps
    assert costs.reward(0, [1], 1) is None                     # no cost yet: no reward
    for seconds in (1.0, 4.0, 1.25):
        costs.observe(0, seconds)                              # γ = 1 arm: 1 -> 2.5 -> 1.25 (the slow step ignored)
    for seconds in (1.5, float("nan"), -1.0):
        costs.observe(1, seconds)                              # γ = 4 arm; bad times are ignored
    assert costs.costs == [1.25, 1.5]
    assert costs.reward(0, [1], 1) == pytest.approx(0.5)       # 2 tokens / 1.25 s: the only rate known
    assert costs.reward(1, [4], 4) == pytest.approx(0.5)       # 5 tokens / 1.5 s: the new best rate
    assert costs.reward(0, [0], 1) == pytest.approx((1 / 1.25) / (2 * 5 / 1.5))
    assert costs.rates() == pytest.approx([1.5 / 1.25, 5 / 1.5])
    assert costs.reward(1, [0, 4], 4) <= 1.0
    fixed = StepCosts(n_arms=2, fixed=[1.0, 4.0])
    fixed.observe(0, 100.0)
    assert fixed.costs == [1.0, 4.0]
    assert fixed.reward(1, [4], 4) == pytest.approx(0.5) and fixed.reward(0, [0], 1) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="smoothing"):
        StepCosts(n_arms=2, smoothing=0.0)


@pytest.mark.parametrize("policy", ["thompson", "gamma-ts"])
@pytest.mark.parametrize("engine", ENGINES)
def test_planted_costs_make_the_bandit_prefer_the_faster_gamma(pool, engine, policy):
    """The near-copy draft is accepted almost always at T = 0. When a γ = 6 step costs 8 times a γ = 1
    step, γ = 1 makes more tokens per second (2 vs 7/8) and the bandit settles there; when it costs
    1.2 times as much, γ = 6 does (7/1.2 vs 2) and the bandit follows the planted costs: Thompson sampling
    through the throughput reward, gamma-ts through the engines' binding (`start_request`) and step updates."""
    target, near, _ = pool
    for costs, best in (([1.0, 8.0], 1), ([1.0, 1.2], 6)):
        decoder = ENGINES[engine](target, [near], policy=policy, gammas=(1, 6), arm_costs=costs,
                                  policy_kwargs={"seed": 0})
        result = decoder.generate(PROMPTS[2:], max_new_tokens=100, ignore_eos=True,
                                  sampling=fs.SamplingParams(0.0), seed=0)
        chosen = Counter(decoder.arms[arm][1] for arm in result.stats.arm_trace[len(result.stats.steps) // 2:])
        assert chosen.most_common(1)[0][0] == best, (costs, chosen)
        if policy == "gamma-ts":  # it learns from step outcomes and reads the bound costs
            assert decoder.policy.trials.sum() > 0 and list(decoder.policy.arm_costs()) == costs


# ------------------------------------------------------------------ the structured policy (gamma-ts)
def test_gamma_ts_measures_every_cost_before_comparing():
    """With measured costs, each arm is played (least played first) until `min_cost_steps` steps measured it."""
    arms = [(0, 1), (0, 4), (1, 1), (1, 4)]
    costs = StepCosts(len(arms))
    policy = bandits.GammaThompsonSampling(len(arms), seed=0)
    policy.bind_arms(arms, costs)
    assert policy.min_cost_steps == 3 and [policy.select() for _ in range(8)] == [0, 1, 2, 3] * 2
    for arm, seconds in [(0, 1.0), (2, 1.0), (3, 2.0)] * 3 + [(1, 2.0)] * 2:
        costs.observe(arm, seconds)
    assert {policy.select() for _ in range(3)} == {1}  # the one arm measured twice only, however often
    costs.observe(1, 2.0)
    assert not np.isnan(policy.arm_costs()).any() and len({policy.select() for _ in range(50)}) > 1
    with pytest.raises(ValueError, match="min_cost_steps must be an int >= 1"):
        bandits.GammaThompsonSampling(2, min_cost_steps=0)


def test_step_costs_are_medians_so_a_slow_step_moves_little():
    """A host stall makes one step slow: a median of the window ignores it, where a moving average of weight 0.1
    would rise by 40 %. `spread` pools how far steps stray from their arm's estimate (log scale)."""
    costs = StepCosts(n_arms=2)
    assert costs.window == 19 and costs.spread() is None
    for seconds in [1.0] * 10 + [5.0]:
        costs.observe(0, seconds, switched=False)
    assert costs.cost(0, False) == 1.0 and costs.steps_when(False) == [11, 0]
    assert costs.spread() == pytest.approx(0.1 ** 0.5 * math.log(5.0))  # ten steps on the estimate, one off it
    assert StepCosts(n_arms=1, fixed=[2.0]).spread() == 0.0


def gamma_share_of_best(policy_costs, min_cost_steps: int, seed: int, steps: int = 600) -> float:
    """One draft at γ = 2, 4, 6 with acceptance 0.45, step costs 2.45 / 2.85 / 3.2 (SmolLM2's pool on the H200:
    γ = 2 is the fastest) times log-normal noise of 15 %: the share of the second half's steps at γ = 2."""
    arms = [(0, 2), (0, 4), (0, 6)]
    true = np.array([2.45, 2.85, 3.2])
    costs = policy_costs(len(arms))
    policy = bandits.GammaThompsonSampling(len(arms), seed=seed, arms=arms, min_cost_steps=min_cost_steps)
    policy.bind_arms(arms, costs)
    rng = np.random.default_rng(seed + 100)
    picks = []
    for step in range(steps):
        arm = int(policy.select())
        costs.observe(arm, true[arm] * math.exp(0.15 * rng.standard_normal()), False if step else None)
        policy.update_step(arm, int(min(rng.geometric(0.55) - 1, arms[arm][1])), arms[arm][1])
        picks.append(arm)
    return float(np.mean(np.array(picks[steps // 2:]) == 0))


class PointCosts(StepCosts):
    """Step costs a policy cannot draw: no spread, so each estimate counts as exact."""

    def spread(self) -> float | None:
        return None


def test_gamma_ts_draws_costs_so_one_noisy_estimate_does_not_shut_out_the_best_arm():
    """With point costs an arm measured once or twice while unlucky is never played again (its estimate moves only
    when it is played): in 4 of 30 seeded runs γ = 2, the fastest, ran under half the steps. Drawn about their
    estimates with the pooled spread, and each measured three times first, it never did (runs: 5 s)."""
    drawn = [gamma_share_of_best(StepCosts, 3, seed) for seed in range(30)]
    point = [gamma_share_of_best(PointCosts, 1, seed) for seed in range(30)]
    assert min(drawn) >= 0.5 and np.mean(drawn) > 0.85, drawn
    assert sum(share < 0.5 for share in point) >= 2, point  # the failure the draws remove


def test_gamma_ts_shares_a_drafts_acceptance_across_its_gammas():
    """Steps at γ = 1 alone (always accepted) make the never-played γ = 8 arm of the same draft the
    choice when it costs little more; rejected steps make γ = 1 the choice. Independent arms could
    not know either without playing γ = 8."""
    arms = [(0, 1), (0, 8)]
    for accepted, expected in [(1, 1), (0, 0)]:
        policy = bandits.GammaThompsonSampling(len(arms), seed=0, arms=arms)
        policy.bind_arms(arms, [1.0, 1.5])
        for _ in range(200):
            policy.update_step(0, accepted, 1)
        picks = Counter(policy.select() for _ in range(200))
        assert picks.most_common(1)[0][0] == expected and policy.successes[0, 1] == 0, picks
        alpha, beta = policy.draft_posterior()
        assert alpha.shape == (1, 1) and alpha[0, 0] == 1 + 200 * accepted and beta[0, 0] == 1 + 200 * (1 - accepted)


def simulate_gamma_choice(policy, arms, alphas, costs, steps, rows, structured, seed=0):
    """Batched bandit runs on truncated-geometric acceptance with fixed costs: the mean expected
    throughput of the arms played, as a fraction of the best arm's."""
    rng = np.random.default_rng(seed)
    drafts = np.array([draft for draft, _ in arms])
    gammas = np.array([gamma for _, gamma in arms])
    rate = np.array([fs.rewards.expected_tokens_per_step(alphas[d], int(g)) for d, g in arms]) / costs
    step_costs = StepCosts(len(arms), fixed=list(costs))
    total = 0.0
    for _ in range(steps):
        played = policy.select()
        accepted = np.minimum(rng.geometric(1.0 - np.asarray(alphas)[drafts[played]]) - 1, gammas[played])
        total += rate[played].mean()
        if structured:  # the geometric counts of each row's step (rows drafted different γ)
            policy._learn_played(played, accepted.astype(float), accepted + (accepted < gammas[played]))
        else:  # the engines' reward for independent (draft, γ) arms
            policy.update(played, np.array([step_costs.reward(int(a), [int(n)], int(gammas[a]))
                                            for a, n in zip(played, accepted)]))
    return total / steps / rate.max()


def test_gamma_ts_finds_the_fastest_arm_sooner_than_independent_arms():
    """Two drafts × four γ, acceptance 0.55 / 0.8, costs growing with γ: over 300 steps (200 seeded runs)
    the structured policy plays arms worth more of the best arm's throughput than Thompson sampling on
    the throughput reward, which must learn each of the eight arms from its own steps."""
    arms = [(draft, gamma) for draft in range(2) for gamma in (1, 2, 4, 8)]
    costs = np.array([1.0 + (0.05 if draft == 0 else 0.3) * gamma for draft, gamma in arms])
    alphas = (0.55, 0.8)
    structured = bandits.GammaThompsonSampling(len(arms), batch_size=200, seed=0, arms=arms)
    structured.bind_arms(arms, list(costs))
    independent = bandits.ThompsonSampling(len(arms), batch_size=200, seed=0)
    ours = simulate_gamma_choice(structured, arms, alphas, costs, 300, 200, True)
    theirs = simulate_gamma_choice(independent, arms, alphas, costs, 300, 200, False)
    assert ours > 0.95 and ours > theirs + 0.05, (ours, theirs)


def test_gamma_ts_bad_arms_name_the_fix():
    policy = bandits.GammaThompsonSampling(2)
    for arms in ([(0, 1)], [(0, 0), (0, 2)], [(0, 1.5), (0, 2)], "0,1", [(-1, 1), (0, 2)]):
        with pytest.raises(ValueError, match=r"arms must be a list of 2 \(draft index >= 0, γ >= 1\) pairs"):
            policy.bind_arms(arms)
    with pytest.raises(ValueError, match="costs must be a StepCosts or 2 finite costs > 0"):
        policy.bind_arms([(0, 1), (0, 2)], [1.0, 0.0])


def test_step_costs_keep_staying_and_switching_apart():
    """`observe(..., switched)` feeds a moving average per kind of step; `cost` reads it, or shifts the arm's
    other kind by the mean gap between switching and staying, or falls back to all its steps."""
    costs = StepCosts(n_arms=3, smoothing=1.0)  # a window of one step: the newest
    costs.observe(0, 1.0, switched=False)
    costs.observe(0, 1.5, switched=True)
    costs.observe(1, 2.0, switched=False)
    costs.observe(2, 3.0)  # a request's first step: neither kind
    assert costs.costs == [1.5, 2.0, 3.0]
    assert costs.steps_when(True) == [1, 1, 1] and costs.steps == {"all": [2, 1, 1], "stay": [1, 1, 0],
                                                                   "switch": [1, 0, 0]}
    assert costs.cost(0, False) == 1.0 and costs.cost(0, True) == 1.5
    assert costs.cost(1, True) == pytest.approx(2.5)  # its stay cost + arm 0's gap
    assert costs.cost(2, True) == 3.0 and costs.cost(2, False) == 3.0
    fixed = StepCosts(n_arms=1, fixed=[4.0])
    fixed.observe(0, 1.0, switched=True)
    assert fixed.cost(0, True) == 4.0 and fixed.switch_costs == [None]


def switching_run(aware: bool, seed: int, steps: int = 600) -> tuple[float, float]:
    """Two drafts with the same acceptance (0.6) at γ = 2 and 4; a step costs 1 + 0.1γ, plus 0.5 when it changes
    draft. gamma-ts with step costs that know (`aware`) or not which steps switched: (share of steps that
    switched, tokens per unit cost)."""
    arms = [(draft, gamma) for draft in range(2) for gamma in (2, 4)]
    costs = StepCosts(len(arms), smoothing=0.2)
    policy = bandits.GammaThompsonSampling(len(arms), seed=seed, arms=arms)
    policy.bind_arms(arms, costs)
    rng = np.random.default_rng(seed)
    previous, switches, spent, tokens = None, 0, 0.0, 0
    for _ in range(steps):
        arm = policy.select()
        draft, gamma = arms[arm]
        switched = previous is not None and draft != previous
        seconds = 1.0 + 0.1 * gamma + (0.5 if switched else 0.0)
        costs.observe(arm, seconds, switched if aware and previous is not None else None)
        accepted = int(min(rng.geometric(0.4) - 1, gamma))
        policy.update_step(arm, accepted, gamma)
        switches += switched
        spent += seconds
        tokens += accepted + 1
        previous = draft
    return switches / steps, tokens / spent


def test_gamma_ts_prices_a_switch_of_draft():
    """Between two equally good drafts Thompson sampling's draws alternate, and each change of draft costs a
    catch-up. Told which steps switched, gamma-ts compares the other draft at its switching cost: it switches
    less than half as often as when the switches only mix into the arms' costs, and makes more tokens per unit
    cost over the runs (eight seeded runs: 1.2-1.8 % of steps switch against 2.7-11 %; one run's tokens per unit
    cost moves more with its acceptance draws than with its switches, so they are compared summed)."""
    aware, unaware = zip(*[(switching_run(True, seed), switching_run(False, seed)) for seed in range(8)])
    assert max(rate for rate, _ in aware) < 0.02, aware
    assert np.mean([rate for rate, _ in aware]) < np.mean([rate for rate, _ in unaware]) / 2, (aware, unaware)
    assert sum(speed for _, speed in aware) > sum(speed for _, speed in unaware), (aware, unaware)
    policy = bandits.GammaThompsonSampling(2, seed=0, arms=[(0, 1), (1, 1)])
    policy.select()
    assert policy.last_draft[0] in (0, 1)
    policy.on_request_start()  # a request's first step is no switch: every draft starts from the prompt
    assert policy.last_draft[0] == -1


class RecordingCosts(StepCosts):
    """StepCosts that remember what each observation said about switching."""

    def __init__(self, n_arms: int) -> None:
        super().__init__(n_arms)
        self.seen: list[tuple[int, bool | None]] = []

    def observe(self, arm, seconds, switched=None):
        self.seen.append((arm, switched))
        super().observe(arm, seconds, switched)


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_tell_the_step_costs_which_steps_switched_draft(pool, engine):
    """A scripted arm sequence over two drafts: every observed step says whether its draft differs from the
    step before's, and a request's first step says nothing."""
    target, near, far = pool
    script = [0, 1, 3, 2, 2, 0, 3, 3, 1]  # arms: near@1, near@2, far@1, far@2
    decoder = ENGINES[engine](target, [near, far], policy=Script(script), gammas=(1, 2))
    decoder.step_costs = RecordingCosts(len(decoder.arms))
    result = decoder.generate(PROMPTS[2:], max_new_tokens=24, ignore_eos=True, sampling=fs.SamplingParams(1.0))
    seen = decoder.step_costs.seen
    arms = [arm for arm, _ in seen]  # the fast path also times the steps it drains after the last row ended
    assert arms[:len(result.stats.arm_trace)] == result.stats.arm_trace
    drafts = [decoder.arms[arm][0] for arm in arms]
    expected = [(arms[0], None)] + [(arm, drafts[i + 1] != drafts[i]) for i, arm in enumerate(arms[1:])]
    assert seen == expected and any(switched for _, switched in seen) and len(seen) > 4


# ------------------------------------------------------------------ shared costs of same-compute arms
SAME_SIZE_ARMS = [(0, 2), (0, 4), (1, 2), (1, 4)]  # drafts A and B of one architecture, γ = 2 and 4


def prefers_cheap_gamma(groups, seed: int, selects: int = 50) -> tuple[float, float]:
    """Drafts A and B of one size: a step costs 1.0 at γ = 2 and 1.165 at γ = 4 (the H200's SmolLM2 pool), with 2 %
    log-normal noise. B's γ = 2 arm was measured by 3 early steps, 8 % slow; A's by 60 accurate ones. B accepts
    α = 0.5 (then γ = 2 makes 1.75 tokens per unit cost against γ = 4's 1.94 / 1.165 = 1.66), A α = 0.2. The
    share of `selects` selects at B@γ=2 and at B@γ=4."""
    costs = StepCosts(len(SAME_SIZE_ARMS), groups=groups)
    rng = np.random.default_rng(seed)
    for arm, true, steps in [(2, 1.08, 3), (0, 1.0, 60), (1, 1.165, 40), (3, 1.165, 60)]:  # B@2's steps come first
        for _ in range(steps):
            costs.observe(arm, true * math.exp(0.02 * rng.standard_normal()), switched=False)
    policy = bandits.GammaThompsonSampling(len(SAME_SIZE_ARMS), seed=seed, arms=SAME_SIZE_ARMS)
    policy.bind_arms(SAME_SIZE_ARMS, costs)
    for arm, alpha in [(1, 0.2), (3, 0.5), (2, 0.5)] * 600:
        gamma = SAME_SIZE_ARMS[arm][1]
        policy.update_step(arm, int(min(rng.geometric(1.0 - alpha) - 1, gamma)), gamma)
    picks = np.array([int(policy.select()) for _ in range(selects)])
    return float(np.mean(picks == 2)), float(np.mean(picks == 3))


def test_shared_costs_price_a_rarely_played_arm_from_its_whole_group():
    """Priced from its own 3 slow steps, B@γ=2 looks 1.08x cheaper than γ = 4 where it is 1.165x, and gamma-ts
    plays B@γ=4 (the over-played γ measured on the H200); sharing the cost of every γ = 2 step of the same-size
    drafts, it plays B@γ=2. 20 seeded policies, 50 selects each (with groups: all 1000 at B@γ=2; without: 89 %
    at B@γ=4)."""
    shared = np.array([prefers_cheap_gamma([("same size", gamma) for _, gamma in SAME_SIZE_ARMS], seed)
                       for seed in range(20)])
    alone = np.array([prefers_cheap_gamma(None, seed) for seed in range(20)])
    assert shared[:, 0].mean() > 0.95 and shared[:, 0].min() > 0.8, shared
    assert alone[:, 1].mean() > 0.7 and alone[:, 0].mean() < 0.25, alone  # the negative control: per-arm costs


def test_cost_signature_says_which_drafts_run_the_same_compute(pool):
    """Same class, size, dtype, device and config shape: one signature, whatever the weights; another size, a
    wrapper, or a drafter without a model (prompt lookup) differs."""
    target, near, far = pool
    twin = fs.models.tiny_llama(vocab_size=near.config.vocab_size, hidden_size=16, num_layers=1,
                                initializer_range=0.3, seed=9)
    assert cost_signature(near) == cost_signature(twin) == cost_signature(copy.deepcopy(near))
    assert cost_signature(near) != cost_signature(far)
    assert cost_signature(near) != cost_signature(copy.deepcopy(near).half())
    assert cost_signature(fs.ModelDrafter(near)) == cost_signature(fs.ModelDrafter(twin)) != cost_signature(near)
    lookups = [PromptLookupDrafter(), PromptLookupDrafter()]
    assert cost_signature(lookups[0]) != cost_signature(lookups[1])
    assert cost_signature(lookups[0]) == cost_signature(lookups[0])


@pytest.mark.parametrize("engine", ENGINES)
def test_decoders_share_costs_between_same_size_drafts(pool, engine):
    """Two same-config drafts at γ = 2 and 4: their γ = 2 arms form one cost group (as do their γ = 4 arms), the
    smaller draft and prompt lookup groups of their own; generated steps feed the shared estimates."""
    target, near, far = pool
    decoder = ENGINES[engine](target, [near, copy.deepcopy(near), far, PromptLookupDrafter()], policy="gamma-ts",
                              gammas=[2, 4], policy_kwargs={"seed": 0})
    groups = decoder.cost_groups
    assert decoder.step_costs.groups == tuple(groups) and len(set(groups)) == 6
    assert groups[0] == groups[2] and groups[1] == groups[3] and groups[0] != groups[1]
    assert groups[4] not in groups[:4] and groups[6] not in groups[:6]
    decoder.generate(PROMPTS[2:], max_new_tokens=24, ignore_eos=True, sampling=fs.SamplingParams(1.0), seed=0)
    costs = decoder.step_costs
    for a, b in [(0, 2), (1, 3)]:
        assert costs.costs[a] == costs.costs[b] and costs.steps["all"][a] == costs.steps["all"][b]
    assert sum(costs.steps["all"][arm] for arm in (0, 1, 4, 5, 6, 7)) > 0


# ------------------------------------------------------------------ the plain arm (γ = 0)
PLAIN_GAMMAS = (0, 2, 4)  # arms: near@2, near@4, far@2, far@4, plain


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_plain_arm_alone_is_plain_decoding_in_either_engine(pool, temperature):
    """`gammas` holding 0 adds one arm, "plain", last; a fixed policy on it gives `FastPlainDecoder`'s tokens in
    either engine for one seed (one target forward and one token per step, drawn with the same key), greedy the
    target's own greedy `generate`; its steps draft nothing and append one token per row."""
    target, near, far = pool
    sampling = fs.SamplingParams(temperature)
    run = dict(attention_mask=MASK, max_new_tokens=[12, 7, 9], sampling=sampling, seed=4, ignore_eos=True)
    expected = fs.FastPlainDecoder(target).generate(PROMPTS, **run)
    for make in ENGINES.values():
        decoder = make(target, [near, far], policy="fixed", gammas=PLAIN_GAMMAS, policy_kwargs={"arm": 4})
        assert decoder.arms[4] == (-1, 0) and decoder.arm_names == [
            "draft0@γ=2", "draft0@γ=4", "draft1@γ=2", "draft1@γ=4", "plain"]
        result = decoder.generate(PROMPTS, **run)
        assert torch.equal(result.sequences, expected.sequences), make.__name__
        steps = result.stats.steps
        assert len(steps) == 12 and all(s.arm == 4 and s.gamma == 0 and set(s.num_accepted) == {0} and
                                        set(s.kept) == {1} for s in steps)
        plain = result.stats.summary()["per_arm"]["plain"]
        assert plain["selections"] == 12 and plain["gamma"] == 0 and math.isnan(plain["acceptance_rate"])
        assert all(math.isnan(value) for value in result.stats.acceptance_trace())
    if temperature == 0:
        greedy = target.generate(PROMPTS, attention_mask=MASK, max_new_tokens=12, min_new_tokens=12,
                                 do_sample=False, eos_token_id=None, pad_token_id=2)
        assert torch.equal(expected.sequences[0], greedy[0])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_steps_between_draft_steps_give_one_text_in_either_engine(pool, temperature):
    """A script that mixes the plain arm with both drafts at γ = 2 and 4 (runs of plain steps, then a draft that
    missed them): the eager engine, the fast one under lazy sync (catching up over the tokens plain steps
    appended) and under "all" give the same tokens for one seed, the two fast modes the same verdicts step by step;
    greedy, the target's greedy `generate`."""
    target, near, far = pool
    script = [4, 0, 4, 4, 3, 4, 1, 4, 4, 4, 2, 0, 4, 3, 3, 4, 1]
    run = dict(attention_mask=MASK, max_new_tokens=40, sampling=fs.SamplingParams(temperature), seed=6,
               ignore_eos=True)
    runs = {}
    for name, make, options in [("eager", SpeculativeDecoder, {}), ("lazy", FastSpeculativeDecoder, {}),
                                ("all", FastSpeculativeDecoder, {"draft_sync": "all"})]:
        decoder = make(target, [near, far], policy=Script(script), gammas=PLAIN_GAMMAS, **options)
        result = decoder.generate(PROMPTS, **run)
        runs[name] = (result.sequences, [(s.arm, s.gamma, s.num_accepted, s.kept) for s in result.stats.steps])
        if name == "lazy":  # a catch-up (maybe of 0 tokens) before every draft step, none before a plain one
            catch_ups = decoder._session.catch_ups
            launched = [script[step % len(script)] for step in range(decoder.policy.t + 1)]  # drained steps too
            assert max(catch_ups) > 0 and sum(catch_ups.values()) == sum(arm != 4 for arm in launched)
    assert torch.equal(runs["eager"][0], runs["lazy"][0]) and torch.equal(runs["lazy"][0], runs["all"][0])
    assert runs["lazy"][1] == runs["all"][1]
    arms = [arm for arm, *_ in runs["lazy"][1]]
    assert arms.count(4) >= 6 and len(set(arms)) == 5
    assert all(set(kept) == {1} and gamma == 0 for arm, gamma, _, kept in runs["lazy"][1] if arm == 4)
    if temperature == 0:
        greedy = target.generate(PROMPTS, attention_mask=MASK, max_new_tokens=40, min_new_tokens=40,
                                 do_sample=False, eos_token_id=None, pad_token_id=2)
        assert torch.equal(runs["eager"][0], greedy)


@pytest.mark.parametrize("policy", ["thompson", "gamma-ts"])
@pytest.mark.parametrize("engine", ENGINES)
def test_planted_costs_make_the_bandit_prefer_plain_decoding_when_no_draft_pays(pool, engine, policy):
    """The unrelated draft is mostly rejected at T = 0: at γ = 2 it makes about 1.3 tokens per step for a cost of 2,
    where the plain arm makes 1 for a cost of 1, and the bandit settles on plain decoding (gamma-ts: expected tokens
    1, no acceptance posterior learnt from its steps); made expensive (cost 3), the plain arm is left for the draft.
    Greedy output stays the target's greedy `generate` whatever the choices."""
    target, _, far = pool
    for costs, best in (([2.0, 3.0, 1.0], (-1, 0)), ([1.0, 1.5, 3.0], None)):
        decoder = ENGINES[engine](target, [far], policy=policy, gammas=(2, 4, 0), arm_costs=costs,
                                  policy_kwargs={"seed": 0})
        result = decoder.generate(PROMPTS, attention_mask=MASK, max_new_tokens=60, sampling=fs.SamplingParams(0.0),
                                  seed=0)
        expected = target.generate(PROMPTS, attention_mask=MASK, max_new_tokens=60, do_sample=False, eos_token_id=2,
                                   pad_token_id=2)
        assert torch.equal(result.sequences, expected)
        chosen = Counter(decoder.arms[arm] for arm in result.stats.arm_trace[len(result.stats.steps) // 2:])
        top = chosen.most_common(1)[0][0]
        assert (top == best) if best else top != (-1, 0), (costs, chosen)
        if policy == "gamma-ts":
            assert decoder.policy.trials[0, 2] == 0 and decoder.policy.trials.sum() > 0
            assert decoder.policy.draft_posterior()[0].shape == (1, 1)


def test_gamma_ts_gives_the_plain_arm_one_token_and_learns_no_acceptance_from_it():
    """Bound with the plain arm (-1, 0): its expected tokens are 1 (it wins when it costs less than a draft's
    expected tokens per unit cost), its steps are counted but feed no posterior, and a step claiming accepted
    drafts at γ = 0 is refused."""
    arms = [(0, 1), (0, 4), (-1, 0)]
    for accepted, costs, expected in [(0, [1.0, 1.5, 0.8], 2), (1, [1.0, 1.5, 0.8], 1), (0, [1.0, 1.5, 1.2], 0)]:
        # no budget: the updates below come without selections (no steps launched to read)
        policy = bandits.GammaThompsonSampling(len(arms), seed=0, arms=arms, budget=None)
        policy.bind_arms(arms, costs)
        for _ in range(200):
            policy.update_step(0, accepted, 1)
            policy.update_step(2, 0, 0)
        assert policy.t == 400 and policy.trials[0, 2] == 0 and policy.draft_posterior()[0].shape == (1, 1)
        picks = Counter(int(policy.select()) for _ in range(200))
        assert picks.most_common(1)[0][0] == expected, (accepted, costs, picks)
    with pytest.raises(ValueError, match="a plain step .* num_accepted must be 0"):
        policy.update_step(2, 1, 0)
    with pytest.raises(ValueError, match=r"or \(-1, 0\) for the plain arm"):
        policy.bind_arms([(0, 1), (0, 4), (-1, 1)])
    policy.select()
    assert policy.last_draft[0] in (0, 1)  # the plain arm is a "draft" of its own: a switch either way


def test_step_costs_reward_a_plain_step_for_its_one_token_per_row():
    costs = StepCosts(n_arms=2, fixed=[2.0, 1.0])  # a γ = 4 arm, the plain arm
    assert costs.reward(0, [4], 4) == pytest.approx(0.5)                    # 5 tokens / 2: the best rate
    assert costs.reward(1, [0, 0], 0) == pytest.approx(1.0 / (2 * 2.5))      # 1 token / 1
    assert costs.tokens[1] == 1.0
    with pytest.raises(ValueError, match=r"num_accepted must be in \[0, gamma=0\]"):
        costs.reward(1, [1], 0)
    with pytest.raises(ValueError, match="gamma must be an int >= 1"):
        fs.rewards.throughput(0, 0, 0.1)  # the reward arithmetic of a drafted step still needs γ >= 1


@pytest.mark.parametrize("engine", ENGINES)
def test_plain_arm_names_costs_and_validation(pool, engine):
    """"plain" never collides with a draft's arm name (those carry "@γ="), the plain arm is a cost group of its own
    and has a cost of its own in `arm_costs`; γ = 0 is refused as the fixed `gamma`."""
    target, near, _ = pool
    make = ENGINES[engine]
    decoder = make(target, [near, PromptLookupDrafter(name="plain")], gammas=[2, 0])
    assert decoder.arm_names == ["draft0@γ=2", "plain@γ=2", "plain"] and decoder.arms[-1] == (-1, 0)
    assert decoder.max_gamma == 2 and decoder.cost_groups[-1] == ("arm", 2)
    assert len(set(decoder.cost_groups)) == 3
    with pytest.raises(ValueError, match=r"one cost > 0 per arm \(3 arms\)"):
        make(target, [near, PromptLookupDrafter()], gammas=[2, 0], arm_costs=[1.0, 1.0])
    with pytest.raises(ValueError, match=r"gamma must be an int in \[1, 256\]"):
        make(target, [near], gamma=0)


def test_update_policy_never_divides_by_a_plain_steps_zero_drafts():
    """A plain step reaches a policy only as what it can learn from: the throughput reward (with step costs), or a
    γ = 0 step for a policy that learns from steps; otherwise nothing (no acceptance fraction 0 / 0)."""
    from flashspec.front import update_policy

    class Recording:
        def __init__(self) -> None:
            self.seen = []

        def select(self) -> int:
            return 0

        def update(self, arm, reward) -> None:
            self.seen.append((arm, reward))

    policy = Recording()
    update_policy(policy, 1, [0, 0], 0)
    assert policy.seen == []
    update_policy(policy, 1, [0, 0], 0, StepCosts(2, fixed=[1.0, 1.0]))
    assert policy.seen == [(1, pytest.approx(0.5))]
    structured = bandits.GammaThompsonSampling(2, arms=[(0, 2), (-1, 0)])
    update_policy(structured, 1, [0, 0], 0, StepCosts(2, fixed=[1.0, 1.0]))
    assert structured.t == 2 and structured.trials.sum() == 0


class RawPlainDecoder(SpeculativeDecoder):
    """Negative control: its plain steps draw from the target's unwarped logits (temperature and top-p ignored),
    so only the plain arm's tokens leave the target's law."""

    def _plain_step(self, cache, state, sampling, key):
        return super()._plain_step(cache, state, fs.SamplingParams(1.0), key)


@pytest.mark.parametrize("engine", [*ENGINES, "negative-control"])
def test_output_matches_exact_distribution_with_a_plain_arm(pool, engine):
    """χ² of the first three tokens against exact enumeration (the family of four statistics at level 0.01,
    Bonferroni: `passes`) while EXP3 mixes the plain arm with three drafts at γ = 1 and 3, in both engines; the same
    test rejects a plain step that ignores the warping (T = 0.7, top-p 0.8), so it sees the plain arm's tokens."""
    target, near, far = pool
    params = fs.SamplingParams(temperature=0.7, top_p=0.8)
    make = RawPlainDecoder if engine == "negative-control" else ENGINES[engine]
    gammas = (1, 3, 0)
    costs = planted_costs(3, (1, 3)) + [0.5]  # a cheap plain arm: played often enough to be seen
    decoder = make(target, [near, far, PromptLookupDrafter()], policy="exp3", gammas=gammas,
                   policy_kwargs={"seed": 0}, arm_costs=costs)
    continuations, arms, _ = chi2_calls(decoder, params, calls=48)
    p_values = fit_p_values(continuations, exact_continuations(target, params))
    plain = len(decoder.arms) - 1
    assert arms.count(plain) >= 10 and len(set(arms)) == len(decoder.arms), Counter(arms)
    assert passes(p_values) == (engine != "negative-control"), p_values
