"""Rewards of a speculative step and their expectations (flashspec.rewards)."""
from __future__ import annotations

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
