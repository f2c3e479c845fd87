"""Rewards of a speculative step and their expectations (flashspec.rewards)."""
from __future__ import annotations

import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashspec import rewards


@settings(max_examples=60, deadline=None)
@given(
    gamma=st.integers(min_value=1, max_value=16),
    fraction=st.floats(min_value=0.0, max_value=1.0),
    draft_cost=st.floats(min_value=0.0, max_value=10.0),
    target_cost=st.floats(min_value=1e-3, max_value=10.0),
)
def test_rewards_are_in_unit_interval(gamma: int, fraction: float, draft_cost: float, target_cost: float) -> None:
    num_accepted = int(round(fraction * gamma))
    for value in (
        rewards.acceptance_fraction(num_accepted, gamma),
        rewards.tokens_per_step(num_accepted, gamma),
        rewards.throughput(num_accepted, gamma, draft_cost, target_cost),
    ):
        assert 0.0 <= value <= 1.0
    assert rewards.throughput(gamma, gamma, 0.0, target_cost) == pytest.approx(1.0)


@settings(max_examples=40, deadline=None)
@given(
    value=st.one_of(st.integers(min_value=-5, max_value=-1), st.integers(min_value=5, max_value=50),
                    st.just(float("nan")), st.just(1.5)),
)
def test_rewards_reject_outcomes_outside_zero_gamma(value) -> None:
    with pytest.raises(ValueError, match="num_accepted"):
        rewards.acceptance_fraction(value, 4)
    with pytest.raises(ValueError, match="num_accepted"):
        rewards.throughput(value, 4, 0.1)


def test_reward_bad_arguments() -> None:
    with pytest.raises(ValueError, match="gamma"):
        rewards.tokens_per_step(1, 0)
    with pytest.raises(ValueError, match="draft_cost"):
        rewards.throughput(1, 4, -0.1)
    with pytest.raises(ValueError, match="target_cost"):
        rewards.throughput(1, 4, 0.1, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        rewards.expected_tokens_per_step(1.2, 4)


@settings(max_examples=40, deadline=None)
@given(alpha=st.floats(min_value=0.0, max_value=0.999), gamma=st.integers(min_value=1, max_value=12))
def test_expected_tokens_per_step_closed_form(alpha: float, gamma: int) -> None:
    expected = rewards.expected_tokens_per_step(alpha, gamma)
    assert expected == pytest.approx((1 - alpha ** (gamma + 1)) / (1 - alpha), rel=1e-9)
    assert expected <= gamma * alpha + 1 + 1e-12  # equality only at α ∈ {0, 1}: γα + 1 overstates it


def test_expected_tokens_per_step_edges() -> None:
    assert rewards.expected_tokens_per_step(1.0, 4) == 5.0
    assert rewards.expected_tokens_per_step(0.0, 4) == 1.0
    assert rewards.expected_tokens_per_step(0.5, 4) == pytest.approx(1.9375)


# ------------------------------------------------------------------ shared step costs (StepCosts groups)
def test_step_costs_groups_share_every_measured_estimate() -> None:
    """Arms of one group read one running median fed by every member's steps, and one step count; arms of
    another group stay apart, and tokens per step stay per arm (acceptance depends on the draft)."""
    costs = rewards.StepCosts(n_arms=4, groups=[("small", 2), ("small", 2), ("small", 4), ("other", 2)])
    for _ in range(20):
        costs.observe(0, 1.0, switched=False)
    for _ in range(2):
        costs.observe(1, 1.1, switched=False)
    window = [1.0] * (costs.window - 2) + [1.1] * 2  # the newest 19 of the group's 22 steps
    expected = statistics.median(window)
    assert costs.costs[:2] == [expected, expected] and costs.stay_costs[:2] == [expected, expected]
    assert costs.cost(1, False) == expected and costs.costs_when(False)[:2] == [expected, expected]
    assert costs.steps == {"all": [22, 22, 0, 0], "stay": [22, 22, 0, 0], "switch": [0, 0, 0, 0]}
    assert costs.steps_when(False) == [22, 22, 0, 0] and costs.switch_costs == [None] * 4
    costs.observe(2, 1.2, switched=True)
    costs.observe(3, 3.0)
    assert costs.costs == [expected, expected, 1.2, 3.0] and costs.steps["all"] == [22, 22, 1, 1]
    assert costs.switch_costs == [None, None, 1.2, None] and costs.cost(0, True) == expected  # no gap known yet
    assert costs.reward(0, [2], 2) == pytest.approx(0.5)
    assert costs.tokens == [3.0, None, None, None]  # arm 1 shares arm 0's cost, not its tokens
    assert costs.reward(1, [0], 2) == pytest.approx(1.0 / 3.0 / 2.0)


def test_step_costs_switch_gap_counts_each_group_once() -> None:
    """The gap that prices an unmeasured kind of step is a mean over groups (each estimate once), not over member
    arms: group "a" (three arms) switches 1.0 above staying, group "b" 0.2, so an arm that only stayed is priced
    0.6 above its stay cost when switching (a mean over arms would say 0.8)."""
    costs = rewards.StepCosts(n_arms=5, smoothing=1.0, groups=["a", "a", "a", "b", "c"])
    for arm, seconds, switched in [(0, 1.0, False), (1, 2.0, True), (3, 1.0, False), (3, 1.2, True), (4, 3.0, False)]:
        costs.observe(arm, seconds, switched)
    assert costs.cost(4, True) == pytest.approx(3.0 + (1.0 + 0.2) / 2)
    assert costs.cost(2, True) == 2.0 and costs.cost(2, False) == 1.0  # arm 2 never ran: its group's estimates


def test_step_costs_groups_bad_values_name_the_fix() -> None:
    for groups, message in [([0, 1], r"groups must be None or a sequence of one hashable per arm \(3 arms\)"),
                            ("abc", "groups must be None or a sequence"), (5, "groups must be None or a sequence"),
                            ([0, [1], 2], r"groups must hold hashable values \(a tuple, not a list or dict\)")]:
        with pytest.raises(ValueError, match=message):
            rewards.StepCosts(n_arms=3, groups=groups)


def test_step_costs_fixed_costs_ignore_groups() -> None:
    fixed = rewards.StepCosts(n_arms=2, fixed=[1.0, 2.0], groups=["same", "same"])
    fixed.observe(0, 5.0, switched=False)
    assert fixed.costs == [1.0, 2.0] and fixed.costs_when(True) == [1.0, 2.0] and fixed.steps["all"] == [0, 0]


def per_arm_medians(observations: list[tuple[int, float, bool | None]], n_arms: int, window: int) -> dict:
    """The per-arm estimates the cost model had before groups: each arm's median of its own last `window` steps of
    each kind, and its own step counts."""
    seen: dict[tuple[str, int], list[float]] = {}
    for arm, seconds, switched in observations:
        seen.setdefault(("all", arm), []).append(seconds)
        if switched is not None:
            seen.setdefault(("switch" if switched else "stay", arm), []).append(seconds)
    return {kind: ([statistics.median(seen[kind, arm][-window:]) if (kind, arm) in seen else None
                    for arm in range(n_arms)], [len(seen.get((kind, arm), [])) for arm in range(n_arms)])
            for kind in ("all", "stay", "switch")}


@settings(max_examples=60, deadline=None)
@given(observations=st.lists(st.tuples(st.integers(0, 2), st.floats(0.1, 10.0), st.sampled_from([None, False, True])),
                             max_size=60),
       smoothing=st.sampled_from([0.1, 0.5, 1.0]))
def test_step_costs_without_groups_keep_each_arm_apart(observations, smoothing) -> None:
    """groups=None is every arm a group of its own: per-arm medians and counts as before groups existed, and the
    same readings (switching costs, gap, spread, rewards) as distinct explicit groups."""
    plain = rewards.StepCosts(n_arms=3, smoothing=smoothing)
    named = rewards.StepCosts(n_arms=3, smoothing=smoothing, groups=["x", ("y", 2), None])
    for arm, seconds, switched in observations:
        for costs in (plain, named):
            costs.observe(arm, seconds, switched)
    expected = per_arm_medians(observations, 3, plain.window)
    for kind, values in (("all", plain.costs), ("stay", plain.stay_costs), ("switch", plain.switch_costs)):
        assert values == expected[kind][0] and plain.steps[kind] == expected[kind][1]
    assert plain.groups == (0, 1, 2)
    for switched in (False, True):
        assert plain.costs_when(switched) == named.costs_when(switched)
        assert plain.steps_when(switched) == named.steps_when(switched)
    assert plain.spread() == named.spread()
    assert [plain.reward(arm, [1], 2) for arm in range(3)] == [named.reward(arm, [1], 2) for arm in range(3)]
