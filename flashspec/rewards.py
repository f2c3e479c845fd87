"""Rewards for draft selection: turn a speculative step's outcome into a number in [0, 1].

A step drafts γ tokens, the target accepts n of them (0 <= n <= γ) and emits n + 1 tokens (the
accepted drafts plus one residual or bonus token).  Which reward a bandit should maximise depends on
what "best draft" means:

* `acceptance_fraction`: n / γ, the per-step acceptance.
* `tokens_per_step`: (n + 1) / (γ + 1), emitted tokens normalised by the most a step can emit.
* `throughput`: emitted tokens per unit of step cost (γ draft forwards + one target forward),
  normalised by γ + 1 tokens per target forward (the rate of a free draft that is always accepted),
  because the draft with the highest acceptance is not always the fastest.

`StepCosts` turns measured (or known) step costs into a throughput reward relative to the best arm:
when the arms are (draft, γ) pairs, a bandit learns how far to speculate from tokens per second
(`SpeculativeDecoder(gammas=...)`).

All functions work on Python numbers or numpy arrays (elementwise) and reject bad input with ValueError.
"""
from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "acceptance_fraction",
    "tokens_per_step",
    "throughput",
    "expected_tokens_per_step",
    "expected_throughput",
    "StepCosts",
    "REWARDS",
]


def check_step_gamma(gamma: Any, plain: bool = False) -> int:
    """A step's drafted tokens as the reward arithmetic and the policies' step updates take them: an int >= 1
    (>= 0 with `plain`: a plain-decoding step drafts none and emits one token)."""
    least = 0 if plain else 1
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < least:
        raise ValueError(f"gamma must be an int >= {least}, the number of drafted tokens per step (got {gamma!r})")
    return int(gamma)


def _check_num_accepted(num_accepted: Any, gamma: int) -> np.ndarray:
    try:
        counts = np.asarray(num_accepted, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"num_accepted must be integer(s) in [0, gamma] (got {num_accepted!r})") from error
    if counts.size == 0 or not np.all(np.isfinite(counts)) or np.any(counts != np.round(counts)):
        raise ValueError(f"num_accepted must be whole numbers in [0, gamma={gamma}] (got {num_accepted!r})")
    if counts.min() < 0 or counts.max() > gamma:
        raise ValueError(f"num_accepted must be in [0, gamma={gamma}] (got {num_accepted!r})")
    return counts


def _check_cost(value: Any, name: str, allow_zero: bool) -> np.ndarray:
    try:
        costs = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name} must be a non-negative number (got {value!r})") from error
    bad = (costs < 0) if allow_zero else (costs <= 0)
    if costs.size == 0 or not np.all(np.isfinite(costs)) or np.any(bad):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound} (got {value!r})")
    return costs


def _scalar_or_array(values: np.ndarray) -> float | np.ndarray:
    return float(values) if values.ndim == 0 else values


def acceptance_fraction(num_accepted: Any, gamma: int) -> float | np.ndarray:
    """n / γ: the fraction of drafted tokens the target accepted."""
    gamma = check_step_gamma(gamma)
    return _scalar_or_array(_check_num_accepted(num_accepted, gamma) / gamma)


def tokens_per_step(num_accepted: Any, gamma: int) -> float | np.ndarray:
    """(n + 1) / (γ + 1): tokens emitted by the step, normalised by the maximum γ + 1."""
    gamma = check_step_gamma(gamma)
    return _scalar_or_array((_check_num_accepted(num_accepted, gamma) + 1.0) / (gamma + 1.0))


def throughput(num_accepted: Any, gamma: int, draft_cost: Any, target_cost: Any = 1.0) -> float | np.ndarray:
    """Tokens per unit cost, normalised to [0, 1].

    tokens = n + 1, cost = γ · draft_cost + target_cost (cost of one draft forward and one target
    forward, in any common unit, e.g. measured seconds).  The normaliser is (γ + 1) / target_cost, the
    rate of a free draft (cost 0) that is always accepted, so the reward is
    (n + 1) · target_cost / ((γ + 1) · (γ · draft_cost + target_cost)).
    """
    gamma = check_step_gamma(gamma)
    counts = _check_num_accepted(num_accepted, gamma)
    draft = _check_cost(draft_cost, "draft_cost", allow_zero=True)
    target = _check_cost(target_cost, "target_cost", allow_zero=False)
    return _scalar_or_array((counts + 1.0) * target / ((gamma + 1.0) * (gamma * draft + target)))


def expected_tokens_per_step(alpha: Any, gamma: int) -> float | np.ndarray:
    """E[n + 1] = (1 - α^(γ+1)) / (1 - α) for per-token acceptance α (γ + 1 at α = 1).

    Not γα + 1: the first rejection ends the step, so n is truncated-geometric, not binomial.
    """
    gamma = check_step_gamma(gamma)
    try:
        rates = np.asarray(alpha, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"alpha must be acceptance rate(s) in [0, 1] (got {alpha!r})") from error
    if rates.size == 0 or not np.all(np.isfinite(rates)) or rates.min() < 0 or rates.max() > 1:
        raise ValueError(f"alpha must be finite acceptance rate(s) in [0, 1] (got {alpha!r})")
    # sum_{j=0}^{γ} α^j, written as a sum so α = 1 needs no special case and stays exact.
    powers = rates[..., None] ** np.arange(gamma + 1)
    return _scalar_or_array(powers.sum(axis=-1))


def expected_throughput(alpha: Any, gamma: int, draft_cost: Any, target_cost: Any = 1.0) -> float | np.ndarray:
    """E[throughput reward] for per-token acceptance α: the normalised tokens per unit cost."""
    gamma = check_step_gamma(gamma)
    draft = _check_cost(draft_cost, "draft_cost", allow_zero=True)
    target = _check_cost(target_cost, "target_cost", allow_zero=False)
    tokens = np.asarray(expected_tokens_per_step(alpha, gamma))
    return _scalar_or_array(tokens * target / ((gamma + 1.0) * (gamma * draft + target)))


class StepCosts:
    """Each arm's step cost and tokens per step, and the relative throughput reward of a step.

    Costs: measured (`fixed=None`), `observe(arm, seconds)` feeds each arm's running median of step
    seconds over the steps a moving average of weight `smoothing` spans (below), which smooths timer
    noise and follows slow drifts; or fixed, known per-arm costs (any unit, e.g. from a benchmark), observations
    ignored, so a seeded run is reproducible.

    `reward(arm, num_accepted, gamma)`: the step's tokens per unit cost, mean(n + 1) / c_arm, over
    twice the best arm's estimated rate max_a T_a / c_a (T_a: the moving average of arm a's tokens
    per step, this step included), clipped to [0, 1]. Relative, not absolute: `throughput`'s
    normaliser (the rate of a free draft always accepted, (Γ + 1) tokens per fastest step) puts every
    arm near 0.1, where a Beta posterior needs thousands of steps to tell arms 30 % apart (measured
    on the CPU zoo: the bandit then ran at 0.73-0.79x the best fixed γ); relative to the best arm, the best
    sits near 0.5 and a γ at half its rate near 0.25. The scale moves while estimates settle, then
    holds still.

    A step that changes draft may cost more than one that keeps it (the new draft catches up on the
    tokens it missed). `observe(arm, seconds, switched)` with `switched` True or False also feeds a
    moving average for that kind of step, and `cost(arm, switched)` / `costs_when(switched)` read it
    (`GammaThompsonSampling` does, so it weighs a switch against staying).

    Measured costs are medians, not means: each estimate is the median of the arm's last `window` steps
    of its kind, `window` = (2 - smoothing) / smoothing, the number of steps a moving average of that
    weight effectively spans (19 at the default 0.1). One slow step, a host stall, moves a median little
    and a mean a lot, and the arm played most meets most of them. `steps_when(switched)` counts the
    steps behind each estimate, and `spread()` is the pooled standard deviation of log step times
    about their arm's estimate, so a policy can draw costs as well as acceptance, and re-measure an
    arm it would otherwise judge once and never again.

    Shared costs (`groups`, one hashable per arm): arms with an equal group share every measured
    estimate -- the running medians of all, staying and switching steps and the steps behind them --
    so `observe(arm, ...)` feeds the arm's group and every reader gives each arm its group's value.
    A step's cost is a property of the compute (the draft's architecture, γ, staying or switching),
    not of which same-sized draft runs it; an arm played rarely is then priced from every step of its
    group rather than from its own few steps, often transitional ones (a policy that mostly stays
    elsewhere plays it just after a switch). Tokens per step stay per arm: acceptance depends on the
    draft. Default None: every arm is a group of its own (the `groups` attribute then holds each arm's
    index). Fixed costs ignore groups (they are already known per arm).
    """

    def __init__(self, n_arms: int, smoothing: float = 0.1, fixed: Sequence[float] | None = None,
                 groups: Sequence[Hashable] | None = None) -> None:
        if isinstance(n_arms, bool) or not isinstance(n_arms, int) or n_arms < 1:
            raise ValueError(f"n_arms must be an int >= 1 (got {n_arms!r})")
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be a number in (0, 1] (weight of the newest step), got {smoothing!r}")
        self.smoothing = float(smoothing)
        self.fixed = fixed is not None
        self.groups = _check_groups(groups, n_arms)
        index: dict[Hashable, int] = {}
        self._group_of = [index.setdefault(group, len(index)) for group in self.groups]  # arm -> group number
        self._members: list[list[int]] = [[] for _ in index]  # group number -> its arms
        for arm, group in enumerate(self._group_of):
            self._members[group].append(arm)
        self.costs: list[float | None] = [None] * n_arms
        self.tokens: list[float | None] = [None] * n_arms
        self.stay_costs: list[float | None] = [None] * n_arms  # steps that kept the previous step's draft
        self.switch_costs: list[float | None] = [None] * n_arms  # steps that changed draft
        # steps behind each estimate, per arm (its group's count, written into every member's slot)
        self.steps = {kind: [0] * n_arms for kind in ("all", "stay", "switch")}
        self.window = max(1, round((2.0 - self.smoothing) / self.smoothing))
        self._recent: dict[tuple[str, int], collections.deque[float]] = {}  # (kind, group): its last `window` steps
        self._log_var: float | None = None  # moving average of squared log deviations from the arm's estimate
        if fixed is not None:
            values = _check_cost(list(fixed), "arm_costs", allow_zero=False) if len(fixed) else np.zeros(0)
            if values.shape != (n_arms,):
                raise ValueError(f"arm_costs must hold one cost > 0 per arm ({n_arms} arms), got {list(fixed)!r}")
            self.costs = [float(value) for value in values]

    def _average(self, previous: float | None, value: float) -> float:
        return value if previous is None else previous + self.smoothing * (value - previous)

    def _update(self, kind: str, values: list[float | None], arm: int, seconds: float) -> None:
        """Feed one step to the median of that kind's last `window` steps of the arm's group, and write the
        group's estimate and step count into every member arm's slot of `values` and `steps[kind]`."""
        group = self._group_of[arm]
        recent = self._recent.setdefault((kind, group), collections.deque(maxlen=self.window))
        recent.append(seconds)
        value = float(statistics.median(recent))  # on every step: cheaper than np.median's array conversion
        count = self.steps[kind][arm] + 1  # the members' counts are equal: each update writes them all
        for member in self._members[group]:
            values[member] = value
            self.steps[kind][member] = count

    def observe(self, arm: int, seconds: float, switched: bool | None = None) -> None:
        """One measured step of `arm` (ignored with fixed costs, or when not a finite time > 0);
        `switched`: whether its draft differs from the previous step's (None: not known, e.g. a
        request's first step)."""
        if self.fixed or not (isinstance(seconds, (int, float)) and np.isfinite(seconds) and seconds > 0):
            return
        seconds = float(seconds)
        estimate = self.costs[arm] if switched is None else self.cost(arm, switched)
        if estimate is not None:  # how far a step strays from its arm's estimate, pooled over arms
            self._log_var = self._average(self._log_var, math.log(seconds / estimate) ** 2)
        self._update("all", self.costs, arm, seconds)
        if switched is not None:
            kind = "switch" if switched else "stay"
            self._update(kind, self.switch_costs if switched else self.stay_costs, arm, seconds)

    def spread(self) -> float | None:
        """Pooled standard deviation of a step's log time about its arm's estimate (None before two steps of
        an arm; 0 with fixed costs)."""
        if self.fixed:
            return 0.0
        return None if self._log_var is None else math.sqrt(self._log_var)

    def steps_when(self, switched: bool) -> list[int]:
        """How many steps stand behind each arm's `costs_when(switched)` estimate (the kind it reads)."""
        kind, other = ("switch", "stay") if switched else ("stay", "switch")
        return [self.steps[kind][arm] or self.steps[other][arm] or self.steps["all"][arm]
                for arm in range(len(self.costs))]

    def cost(self, arm: int, switched: bool) -> float | None:
        """The arm's expected step cost when its step changes draft (`switched`) or keeps it: that kind's
        moving average; else the arm's other estimates, shifted by the mean gap between switching and
        staying over the arms that measured both (no gap known: none); None before any measurement."""
        return self._cost(arm, switched, self._switch_gap())

    def costs_when(self, switched: bool) -> list[float | None]:
        """`cost(arm, switched)` of every arm (the gap computed once)."""
        gap = self._switch_gap()
        return [self._cost(arm, switched, gap) for arm in range(len(self.costs))]

    def _switch_gap(self) -> float:
        """Mean of switching minus staying cost over the groups that measured both (each group once)."""
        firsts = [members[0] for members in self._members]
        both = [(self.switch_costs[arm], self.stay_costs[arm]) for arm in firsts
                if self.switch_costs[arm] is not None and self.stay_costs[arm] is not None]
        return float(np.mean([go - stay for go, stay in both])) if both else 0.0

    def _cost(self, arm: int, switched: bool, gap: float) -> float | None:
        own = (self.switch_costs if switched else self.stay_costs)[arm]
        if own is not None or self.fixed:
            return own if own is not None else self.costs[arm]
        other = (self.stay_costs if switched else self.switch_costs)[arm]
        if other is not None:
            return max(other + (gap if switched else -gap), 1e-12)
        return self.costs[arm]

    def rates(self) -> list[float | None]:
        """Each arm's estimated tokens per unit cost (None until it has a cost and a step)."""
        return [None if cost is None or tokens is None else tokens / cost
                for cost, tokens in zip(self.costs, self.tokens)]

    def reward(self, arm: int, num_accepted: Sequence[int], gamma: int) -> float | None:
        """The step's relative throughput reward in [0, 1]; None while the arm has no cost yet. A plain step
        (γ = 0, every count 0) emits one token per row."""
        cost = self.costs[arm]
        if cost is None or not len(num_accepted):
            return None
        tokens = float(np.mean(_check_num_accepted(list(num_accepted), check_step_gamma(gamma, plain=True)))) + 1.0
        self.tokens[arm] = self._average(self.tokens[arm], tokens)
        best = max(rate for rate in self.rates() if rate is not None)
        return min(1.0, tokens / cost / (2.0 * best))


def _check_groups(groups: Sequence[Hashable] | None, n_arms: int) -> tuple[Hashable, ...]:
    """`groups` as validated: one hashable per arm (default: each arm's own index, a group of its own)."""
    if groups is None:
        return tuple(range(n_arms))
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence) or len(groups) != n_arms:
        raise ValueError(f"groups must be None or a sequence of one hashable per arm ({n_arms} arms), e.g. "
                         f"(draft architecture, γ) per arm, got {groups!r}")
    for arm, group in enumerate(groups):
        try:
            hash(group)
        except TypeError as error:
            raise ValueError(f"groups must hold hashable values (a tuple, not a list or dict), got {group!r} for "
                             f"arm {arm}") from error
    return tuple(groups)


REWARDS = {
    "acceptance_fraction": acceptance_fraction,
    "tokens_per_step": tokens_per_step,
    "throughput": throughput,
}
