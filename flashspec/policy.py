"""The bandit policies' common ground: `Policy` (validation, batching over a leading axis, request boundaries,
plain-data state) and `CountPolicy` (per-arm success and trial counts, the geometric step update). The policies
themselves are in `flashspec.bandits`, which documents the interface.
"""
from __future__ import annotations

import abc
import math
import operator
from typing import Any, ClassVar

import numpy as np

from flashspec.rewards import check_step_gamma

TINY_COUNT = 1e-12  # a count below this is treated as "never observed" (infinite UCB bonus)


def _make_generator(seed: int | np.random.Generator | np.random.SeedSequence | None) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    if isinstance(seed, bool) or not (seed is None or isinstance(seed, (int, np.integer, np.random.SeedSequence))):
        raise ValueError(f"seed must be an int, a numpy Generator/SeedSequence or None (got {seed!r})")
    return np.random.default_rng(seed)


def check_unit_interval(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number in [0, 1] (got {value!r})")
    value = float(value)
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a finite number in [0, 1] (got {value!r})")
    return value


def check_positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a positive number (got {value!r})")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be a finite number > 0 (got {value!r})")
    return value


class Policy(abc.ABC):
    """Base class: validation, batching, request boundaries and state for every policy."""

    name: ClassVar[str] = "policy"
    needs_true_values: ClassVar[bool] = False  # only the Oracle reads the environment's true values

    def __init__(
        self,
        n_arms: int,
        *,
        batch_size: int | None = None,
        seed: int | np.random.Generator | np.random.SeedSequence | None = None,
        request_decay: float = 1.0,
    ) -> None:
        if isinstance(n_arms, bool) or not isinstance(n_arms, (int, np.integer)) or n_arms < 1:
            raise ValueError(f"n_arms must be an int >= 1 (got {n_arms!r})")
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1
        ):
            raise ValueError(f"batch_size must be None (scalar interface) or an int >= 1 (got {batch_size!r})")
        self.n_arms = int(n_arms)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.request_decay = check_unit_interval(request_decay, "request_decay")
        self.rng = _make_generator(seed)
        self.t = 0  # number of updates (steps) observed since the last reset
        self.reset()

    # ----------------------------------------------------------------- shapes and validation
    @property
    def _rows(self) -> int:
        return 1 if self.batch_size is None else self.batch_size

    def _check_arm(self, arm: Any) -> np.ndarray:
        if self.batch_size is None:
            if isinstance(arm, (bool, np.bool_)):
                raise ValueError(f"arm must be an int in [0, {self.n_arms - 1}] (got {arm!r})")
            try:
                index = operator.index(arm)  # int, numpy integer, or a 0-d integer array/tensor
            except TypeError:
                raise ValueError(f"arm must be an int in [0, {self.n_arms - 1}] (got {arm!r})") from None
            arms = np.array([index], dtype=np.int64)
        else:
            arms = np.asarray(arm)
            if arms.shape != (self.batch_size,) or not np.issubdtype(arms.dtype, np.integer):
                raise ValueError(f"arm must be an integer array of shape ({self.batch_size},) (got {arms.dtype} {arms.shape})")
            arms = arms.astype(np.int64, copy=False)
        if arms.min() < 0 or arms.max() >= self.n_arms:
            raise ValueError(f"arm must be in [0, {self.n_arms - 1}] (got {arm!r})")
        return arms

    def _check_reward(self, reward: Any, shape: tuple[int, ...], name: str = "reward") -> np.ndarray:
        if self.batch_size is None and shape == (1,):
            if reward is None or isinstance(reward, (bool, np.bool_, str, bytes)) or np.ndim(reward) != 0:
                raise ValueError(f"{name} must be a number in [0, 1] (got {reward!r})")
        try:
            values = np.asarray(reward, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{name} must be numbers in [0, 1] (got {reward!r})") from error
        if self.batch_size is None:
            values = values.reshape(-1)
        if values.shape != shape:
            raise ValueError(f"{name} must have shape {shape} (got {np.shape(reward)})")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{name} must be finite (got NaN or inf)")
        if values.min() < 0.0 or values.max() > 1.0:
            hint = ""
            if values.max() > 1.0 and np.all(values == np.round(values)):
                hint = "; it looks like an accepted-token count: use update_step(arm, num_accepted, gamma)"
            raise ValueError(f"{name} must be in [0, 1] (got {reward!r}){hint}")
        return values

    def _check_step(self, num_accepted: Any, gamma: Any, shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
        gamma = check_step_gamma(gamma)
        counts = np.asarray(num_accepted)
        if self.batch_size is None:
            counts = counts.reshape(-1)
        if counts.dtype == bool:
            raise ValueError(f"num_accepted must be integer(s) in [0, gamma], not booleans (got {num_accepted!r})")
        if counts.shape != shape or not np.issubdtype(counts.dtype, np.integer):
            if counts.shape == shape and np.issubdtype(counts.dtype, np.floating) and np.all(counts == np.round(counts)):
                counts = counts.astype(np.int64)
            else:
                raise ValueError(f"num_accepted must be integer(s) of shape {shape} (got {num_accepted!r})")
        if counts.min() < 0 or counts.max() > gamma:
            raise ValueError(f"num_accepted must be in [0, gamma={gamma}] (got {num_accepted!r})")
        return counts.astype(np.float64), int(gamma)

    def _rows_mask(self, rows: Any) -> np.ndarray | None:
        if rows is None:
            return None
        mask = np.asarray(rows, dtype=bool).reshape(-1)
        if mask.shape != (self._rows,):
            raise ValueError(f"rows must be a boolean mask of shape ({self._rows},) (got {np.shape(rows)})")
        return mask

    def _output(self, arms: np.ndarray) -> int | np.ndarray:
        return int(arms[0]) if self.batch_size is None else arms

    # ----------------------------------------------------------------- public interface
    def select(self, context: Any = None) -> int | np.ndarray:
        """Choose an arm (int; int64 array [batch_size] in batched mode)."""
        return self._output(self._select(context))

    def update(self, arm: Any, reward: Any) -> None:
        """Learn from one reward in [0, 1] for the arm that was played."""
        arms = self._check_arm(arm)
        rewards = self._check_reward(reward, (self._rows,))
        self._learn_played(arms, rewards, np.ones(self._rows))
        self.t += 1

    def update_step(self, arm: Any, num_accepted: Any, gamma: int) -> None:
        """Learn from a speculative step: num_accepted of gamma drafted tokens were accepted."""
        arms = self._check_arm(arm)
        counts, gamma = self._check_step(num_accepted, gamma, (self._rows,))
        self._learn_step(arms, counts, gamma)
        self.t += 1

    def update_full(self, rewards: Any) -> None:
        """Full feedback: a reward in [0, 1] for every arm (shape [n_arms], or [batch_size, n_arms])."""
        values = self._check_reward(rewards, (self._rows, self.n_arms) if self.batch_size else (self.n_arms,), "rewards")
        self._learn_all(values.reshape(self._rows, self.n_arms), np.ones((self._rows, self.n_arms)))
        self.t += 1

    def update_full_step(self, num_accepted: Any, gamma: int) -> None:
        """Full feedback for steps: the accepted count every arm would have had (n_k of gamma)."""
        shape = (self._rows, self.n_arms) if self.batch_size else (self.n_arms,)
        counts, gamma = self._check_step(num_accepted, gamma, shape)
        counts = counts.reshape(self._rows, self.n_arms)
        self._learn_all(counts, counts + (counts < gamma))
        self.t += 1

    def on_request_start(self, rows: Any = None) -> None:
        """A new request begins (in the rows of `rows`, a boolean mask; all rows if None).

        Statistics are scaled by `request_decay`: 1.0 ignores boundaries, 0.0 resets to the prior.
        """
        mask = self._rows_mask(rows)
        if self.request_decay < 1.0:
            self._decay_rows(self.request_decay, mask)

    def reset(self) -> None:
        """Forget everything learned (the random generator keeps its stream)."""
        self.t = 0
        self._reset_state()

    def reseed(self, seed: int | np.random.Generator | np.random.SeedSequence | None) -> None:
        """Restart the random generator from `seed`; what was learned is kept. The engine calls it
        with a seed derived from `generate(seed=...)`, so one seed fixes the policy's draws too."""
        self.rng = _make_generator(seed)

    # ----------------------------------------------------------------- state as plain data
    def _params(self) -> dict[str, Any]:
        return {"request_decay": self.request_decay}

    def _arrays(self) -> dict[str, np.ndarray]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume, as JSON-serialisable plain data."""
        return {
            "policy": self.name,
            "n_arms": self.n_arms,
            "batch_size": self.batch_size,
            "params": self._params(),
            "t": self.t,
            "arrays": {key: value.tolist() for key, value in self._arrays().items()},
            "extra": self._extra_state(),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by `state_dict()` of the same policy and shape."""
        if state.get("policy") != self.name:
            raise ValueError(f"state is for policy {state.get('policy')!r}, not {self.name!r}")
        if state.get("n_arms") != self.n_arms or state.get("batch_size") != self.batch_size:
            raise ValueError(
                f"state has n_arms={state.get('n_arms')}, batch_size={state.get('batch_size')}; "
                f"this policy has n_arms={self.n_arms}, batch_size={self.batch_size}"
            )
        if state.get("params") != self._params():
            raise ValueError(f"state params {state.get('params')} differ from this policy's {self._params()}")
        current = self._arrays()
        for key, value in current.items():
            loaded = np.asarray(state["arrays"][key], dtype=value.dtype)
            if loaded.shape != value.shape:
                raise ValueError(f"state array {key!r} has shape {loaded.shape}, expected {value.shape}")
            value[...] = loaded
        self._load_extra_state(state.get("extra", {}))
        self.t = int(state["t"])
        self.rng.bit_generator.state = state["rng"]

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        return None

    # ----------------------------------------------------------------- subclass hooks
    def _reset_state(self) -> None:
        return None

    @abc.abstractmethod
    def _select(self, context: Any) -> np.ndarray:
        """The arm of each row, [rows] ints: what makes one policy differ from another."""

    def _learn_played(self, arms: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        return None

    def _learn_step(self, arms: np.ndarray, counts: np.ndarray, gamma: int) -> None:
        self._learn_played(arms, counts / gamma, np.ones(self._rows))

    def _learn_all(self, successes: np.ndarray, trials: np.ndarray) -> None:
        return None

    def _decay_rows(self, factor: float, mask: np.ndarray | None) -> None:
        return None

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self._params().items())
        return f"{type(self).__name__}(n_arms={self.n_arms}, batch_size={self.batch_size}, {params})"


class CountPolicy(Policy):
    """Keeps, per arm, a (possibly discounted) sum of successes and number of trials, arrays [rows, arms].

    A reward r in [0, 1] counts as r successes in 1 trial; a step with n of γ accepted counts as n
    successes in n + [n < γ] per-token trials (the geometric likelihood's sufficient statistics).
    """

    def _reset_state(self) -> None:
        self.successes = np.zeros((self._rows, self.n_arms))
        self.trials = np.zeros((self._rows, self.n_arms))
        self._row_index = np.arange(self._rows)

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"successes": self.successes, "trials": self.trials}

    def _observe(self, successes: np.ndarray, trials: np.ndarray) -> None:
        """Add one step's observations (arrays [rows, arms], zeros for unobserved arms)."""
        self.successes += successes
        self.trials += trials

    def _one_hot(self, arms: np.ndarray, values: np.ndarray) -> np.ndarray:
        out = np.zeros((self._rows, self.n_arms))
        out[self._row_index, arms] = values
        return out

    def _learn_played(self, arms: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        self._observe(self._one_hot(arms, successes), self._one_hot(arms, trials))

    def _learn_step(self, arms: np.ndarray, counts: np.ndarray, gamma: int) -> None:
        self._learn_played(arms, counts, counts + (counts < gamma))

    def _learn_all(self, successes: np.ndarray, trials: np.ndarray) -> None:
        self._observe(successes, trials)

    def _decay_rows(self, factor: float, mask: np.ndarray | None) -> None:
        scale = factor if mask is None else np.where(mask, factor, 1.0)[:, None]
        self.successes *= scale
        self.trials *= scale


