"""The speculative generation loop: a Hugging Face target, a pool of drafters, a bandit choosing the
drafter per step, on-device verification, exact output (book/design.md §1).

One step:
  1. the policy picks an arm from the past only (`policy.select()`);
  2. that drafter proposes γ tokens per row, sampled from its warped distribution on
     rng.STREAM_DRAFT with the step key, and returns the logits it sampled from;
  3. one target forward over γ + 1 positions (the last known token + the γ drafts);
  4. `flashspec.verify` (backend "auto": Triton on CUDA, PyTorch on CPU) with an int generator
     derived from (seed, step) -- the verifier's own streams, never the draft's;
  5. ONE host transfer per step (tokens + num_accepted, [B, γ+2] ints): the KV caches must be
     rolled back to the accepted lengths, which eager Hugging Face caches can only do with host
     integers. That sync is inherent in HF eager; everything else in the step stays on the device;
  6. append; crop the target's and the chosen drafter's caches; reward -> `policy.update`.
Drafters not chosen catch up lazily the next time they propose.

Adaptive γ (`gammas=`): the arms are (drafter, γ) pairs and the policy learns from the throughput
reward (tokens per second of each arm's step, `flashspec.rewards.StepCosts`) how far to speculate.

Batches (B > 1): rows keep their own lengths. Each row appends its own num_accepted + 1 tokens
(cut only by its own budget or EOS), so nothing accepted is thrown away and every row is an exact
speculative decoder of its own (Theorem 1 per row; the arm choice is shared but comes from the
past). The KV caches stay whole-batch `DynamicCache`s: each step appends γ + 1 columns for every
row, the columns a row rejected become holes in its attention mask (position ids come from each
row's own token count), and trailing columns that are holes in every row are cropped with
`crop(-k)`. The cost is attention over hole columns, reported as `kv_cache_fill` (real tokens /
cache columns) in the stats. (Truncating every row to the batch's minimum accepted length is also
exact, but throws accepted tokens away: with a handful of rows most steps keep one token per row.)
The per-row counts go back to the device as small host-to-device copies right after the step's
one device-to-host sync, when the stream is already idle.

The model call lives in `flashspec.models.forward_logits`, the one function a static-cache /
CUDA-graph fast path replaces.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flashspec import models, rng
from flashspec.drafters import DraftContext, Proposal, as_drafter
from flashspec.rewards import StepCosts
from flashspec.sampling import SamplingParams
from flashspec.stats import GenerationStats, StepRecord
from flashspec.checks import (check_budgets, check_draft_positions, check_finite, check_prompt,  # noqa: F401
                              check_token_ids, nonfinite_rows, resolve_pad)
from flashspec.verify import verify

DRAFT_KEY_TAG = 0x0D4AF7  # separates draft keys from the verifier's key derive_seed(seed, step)
POLICY_SEED_TAG = 0x9011C7  # the policy's generator restarts from derive_seed(seed, POLICY_SEED_TAG)
# A step drafts at most this many tokens. Acceptance decays geometrically with the position, so a
# longer speculation only allocates memory; the bound stops absurd values before they allocate.
MAX_GAMMA = 256


@dataclass
class GenerationResult:
    """sequences: [B, prompt + generated], right-padded with the pad id after each row's end;
    num_generated: [B] tokens generated per row (EOS included); stats: GenerationStats."""

    sequences: torch.Tensor
    num_generated: torch.Tensor
    stats: GenerationStats


@dataclass(frozen=True)
class StepEvent:
    """Passed to `on_step` after each step: the tokens each row appended (host lists, pad after EOS)."""

    step: int
    arm: int
    new_tokens: list[list[int]]
    num_generated: list[int]
    gamma: int | None = None  # the step's drafted tokens per row


def check_gamma(gamma: Any) -> int:
    """`gamma` as validated: an int in [1, MAX_GAMMA]."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 1 <= gamma <= MAX_GAMMA:
        raise ValueError(
            f"gamma must be an int in [1, {MAX_GAMMA}] (drafted tokens per step; 2-8 is typical), got {gamma!r}"
        )
    return gamma


def check_gammas(gammas: Any) -> tuple[int, ...] | None:
    """`gammas` as validated: None, or distinct ints in [1, MAX_GAMMA] (the γ values arms may use)."""
    if gammas is None:
        return None
    if isinstance(gammas, (str, bytes, int)) or not isinstance(gammas, Sequence) or len(gammas) == 0:
        raise ValueError(f"gammas must be None or a non-empty list of ints, e.g. [2, 4, 8], got {gammas!r}")
    for value in gammas:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GAMMA:
            raise ValueError(f"gammas must hold ints in [1, {MAX_GAMMA}] (drafted tokens per step), got {value!r} "
                             f"in {list(gammas)!r}")
    if len(set(gammas)) != len(gammas):
        raise ValueError(f"gammas must not repeat a value (each γ is one arm per draft), got {list(gammas)!r}; "
                         f"drop the duplicates")
    return tuple(gammas)


def make_arms(n_drafts: int, gamma: int, gammas: tuple[int, ...] | None) -> list[tuple[int, int]]:
    """The arms as (draft index, γ): one per draft at `gamma`, or every draft × every γ of `gammas`
    (draft-major: arm = draft · len(gammas) + position of γ)."""
    if gammas is None:
        return [(draft, gamma) for draft in range(n_drafts)]
    return [(draft, value) for draft in range(n_drafts) for value in gammas]


# The config fields a draft's step cost depends on besides its parameter count, dtype and device.
COST_CONFIG_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                      "num_key_value_heads")


def cost_signature(draft: Any) -> Hashable:
    """What a draft's step cost depends on: equal signatures mean the same compute per step.

    A torch module (or a drafter holding one as `.model`, like `ModelDrafter`): its class name, parameter
    count, the dtype and device of its first parameter and the shape fields of its `config` (None where
    absent); a wrapper's class name is added, since another drafter may run the same model differently.
    Anything else (a `PromptLookupDrafter`, an unknown drafter) shares with nothing: ("object", id(draft)).
    """
    model = draft if isinstance(draft, torch.nn.Module) else getattr(draft, "model", None)
    if not isinstance(model, torch.nn.Module):
        return ("object", id(draft))
    first = next(model.parameters(), None)
    config = getattr(model, "config", None)
    shape = tuple(_hashable(getattr(config, field, None)) for field in COST_CONFIG_FIELDS)
    kind = type(model).__name__ if draft is model else f"{type(draft).__name__}({type(model).__name__})"
    return (kind, sum(parameter.numel() for parameter in model.parameters()),
            None if first is None else str(first.dtype), None if first is None else str(first.device), shape)


def _hashable(value: Any) -> Hashable:
    """A config value as a hashable (a list, e.g. per-layer sizes, becomes a tuple)."""
    return tuple(value) if isinstance(value, list) else value


def arm_cost_groups(arms: list[tuple[int, int]], drafts: Sequence[Any]) -> list[Hashable]:
    """Each arm's cost group for `StepCosts(groups=...)`: (its draft's `cost_signature`, γ), so arms whose
    drafts run the same compute at the same γ share their measured costs. An arm without a draft (plain
    decoding's draft index -1) is a group of its own."""
    return [(cost_signature(drafts[draft]), gamma) if 0 <= draft < len(drafts) else ("arm", arm)
            for arm, (draft, gamma) in enumerate(arms)]


def make_step_costs(arms: list[tuple[int, int]], gammas: tuple[int, ...] | None,
                    arm_costs: Sequence[float] | None, groups: Sequence[Hashable] | None = None) -> StepCosts | None:
    """The throughput reward's cost model when arms carry their own γ (None keeps the acceptance reward).
    `groups` (`arm_cost_groups`): arms of one group share measured costs."""
    if gammas is None:
        if arm_costs is not None:
            raise ValueError("arm_costs sets the cost of each (draft, γ) arm: pass gammas=[...] with it")
        return None
    return StepCosts(len(arms), fixed=arm_costs, groups=groups)


def resolve_policy(policy: Any, n_arms: int, **policy_kwargs: Any) -> Any:
    """A policy object from a name (`flashspec.bandits.make_policy`) or an object with select/update."""
    if isinstance(policy, str):
        try:
            from flashspec import bandits
        except ImportError as error:
            raise ValueError(
                f"policy={policy!r} needs flashspec.bandits, which failed to import ({error}); pass a policy object"
            ) from error
        try:
            policy = bandits.make_policy(policy, n_arms, **policy_kwargs)
        except (KeyError, ValueError, TypeError) as error:
            raise ValueError(f"unknown or invalid policy {policy!r}: {error}") from error
    if getattr(policy, "needs_true_values", False):
        raise ValueError(
            f"policy {getattr(policy, 'name', policy)!r} reads the true per-arm values (simulation only); "
            "pick a learning policy such as 'thompson'"
        )
    if all(callable(getattr(policy, method, None)) for method in ("select", "update")):
        return policy
    raise ValueError(
        f"policy must be a policy name (e.g. 'thompson') or an object with select()/update(arm, reward), "
        f"got {type(policy).__name__}"
    )


class SpeculativeDecoder:
    """Exact speculative decoding with a bandit-chosen draft per step.

    Args:
        target: a Hugging Face causal LM (the distribution the output follows exactly).
        drafts: HF causal LMs sharing the target's tokenizer and/or Drafter objects
            (e.g. `PromptLookupDrafter()`); each is one arm of the bandit.
        policy: a name for `flashspec.bandits.make_policy` or a policy object (select/update/reset).
        gamma: drafted tokens per step (1 <= γ <= 256; a step never drafts past the token budget).
        gammas: None (one arm per draft, at `gamma`), or distinct γ values: then the arms are every
            (draft, γ) pair, draft-major, named "<draft>@γ=<γ>", and the policy learns from the
            throughput reward (`flashspec.rewards.StepCosts`: each step's tokens over its arm's
            moving-average wall time, relative to the best arm's rate), so it learns how far to
            speculate as well as which draft. `policy="gamma-ts"` (`bandits.GammaThompsonSampling`)
            instead shares each draft's acceptance across its γ arms and reads the same costs:
            it learns the arms from fewer steps (the CLI's choice with --gammas). Arms whose drafts run
            the same compute (`cost_signature`) at the same γ share their measured costs (`cost_groups`).
        arm_costs: with `gammas`, fixed per-arm step costs (any unit) instead of measured times,
            e.g. from a benchmark: the choices then depend on the seed only (reproducible runs).
        policy_kwargs: extra arguments for `make_policy` (e.g. window, discount). Its random
            generator is restarted by every `generate` call from that call's `seed`.
        backend: verify backend, "auto" | "torch" | "triton".

    The arm of each step comes from `_choose_and_propose`, which asks the policy (the past only);
    the exactness tests override it in a subclass to build a cherry-picking negative control.

    Exactness with measured costs: the reward of step t uses the wall times of steps <= t, which are
    part of the past of every later step, and the uniforms of later steps are counter-based
    functions of (seed, step), independent of any timing. So the choice of (draft, γ) at step t is
    still a function of the past plus independent coins, and Theorem 1 holds (design notes §1).
    What timing changes is reproducibility: with measured costs the same seed can choose other arms
    (each output still exactly the target's distribution); `arm_costs` makes it depend on the seed only.
    """

    def __init__(
        self,
        target: torch.nn.Module,
        drafts: Sequence[Any],
        policy: Any = "thompson",
        gamma: int = 4,
        policy_kwargs: dict[str, Any] | None = None,
        backend: str = "auto",
        gammas: Sequence[int] | None = None,
        arm_costs: Sequence[float] | None = None,
    ) -> None:
        check_gamma(gamma)
        self.gammas = check_gammas(gammas)
        if not hasattr(target, "config") or not callable(target):
            raise ValueError(f"target must be a Hugging Face causal LM, got {type(target).__name__}")
        if isinstance(drafts, (torch.nn.Module, str)) or not isinstance(drafts, Sequence) or len(drafts) == 0:
            raise ValueError("drafts must be a non-empty list of draft models and/or Drafter objects")
        self.target = target
        self.drafts = [as_drafter(draft, index) for index, draft in enumerate(drafts)]
        for index, drafter in enumerate(self.drafts):
            model = getattr(drafter, "model", None)
            if model is not None:
                models.check_compatible(target, model, draft_name=f"drafts[{index}]")
        self.gamma = gamma
        self.backend = backend
        self.arms = make_arms(len(self.drafts), gamma, self.gammas)
        self.max_gamma = max(arm_gamma for _, arm_gamma in self.arms)
        # arms whose drafts run the same compute at the same γ share measured step costs; kept so a caller can
        # start a fresh StepCosts(len(arms), groups=decoder.cost_groups)
        self.cost_groups = arm_cost_groups(self.arms, self.drafts)
        self.step_costs = make_step_costs(self.arms, self.gammas, arm_costs, self.cost_groups)
        self.policy = resolve_policy(policy, len(self.arms), **(policy_kwargs or {}))

    @property
    def arm_names(self) -> list[str]:
        if self.gammas is None:
            return [drafter.name for drafter in self.drafts]
        return [f"{self.drafts[draft].name}@γ={arm_gamma}" for draft, arm_gamma in self.arms]

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int | Sequence[int] = 64,
        sampling: SamplingParams | None = None,
        seed: int = 0,
        eos_token_id: int | Sequence[int] | None = None,
        ignore_eos: bool = False,
        pad_token_id: int | None = None,
        timing: bool = False,
        on_step: Callable[[StepEvent], None] | None = None,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens` (an int, or one int per row) after left-padded prompts.

        `seed` fixes every draw of the run: the drafts' and the verifier's sampling and the policy's
        own randomness (its generator restarts from a seed derived from `seed`), so a fresh decoder
        given the same inputs and seed returns the same output. A reused decoder keeps what its
        policy learned (arm statistics) from earlier calls, so its choices -- and with them the
        output -- may differ from a fresh decoder's; call `decoder.policy.reset()` to forget them.
        `eos_token_id` defaults to the target's (`ignore_eos=True` turns stopping off);
        `timing=True` synchronises the device around each step so step latencies are device-accurate.
        Raises FloatingPointError when a model returns NaN or +inf logits (or a row of -inf).
        """
        sampling = SamplingParams() if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a flashspec.SamplingParams, got {type(sampling).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        device = self.device
        input_ids, mask = check_prompt(input_ids, attention_mask, models.vocab_size_of(self.target))
        batch, prompt_length = input_ids.shape
        budgets = check_budgets(max_new_tokens, batch)
        max_positions = models.max_positions_of(self.target)
        if max_positions is not None:
            if prompt_length > max_positions:
                raise ValueError(
                    f"prompt length {prompt_length} exceeds the target's {max_positions} positions; shorten the prompt"
                )
            if prompt_length + max(budgets) > max_positions:
                raise ValueError(
                    f"prompt length {prompt_length} + max_new_tokens {max(budgets)} exceeds the target's "
                    f"{max_positions} positions; lower max_new_tokens to at most {max_positions - prompt_length}"
                )
        for index, drafter in enumerate(self.drafts):
            check_draft_positions(drafter, index, prompt_length + max(budgets))
        vocab = models.vocab_size_of(self.target)
        stop_ids = set() if ignore_eos else check_token_ids(
            "eos_token_id",
            models.special_token_ids(self.target)["eos_token_id"] if eos_token_id is None else eos_token_id,
            vocab,
        )
        if pad_token_id is not None:
            check_token_ids("pad_token_id", pad_token_id, vocab)
        pad_id = resolve_pad(pad_token_id, self.target, stop_ids)
        stats = GenerationStats(
            arm_names=self.arm_names, batch_size=batch, prompt_length=prompt_length, synchronized_timing=timing,
            arm_gammas=None if self.gammas is None else [arm_gamma for _, arm_gamma in self.arms],
        )
        sync = timing and device.type == "cuda"
        start_time = _clock(sync)

        state = RowState.start(input_ids.to(device), mask.to(device), budgets, self.max_gamma, pad_id)
        cache = models.new_cache(self.target)
        start_request(self.policy, seed, self.arms, self.step_costs)
        for drafter in self.drafts:
            drafter.reset(batch)
        if prompt_length > 1:
            models.forward_logits(
                self.target, state.tokens[:, : prompt_length - 1], cache,
                attention_mask=state.target_mask[:, : prompt_length - 1],
                position_ids=state.positions(0, prompt_length - 1), logits_to_keep=1,
            )
        stats.prefill_s = _clock(sync) - start_time

        active = [budget > 0 for budget in budgets]
        num_generated = [0] * batch
        step = 0
        previous_draft: int | None = None  # the draft of the step before (a step that changes it catches up)
        while any(active):
            step_start = _clock(sync)
            active_rows = [row for row in range(batch) if active[row]]
            remaining = [budgets[row] - num_generated[row] for row in range(batch)]
            # the most any arm may draft this step; the chosen arm drafts min(its γ, this)
            gamma = max(1, min(self.max_gamma, max(remaining[row] for row in active_rows) - 1))
            step_seed = rng.derive_seed(seed, step)
            context = state.draft_context(gamma, sampling, rng.Key.from_seed(step_seed))
            arm, proposal = self._choose_and_propose(context, cache, state, seed, step)
            gamma = proposal.tokens.shape[1]
            target_logits = self._target_forward(cache, state, proposal.tokens)
            # the draft's log-probs where it kept them: exactly the q it sampled from, and no pass over its vocabulary
            given = proposal.log_probs is not None
            out = verify(
                target_logits, proposal.log_probs if given else proposal.logits, proposal.tokens, sampling,
                generator=step_seed, backend=self.backend, validate=False, draft_is_log_probs=given,
            )
            # The one host sync of the step: cache rollback needs the accepted lengths as host ints;
            # the non-finite flag rides along, so checking the models' logits costs no extra sync.
            flags = nonfinite_rows(target_logits, proposal.logits)
            host = torch.cat([out.tokens, out.num_accepted.view(-1, 1), flags.view(-1, 1)], dim=1).cpu().tolist()
            check_finite([row[-1] for row in host], active_rows, step, self.arm_names[arm])
            num_accepted = [row[-2] for row in host]
            kept = [0] * batch
            for row in active_rows:
                kept[row] = min(num_accepted[row] + 1, remaining[row])
                for index, token in enumerate(host[row][: kept[row]]):
                    if token in stop_ids:
                        kept[row] = index + 1
                        active[row] = False
                        break
                num_generated[row] += kept[row]
                if num_generated[row] >= budgets[row]:
                    active[row] = False

            previous_lengths = list(state.lengths)
            state.append(out.tokens, kept, cache)
            draft = self.arms[arm][0]
            self.drafts[draft].rollback([length + max(count - 1, 0) for length, count in zip(previous_lengths, kept)])
            if self.step_costs is not None:  # the step's wall time so far: its cost for the throughput reward
                switched = None if previous_draft is None else draft != previous_draft
                self.step_costs.observe(arm, _clock(sync) - step_start, switched)
            previous_draft = draft
            self._update_policy(arm, [num_accepted[row] for row in active_rows], gamma)

            latency = _clock(sync) - step_start
            stats.record(StepRecord(
                step=step, arm=arm, gamma=gamma,
                num_accepted=[num_accepted[row] for row in active_rows],
                kept=[kept[row] for row in active_rows], latency_s=latency,
            ))
            if on_step is not None:
                new_tokens = [host[row][: kept[row]] for row in range(batch)]
                on_step(StepEvent(step=step, arm=arm, new_tokens=new_tokens, num_generated=list(num_generated),
                                  gamma=gamma))
            step += 1

        stats.total_s = _clock(sync) - start_time
        stats.generated_tokens = sum(num_generated)
        stats.cache_columns = state.columns
        pads = state.num_pads.tolist()
        stats.cache_tokens = sum(length - 1 - pad for length, pad in zip(state.lengths, pads)) / batch
        return GenerationResult(
            sequences=state.tokens[:, : prompt_length + max(num_generated)].clone(),
            num_generated=torch.tensor(num_generated, dtype=torch.long),
            stats=stats,
        )

    def _target_forward(self, cache: Any, state: "RowState", draft_tokens: torch.Tensor) -> torch.Tensor:
        """Target logits [B, γ+1, V] for each row's pending token followed by its γ drafts; the γ+1
        new cache columns are attended (mask 1) until `state.append` turns the rejected ones into holes."""
        gamma = draft_tokens.shape[1]
        state.open_columns(gamma + 1)
        return models.forward_logits(
            self.target,
            torch.cat([state.pending_tokens(), draft_tokens], dim=1),
            cache,
            attention_mask=state.target_mask[:, : state.columns + gamma + 1],
            position_ids=state.next_positions(gamma + 1),
        )

    def _choose_and_propose(
        self, context: DraftContext, cache: Any, state: "RowState", seed: int, step: int
    ) -> tuple[int, Proposal]:
        """Pick an arm from the policy (the past only) and get its drafter's proposal of the arm's γ
        (`context.gamma` caps it: a step never drafts past the token budget)."""
        arm = int(self.policy.select())
        if not 0 <= arm < len(self.arms):
            raise ValueError(f"policy returned arm {arm}, but there are {len(self.arms)} arms")
        draft, arm_gamma = self.arms[arm]
        context = dataclasses.replace(context, gamma=min(context.gamma, arm_gamma))
        return arm, self.drafts[draft].propose(draft_context(context, seed, step, draft))

    def _update_policy(self, arm: int, num_accepted: list[int], gamma: int) -> None:
        update_policy(self.policy, arm, num_accepted, gamma, self.step_costs)


def start_request(policy: Any, seed: int, arms: list[tuple[int, int]], step_costs: StepCosts | None) -> None:
    """What a policy hears at the start of a `generate`: its seed (derived from the run's), a request
    boundary (policies may re-prior, `request_decay`), and -- for policies that model the arms, such as
    `GammaThompsonSampling` -- the (draft, γ) arms and where their step costs are kept."""
    reseed = getattr(policy, "reseed", None)
    if callable(reseed):
        reseed(rng.derive_seed(seed, POLICY_SEED_TAG))
    on_request_start = getattr(policy, "on_request_start", None)
    if callable(on_request_start):
        on_request_start()
    bind_arms = getattr(policy, "bind_arms", None)
    if callable(bind_arms):
        bind_arms(arms, step_costs)


def update_policy(policy: Any, arm: int, num_accepted: list[int], gamma: int,
                  step_costs: StepCosts | None = None) -> None:
    """Reward from one step's acceptances (the past of every later step). With `step_costs` (arms
    of their own γ): the throughput reward, skipped while the arm has no cost yet, unless the policy
    `learns_from_steps` (it reads the costs itself). Otherwise policies with `update_step` (Thompson
    sampling) get the geometric conjugate update per row; others the mean acceptance fraction in [0, 1]."""
    if not num_accepted:
        return
    if step_costs is not None and not getattr(policy, "learns_from_steps", False):
        reward = step_costs.reward(arm, num_accepted, gamma)
        if reward is not None:
            policy.update(arm, reward)
        return
    update_step = getattr(policy, "update_step", None)
    if callable(update_step):
        for accepted in num_accepted:
            update_step(arm, accepted, gamma)
    else:
        policy.update(arm, sum(num_accepted) / (gamma * len(num_accepted)))


@dataclass
class RowState:
    """Per-row sequences of a batch and the layout of the target's KV cache.

    Rows advance by different numbers of tokens per step. Their tokens are stored compactly
    (`tokens[r, :lengths[r]]`: left-padded prompt, then generated tokens), while the target's cache
    has one shared column count: every step appends γ + 1 columns for every row, and the columns a
    row rejected become holes (`target_mask` 0) that attention skips; trailing columns that are
    holes in every row are cropped. Positions come from each row's own token count, so the target
    computes exactly what it would on the compact row.
    """

    tokens: torch.Tensor
    real: torch.Tensor
    num_pads: torch.Tensor
    lengths: list[int]
    target_mask: torch.Tensor
    columns: int

    @classmethod
    def start(
        cls, input_ids: torch.Tensor, mask: torch.Tensor, budgets: list[int], gamma: int, pad_id: int
    ) -> "RowState":
        batch, prompt_length = input_ids.shape
        gamma = max(1, min(gamma, max(budgets)))  # a step never drafts past the largest budget
        capacity = prompt_length + max(budgets) + gamma + 1
        tokens = torch.full((batch, capacity), pad_id, dtype=torch.long, device=input_ids.device)
        tokens[:, :prompt_length] = input_ids
        real = torch.ones((batch, capacity), dtype=torch.bool, device=input_ids.device)
        real[:, :prompt_length] = mask
        # Columns grow by the largest kept count per step; start with room for one row's whole run
        # and let `open_columns` grow the mask when rows take turns at long accepts.
        column_capacity = prompt_length + max(budgets) + gamma + 1
        target_mask = torch.zeros((batch, column_capacity), dtype=torch.long, device=input_ids.device)
        target_mask[:, :prompt_length] = mask.long()
        return cls(tokens, real, (~mask).sum(dim=1), [prompt_length] * batch, target_mask, prompt_length - 1)

    def _lengths(self) -> torch.Tensor:
        return torch.tensor(self.lengths, dtype=torch.long, device=self.tokens.device)

    def positions(self, start: int, stop: int) -> torch.Tensor:
        """Positions [B, stop-start] of compact indices start..stop-1 (left pads clamp to 0)."""
        index = torch.arange(start, stop, device=self.tokens.device).view(1, -1)
        return (index - self.num_pads.view(-1, 1)).clamp(min=0)

    def pending_tokens(self) -> torch.Tensor:
        """[B, 1]: each row's last token, the one the target's cache has not seen yet."""
        return self.tokens.gather(1, (self._lengths() - 1).view(-1, 1))

    def next_positions(self, count: int) -> torch.Tensor:
        """[B, count]: positions of the pending token and the `count - 1` slots after it."""
        first = self._lengths() - 1 - self.num_pads
        return first.view(-1, 1) + torch.arange(count, device=self.tokens.device).view(1, -1)

    def open_columns(self, count: int) -> None:
        needed = self.columns + count
        if needed > self.target_mask.shape[1]:  # double: amortised O(1) per column
            grown = torch.zeros((self.target_mask.shape[0], max(needed, 2 * self.target_mask.shape[1])),
                                dtype=self.target_mask.dtype, device=self.target_mask.device)
            grown[:, : self.target_mask.shape[1]] = self.target_mask
            self.target_mask = grown
        self.target_mask[:, self.columns : needed] = 1

    def append(self, verified: torch.Tensor, kept: list[int], cache: Any) -> None:
        """Append `kept[r]` tokens of `verified[r]` to row r; the target cache keeps, per row, the
        columns of its pending token and kept drafts, and drops columns that are holes in every row."""
        width = verified.shape[1]
        device = self.tokens.device
        offsets = torch.arange(width, device=device).view(1, -1)
        keep = offsets < torch.tensor(kept, dtype=torch.long, device=device).view(-1, 1)
        index = self._lengths().view(-1, 1) + offsets
        self.tokens.scatter_(1, index, torch.where(keep, verified.clamp(min=0), self.tokens.gather(1, index)))
        self.target_mask[:, self.columns : self.columns + width] = keep.long()
        grown = max(kept)
        models.crop_cache(cache, self.columns + grown)
        self.columns += grown
        self.lengths = [length + count for length, count in zip(self.lengths, kept)]

    def draft_context(self, gamma: int, sampling: SamplingParams, key: rng.Key) -> DraftContext:
        """Rows right-aligned (every row ends at the last column), which is what drafters read."""
        longest = max(self.lengths)
        lengths = self._lengths()
        index = torch.arange(longest, device=self.tokens.device).view(1, -1) - (longest - lengths).view(-1, 1)
        inside = index >= 0
        index = index.clamp(min=0)
        return DraftContext(
            tokens=self.tokens.gather(1, index),
            valid=inside & self.real.gather(1, index),
            position_ids=(index - self.num_pads.view(-1, 1)).clamp(min=0),
            lengths=list(self.lengths),
            next_position=lengths - self.num_pads,
            gamma=gamma,
            sampling=sampling,
            key=key,
        )


def draft_context(context: DraftContext, seed: int, step: int, arm: int) -> DraftContext:
    """The context for arm `arm`: its own key derived from (seed, step, arm), so drafts never share
    noise with each other, and drafts sample on rng.STREAM_DRAFT, never the verifier's streams."""
    return dataclasses.replace(context, key=rng.Key.from_seed(rng.derive_seed(seed, step, DRAFT_KEY_TAG, arm)))


def generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    drafts: Sequence[Any] | None = None,
    policy: Any = "thompson",
    gamma: int = 4,
    policy_kwargs: dict[str, Any] | None = None,
    backend: str = "auto",
    gammas: Sequence[int] | None = None,
    **generate_kwargs: Any,
) -> GenerationResult:
    """One call: build a SpeculativeDecoder (default pool: prompt lookup only) and generate.
    `generate_kwargs` go to `SpeculativeDecoder.generate` (seed, max_new_tokens, sampling, ...)."""
    from flashspec.drafters import PromptLookupDrafter

    decoder = SpeculativeDecoder(target, drafts if drafts is not None else [PromptLookupDrafter()], policy, gamma,
                                 policy_kwargs=policy_kwargs, backend=backend, gammas=gammas)
    return decoder.generate(input_ids, **generate_kwargs)


def _clock(sync: bool) -> float:
    if sync:
        torch.cuda.synchronize()
    return time.perf_counter()
