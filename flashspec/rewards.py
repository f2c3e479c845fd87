"""Rewards for draft selection: turn a speculative step's outcome into a number in [0, 1].

A step drafts γ tokens, the target accepts n of them (0 <= n <= γ) and emits n + 1 tokens (the
accepted drafts plus one residual or bonus token).  Which reward a bandit should maximise depends on
what "best draft" means:

* `acceptance_fraction`: n / γ, the per-step acceptance.
* `tokens_per_step`: (n + 1) / (γ + 1), emitted tokens normalised by the most a step can emit.
* `throughput`: emitted tokens per unit of step cost (γ draft forwards + one target forward),
  normalised by γ + 1 tokens per target forward (the rate of a free draft that is always accepted),
  because the draft with the highest acceptance is not always the fastest.

All functions work on Python numbers or numpy arrays (elementwise) and reject bad input with ValueError.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "acceptance_fraction",
    "tokens_per_step",
    "throughput",
    "expected_tokens_per_step",
    "expected_throughput",
    "REWARDS",
]


def _check_gamma(gamma: Any) -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 1:
        raise ValueError(f"gamma must be an int >= 1, the number of drafted tokens per step (got {gamma!r})")
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
    gamma = _check_gamma(gamma)
    return _scalar_or_array(_check_num_accepted(num_accepted, gamma) / gamma)


def tokens_per_step(num_accepted: Any, gamma: int) -> float | np.ndarray:
    """(n + 1) / (γ + 1): tokens emitted by the step, normalised by the maximum γ + 1."""
    gamma = _check_gamma(gamma)
    return _scalar_or_array((_check_num_accepted(num_accepted, gamma) + 1.0) / (gamma + 1.0))


def throughput(num_accepted: Any, gamma: int, draft_cost: Any, target_cost: Any = 1.0) -> float | np.ndarray:
    """Tokens per unit cost, normalised to [0, 1].

    tokens = n + 1, cost = γ · draft_cost + target_cost (cost of one draft forward and one target
    forward, in any common unit, e.g. measured seconds).  The normaliser is (γ + 1) / target_cost, the
    rate of a free draft (cost 0) that is always accepted, so the reward is
    (n + 1) · target_cost / ((γ + 1) · (γ · draft_cost + target_cost)).
    """
    gamma = _check_gamma(gamma)
    counts = _check_num_accepted(num_accepted, gamma)
    draft = _check_cost(draft_cost, "draft_cost", allow_zero=True)
    target = _check_cost(target_cost, "target_cost", allow_zero=False)
    return _scalar_or_array((counts + 1.0) * target / ((gamma + 1.0) * (gamma * draft + target)))


def expected_tokens_per_step(alpha: Any, gamma: int) -> float | np.ndarray:
    """E[n + 1] = (1 - α^(γ+1)) / (1 - α) for per-token acceptance α (γ + 1 at α = 1).

    Not γα + 1: the first rejection ends the step, so n is truncated-geometric, not binomial.
    """
    gamma = _check_gamma(gamma)
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
    gamma = _check_gamma(gamma)
    draft = _check_cost(draft_cost, "draft_cost", allow_zero=True)
    target = _check_cost(target_cost, "target_cost", allow_zero=False)
    tokens = np.asarray(expected_tokens_per_step(alpha, gamma))
    return _scalar_or_array(tokens * target / ((gamma + 1.0) * (gamma * draft + target)))


REWARDS = {
    "acceptance_fraction": acceptance_fraction,
    "tokens_per_step": tokens_per_step,
    "throughput": throughput,
}
