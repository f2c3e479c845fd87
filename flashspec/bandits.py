"""Online draft selection: multi-armed bandit policies, one interface, batched over a leading axis.

Every policy answers `select(context=None) -> arm` and learns from `update(arm, reward)` with a reward
in [0, 1].  Because a speculative step reports more than one bit, statistics-based policies also take

* `update_step(arm, num_accepted, gamma)`: the step's outcome, n accepted of γ drafted.  Under a
  per-token acceptance rate α, n is a truncated geometric draw: n Bernoulli successes, then one
  failure unless n = γ.  Counting those trials gives the conjugate update Beta(a + n, b + [n < γ])
  for Thompson sampling and token-level counts for the UCB family.
* `update_full(rewards)` / `update_full_step(num_accepted, gamma)`: "full feedback", one observation
  for every arm (e.g. each draft scored on the verified tokens with draft forwards only).
* `on_request_start()`: a request boundary, where domain changes mostly arrive.  Statistics are
  multiplied by `request_decay` (1 keeps them, 0 resets to the prior, in between re-priors softly).

Batching: `batch_size=None` (the default) is the scalar interface the engine uses: `select` returns an
int and `update` takes scalars.  `batch_size=B` runs B independent copies at once (the simulator runs
one copy per seed this way): `select` returns an int64 array [B] and updates take arrays [B] (or
[B, n_arms] for full feedback).  The scalar interface is the batched code with B = 1, so simulations
and the engine share the same arithmetic.

State is plain data (`state_dict()` is JSON-serialisable, random generator included), so a
long-running engine can checkpoint its policy.
"""
from __future__ import annotations

import collections
import inspect
import math
from typing import Any, ClassVar

import numpy as np

from flashspec.policy import TINY_COUNT, CountPolicy, Policy, check_positive, check_unit_interval
from flashspec.rewards import check_step_gamma

__all__ = [
    "Policy",
    "UCB1",
    "SlidingWindowUCB",
    "DiscountedUCB",
    "ThompsonSampling",
    "DiscountedThompsonSampling",
    "GammaThompsonSampling",
    "DiscountedGammaThompsonSampling",
    "EXP3",
    "FixedArm",
    "Oracle",
    "POLICIES",
    "make_policy",
]


class _UCBIndex(CountPolicy):
    """Index = mean + sqrt(exploration · ln(total trials) / trials); an unobserved arm is played first."""

    def __init__(self, n_arms: int, *, exploration: float = 2.0, **kwargs: Any) -> None:
        self.exploration = check_positive(exploration, "exploration")
        super().__init__(n_arms, **kwargs)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "exploration": self.exploration}

    def _select(self, context: Any) -> np.ndarray:
        trials = self.trials
        total = np.maximum(trials.sum(axis=1, keepdims=True), 1.0)
        observed = trials > TINY_COUNT
        safe = np.where(observed, trials, 1.0)
        index = self.successes / safe + np.sqrt(self.exploration * np.log(total) / safe)
        index = np.where(observed, index, np.inf)
        return np.argmax(index, axis=1)


class UCB1(_UCBIndex):
    """UCB1 (Auer, Cesa-Bianchi & Fischer 2002): mean + sqrt(2 ln t / n_i); each arm once first."""

    name = "ucb1"


class SlidingWindowUCB(_UCBIndex):
    """SW-UCB (Garivier & Moulines 2011): UCB on the last `window` steps only, to follow changes."""

    name = "sw-ucb"

    def __init__(self, n_arms: int, *, window: int = 500, **kwargs: Any) -> None:
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window must be an int >= 1 (number of recent steps kept) (got {window!r})")
        self.window = int(window)
        super().__init__(n_arms, **kwargs)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "window": self.window}

    def _reset_state(self) -> None:
        super()._reset_state()
        # Ring buffer of the last `window` steps' observations, [rows, window, arms].
        self.buffer_successes = np.zeros((self._rows, self.window, self.n_arms))
        self.buffer_trials = np.zeros((self._rows, self.window, self.n_arms))
        self.position = 0

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**super()._arrays(), "buffer_successes": self.buffer_successes, "buffer_trials": self.buffer_trials}

    def _extra_state(self) -> dict[str, Any]:
        return {"position": self.position}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        self.position = int(extra["position"])

    def _observe(self, successes: np.ndarray, trials: np.ndarray) -> None:
        slot = self.position
        self.successes += successes - self.buffer_successes[:, slot]
        self.trials += trials - self.buffer_trials[:, slot]
        self.buffer_successes[:, slot] = successes
        self.buffer_trials[:, slot] = trials
        self.position = (slot + 1) % self.window
        # Running sums drift by rounding; keep them non-negative and exact at zero.
        np.maximum(self.trials, 0.0, out=self.trials)
        np.clip(self.successes, 0.0, self.trials, out=self.successes)

    def _decay_rows(self, factor: float, mask: np.ndarray | None) -> None:
        super()._decay_rows(factor, mask)
        scale = factor if mask is None else np.where(mask, factor, 1.0)[:, None, None]
        self.buffer_successes *= scale
        self.buffer_trials *= scale


class _Discounted:
    """Mixin: per-arm statistics decay by `discount` before each new observation."""

    def __init__(self, n_arms: int, *, discount: float = 0.99, **kwargs: Any) -> None:
        self.discount = check_unit_interval(discount, "discount")
        super().__init__(n_arms, **kwargs)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "discount": self.discount}

    def _observe(self, successes: np.ndarray, trials: np.ndarray) -> None:
        self.successes *= self.discount
        self.trials *= self.discount
        super()._observe(successes, trials)


class DiscountedUCB(_Discounted, _UCBIndex):
    """D-UCB (Kocsis & Szepesvári 2006; Garivier & Moulines 2011): statistics decay by `discount` per step."""

    name = "d-ucb"


class ThompsonSampling(CountPolicy):
    """Beta-Bernoulli Thompson sampling (Thompson 1933; Agrawal & Goyal 2012).

    Posterior for arm i: Beta(prior_alpha + successes_i, prior_beta + trials_i - successes_i).
    `update_step(arm, n, γ)` is the conjugate update Beta(a + n, b + [n < γ]) for per-token acceptance.
    """

    name = "thompson"

    def __init__(self, n_arms: int, *, prior_alpha: float = 1.0, prior_beta: float = 1.0, **kwargs: Any) -> None:
        self.prior_alpha = check_positive(prior_alpha, "prior_alpha")
        self.prior_beta = check_positive(prior_beta, "prior_beta")
        super().__init__(n_arms, **kwargs)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "prior_alpha": self.prior_alpha, "prior_beta": self.prior_beta}

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Beta parameters (alpha, beta), arrays [rows, arms]."""
        alpha = self.prior_alpha + self.successes
        beta = self.prior_beta + np.maximum(self.trials - self.successes, 0.0)
        return alpha, beta

    def _select(self, context: Any) -> np.ndarray:
        alpha, beta = self.posterior()
        return np.argmax(self.rng.beta(alpha, beta), axis=1)


class DiscountedThompsonSampling(_Discounted, ThompsonSampling):
    """Discounted Thompson sampling (Raj & Kalyani 2017): counts decay by `discount` per step."""

    name = "d-ts"


AUTO_BUDGET = 0.01  # `GammaThompsonSampling`'s budget against plain decoding when the plain arm is among its arms


class GammaThompsonSampling(ThompsonSampling):
    """Thompson sampling for (draft, γ) arms: one acceptance posterior per draft, one cost per arm.

    Arm a drafts γ_a tokens with draft d_a. A step of any arm of draft d is evidence about d's per-token
    acceptance α_d, and its likelihood (n successes, then a failure unless n = γ) does not depend on γ,
    so the arms of one draft share one posterior: Beta(prior + successes, prior + failures) summed over
    them. To select, draw α̃_d from each draft's posterior and play the arm with the most expected tokens
    per unit of step cost, (1 + α̃ + ... + α̃^γ_a) / c̃_a. Independent arms with a throughput reward must
    learn each γ from its own steps; here a step at γ = 2 also tells what γ = 6 would give.
    Measured costs are drawn too: c̃_a = c_a exp(σ z / √n_a), z standard normal, σ the pooled spread of log
    step times (`StepCosts.spread`) and n_a the steps behind the estimate (at most its `window`). With point costs, a few slow steps of the best arm could shut it out for good: its
    estimate only moves when it is played. Every arm is first played until `min_cost_steps` steps
    measure it (with shared costs, `StepCosts(groups=...)`, the steps of every arm of its group count).

    The arm structure and costs come from `bind_arms(arms, costs)`, which the engines call at the start of
    every `generate`, or from the `arms=` argument: `arms` is a list of (draft index, γ) and `costs` a
    `flashspec.rewards.StepCosts` (read at every select, so measured costs count as they arrive) or fixed
    per-arm costs; with no costs every arm costs 1. An arm measured by fewer than `min_cost_steps` steps
    is played first (the least played of them), so no arm is compared before its cost is measured. A
    `StepCosts` that the engine tells which steps changed draft also prices a switch: an arm of another draft than the
    last one played is compared at its switching cost (`StepCosts.costs_when`), so drafts that differ little are
    not swapped at a catch-up's price. Unbound, every arm is a draft of its own at γ = 1: plain Thompson
    sampling on acceptance.
    The engines feed it `update_step` per row (`learns_from_steps`); `update(arm, r)` counts r as r
    accepted tokens of one trial, as `ThompsonSampling` does.
    The plain arm (-1, 0) (`front.PLAIN`: the target alone) emits exactly one token per step: its expected tokens are
    1, it has no acceptance posterior, its steps (`update_step` with γ = 0) teach no draft's, and it counts as a draft
    of its own for switching (a draft played after it catches up on the token it missed).

    `budget` δ (with the plain arm among the arms and step costs; "auto", the default: `AUTO_BUDGET` when the
    plain arm is bound, else none): never fall more than δ behind plain decoding.
    The policy keeps a credit in tokens: what it has made minus (1 - δ) times what plain steps of cost c₀ would
    have made in the same cost, capped at `credit` (also its start). An arm whose step costs c risks
    (1 - δ) c / c₀ - T_low tokens, T_low its expected tokens at the draft's acceptance two posterior standard
    deviations below the mean (an arm not yet tried: about one token, the least a step makes). The policy plays
    the arm of most sampled tokens per cost among those whose risk the credit covers, less the risks of the steps
    launched and not yet read (`update_step` reads them); plain is always allowed, and earns δ per step. This is a
    conservative bandit (Wu et al. 2016) with realised tokens in the account: at the policy's cost estimates any
    stretch of steps makes at least (1 - δ) of plain decoding's tokens in the same cost, less `credit` + γ
    tokens (a step's loss beyond its risk is at most its T_low - 1). The plain arm's cost is measured first; an
    arm whose cost is not yet measured is priced at γ + 1 plain steps when it is chosen, and its step is left out of
    the account (the engines do not time a step that captures a graph); an arm whose risk exceeds `credit` is
    never played (a larger `credit` lets it be tried, and loosens the bound by as much). The price is slower
    exploration: a draft the policy has ruled out is tried again only as the credit allows. The engines give a
    step that the rows of a batch shared to `update_shared_step` (`front.update_policy`).
    """

    name = "gamma-ts"
    learns_from_steps: ClassVar[bool] = True  # engines give it step outcomes, not a throughput reward

    def __init__(self, n_arms: int, *, arms: Any = None, min_cost_steps: int = 3, budget: float | str | None = "auto",
                 credit: float = 4.0, **kwargs: Any) -> None:
        if isinstance(min_cost_steps, bool) or not isinstance(min_cost_steps, (int, np.integer)) or min_cost_steps < 1:
            raise ValueError(f"min_cost_steps must be an int >= 1 (steps that measure an arm's cost before it is "
                             f"compared), got {min_cost_steps!r}")
        if budget != "auto" and budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                                        or not 0.0 < budget < 1.0):
            raise ValueError(f"budget must be 'auto' ({AUTO_BUDGET} with the plain arm among the arms, else none), "
                             f"None (no limit) or a fraction in (0, 1) of plain decoding's throughput the policy may "
                             f"lose, e.g. 0.02, got {budget!r}")
        if isinstance(credit, bool) or not isinstance(credit, (int, float)) or not 0.0 < credit < math.inf:
            raise ValueError(f"credit must be a finite number of tokens > 0 (what the budget may bank), got "
                             f"{credit!r}")
        self.min_cost_steps = int(min_cost_steps)
        self.budget_option = budget if budget in ("auto", None) else float(budget)
        self.budget: float | None = None if budget in ("auto", None) else float(budget)  # as bound (`bind_arms`)
        self.credit = float(credit)
        self._arm_draft = np.arange(int(n_arms)) if isinstance(n_arms, (int, np.integer)) else np.zeros(0, int)
        self._n_drafts = len(self._arm_draft)
        self._arm_gamma = np.ones_like(self._arm_draft)
        self._plain = -1  # the plain arm's index (-1: none), kept with `_arm_gamma`
        self._costs: Any = None
        super().__init__(n_arms, **kwargs)
        if arms is not None:
            self.bind_arms(arms)

    def bind_arms(self, arms: Any, costs: Any = None) -> None:
        """Set the arms' (draft index, γ) and where their costs come from (`StepCosts`, a sequence, None)."""
        pairs = [tuple(pair) for pair in arms] if isinstance(arms, (list, tuple)) else None
        if pairs is None or len(pairs) != self.n_arms or not all(
                len(pair) == 2 and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair)
                and ((pair[0] >= 0 and pair[1] >= 1) or pair == (-1, 0)) for pair in pairs):
            raise ValueError(f"arms must be a list of {self.n_arms} (draft index >= 0, γ >= 1) pairs, or (-1, 0) for "
                             f"the plain arm, got {arms!r}")
        if costs is not None and not hasattr(costs, "costs"):
            fixed = np.asarray(costs, dtype=np.float64)
            if fixed.shape != (self.n_arms,) or not np.all(np.isfinite(fixed)) or np.any(fixed <= 0):
                raise ValueError(f"costs must be a StepCosts or {self.n_arms} finite costs > 0, got {costs!r}")
        drafts = np.array([pair[0] for pair in pairs], dtype=np.int64)
        plain = drafts < 0
        real = np.unique(drafts[~plain])
        # draft ids as 0..D-1; the plain arm gets D, a draft of its own with no posterior
        self._arm_draft = np.where(plain, len(real), np.searchsorted(real, drafts))
        self._n_drafts = len(real)
        self._arm_gamma = np.array([pair[1] for pair in pairs], dtype=np.int64)
        self._plain = int(np.flatnonzero(plain)[0]) if plain.any() else -1
        self._costs = costs
        if self.budget_option == "auto":
            self.budget = AUTO_BUDGET if plain.any() and costs is not None else None
        elif self.budget is not None and not plain.any():
            raise ValueError(f"budget={self.budget} measures the policy against plain decoding: the arms need the "
                             f"plain arm (-1, 0) (gammas with 0, e.g. gammas=[0, 4]), got {pairs!r}")

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "budget": self.budget_option, "credit": self.credit}

    def _reset_state(self) -> None:
        super()._reset_state()
        self.plays = np.zeros((self._rows, self.n_arms))
        self.last_draft = np.full(self._rows, -1.0)  # the draft of each row's last played arm (-1: none yet)
        self.banked = np.full(self._rows, self.credit)  # the budget's settled credit in tokens, per row
        # per step selected and not yet read: (switched, reserved risk) per row, oldest first
        self._pending: collections.deque[tuple[np.ndarray, np.ndarray]] = collections.deque()

    def _arrays(self) -> dict[str, np.ndarray]:
        return {**super()._arrays(), "plays": self.plays, "last_draft": self.last_draft, "banked": self.banked}

    def _extra_state(self) -> dict[str, Any]:
        return {"pending": [[part.tolist() for part in entry] for entry in self._pending]}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        self._pending = collections.deque((np.asarray(switched, dtype=bool), np.asarray(risk, dtype=float))
                                          for switched, risk in extra.get("pending", []))

    def on_request_start(self, rows: Any = None) -> None:
        """A request boundary: as `Policy.on_request_start`, and a request's first step is no switch (every
        draft starts from the prompt)."""
        super().on_request_start(rows)
        mask = self._rows_mask(rows)
        self.last_draft[slice(None) if mask is None else mask] = -1.0

    def arm_costs(self) -> np.ndarray:
        """Each arm's current cost over all its steps, [n_arms] (NaN where not measured yet)."""
        if self._costs is None:
            return np.ones(self.n_arms)
        values = getattr(self._costs, "costs", self._costs)
        return np.array([np.nan if value is None else float(value) for value in values])

    def _measured(self) -> bool:
        """Whether the costs come from measured steps (a `StepCosts` without fixed costs)."""
        return callable(getattr(self._costs, "costs_when", None)) and not self._costs.fixed

    def _under_measured(self) -> np.ndarray:
        """[arms]: True where fewer than `min_cost_steps` steps measured the arm (never with known costs)."""
        if self._costs is None:
            return np.zeros(self.n_arms, dtype=bool)
        if not self._measured():
            return np.isnan(self.arm_costs())
        return np.array(self._costs.steps["all"]) < self.min_cost_steps

    def _stay_go(self) -> tuple[np.ndarray, np.ndarray] | None:
        """([arms], [arms]): each arm's measured cost as a step that keeps the draft and as one that changes it
        (NaN where not measured yet), from a `StepCosts` source; None for any other (`_measured`)."""
        if not self._measured():
            return None
        stay, go = (np.array([np.nan if c is None else c for c in self._costs.costs_when(kind)])
                    for kind in (False, True))
        return stay, go

    def _row_costs(self, flat: np.ndarray, switched: np.ndarray, stay_go: tuple[np.ndarray, np.ndarray] | None
                   ) -> np.ndarray:
        """[rows, arms]: each arm's cost from where each row is, its switching cost where its draft is not
        the row's last one (`switched`, with `stay_go` from a `StepCosts` source), else `flat` (`arm_costs`);
        measured costs are drawn about their estimate (the class docstring)."""
        if stay_go is None:
            return np.broadcast_to(flat, (self._rows, self.n_arms))
        stay, go = stay_go
        costs = np.where(switched, go, stay)
        spread = self._costs.spread()
        if not spread:
            return costs
        steps = np.where(switched, *(np.array(self._costs.steps_when(kind), dtype=float) for kind in (True, False)))
        scale = spread / np.sqrt(np.clip(steps, 1.0, self._costs.window))  # the estimate's steps, at most its window
        return costs * np.exp(scale * self.rng.standard_normal(costs.shape))

    def draft_posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Beta parameters (alpha, beta) of each draft's per-token acceptance, arrays [rows, drafts] (the plain
        arm has none)."""
        groups = np.zeros((self.n_arms, self._n_drafts + 1))
        groups[np.arange(self.n_arms), self._arm_draft] = 1.0
        groups = groups[:, : self._n_drafts]
        failures = np.maximum(self.trials - self.successes, 0.0)
        return self.prior_alpha + self.successes @ groups, self.prior_beta + failures @ groups

    def update_step(self, arm: Any, num_accepted: Any, gamma: int) -> None:
        """As `Policy.update_step`; a plain step (γ = 0, nothing drafted, every count 0) is counted as a step
        and teaches no acceptance. With a budget, the step is also the oldest one selected and not yet read
        (its tokens enter the budget's account)."""
        self._learn_step_outcome(arm, num_accepted, gamma)
        self._settle(arm, np.asarray(num_accepted, dtype=float).reshape(-1), gamma)

    def update_shared_step(self, arm: Any, num_accepted: Any, gamma: int) -> None:
        """One step that several rows of a batch shared (one arm chosen for all; the engines' case, B rows and a
        policy of one row): each row's count teaches the posterior as `update_step` does, and the budget counts
        the step once, at the rows' mean tokens. No counts (every row had finished): the step only leaves the
        budget's list of steps not yet read."""
        counts = list(np.asarray(num_accepted).reshape(-1))
        for count in counts:
            self._learn_step_outcome(arm, count, gamma)
        self._settle(arm, np.asarray(counts, dtype=float), gamma)

    def _learn_step_outcome(self, arm: Any, num_accepted: Any, gamma: int) -> None:
        if check_step_gamma(gamma, plain=True) > 0:
            super().update_step(arm, num_accepted, gamma)
            return
        self._check_arm(arm)
        counts = np.asarray(num_accepted).reshape(-1)
        if counts.shape != (self._rows,) or np.any(counts != 0):
            raise ValueError(f"a plain step (gamma=0) accepts no drafts: num_accepted must be 0 per row, got "
                             f"{num_accepted!r}")
        self.t += 1

    def _select(self, context: Any) -> np.ndarray:
        alpha, beta = self.draft_posterior()
        tokens = self._tokens_at(self.rng.beta(alpha, beta))
        rows = np.arange(self._rows)
        unknown = self._under_measured()
        plain = self._plain_arm()
        switched = self._switched()
        stay_go = self._stay_go()  # read once: the budget and the choice use them
        allowed, risk = self._budget_allows(alpha, beta, switched, stay_go)
        if self.budget is not None and unknown[plain]:  # the budget's yardstick first: plain steps risk nothing
            arms = np.full(self._rows, plain)
        elif unknown.any():  # measure every arm's cost before comparing: the least played such arm
            arms = np.argmin(np.where(unknown, self.plays, np.inf), axis=1)
            arms = np.where(allowed[rows, arms], arms, plain)
        else:  # the most tokens per unit cost among the arms the budget allows
            costs = self._row_costs(self.arm_costs(), switched, stay_go)
            arms = np.argmax(np.where(allowed, tokens / costs, -np.inf), axis=1)
        if self.budget is not None:  # the choice's risk is reserved until its step is read
            self._pending.append((switched[rows, arms], np.maximum(risk[rows, arms], 0.0)))
        self.plays[rows, arms] += 1
        self.last_draft = self._arm_draft[arms].astype(float)
        return arms

    def _plain_arm(self) -> int:
        """The plain arm's index (-1 when the arms have none): read several times a step, so kept by `bind_arms`."""
        return self._plain

    def _cost_ratios(self, switched: np.ndarray, stay_go: tuple[np.ndarray, np.ndarray] | None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """([rows, arms] ratios, [rows, arms] bool): each arm's estimated step cost over the plain arm's, as a step
        that changes draft (`switched` [rows, arms]) or keeps it, and where that estimate is measured; an arm not
        measured yet (or any arm before the plain one is) counts as γ + 1 plain steps. `stay_go`: `_stay_go()`
        (None without measured costs)."""
        if stay_go is not None:
            stay, go = stay_go
            costs = np.where(switched, go, stay)
            plain_cost = stay[self._plain_arm()]
        else:
            costs = np.broadcast_to(self.arm_costs(), switched.shape)
            plain_cost = costs[0, self._plain_arm()]
        known = np.isfinite(costs) & bool(np.isfinite(plain_cost))
        known[:, self._plain_arm()] = True  # a plain step costs one plain step, measured or not
        ratios = np.where(known, costs / (plain_cost if np.isfinite(plain_cost) else 1.0), self._arm_gamma + 1.0)
        ratios[:, self._plain_arm()] = 1.0
        return ratios, known

    def _switched(self) -> np.ndarray:
        """[rows, arms]: whether playing each arm now would change the row's draft."""
        return (self.last_draft[:, None] >= 0) & (self._arm_draft[None, :] != self.last_draft[:, None])

    def _budget_allows(self, alpha: np.ndarray, beta: np.ndarray, switched: np.ndarray,
                       stay_go: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
        """([rows, arms] bool, [rows, arms] tokens): which arms the budget's credit, less what the steps not
        yet settled may lose, lets each row play, and what each arm's step may lose against plain steps of its
        cost at the acceptance's lower bound (the plain arm: nothing); `alpha`, `beta` the drafts' posterior,
        `switched` `_switched()`, `stay_go` as for `_cost_ratios`. Without a budget: every arm, no risk."""
        if self.budget is None:
            return np.ones((self._rows, self.n_arms), dtype=bool), np.zeros((self._rows, self.n_arms))
        if self._plain_arm() < 0 or self._costs is None:
            raise ValueError(f"budget={self.budget} needs the arms bound first, the plain arm among them, with step "
                             f"costs (a StepCosts or fixed costs): bind_arms([..., (-1, 0)], costs)")
        risk = (1.0 - self.budget) * self._cost_ratios(switched, stay_go)[0] - self._lower_tokens(alpha, beta)
        risk[:, self._plain_arm()] = 0.0  # a plain step makes its one token: it can only earn
        reserved = sum((entry[1] for entry in self._pending), np.zeros(self._rows))
        allowed = (self.banked - reserved)[:, None] >= risk
        allowed[:, self._plain_arm()] = True  # the way back to credit, whatever is left
        return allowed, risk

    def _lower_tokens(self, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
        """[rows, arms]: each arm's expected tokens per step at its draft's acceptance two posterior standard
        deviations below the mean of Beta(`alpha`, `beta`) (about its 2 % quantile; 1 for the plain arm): what the
        budget counts on."""
        total = alpha + beta
        return self._tokens_at(np.clip(alpha / total - 2.0 * np.sqrt(alpha * beta / (total * total * (total + 1.0))),
                                       0.0, 1.0))

    def _tokens_at(self, rates: np.ndarray) -> np.ndarray:
        """[rows, arms]: each arm's expected tokens per step, 1 + α + ... + α^γ, at its draft's acceptance in
        `rates` [rows, drafts] (the plain arm: 1)."""
        # the plain arm's "draft" reads 1, so its tokens are 1 + 0 (γ = 0)
        rate = np.concatenate([rates, np.ones((self._rows, 1))], axis=1)[:, self._arm_draft]
        exponent = self._arm_gamma + 1.0
        below = rate < 1.0  # written so α = 1 gives γ + 1 exactly (and α = 0 gives 1: log 0 = -inf)
        with np.errstate(divide="ignore"):
            return np.where(below, -np.expm1(exponent * np.log(np.where(below, rate, 0.5))) /
                            np.where(below, 1.0 - rate, 1.0), exponent)

    def _settle(self, arm: Any, counts: np.ndarray, gamma: int) -> None:
        """The budget's account of the oldest step selected and not yet read: its tokens (one more than each
        count in `counts`, per row; with one row and several counts, their mean) against (1 - δ) times the plain
        steps its cost would have bought; a step of an arm whose cost is not measured yet counts nothing (the
        engines measure no step that captures a graph). No counts: the step leaves the list only. Without a budget:
        nothing."""
        if self.budget is None:
            return
        entry = self._pending.popleft() if self._pending else None
        if not len(counts):  # a step after every row finished made nothing to count
            return
        arms = self._check_arm(arm)
        if self._rows > 1 and counts.shape != (self._rows,):
            raise ValueError(f"num_accepted must hold one count per row ({self._rows}), got {counts.tolist()!r}")
        tokens = (np.full(self._rows, counts.mean()) if self._rows == 1 else counts) + 1.0
        switched = entry[0] if entry is not None else np.zeros(self._rows, dtype=bool)
        table = np.zeros((self._rows, self.n_arms), dtype=bool)
        table[np.arange(self._rows), arms] = switched
        ratios, known = self._cost_ratios(table, self._stay_go())
        rows = np.arange(self._rows)
        # a step whose arm has no measured cost yet (its graph's first run: the capture) is left out of the account
        change = np.where(known[rows, arms], tokens - (1.0 - self.budget) * ratios[rows, arms], 0.0)
        self.banked = np.minimum(self.banked + change, self.credit)


class DiscountedGammaThompsonSampling(_Discounted, GammaThompsonSampling):
    """`GammaThompsonSampling` whose counts decay by `discount` per step (follows a changing domain)."""

    name = "d-gamma-ts"


class EXP3(Policy):
    """EXP3 (Auer et al. 2002b), the adversarial baseline: exponential weights on importance-weighted rewards.

    `exploration_rate` defaults to Auer's tuning min(1, sqrt(K ln K / ((e - 1) T))) when `horizon` T is
    given, else 0.1.  Full feedback turns it into Hedge (no importance weighting needed).
    """

    name = "exp3"

    def __init__(
        self, n_arms: int, *, exploration_rate: float | None = None, horizon: int | None = None, **kwargs: Any
    ) -> None:
        if exploration_rate is None:
            if horizon is not None:
                if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
                    raise ValueError(f"horizon must be an int >= 1 (got {horizon!r})")
                k = max(int(n_arms), 2) if isinstance(n_arms, (int, np.integer)) else 2
                exploration_rate = min(1.0, math.sqrt(k * math.log(k) / ((math.e - 1.0) * horizon)))
            else:
                exploration_rate = 0.1
        self.exploration_rate = check_unit_interval(exploration_rate, "exploration_rate")
        if self.exploration_rate == 0.0:
            raise ValueError("exploration_rate must be > 0 (EXP3 needs every arm's probability positive)")
        super().__init__(n_arms, **kwargs)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "exploration_rate": self.exploration_rate}

    def _reset_state(self) -> None:
        self.log_weights = np.zeros((self._rows, self.n_arms))
        self._row_index = np.arange(self._rows)

    def _arrays(self) -> dict[str, np.ndarray]:
        return {"log_weights": self.log_weights}

    def probabilities(self) -> np.ndarray:
        """Current arm probabilities, array [rows, arms]."""
        weights = np.exp(self.log_weights - self.log_weights.max(axis=1, keepdims=True))
        weights /= weights.sum(axis=1, keepdims=True)
        return (1.0 - self.exploration_rate) * weights + self.exploration_rate / self.n_arms

    def _select(self, context: Any) -> np.ndarray:
        cumulative = np.cumsum(self.probabilities(), axis=1)
        draws = self.rng.random((self._rows, 1)) * cumulative[:, -1:]
        return np.minimum((cumulative < draws).sum(axis=1), self.n_arms - 1)

    def _learn_played(self, arms: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        played = self.probabilities()[self._row_index, arms]
        self.log_weights[self._row_index, arms] += self.exploration_rate * successes / (played * self.n_arms)
        self.log_weights -= self.log_weights.max(axis=1, keepdims=True)

    def _learn_all(self, successes: np.ndarray, trials: np.ndarray) -> None:
        rewards = successes / np.maximum(trials, 1.0)
        self.log_weights += self.exploration_rate * rewards / self.n_arms
        self.log_weights -= self.log_weights.max(axis=1, keepdims=True)

    def _decay_rows(self, factor: float, mask: np.ndarray | None) -> None:
        scale = factor if mask is None else np.where(mask, factor, 1.0)[:, None]
        self.log_weights *= scale


class FixedArm(Policy):
    """Always plays `arm` (a baseline, and "the draft you would have hard-coded")."""

    name = "fixed"

    def __init__(self, n_arms: int, *, arm: int = 0, **kwargs: Any) -> None:
        if isinstance(arm, bool) or not isinstance(arm, (int, np.integer)) or not 0 <= arm < n_arms:
            raise ValueError(f"arm must be an int in [0, n_arms - 1] (got {arm!r} with n_arms={n_arms!r})")
        self.arm = int(arm)
        super().__init__(n_arms, **kwargs)

    def _params(self) -> dict[str, Any]:
        return {**super()._params(), "arm": self.arm}

    def _select(self, context: Any) -> np.ndarray:
        return np.full(self._rows, self.arm, dtype=np.int64)


class Oracle(Policy):
    """Plays the best arm at each moment; `select(context)` takes the true per-arm values (simulation only)."""

    name = "oracle"
    needs_true_values = True

    def _select(self, context: Any) -> np.ndarray:
        if context is None:
            raise ValueError("Oracle.select needs context = the true per-arm values, shape [n_arms] or [batch, n_arms]")
        values = np.asarray(context, dtype=np.float64)
        if values.shape[-1] != self.n_arms:
            raise ValueError(f"context must have {self.n_arms} values per row (got shape {values.shape})")
        return np.broadcast_to(np.argmax(values, axis=-1), (self._rows,)).astype(np.int64)


POLICIES: dict[str, type[Policy]] = {
    "ucb1": UCB1,
    "ucb": UCB1,
    "thompson": ThompsonSampling,
    "ts": ThompsonSampling,
    "sw-ucb": SlidingWindowUCB,
    "sliding-window-ucb": SlidingWindowUCB,
    "d-ucb": DiscountedUCB,
    "discounted-ucb": DiscountedUCB,
    "d-ts": DiscountedThompsonSampling,
    "discounted-thompson": DiscountedThompsonSampling,
    "gamma-ts": GammaThompsonSampling,
    "d-gamma-ts": DiscountedGammaThompsonSampling,
    "exp3": EXP3,
    "fixed": FixedArm,
    "oracle": Oracle,
}


def make_policy(name: str, n_arms: int, **kwargs: Any) -> Policy:
    """Build a policy by name ("ucb1", "thompson", "sw-ucb", "d-ucb", "d-ts", "gamma-ts", "d-gamma-ts", "exp3",
    "fixed", "oracle").

    Keyword arguments go to the class (seed, batch_size, request_decay, window, discount, ...).
    """
    cls = policy_class(name)
    options = policy_options(cls)
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        raise ValueError(f"policy_kwargs {unknown} are not options of policy {name!r} ({cls.__name__}); "
                         f"it takes: {', '.join(options)}")
    return cls(n_arms, **kwargs)


def policy_class(name: str) -> type[Policy]:
    """The policy class a name stands for (case, surrounding spaces and "_" for "-" ignored)."""
    if not isinstance(name, str):
        raise ValueError(f"policy name must be a string, one of {sorted(POLICIES)} (got {name!r})")
    key = name.strip().lower().replace("_", "-")
    if key not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; known policies: {', '.join(sorted(POLICIES))}")
    return POLICIES[key]


def policy_options(cls: type[Policy]) -> list[str]:
    """The keyword options a policy class takes through its constructors, its own and its bases'."""
    options: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for parameter in inspect.signature(init).parameters.values():
            if parameter.kind is parameter.KEYWORD_ONLY or (
                    parameter.kind is parameter.POSITIONAL_OR_KEYWORD and parameter.name not in ("self", "n_arms")):
                options.add(parameter.name)
    return sorted(options)

