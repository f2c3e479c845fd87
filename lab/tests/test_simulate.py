"""The regret simulator (flashspec_lab.simulate) and its statistics, the reference curves, and the bandit
experiments' figures and command line (experiments/bandits.py)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from experiments import bandits as bandit_experiments
from flashspec import bandits, cli, rewards
from flashspec_lab import plots, provenance
from flashspec_lab import simulate as sim

PAPER_ARMS = [0.3, 0.7, 0.5]


# ----------------------------------------------------------------------------- environment
def test_truncated_geometric_outcomes_match_their_law() -> None:
    alpha, gamma, n = 0.7, 4, 40_000
    env = sim.Environment(levels=np.array([[alpha, 0.0, 1.0]]), gamma=gamma)
    counts = env.sample_accepted([3], n)[0]
    tokens = counts[:, 0] + 1.0
    # mean within 5 standard errors of (1 - α^(γ+1)) / (1 - α)
    assert abs(tokens.mean() - rewards.expected_tokens_per_step(alpha, gamma)) < 5 * tokens.std() / math.sqrt(n)
    full = np.mean(counts[:, 0] == gamma)
    assert abs(full - alpha**gamma) < 5 * math.sqrt(alpha**gamma * (1 - alpha**gamma) / n)
    assert np.all(counts[:, 1] == 0) and np.all(counts[:, 2] == gamma)


def test_environment_validation() -> None:
    with pytest.raises(ValueError, match="levels"):
        sim.Environment(levels=np.array([[1.2, 0.5]]))
    with pytest.raises(ValueError, match="switch_every"):
        sim.Environment(levels=np.array([[0.5, 0.6], [0.6, 0.5]]))
    with pytest.raises(ValueError, match="multiple of request_length"):
        sim.Environment(levels=np.array([[0.5, 0.6], [0.6, 0.5]]), switch_every=150, request_length=100)
    with pytest.raises(ValueError, match="draft_costs"):
        sim.Environment(levels=np.array([[0.5, 0.6]]), objective="throughput")
    env = sim.bernoulli_environment(PAPER_ARMS)
    with pytest.raises(ValueError, match="observation"):
        sim.simulate("ucb1", env, 10, 2, observation="tokens")
    with pytest.raises(ValueError, match="request_boundaries"):
        sim.simulate("ucb1", env, 10, 2, request_boundaries=True)
    with pytest.raises(ValueError, match="n_rounds"):
        sim.simulate("ucb1", env, 0, 2)


def test_piecewise_environment_changes_best_arm_at_every_switch() -> None:
    env = sim.piecewise_environment(200, 2000, levels=(0.85, 0.7, 0.55), seed=1)
    best = np.argmax(env.levels, axis=1)
    assert env.levels.shape == (10, 3) and np.all(best[1:] != best[:-1])
    assert np.all(np.sort(env.levels, axis=1) == np.array([0.55, 0.7, 0.85]))


# ----------------------------------------------------------------------------- simulator = library classes
def _scalar_run(policy: bandits.Policy, env: sim.Environment, seed: int, n_rounds: int) -> np.ndarray:
    """Reference loop with the scalar interface, as the engine would drive a policy."""
    counts = env.sample_accepted([seed], n_rounds)[0]
    values = env.values()[0]
    regret = []
    for t in range(n_rounds):
        arm = policy.select()
        regret.append(values.max() - values[arm])
        policy.update(arm, float(counts[t, arm] >= 1))
    return np.cumsum(regret)


@pytest.mark.parametrize("name", ["ucb1", "thompson", "d-ts", "exp3"])
def test_simulator_matches_scalar_policy_on_the_same_stream(name: str) -> None:
    env = sim.bernoulli_environment(PAPER_ARMS)
    seed, n_rounds = 11, 400
    result = sim.simulate(name, env, n_rounds, [seed])
    scalar = bandits.make_policy(name, 3, seed=np.random.SeedSequence([sim._POLICY_STREAM, seed]))
    np.testing.assert_allclose(result.cumulative_regret[0], _scalar_run(scalar, env, seed, n_rounds), atol=1e-9)


def test_deterministic_policy_row_does_not_depend_on_batch() -> None:
    env = sim.bernoulli_environment(PAPER_ARMS)
    alone = sim.simulate("ucb1", env, 500, [4]).cumulative_regret[0]
    batch = sim.simulate("ucb1", env, 500, list(range(8))).cumulative_regret[4]
    np.testing.assert_array_equal(alone, batch)


def test_oracle_and_best_fixed_arm_have_zero_regret() -> None:
    env = sim.piecewise_environment(100, 600, gamma=4, request_length=50)
    assert np.all(sim.simulate("oracle", env, 600, 3).final_regret == 0)
    stationary = sim.bernoulli_environment(PAPER_ARMS)
    assert np.all(sim.simulate("fixed", stationary, 300, 3, policy_kwargs={"arm": 1}).final_regret == 0)
    assert np.allclose(sim.simulate("fixed", stationary, 300, 3).final_regret, 0.4 * 300)


# ----------------------------------------------------------------------------- statistical properties
@pytest.mark.parametrize("name", ["ucb1", "thompson"])
def test_regret_is_sublinear_on_a_stationary_problem(name: str) -> None:
    """Over 100 seeds, regret from T/4 to T grows far less than linear (4×), with the CI as margin."""
    n_rounds, n_seeds = 4000, 100
    result = sim.simulate(name, sim.bernoulli_environment(PAPER_ARMS), n_rounds, n_seeds)
    early_mean, early_ci = sim.mean_confidence_interval(result.cumulative_regret[:, n_rounds // 4 - 1])
    late_mean, late_ci = sim.mean_confidence_interval(result.final_regret)
    assert late_mean + late_ci < 2.0 * (early_mean - early_ci)  # linear growth would give 4×
    late_rate = (result.final_regret - result.cumulative_regret[:, n_rounds // 2 - 1]) / (n_rounds // 2)
    assert late_rate.mean() + 3 * late_rate.std() / math.sqrt(n_seeds) < 0.2 * 0.2  # < 20% of the smallest gap


def test_ucb1_mean_regret_is_below_auer_bound() -> None:
    n_rounds = 3000
    result = sim.simulate("ucb1", sim.bernoulli_environment(PAPER_ARMS), n_rounds, 100)
    mean, ci = sim.mean_confidence_interval(result.final_regret)
    assert mean + ci < sim.auer_ucb1_bound(PAPER_ARMS, n_rounds)


@pytest.mark.parametrize("name, kwargs", [("sw-ucb", {"window": 200}), ("d-ucb", {"discount": 0.98}),
                                          ("d-ts", {"discount": 0.98})])
def test_windowed_and_discounted_policies_recover_after_a_switch(name: str, kwargs: dict) -> None:
    """Arms swap at step 1000; over the last 500 steps ≥ 75% of plays are on the new best arm (50 seeds)."""
    env = sim.Environment(levels=np.array([[0.8, 0.3], [0.3, 0.8]]), switch_every=1000)
    result = sim.simulate(name, env, 2000, 50, policy_kwargs=kwargs)
    late_wrong_share = (result.final_regret - result.cumulative_regret[:, 1499]) / (500 * 0.5)
    mean, ci = sim.mean_confidence_interval(late_wrong_share)
    assert mean + ci < 0.25


def test_throughput_reward_picks_the_fast_draft() -> None:
    levels, costs = (0.80, 0.70, 0.50), (0.30, 0.05, 0.02)
    env = sim.Environment(levels=np.array([levels]), gamma=4, draft_costs=np.array(costs), objective="throughput")
    by_acceptance = sim.simulate("thompson", env, 1500, 30, observation="acceptance_fraction")
    by_throughput = sim.simulate("thompson", env, 1500, 30, observation="throughput")
    fastest = int(np.argmax(env.values()[0]))
    assert fastest == 1 and int(np.argmax(levels)) == 0
    assert by_throughput.summary()["pull_share"][fastest] > 0.8
    assert by_acceptance.summary()["pull_share"][0] > 0.8
    assert by_throughput.final_regret.mean() < 0.2 * by_acceptance.final_regret.mean()


# ----------------------------------------------------------------------------- references, figures, CLI
def test_reference_curves() -> None:
    assert sim.sqrt_kt_log_t(3, 10_000) == pytest.approx(525.65, abs=0.01)
    gaps = np.array([0.4, 0.0, 0.2])
    by_hand = 8 * math.log(10_000) * (1 / 0.4 + 1 / 0.2) + (1 + math.pi**2 / 3) * gaps.sum()
    assert sim.auer_ucb1_bound(PAPER_ARMS, 10_000) == pytest.approx(by_hand)
    assert 550 < sim.auer_ucb1_bound(PAPER_ARMS, 10_000) < 560


def test_figures_from_small_runs(tmp_path) -> None:
    figure = plots.plot_reproduced_regret(bandit_experiments.experiment_reproduce(200, 6), tmp_path / "reproduce.png")
    assert figure.axes and (tmp_path / "reproduce.png").stat().st_size > 0
    plots.plot_nonstationary_regret(bandit_experiments.experiment_nonstationary(200, 3, switches=(100,)),
                                    tmp_path / "ns.png")
    assert (tmp_path / "ns.png").stat().st_size > 0


def test_cli_writes_json_with_provenance(tmp_path) -> None:
    code = cli.main(["bandits", "--experiments", "cost", "--rounds", "100", "--seeds", "5", "--out", str(tmp_path)])
    assert code == 0
    record = json.loads((tmp_path / "bandits_cost.json").read_text())
    assert list(record) == list(provenance.RESULT_KEYS)
    assert record["settings"] == {"experiment": "cost", "n_rounds": 100, "n_seeds": 5}
    assert record["provenance"]["command"] == f"flashspec bandits --experiments cost --rounds 100 --seeds 5 --out {tmp_path}"
    assert record["provenance"]["versions"]["numpy"] == np.__version__ and record["provenance"]["wall_seconds"] >= 0
    assert record["results"]["draft_costs"] == [0.30, 0.05, 0.02]
    assert (tmp_path / "bandits_cost.png").stat().st_size > 0
