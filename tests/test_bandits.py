"""Bandit policies: interface, conjugate step update, state round-trips, batching and input validation."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flashspec as fs
from flashspec import bandits

ENGINE_NAMES = ["ucb1", "thompson", "sw-ucb", "d-ucb", "d-ts", "gamma-ts", "d-gamma-ts", "exp3", "fixed"]
LEARNING_NAMES = ["ucb1", "thompson", "sw-ucb", "d-ucb", "d-ts", "gamma-ts", "d-gamma-ts", "exp3"]
DETERMINISTIC_NAMES = ["ucb1", "sw-ucb", "d-ucb", "fixed"]


def small_policy(name: str, n_arms: int = 3, **kwargs) -> bandits.Policy:
    extra = {"window": 7} if name == "sw-ucb" else {}
    return bandits.make_policy(name, n_arms, seed=0, **extra, **kwargs)


def test_public_api_as_in_design() -> None:
    pol = fs.bandits.ThompsonSampling(n_arms=3)
    arm = pol.select()
    assert isinstance(arm, int) and 0 <= arm < 3
    pol.update(arm, reward=0.75)
    pol.reset()
    assert np.all(pol.trials == 0)


@pytest.mark.parametrize("name", ENGINE_NAMES)
def test_make_policy_accepts_engine_names(name: str) -> None:
    policy = bandits.make_policy(name, 4)
    assert isinstance(policy, bandits.Policy) and policy.n_arms == 4


def test_make_policy_unknown_name_lists_known() -> None:
    with pytest.raises(ValueError, match="known policies:.*thompson.*ucb1"):
        bandits.make_policy("epsilon-greedy", 3)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(LEARNING_NAMES + ["fixed"]),
    rewards=st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=40),
)
def test_any_reward_in_unit_interval_is_accepted(name: str, rewards: list[float]) -> None:
    policy = small_policy(name)
    for reward in rewards:
        arm = policy.select()
        assert isinstance(arm, int) and 0 <= arm < 3
        policy.update(arm, reward)
    assert policy.t == len(rewards)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(LEARNING_NAMES + ["fixed"]),
    gamma=st.integers(min_value=1, max_value=8),
    fractions=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=30),
)
def test_any_step_outcome_is_accepted(name: str, gamma: int, fractions: list[float]) -> None:
    policy = small_policy(name)
    for fraction in fractions:
        arm = policy.select()
        policy.update_step(arm, int(round(fraction * gamma)), gamma)
    policy.update_full_step([0, gamma, gamma // 2], gamma)
    policy.update_full([0.0, 1.0, 0.5])
    assert 0 <= policy.select() < 3


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
def test_thompson_step_update_is_beta_geometric_conjugate(gamma: int) -> None:
    for num_accepted in range(gamma + 1):
        policy = bandits.ThompsonSampling(n_arms=2, prior_alpha=2.0, prior_beta=3.0)
        policy.update_step(1, num_accepted, gamma)
        alpha, beta = policy.posterior()
        assert alpha[0].tolist() == [2.0, 2.0 + num_accepted]
        assert beta[0].tolist() == [3.0, 3.0 + (1.0 if num_accepted < gamma else 0.0)]


def test_accepted_count_fed_as_reward_is_a_clear_error() -> None:
    # The paper's public code crashes when Thompson sampling is fed accepted counts; ours says what to do.
    policy = bandits.ThompsonSampling(n_arms=3)
    with pytest.raises(ValueError, match="update_step"):
        policy.update(0, 3)
    policy.update_step(0, 3, 4)  # the supported way
    assert policy.successes[0, 0] == 3.0


@pytest.mark.parametrize("n_arms", [0, -1, 1.5, True, "3"])
def test_bad_n_arms(n_arms) -> None:
    with pytest.raises(ValueError, match="n_arms"):
        bandits.UCB1(n_arms)


@pytest.mark.parametrize("name", LEARNING_NAMES + ["fixed", "oracle"])
@pytest.mark.parametrize("reward", [-0.1, 1.0001, float("nan"), float("inf"), "0.5", None, True])
def test_bad_reward(name: str, reward) -> None:
    policy = small_policy(name)
    with pytest.raises(ValueError, match="reward"):
        policy.update(0, reward)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(LEARNING_NAMES),
    reward=st.one_of(st.floats(max_value=-1e-9), st.floats(min_value=1.0 + 1e-9), st.just(float("nan")),
                     st.integers(min_value=2, max_value=64)),
)
def test_any_reward_outside_unit_interval_is_rejected(name: str, reward: float) -> None:
    policy = small_policy(name, batch_size=2)
    with pytest.raises(ValueError, match="reward"):
        policy.update(np.array([0, 1]), np.array([0.5, reward]))


@pytest.mark.parametrize("name", LEARNING_NAMES)
@pytest.mark.parametrize("arm", [-1, 3, 1.0, None, True])
def test_bad_arm(name: str, arm) -> None:
    with pytest.raises(ValueError, match="arm"):
        small_policy(name).update(arm, 0.5)


@pytest.mark.parametrize("num_accepted, gamma, match", [(5, 4, "num_accepted"), (-1, 4, "num_accepted"),
                                                        (1, 0, "gamma"), (0.5, 4, "num_accepted"),
                                                        (True, 4, "num_accepted"), (None, 4, "num_accepted")])
def test_bad_step(num_accepted, gamma, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        bandits.ThompsonSampling(3).update_step(0, num_accepted, gamma)


@pytest.mark.parametrize("kwargs, match", [({"window": 0}, "window"), ({"discount": 1.5}, "discount"),
                                           ({"exploration": -1.0}, "exploration"), ({"request_decay": 2.0}, "request_decay")])
def test_bad_parameters(kwargs: dict, match: str) -> None:
    name = "sw-ucb" if "window" in kwargs else "d-ucb"
    with pytest.raises(ValueError, match=match):
        bandits.make_policy(name, 3, **kwargs)


def test_numpy_scalars_and_zero_dim_arrays_are_accepted() -> None:
    policy = bandits.UCB1(3)
    policy.update(np.int64(1), np.float32(0.5))
    policy.update(np.array(2), np.array(1.0))
    policy.update_step(np.int32(0), np.int64(2), 4)
    assert policy.trials[0].tolist() == [3.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="reward"):
        policy.update(0, np.array([0.5, 0.5]))


def test_batched_shapes_are_checked() -> None:
    policy = bandits.UCB1(3, batch_size=4)
    arms = policy.select()
    assert arms.shape == (4,) and arms.dtype == np.int64
    with pytest.raises(ValueError, match="arm"):
        policy.update(arms[:3], np.zeros(3))
    with pytest.raises(ValueError, match="reward"):
        policy.update(arms, np.array([0.1, 0.2, np.nan, 0.3]))


@pytest.mark.parametrize("name", LEARNING_NAMES + ["fixed"])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_state_round_trips_through_json(name: str, batch_size: int | None) -> None:
    rng = np.random.default_rng(1)
    policy = small_policy(name, batch_size=batch_size)
    rows = 1 if batch_size is None else batch_size
    for _ in range(25):
        arm = policy.select()
        reward = float(rng.random()) if batch_size is None else rng.random(rows)
        policy.update(arm, reward)
    state = json.loads(json.dumps(policy.state_dict()))
    clone = small_policy(name, batch_size=batch_size)
    clone.load_state_dict(state)
    for _ in range(20):  # the same future, random generator included
        a, b = policy.select(), clone.select()
        assert np.array_equal(a, b)
        reward = float(rng.random()) if batch_size is None else rng.random(rows)
        policy.update(a, reward)
        clone.update(b, reward)
    assert json.dumps(policy.state_dict()) == json.dumps(clone.state_dict())


def test_load_state_dict_rejects_other_policy() -> None:
    state = bandits.UCB1(3).state_dict()
    with pytest.raises(ValueError, match="policy"):
        bandits.ThompsonSampling(3).load_state_dict(state)
    with pytest.raises(ValueError, match="n_arms"):
        bandits.UCB1(4).load_state_dict(state)


@pytest.mark.parametrize("name", DETERMINISTIC_NAMES)
def test_batched_rows_equal_scalar_policies(name: str) -> None:
    """The batched class (used by the simulator) does exactly the scalar class's arithmetic, row by row."""
    rows, steps = 4, 300
    rewards = np.random.default_rng(7).random((steps, rows, 3))
    batched = small_policy(name, batch_size=rows)
    scalars = [small_policy(name) for _ in range(rows)]
    for t in range(steps):
        arms = batched.select()
        assert [s.select() for s in scalars] == arms.tolist()
        batched.update(arms, rewards[t, np.arange(rows), arms])
        for row, scalar in enumerate(scalars):
            scalar.update(int(arms[row]), float(rewards[t, row, arms[row]]))


def test_request_boundary_resets_or_reprior() -> None:
    reset = bandits.ThompsonSampling(2, request_decay=0.0)
    soft = bandits.ThompsonSampling(2, request_decay=0.5)
    keep = bandits.ThompsonSampling(2)
    for policy in (reset, soft, keep):
        policy.update_step(0, 4, 4)
        policy.on_request_start()
    assert reset.posterior()[0].tolist() == [[1.0, 1.0]]
    assert soft.posterior()[0].tolist() == [[3.0, 1.0]]
    assert keep.posterior()[0].tolist() == [[5.0, 1.0]]
    window = bandits.SlidingWindowUCB(2, window=5, request_decay=0.0)
    window.update(1, 1.0)
    window.on_request_start()
    assert window.select() == 0 and np.all(window.trials == 0) and np.all(window.buffer_trials == 0)


def test_request_boundary_row_mask() -> None:
    policy = bandits.UCB1(2, batch_size=3, request_decay=0.0)
    policy.update(np.array([0, 0, 0]), np.array([1.0, 1.0, 1.0]))
    policy.on_request_start(rows=np.array([True, False, True]))
    assert policy.trials[:, 0].tolist() == [0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="rows"):
        policy.on_request_start(rows=np.array([True, False]))


def test_sliding_window_forgets_old_steps() -> None:
    policy = bandits.SlidingWindowUCB(2, window=3)
    for _ in range(3):
        policy.update(0, 1.0)
    policy.update(1, 0.0)
    assert policy.trials[0].tolist() == [2.0, 1.0]
    assert policy.successes[0].tolist() == [2.0, 0.0]


def test_discounted_ucb_discounts_every_step() -> None:
    policy = bandits.DiscountedUCB(2, discount=0.5)
    policy.update(0, 1.0)
    policy.update(1, 1.0)
    assert policy.trials[0].tolist() == [0.5, 1.0]


def test_exp3_probabilities() -> None:
    policy = bandits.EXP3(3, exploration_rate=0.3, seed=0)
    for _ in range(50):
        policy.update(policy.select(), 1.0)
    probabilities = policy.probabilities()[0]
    assert math.isclose(probabilities.sum(), 1.0) and probabilities.min() >= 0.1 - 1e-12
    assert bandits.EXP3(3, horizon=10_000).exploration_rate < 0.1


def test_oracle_and_fixed() -> None:
    assert bandits.Oracle(3).select(context=[0.2, 0.9, 0.5]) == 1
    with pytest.raises(ValueError, match="context"):
        bandits.Oracle(3).select()
    assert bandits.FixedArm(3, arm=2).select() == 2
    with pytest.raises(ValueError, match="arm"):
        bandits.FixedArm(3, arm=3)


def test_ucb1_plays_each_arm_once_first() -> None:
    policy = bandits.UCB1(4)
    played = []
    for _ in range(4):
        played.append(policy.select())
        policy.update(played[-1], 1.0)
    assert sorted(played) == [0, 1, 2, 3]
