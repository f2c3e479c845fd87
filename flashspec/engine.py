"""The eager engine: a Hugging Face target, a pool of drafters, a bandit choosing the drafter per step,
on-device verification, exact output (book/design.md §1).

One step (the request front, `flashspec.front.Front`, has checked the request and started the policy):
  1. the policy picks an arm from the past only (`Front.choose_arm`);
  2. that drafter proposes γ tokens per row, sampled from its warped distribution with the step's key on its own
     stream (`rng.draft_stream`), and returns what it sampled from;
  3. one target forward over γ + 1 positions (the last known token + the γ drafts);
  4. `flashspec.verify` (backend "auto": Triton on CUDA, PyTorch on CPU) with the same step key, on the
     verifier's own streams (`front` module docstring: the key schedule both engines share);
  5. ONE host transfer per step (tokens + num_accepted + a non-finite flag, [B, γ+3] ints): the KV caches must be
     rolled back to the accepted lengths, which eager Hugging Face caches can only do with host integers. That sync
     is inherent in HF eager; everything else in the step stays on the device;
  6. append; crop the target's and the chosen drafter's caches; reward -> `policy.update`.
Drafters not chosen catch up lazily the next time they propose.

Adaptive γ (`gammas=`): the arms are (drafter, γ) pairs and the policy learns from the throughput
reward (tokens per second of each arm's step, `flashspec.rewards.StepCosts`) how far to speculate. γ = 0
among them adds the plain arm: steps 2-4 become one target forward of the pending token and one token sampled
from it, so the policy may also decide that no draft pays.

Batches (B > 1): rows keep their own lengths. Each row appends its own num_accepted + 1 tokens
(cut only by its own budget or EOS), so nothing accepted is thrown away and every row is an exact
speculative decoder of its own (Theorem 1 per row; the arm choice is shared but comes from the
past). The KV caches stay whole-batch `DynamicCache`s: each step appends γ + 1 columns for every
row, the columns a row rejected become holes in its attention mask (position ids come from each
row's own token count), and trailing columns that are holes in every row are cropped with
`crop(-k)`. The cost is attention over hole columns, reported as `kv_cache_fill` (real tokens /
cache columns) in the stats. (Truncating every row to the batch's minimum accepted length is also
exact, but throws accepted tokens away: with a handful of rows most steps keep one token per row.)

The model call lives in `flashspec.models.forward_logits`, the one function a static-cache /
CUDA-graph fast path replaces.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flashspec import models, rng
from flashspec.checks import check_finite, nonfinite_rows
from flashspec.drafters import DraftContext, Proposal, as_drafter
from flashspec.front import (Front, GenerationResult, Request, StepEvent, position_limit, update_policy)
from flashspec.sampling import SamplingParams, sample_from_logits
from flashspec.stats import GenerationStats, StepRecord
from flashspec.verify import verify_with_key


class SpeculativeDecoder(Front):
    """Exact speculative decoding with a bandit-chosen draft per step, on Hugging Face forwards.

    Args:
        target: a Hugging Face causal LM (the distribution the output follows exactly).
        drafts: HF causal LMs sharing the target's tokenizer and/or Drafter objects
            (e.g. `PromptLookupDrafter()`); each is one arm of the bandit.
        policy: a name for `flashspec.bandits.make_policy` or a policy object (select/update/reset).
        gamma: drafted tokens per step (1 <= γ <= 256).
        gammas: None (one arm per draft, at `gamma`), or distinct γ values: then the arms are every
            (draft, γ) pair, draft-major, named "<draft>@γ=<γ>" (γ = 0: one more arm, last, "plain": the
            target alone, one token per step, no draft), and the policy learns from the
            throughput reward (`flashspec.rewards.StepCosts`: each step's tokens over its arm's
            moving-average wall time, relative to the best arm's rate), so it learns how far to
            speculate as well as which draft. `policy="gamma-ts"` (`bandits.GammaThompsonSampling`)
            instead shares each draft's acceptance across its γ arms and reads the same costs:
            it learns the arms from fewer steps (the CLI's choice with --gammas). Arms whose drafts run
            the same compute (`front.cost_signature`) at the same γ share their measured costs (`cost_groups`).
        arm_costs: with `gammas`, fixed per-arm step costs (any unit) instead of measured times,
            e.g. from a benchmark: the choices then depend on the seed only (reproducible runs).
        policy_kwargs: the options of a policy built by name (e.g. window, discount). Its random
            generator is restarted by every `generate` call from that call's `seed`.
        backend: verify backend, "auto" | "torch" | "triton".
        verify_method: how each step's chain is verified, "token" (default) or "block" (`flashspec.verify`'s
            `method`: block verification accepts at least as many tokens in expectation; both are exact).

    The arm of each step comes from `_choose_and_propose`, which asks the policy (the past only);
    the exactness tests override it in a subclass to build a cherry-picking negative control.

    Exactness with measured costs: the reward of step t uses the wall times of steps <= t, which are
    part of the past of every later step, and the uniforms of later steps are counter-based
    functions of (seed, step), independent of any timing. So the choice of (draft, γ) at step t is
    still a function of the past plus independent coins, and Theorem 1 holds (design notes §1).
    What timing changes is reproducibility: with measured costs the same seed can choose other arms
    (each output still exactly the target's distribution); `arm_costs` makes it depend on the seed only.
    """

    def _accept_drafts(self, drafts: list[Any]) -> list[Any]:
        vocab = models.vocab_size_of(self.target)
        accepted = [as_drafter(draft, index, vocab) for index, draft in enumerate(drafts)]
        for index, drafter in enumerate(accepted):
            model = getattr(drafter, "model", None)
            if model is not None:
                models.check_compatible(self.target, model, draft_name=f"drafts[{index}]")
        return accepted

    def _decode(self, request: Request, stats: GenerationStats, on_step: Callable[[StepEvent], None] | None,
                timing: bool) -> GenerationResult:
        device = self.device
        batch, prompt_length = request.batch, request.width
        budgets, sampling, seed, stop_ids = request.budgets, request.sampling, request.seed, request.stop_ids
        limit, _ = position_limit(self.target, self.drafts)
        sync = timing and device.type == "cuda"
        start_time = _clock(sync)

        state = RowState.start(request.tokens.to(device), request.mask.to(device), budgets, self.max_gamma,
                               request.pad_id)
        pads = state.num_pads.tolist()
        cache = models.new_cache(self.target)
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
            # every arm drafts its whole γ (as the fast engine does: a shorter draft would change the step's
            # draws), except where a model's last position comes first
            room = self.max_gamma if limit is None else max(1, limit - max(
                length - pad for length, pad in zip(state.lengths, pads)))
            key = rng.step_key_host(rng.Key.from_seed(seed), step)
            context = state.draft_context(min(self.max_gamma, room), sampling, key)
            arm, proposal = self._choose_and_propose(context, cache, state, seed, step)
            if proposal is None:  # the plain arm: one target forward, one token from p
                gamma, (out_tokens, out_accepted, flags) = 0, self._plain_step(cache, state, sampling, key)
            else:
                gamma = proposal.tokens.shape[1]
                out_tokens, out_accepted, flags = self._speculative_step(cache, state, proposal, sampling, key)
            # The one host sync of the step: cache rollback needs the accepted lengths as host ints;
            # the non-finite flag rides along, so checking the models' logits costs no extra sync.
            host = torch.cat([out_tokens, out_accepted.view(-1, 1), flags.view(-1, 1)], dim=1).cpu().tolist()
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
            state.append(out_tokens, kept, cache)
            draft = self.arms[arm][0]
            if draft >= 0:  # the drafters that did not run (all of them after a plain step) catch up when they next do
                self.drafts[draft].rollback([length + max(count - 1, 0)
                                             for length, count in zip(previous_lengths, kept)])
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
        stats.cache_tokens = sum(length - 1 - pad for length, pad in zip(state.lengths, pads)) / batch
        sequences = state.tokens[:, : prompt_length + max(num_generated)].clone()
        sequences[:, :prompt_length] = request.input_ids  # each prompt as given
        return GenerationResult(
            sequences=sequences,
            num_generated=torch.tensor(num_generated, dtype=torch.long),
            stats=stats,
        )

    def _speculative_step(self, cache: Any, state: "RowState", proposal: Proposal, sampling: SamplingParams,
                          key: rng.Key) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The target scores the proposal and `verify` judges it: (tokens [B, γ+1], num_accepted [B], non-finite
        flags [B]), all on the device."""
        target_logits = self._target_forward(cache, state, proposal.tokens)
        # the draft's log-probs where it kept them: exactly the q it sampled from, and no pass over its vocabulary
        given = proposal.log_probs is not None
        out = verify_with_key(target_logits, proposal.log_probs if given else proposal.logits, proposal.tokens,
                              sampling, key, backend=self.backend, draft_is_log_probs=given, method=self.verify_method)
        return out.tokens, out.num_accepted, nonfinite_rows(target_logits, proposal.logits)

    def _plain_step(self, cache: Any, state: "RowState", sampling: SamplingParams,
                    key: rng.Key) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The plain arm's step: the target reads each row's pending token and one token is drawn from its warped
        p with the step's key on the sample stream at position 0, as the fast engine draws it. (tokens [B, 1],
        num_accepted [B] zeros, non-finite flags [B])."""
        no_drafts = state.tokens.new_zeros((state.tokens.shape[0], 0))
        logits = self._target_forward(cache, state, no_drafts)
        token, _ = sample_from_logits(logits[:, 0], sampling, key, position=0, stream=rng.STREAM_SAMPLE)
        return token[:, None], torch.zeros_like(token), nonfinite_rows(logits, None)

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
    ) -> tuple[int, Proposal | None]:
        """Pick an arm from the policy (the past only) and get its drafter's proposal of the arm's γ
        (`context.gamma` caps it where a model's positions end); None for the plain arm (no draft)."""
        arm = self.choose_arm()
        draft, arm_gamma = self.arms[arm]
        if draft < 0:
            return arm, None
        context = dataclasses.replace(context, gamma=min(context.gamma, arm_gamma))
        return arm, self.drafts[draft].propose(draft_context(context, seed, step, draft))

    def _update_policy(self, arm: int, num_accepted: list[int], gamma: int) -> None:
        update_policy(self.policy, arm, num_accepted, gamma, self.step_costs)


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


def draft_context(context: DraftContext, seed: int, step: int, draft: int) -> DraftContext:
    """The context for draft `draft` at step `step` of a run seeded `seed`: the step's key (`rng.step_key_host`)
    and the draft's own stream (`rng.draft_stream`), so drafts never share noise with each other or with the
    verifier's accept and sample streams."""
    return dataclasses.replace(context, key=rng.step_key_host(rng.Key.from_seed(seed), step),
                               stream=rng.draft_stream(draft))


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
