"""Regret simulator for draft selection, vectorised over seeds, and the script that makes results/bandits_*.

An environment gives every arm (draft) a per-token acceptance rate α that is constant (stationary) or
changes every `switch_every` steps (piecewise-stationary: the prompt moved to another domain).  A step
drafts γ tokens; the number accepted is truncated-geometric: P(n >= j) = α^j, n <= γ.  With γ = 1 the
arms are Bernoulli, the paper's toy.  Regret is measured against the best arm *at each moment*, in the
units of the environment's objective (acceptance rate, expected tokens per step, or normalised
throughput), using expectations (pseudo-regret), not the noisy realised rewards.

Speed: all seeds run at once.  The policy is the library class itself with `batch_size = n_seeds`
(one independent copy per row), so the simulated arithmetic is exactly the engine's.  Each row's
environment noise comes from its own generator seeded by the row's seed, so a deterministic policy's
row for seed s is the same whatever other seeds run beside it.

The experiments that use it to make results/bandits_*.json are `experiments/bandits.py` (``flashspec bandits``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from flashspec import bandits, front, rewards

__all__ = [
    "Environment",
    "bernoulli_environment",
    "piecewise_environment",
    "SimulationResult",
    "simulate",
    "sqrt_kt_log_t",
    "auer_ucb1_bound",
    "mean_confidence_interval",
]

OBJECTIVES = ("acceptance", "tokens_per_step", "throughput")
OBSERVATIONS = ("bit", "acceptance_fraction", "tokens_per_step", "throughput", "step")
FEEDBACKS = ("bandit", "full")
_ENV_STREAM = 1  # seeds the environment's uniforms of a row
_POLICY_STREAM = 2  # seeds the policy's generator

# Numbers reported in the FlashSpec paper's text (cited for comparison, not produced here).
PAPER_REPORTED = {"ucb1_regret": 100.2, "thompson_regret": 18.9, "claimed_bound": 526.0}


@dataclass(frozen=True)
class Environment:
    """Per-token acceptance of each arm over time, with optional per-arm draft cost and request boundaries.

    levels: [n_segments, n_arms] acceptance rates; segment s covers steps [s·switch_every, (s+1)·switch_every)
        and the schedule cycles if the run is longer.  One row and switch_every=None: stationary.
    gamma: drafted tokens per step (1 = Bernoulli arms).
    draft_costs: [n_arms] cost of one draft forward in units of one target forward (None: all free).
    request_length: steps per request; switches must fall on request boundaries (a multiple of it).
    """

    levels: np.ndarray
    switch_every: int | None = None
    gamma: int = 1
    draft_costs: np.ndarray | None = None
    request_length: int | None = None
    objective: str = "acceptance"

    def __post_init__(self) -> None:
        levels = np.atleast_2d(np.asarray(self.levels, dtype=np.float64))
        if levels.ndim != 2 or levels.shape[1] < 1 or not np.all(np.isfinite(levels)):
            raise ValueError(f"levels must be a finite [n_segments, n_arms] array (got shape {levels.shape})")
        if levels.min() < 0 or levels.max() > 1:
            raise ValueError("levels must be acceptance rates in [0, 1]")
        object.__setattr__(self, "levels", levels)
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, (int, np.integer)) or self.gamma < 1:
            raise ValueError(f"gamma must be an int >= 1 (got {self.gamma!r})")
        if self.switch_every is None and levels.shape[0] != 1:
            raise ValueError("several segments of levels need switch_every (steps per segment)")
        if self.switch_every is not None and (not isinstance(self.switch_every, (int, np.integer)) or self.switch_every < 1):
            raise ValueError(f"switch_every must be None or an int >= 1 (got {self.switch_every!r})")
        if self.request_length is not None:
            if not isinstance(self.request_length, (int, np.integer)) or self.request_length < 1:
                raise ValueError(f"request_length must be None or an int >= 1 (got {self.request_length!r})")
            if self.switch_every is not None and self.switch_every % self.request_length:
                raise ValueError("switch_every must be a multiple of request_length (domains change with requests)")
        if self.draft_costs is not None:
            costs = np.asarray(self.draft_costs, dtype=np.float64)
            if costs.shape != (levels.shape[1],) or not np.all(np.isfinite(costs)) or costs.min() < 0:
                raise ValueError(f"draft_costs must be {levels.shape[1]} finite numbers >= 0")
            object.__setattr__(self, "draft_costs", costs)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES} (got {self.objective!r})")
        if self.objective == "throughput" and self.draft_costs is None:
            raise ValueError("objective='throughput' needs draft_costs")

    @property
    def n_arms(self) -> int:
        return int(self.levels.shape[1])

    def segment_index(self, n_rounds: int) -> np.ndarray:
        """Segment of each step, int array [n_rounds]."""
        steps = np.arange(n_rounds)
        if self.switch_every is None:
            return np.zeros(n_rounds, dtype=np.int64)
        return (steps // self.switch_every) % self.levels.shape[0]

    def values(self) -> np.ndarray:
        """Expected objective of each arm in each segment, [n_segments, n_arms]: what regret is measured in."""
        if self.objective == "acceptance":
            return self.levels.copy()
        if self.objective == "tokens_per_step":
            return np.asarray(rewards.expected_tokens_per_step(self.levels, self.gamma))
        return np.asarray(rewards.expected_throughput(self.levels, self.gamma, self.draft_costs))

    def sample_accepted(self, seeds: Sequence[int], n_rounds: int) -> np.ndarray:
        """Accepted counts every arm would have had, int8/int16 [n_seeds, n_rounds, n_arms], row r from seed r."""
        segments = self.segment_index(n_rounds)
        alpha = self.levels[segments]  # [T, K]
        with np.errstate(divide="ignore"):
            log_alpha = np.log(alpha)
        dtype = np.int8 if self.gamma < 127 else np.int32
        out = np.empty((len(seeds), n_rounds, self.n_arms), dtype=dtype)
        for row, seed in enumerate(seeds):
            uniforms = np.random.default_rng([_ENV_STREAM, int(seed)]).random((n_rounds, self.n_arms))
            uniforms = np.maximum(uniforms, np.finfo(np.float64).tiny)  # never exactly 0
            with np.errstate(divide="ignore", invalid="ignore"):
                runs = np.floor(np.log(uniforms) / log_alpha)  # P(run >= j) = α^j
            runs = np.where(alpha >= 1.0, self.gamma, np.where(alpha <= 0.0, 0, runs))
            out[row] = np.minimum(runs, self.gamma).astype(dtype)
        return out


def bernoulli_environment(means: Sequence[float]) -> Environment:
    """Stationary Bernoulli arms (γ = 1): the paper's toy with means [0.3, 0.7, 0.5]."""
    return Environment(levels=np.asarray([means], dtype=np.float64), gamma=1)


def piecewise_environment(
    switch_every: int,
    n_rounds: int,
    levels: Sequence[float] = (0.85, 0.70, 0.55),
    gamma: int = 4,
    request_length: int | None = 100,
    seed: int = 0,
    draft_costs: Sequence[float] | None = None,
    objective: str = "acceptance",
) -> Environment:
    """Domain switches every `switch_every` steps; each domain gives the arms a permutation of `levels`.

    The best arm changes at every switch (a switch that keeps the best arm tests nothing).
    """
    rng = np.random.default_rng(seed)
    n_arms = len(levels)
    level_array = np.asarray(levels, dtype=np.float64)
    n_segments = max(1, math.ceil(n_rounds / switch_every))
    rows: list[np.ndarray] = []
    previous_best = -1
    for _ in range(n_segments):
        while True:
            row = level_array[rng.permutation(n_arms)]
            best = int(np.argmax(row))
            if best != previous_best or n_arms == 1:
                break
        rows.append(row)
        previous_best = best
    return Environment(
        levels=np.stack(rows),
        switch_every=switch_every,
        gamma=gamma,
        request_length=request_length,
        draft_costs=None if draft_costs is None else np.asarray(draft_costs, dtype=np.float64),
        objective=objective,
    )


@dataclass
class SimulationResult:
    """Per-seed cumulative regret [n_seeds, n_rounds] and arm pull counts [n_seeds, n_arms]."""

    cumulative_regret: np.ndarray
    pulls: np.ndarray
    seeds: list[int]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def final_regret(self) -> np.ndarray:
        return self.cumulative_regret[:, -1]

    def summary(self) -> dict[str, Any]:
        mean, half_width = mean_confidence_interval(self.final_regret)
        return {
            "final_regret_mean": mean,
            "final_regret_ci95": half_width,
            "final_regret_std": float(np.std(self.final_regret, ddof=1)) if len(self.seeds) > 1 else 0.0,
            "n_seeds": len(self.seeds),
            "pull_share": (self.pulls.sum(axis=0) / self.pulls.sum()).tolist(),
        }

    def curve(self, n_points: int = 200) -> dict[str, list[float]]:
        """Mean cumulative regret and its 95% CI at ~n_points steps (for plots and JSON)."""
        n_rounds = self.cumulative_regret.shape[1]
        steps = np.unique(np.linspace(0, n_rounds - 1, n_points).round().astype(int))
        data = self.cumulative_regret[:, steps]
        mean = data.mean(axis=0)
        half = 1.96 * data.std(axis=0, ddof=1) / math.sqrt(data.shape[0]) if data.shape[0] > 1 else 0 * mean
        return {"t": (steps + 1).tolist(), "mean": mean.tolist(), "low": (mean - half).tolist(), "high": (mean + half).tolist()}


def _observation_values(observation: str, counts: np.ndarray, env: Environment, arms: np.ndarray | None) -> np.ndarray:
    """Rewards in [0, 1] from accepted counts (`flashspec.rewards`; arms given: per row's played arm, for
    per-arm costs)."""
    if observation == "bit":
        return (counts >= 1).astype(np.float64)  # was the first drafted token accepted: Bernoulli(α)
    if observation == "throughput":
        if env.draft_costs is None:
            raise ValueError("observation='throughput' needs an environment with draft_costs")
        costs = env.draft_costs if arms is None else env.draft_costs[arms]
        return np.asarray(rewards.throughput(counts, env.gamma, costs))
    return np.asarray(rewards.REWARDS[observation](counts, env.gamma))


def simulate(
    policy: str | Callable[..., bandits.Policy],
    env: Environment,
    n_rounds: int,
    seeds: Sequence[int] | int = 100,
    *,
    observation: str = "bit",
    feedback: str = "bandit",
    request_boundaries: bool = False,
    policy_kwargs: dict[str, Any] | None = None,
    progress: bool = False,
) -> SimulationResult:
    """Run a policy on an environment for n_rounds steps, all seeds at once.

    policy: a name for `bandits.make_policy` or a callable (n_arms, batch_size=, seed=, **policy_kwargs) -> Policy.
    observation: what the policy learns from each observed step: "bit" (first drafted token accepted),
        a reward in [0, 1] ("acceptance_fraction", "tokens_per_step", "throughput"), or "step" (n of γ,
        via update_step / update_full_step).
    feedback: "bandit" (only the played arm is observed) or "full" (every arm's outcome on the step).
    request_boundaries: call policy.on_request_start() at each new request (env.request_length).
    """
    if isinstance(seeds, (int, np.integer)):
        seeds = list(range(int(seeds)))
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must be a positive count or a non-empty list of ints")
    if isinstance(n_rounds, bool) or not isinstance(n_rounds, (int, np.integer)) or n_rounds < 1:
        raise ValueError(f"n_rounds must be an int >= 1 (got {n_rounds!r})")
    if observation not in OBSERVATIONS:
        raise ValueError(f"observation must be one of {OBSERVATIONS} (got {observation!r})")
    if feedback not in FEEDBACKS:
        raise ValueError(f"feedback must be one of {FEEDBACKS} (got {feedback!r})")
    if request_boundaries and env.request_length is None:
        raise ValueError("request_boundaries=True needs an environment with request_length")
    kwargs = dict(policy_kwargs or {})
    n_seeds, n_arms = len(seeds), env.n_arms
    policy_seed = np.random.SeedSequence([_POLICY_STREAM, *seeds])
    if isinstance(policy, str):
        agent = bandits.make_policy(policy, n_arms, batch_size=n_seeds, seed=policy_seed, **kwargs)
    else:
        agent = policy(n_arms, batch_size=n_seeds, seed=policy_seed, **kwargs)

    accepted = env.sample_accepted(seeds, n_rounds)  # [S, T, K]
    segments = env.segment_index(n_rounds)
    values = env.values()  # [n_segments, K]
    best = values.max(axis=1)
    rows = np.arange(n_seeds)
    instant_regret = np.empty((n_seeds, n_rounds))
    pulls = np.zeros((n_seeds, n_arms), dtype=np.int64)
    request_length = env.request_length if request_boundaries else None

    steps: Any = range(n_rounds)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc=getattr(agent, "name", "policy"), leave=False, mininterval=0.5)
    for t in steps:
        segment = segments[t]
        if request_length is not None and t > 0 and t % request_length == 0:
            agent.on_request_start()
        arms = agent.select(values[segment] if agent.needs_true_values else None)
        counts_all = accepted[:, t, :]
        instant_regret[:, t] = best[segment] - values[segment][arms]
        np.add.at(pulls, (rows, arms), 1)
        if feedback == "full":
            if observation == "step":
                agent.update_full_step(counts_all, env.gamma)
            else:
                agent.update_full(_observation_values(observation, counts_all.astype(np.float64), env, None))
        else:
            counts = counts_all[rows, arms]
            if observation == "step":
                agent.update_step(arms, counts, env.gamma)
            else:
                agent.update(arms, _observation_values(observation, counts.astype(np.float64), env, arms))
    settings = {
        "policy": policy if isinstance(policy, str) else getattr(agent, "name", repr(policy)),
        "policy_kwargs": kwargs,
        "n_rounds": int(n_rounds),
        "n_seeds": n_seeds,
        "observation": observation,
        "feedback": feedback,
        "request_boundaries": request_boundaries,
        "gamma": env.gamma,
        "switch_every": env.switch_every,
        "request_length": env.request_length,
        "objective": env.objective,
    }
    return SimulationResult(np.cumsum(instant_regret, axis=1), pulls, seeds, settings)


# --------------------------------------------------------------------------- reference curves and statistics
def sqrt_kt_log_t(n_arms: int, n_rounds: int | np.ndarray) -> float | np.ndarray:
    """√(K·T·ln T): the scale of a minimax regret rate (526 for K=3, T=10⁴), not a bound for any policy."""
    rounds = np.asarray(n_rounds, dtype=np.float64)
    value = np.sqrt(n_arms * rounds * np.log(np.maximum(rounds, 1.0)))
    return float(value) if value.ndim == 0 else value


def auer_ucb1_bound(means: Sequence[float], n_rounds: int | np.ndarray) -> float | np.ndarray:
    """Auer, Cesa-Bianchi & Fischer (2002), Theorem 1: UCB1's expected regret after n plays is at most

    8 · Σ_{i: Δ_i > 0} ln(n) / Δ_i + (1 + π²/3) · Σ_j Δ_j,  with Δ_i = μ* - μ_i.
    """
    mu = np.asarray(means, dtype=np.float64)
    gaps = mu.max() - mu
    positive = gaps[gaps > 0]
    rounds = np.asarray(n_rounds, dtype=np.float64)
    value = 8.0 * np.log(np.maximum(rounds, 1.0)) * np.sum(1.0 / positive) + (1.0 + math.pi**2 / 3.0) * gaps.sum()
    return float(value) if value.ndim == 0 else value


def mean_confidence_interval(samples: np.ndarray) -> tuple[float, float]:
    """Mean and the half-width of its 95% CI (normal approximation, 1.96·s/√n; fine for n >= 30)."""
    data = np.asarray(samples, dtype=np.float64)
    if data.size < 2:
        return float(data.mean()), float("nan")
    return float(data.mean()), float(1.96 * data.std(ddof=1) / math.sqrt(data.size))


class Blocks:
    """A scripted policy: arm 0 for `length` steps, then arm 1 for `length`, and so on, learning nothing.
    Its switches make a lazy draft catch up at known steps (the engine and workload tests drive it)."""

    def __init__(self, length: int = 2) -> None:
        self.length = length
        self.t = -1

    def select(self) -> int:
        self.t += 1
        return (self.t // self.length) % 2

    def update(self, arm: int, reward: float) -> None:
        return None


def acceptance_for_tokens(tokens_per_step: float, gamma: int) -> float:
    """The per-token acceptance α whose truncated-geometric step makes `tokens_per_step` tokens at γ = `gamma`:
    the inverse of `rewards.expected_tokens_per_step`, by bisection (1 token: α = 0; γ + 1 tokens: α = 1)."""
    if gamma < 1 or not 1.0 <= tokens_per_step <= gamma + 1:
        raise ValueError(f"tokens_per_step must lie in [1, gamma + 1] with gamma >= 1, got {tokens_per_step!r}, "
                         f"gamma={gamma!r}")
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if rewards.expected_tokens_per_step(middle, gamma) < tokens_per_step:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def plain_arm_stream(acceptance: dict[str, dict[str, float]], step_ms: float, plain_ms: float, gamma: int,
                     tokens_per_category: int, seed: int, policy: str = "gamma-ts",
                     **policy_options: Any) -> dict[str, float]:
    """One task-switching stream served by an adaptive policy over every draft at γ = `gamma` and the plain arm,
    learning from nothing: `acceptance` maps draft -> category -> α, the categories served in that order,
    `tokens_per_category` tokens each; a draft step costs `step_ms` and makes 1 + its truncated-geometric
    accepted count, a plain step costs `plain_ms` and makes 1 token. Returns each category's throughput as a
    multiple of plain decoding's (what the engine's `ratio to fast plain` measures), with the costs known to the
    policy from the start (no cost-measuring steps: the most favourable case for it)."""
    drafts = list(acceptance)
    categories = list(acceptance[drafts[0]])
    arms = [(index, gamma) for index in range(len(drafts))] + [front.PLAIN]
    costs = [step_ms] * len(drafts) + [plain_ms]
    chooser = bandits.make_policy(policy, len(arms), seed=seed, **policy_options)
    chooser.bind_arms(arms, costs)
    rng = np.random.default_rng(seed)
    ratios = {}
    for category in categories:
        made, spent = 0, 0.0
        while made < tokens_per_category:
            arm = int(chooser.select())
            draft, arm_gamma = arms[arm]
            accepted = 0
            if draft >= 0:
                alpha = acceptance[drafts[draft]][category]
                while accepted < arm_gamma and rng.random() < alpha:
                    accepted += 1
            front.update_policy(chooser, arm, [accepted], arm_gamma)  # as the engines tell it a step
            made += accepted + 1
            spent += costs[arm]
        ratios[category] = made / spent * plain_ms
    return ratios
