"""The fast engine's session: static caches, device buffers, the step as pure device work, its CUDA graphs, and
the host loop that reads each step's outcome `lag` steps late (`flashspec.fast` explains the design).

A session serves every request of one (batch, cache capacity, sampling, stop ids, graphs) shape: its buffers keep
fixed addresses, so the graphs it captured replay for each request of that shape.
"""
from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flashspec import models, rng, runner
from flashspec.checks import check_finite, nonfinite_rows
from flashspec.drafters import PromptLookupDrafter
from flashspec.features import FeatureDraft, FeatureRunner
from flashspec.paths import paths_inputs, verify_paths_reference
from flashspec.front import StepEvent, update_policy
from flashspec.sampling import SamplingParams, sample_from_logits
from flashspec.stats import GenerationStats, StepRecord
from flashspec.verify import draft_log_probs, verify_reference


def catch_up_tokens(appended_bound: int, gamma: int, bucket: int) -> int:
    """Tokens a draft must read before the step's γ+1 window, when at most `appended_bound` tokens
    were appended since its cache was last complete (the sum of γ+1 over the steps from its last run
    on): what the window does not cover, rounded up to a power of two (few graphs), capped at the bucket."""
    missed = appended_bound - (gamma + 1)
    if missed <= 0:
        return 0
    return min(1 << (missed - 1).bit_length(), bucket)


def catch_up_choices(bucket: int) -> list[int]:
    """Every length `catch_up_tokens` can return at `bucket` (its powers of two, capped at the bucket)."""
    return sorted({min(1 << k, bucket) for k in range(bucket.bit_length() + 1)})


def capture_fill(bucket: int, capacity: int, gamma: int, max_gamma: int) -> int:
    """Tokens per row while a step of γ = `gamma` at attention `bucket` is captured ahead: a fill the step
    loop can reach there, so the step's γ+1 positions stay inside the bucket (fill + γ <= bucket) and the
    commit's fixed Γ+1 columns (Γ = `max_gamma`) inside the cache (fill + Γ < capacity), as in a real run,
    where a row never holds more than capacity - Γ - 1 tokens."""
    return max(1, min(bucket, capacity - max_gamma - 1) - gamma)


def session_capacity(tokens: int, slack: int, max_positions: int | None = None) -> int:
    """Cache slots of the session that serves a request of `tokens` (prompt + max_new_tokens), `slack`
    (γ+1) more for the last step's drafts: rounded up onto the attention buckets' grid
    (`runner.bucket_for`), so requests of similar lengths share one session with its buffers and captured
    graphs; a function of the request alone, so the buckets and the run a seed gives do not depend on what
    ran before. Capped at the models' positions plus the slack."""
    rounded = runner.bucket_for(tokens + slack, sys.maxsize)
    if max_positions is not None:
        rounded = min(rounded, max_positions + slack)
    return max(tokens + slack, rounded)


def catch_up_length(steps_away: int, gamma: int, bucket: int) -> int:
    """`catch_up_tokens` when every step drafts γ and the draft runs `steps_away` >= 1 steps after it
    last ran: none when it ran the step before, else the at most (steps_away-1)·(γ+1) older tokens."""
    if steps_away <= 1:
        return 0
    return catch_up_tokens(steps_away * (gamma + 1), gamma, bucket)


@dataclass
class Buffers:
    """Device state of one generation; every step reads and writes these in place (fixed addresses,
    so captured graphs stay valid across requests of the same shape)."""

    seq: torch.Tensor        # [B, capacity] long: each row's tokens, position t in column t
    lengths: torch.Tensor    # [B] long: tokens per row (the last one is pending: not yet in the target cache)
    remaining: torch.Tensor  # [B] long: tokens each row may still append
    done: torch.Tensor       # [B] bool: row finished (budget or EOS)
    step: torch.Tensor       # [1] long: steps taken, the RNG counter
    seed_key: torch.Tensor   # [2] long: the request's key (lo, hi)
    frozen: torch.Tensor     # [1] bool: warm-up runs (graph capture) commit nothing and keep the counter
    stop_ids: torch.Tensor   # [S] long: EOS ids (S may be 0)
    outcome: torch.Tensor    # [B, Γ+4] long out: this step's verified tokens (Γ = largest γ; -1 past the
    #                          step's own γ+1), accepted drafts, appended count, non-finite logits flag


def commit(b: Buffers, out_tokens: torch.Tensor, num_accepted: torch.Tensor, offsets: torch.Tensor,
           flags: torch.Tensor) -> None:
    """Append each row's accepted tokens and its emitted token, cut by its budget and its first EOS,
    in place on the buffers (warm-up runs, `b.frozen`, append nothing and keep the counter). `flags` [B]:
    `checks.nonfinite_rows` of the step's logits, copied out with the outcome (the host raises on it)."""
    width = offsets.shape[0]
    emitted = offsets[None] <= num_accepted[:, None]                     # [B, γ+1]
    is_stop = (out_tokens[..., None] == b.stop_ids).any(-1) & emitted
    first_stop = torch.where(is_stop.any(1), is_stop.long().argmax(1), torch.full_like(num_accepted, width))
    budget_cut = torch.minimum(num_accepted + 1, b.remaining)
    hit_stop = first_stop < budget_cut
    kept = torch.where(hit_stop, first_stop + 1, budget_cut)
    kept = torch.where(b.done | b.frozen, torch.zeros_like(kept), kept)
    index = b.lengths[:, None] + offsets[None]                           # < capacity by construction
    b.seq.scatter_(1, index, torch.where(offsets[None] < kept[:, None], out_tokens.clamp(min=0),
                                         b.seq.gather(1, index)))
    b.lengths.add_(kept)
    b.remaining.sub_(kept)
    b.done.logical_or_(hit_stop & ~b.frozen).logical_or_(b.remaining == 0)
    b.step.add_((~b.frozen).long())
    b.outcome.copy_(torch.cat([out_tokens, num_accepted[:, None], kept[:, None], flags[:, None]], 1))


def step_prologue(seed_key: torch.Tensor, step: torch.Tensor, prefixes_of: Callable[[torch.Tensor], torch.Tensor]
                  | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This step's device key (`rng.step_key`) and, for the Triton verify, its stream prefixes
    (`prefixes_of` = `flashspec.kernels.verify.device_prefixes`)."""
    key = rng.step_key(seed_key, step)
    return key, None if prefixes_of is None else prefixes_of(key)


@dataclass(frozen=True)
class Launch:
    """A launched step as the host remembers it until it reads the outcome."""

    step: int
    arm: int
    gamma: int
    launched: float   # host perf_counter at launch
    host_s: float     # host time of the launch call (the whole step on a CPU, where it is synchronous)
    captured: bool    # a graph was captured: the step's time is not its cost
    switched: bool | None  # its draft differs from the previous step's (None: the request's first step)


class Session:
    """Runners, buffers and captured step graphs for one (batch, capacity, sampling, EOS, graphs) shape."""

    def __init__(self, decoder: Any, key: tuple, batch: int, capacity: int,
                 sampling: SamplingParams, stop_ids: set[int], use_graphs: bool) -> None:
        self.key = key
        self.gamma = decoder.gamma  # the single-γ mode's γ (benchmarks time the step's pieces at it)
        self.arms = decoder.arms
        self.max_gamma = decoder.max_gamma
        self.sampling = sampling
        self.use_graphs = use_graphs
        self.capacity = capacity
        device = decoder.device
        self.device = device
        # compiled query lengths (when asked): decode, every arm's verify/window γ+1, and each γ's
        # commonest catch-up
        gammas = sorted({arm_gamma for draft, arm_gamma in self.arms if draft >= 0})
        verify_lengths = (1, *(g + 1 for g in gammas))
        catch_ups = tuple(dict.fromkeys(catch_up_length(2, g, capacity) for g in gammas))
        options = {"logits_dtype": torch.float32, "compile": decoder.compile, "compile_scope": decoder.compile_scope}
        tree_lengths = (1 + decoder.reach(),) if decoder.paths else ()  # the paths decoder's tree forward
        self.target = runner.LlamaRunner(decoder.target, batch, capacity, compile_lengths=verify_lengths + tree_lengths,
                                         state_layers=decoder.state_layers, **options)

        def make(draft: Any) -> runner.LlamaRunner | PromptLookupDrafter:
            if isinstance(draft, PromptLookupDrafter):
                return draft
            if isinstance(draft, FeatureDraft):
                return FeatureRunner(draft, self.target, batch, capacity, compile_lengths=verify_lengths + catch_ups,
                                     **options)
            return runner.LlamaRunner(draft, batch, capacity, compile_lengths=verify_lengths + catch_ups, **options)

        self.drafts: list[runner.LlamaRunner | PromptLookupDrafter] = [make(d) for d in decoder.drafts]
        self.reach = decoder.reach()  # target slots a step writes past the pending token's
        self.paths = decoder.paths
        if self.paths:  # one chain per draft under the pending token; path k's nodes in depth order [K, γ+1]
            self.tree = runner.TokenTree.chains(len(self.drafts), self.gamma)
            self.path_nodes = torch.tensor([self.tree.path(1 + k * self.gamma + self.gamma - 1)
                                            for k in range(len(self.drafts))], device=device)
        self.sync_all = decoder.draft_sync == "all"
        # the step's small device-side pieces: dozens of tiny kernels each unless compiled
        self.sample, self.prologue, self.commit = sample_from_logits, step_prologue, commit
        # the draws' positions and streams as device scalars (one tensor each, the same values as the ints): the
        # compiled sampler then serves every position and draft without compiling again
        self.draw_positions = [torch.tensor(p, device=device) for p in range(self.max_gamma + 1)]
        self.draw_streams = {stream: torch.tensor(stream, device=device) for stream in (
            rng.STREAM_SAMPLE, *(rng.draft_stream(index) for index in range(len(decoder.drafts))))}
        if decoder.compile is not False:
            self.sample, self.prologue, self.commit = (torch.compile(fn, fullgraph=True) for fn in (
                sample_from_logits, step_prologue, commit))
        use_triton = decoder.backend == "triton" or (decoder.backend == "auto" and device.type == "cuda")
        self.verify_triton = use_triton
        self.method = decoder.verify_method
        self.prefixes_of = None
        if use_triton:
            from flashspec.kernels.verify import device_prefixes

            self.prefixes_of = device_prefixes
        zeros = lambda dtype, *shape: torch.zeros(shape, dtype=dtype, device=device)  # noqa: E731
        self.buffers = Buffers(
            seq=zeros(torch.long, batch, capacity), lengths=zeros(torch.long, batch),
            remaining=zeros(torch.long, batch), done=zeros(torch.bool, batch), step=zeros(torch.long, 1),
            seed_key=zeros(torch.long, 2), frozen=zeros(torch.bool, 1),
            stop_ids=torch.tensor(sorted(stop_ids), dtype=torch.long, device=device),
            outcome=zeros(torch.long, batch, self.max_gamma + 4))
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}  # ("step", arm, bucket) or ("catch_up", arm, bucket, n)
        self.catch_ups: collections.Counter[int] = collections.Counter()  # catch-up length -> times
        self.batch = batch
        self.vocab = models.vocab_size_of(decoder.target)  # a draft with a padded embedding proposes ids below it
        self.prefill_captures = 0  # prefill graphs the last prefill captured

    # ------------------------------------------------------------------------------- request set-up
    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor, budgets: list[int], seed: int,
                pad_id: int) -> list[int]:
        """Fill the caches of `prefilled` with the prompts and the buffers with the request (one host read of the
        prompt lengths, before the first step). With graphs, each such runner's prefill replays a graph per
        (batch, width bucket); `prefill_captures` says how many this call captured."""
        buffers = self.buffers
        before = self.prefill_graphs
        _, lengths = self.target.prefill(input_ids, mask, graphed=self.use_graphs)
        for draft in self.prefilled()[1:]:
            draft.prefill(input_ids, mask, graphed=self.use_graphs)
        self.prefill_captures = self.prefill_graphs - before
        width = input_ids.shape[1]
        columns = torch.arange(width, device=self.device)
        source = (columns + (width - lengths)[:, None]) % width  # real tokens first (slot == position)
        buffers.seq.fill_(pad_id)
        buffers.seq[:, :width] = torch.where(columns < lengths[:, None], input_ids.gather(1, source), pad_id)
        buffers.lengths.copy_(lengths)
        budget = torch.tensor(budgets, dtype=torch.long, device=self.device)
        buffers.remaining.copy_(budget)
        buffers.done.copy_(budget == 0)
        buffers.step.zero_()
        buffers.frozen.zero_()
        key = rng.Key.from_seed(seed)
        buffers.seed_key.copy_(torch.tensor([key.lo, key.hi], dtype=torch.long))
        return lengths.tolist()

    def output(self, input_ids: torch.Tensor, mask: torch.Tensor, generated: int, pad_id: int) -> torch.Tensor:
        """[B, width + generated]: each prompt as given (left-padded), then the row's tokens, then pads."""
        width = input_ids.shape[1]
        lengths = self.buffers.lengths.cpu()
        seq = self.buffers.seq.cpu()
        pads = (~mask.cpu()).sum(1)
        columns = torch.arange(width, width + generated)
        source = columns[None] - pads[:, None]                              # compact index of each column
        tail = seq.gather(1, source.clamp(max=self.capacity - 1))
        tail = torch.where(source < lengths[:, None], tail, torch.full_like(tail, pad_id))
        return torch.cat([input_ids.cpu(), tail], 1)

    # ------------------------------------------------------------------------------- the step
    def catch_up(self, arm: int, bucket: int, length: int) -> None:
        """The draft of `arm` reads the `length` tokens before the step's window (positions
        last-γ-length .. last-γ-1, clamped at 0, γ the arm's) into its cache: what it missed while
        other arms ran."""
        index, gamma = self.arms[arm]
        b, draft = self.buffers, self.drafts[index]
        end = b.lengths - 1 - gamma                                             # [B] the window's first position
        span = (end[:, None] - length + torch.arange(length, device=self.device)).clamp(min=0)
        last = torch.full((self.batch, 1), length - 1, dtype=torch.long, device=self.device)
        draft.forward(b.seq.gather(1, span), span, bucket, last)

    def step(self, arm: int, bucket: int) -> None:
        """One speculative step for `arm` with attention over `bucket` slots: device work only. The plain arm
        (draft index -1) samples one token from the target instead (`plain_step`)."""
        (index, gamma), b, params = self.arms[arm], self.buffers, self.sampling
        offsets = torch.arange(gamma + 1, device=self.device)
        out_offsets = torch.arange(self.max_gamma + 1, device=self.device)     # the commit's fixed width
        key, prefixes = self.prologue(b.seed_key, b.step, self.prefixes_of)
        last = b.lengths - 1                                                   # [B] the pending token
        if index < 0:
            self.plain_step(bucket, key, last, out_offsets)
            return
        if self.paths:
            self.paths_step(bucket, key, prefixes, last, out_offsets)
            return
        chosen = self.drafts[index]
        logits = self.windows(bucket, last, gamma, chosen).get(index)
        if isinstance(chosen, PromptLookupDrafter):
            drafted, draft_logits = self._lookup(chosen, bucket, gamma), None
        else:
            drafted, draft_logits = self._chain(index, logits, key, bucket, gamma)
        given = draft_logits is not None  # the draft's warped log-probs (`draft_is_log_probs`), or no draft
        target_tokens = torch.cat([b.seq.gather(1, last[:, None]), drafted], 1)
        target_logits = self.target.forward(target_tokens, last[:, None] + offsets, bucket)
        if self.verify_triton:
            from flashspec.kernels import verify_triton

            out_tokens, num_accepted = verify_triton(target_logits, draft_logits, drafted, params, key,
                                                     prefixes=prefixes, draft_is_log_probs=given, method=self.method)
        else:
            result = verify_reference(target_logits, draft_logits, drafted, params, key, given, method=self.method)
            out_tokens, num_accepted = result.tokens, result.num_accepted
        if gamma < self.max_gamma:  # -1 past the γ+1 verified tokens: never emitted (offset > num_accepted)
            out_tokens = torch.nn.functional.pad(out_tokens, (0, self.max_gamma - gamma), value=-1)
        self.commit(b, out_tokens, num_accepted, out_offsets, nonfinite_rows(target_logits, draft_logits))

    def _chain(self, index: int, logits: torch.Tensor, key: torch.Tensor, bucket: int,
               gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Model draft `index` drafts γ tokens from its logits at the pending token, on its own stream (index: the
        draft, not the arm): (tokens [B, γ], the warped log-probs [B, γ, V] each was drawn from -- exactly the q the
        verifier reads as given)."""
        b, draft = self.buffers, self.drafts[index]
        tokens, all_log_probs = [], []
        for position in range(gamma):
            token, log_probs = self.sample(logits, self.sampling, key, position=self.draw_positions[position],
                                           stream=self.draw_streams[rng.draft_stream(index)])
            tokens.append(token)
            all_log_probs.append(log_probs)
            if position < gamma - 1:
                logits = models.fit_vocab(
                    draft.next_draft(token[:, None], (b.lengths + position)[:, None], bucket)[:, 0], self.vocab)
        return torch.stack(tokens, 1), torch.stack(all_log_probs, 1)

    def windows(self, bucket: int, last: torch.Tensor, gamma: int, chosen: Any,
                every: bool = False) -> dict[int, torch.Tensor]:
        """The drafts' window forwards before a step: the chosen model draft re-reads the last γ+1 tokens
        (`last` [B]: the pending token's position); with "all", every model draft re-reads the last Γ+1 (Γ the
        largest γ), so that no step appends more than a draft re-reads and none ever needs a catch-up. Returns the
        logits [B, V] at the pending token of the chosen model draft, or of every model draft (`every`), by the
        draft's index."""
        span = self.max_gamma if self.sync_all else gamma
        window = (last[:, None] - span + torch.arange(span + 1, device=self.device)).clamp(min=0)  # [B, span+1]
        window_tokens = self.buffers.seq.gather(1, window)
        at_end = torch.full((self.batch, 1), span, dtype=torch.long, device=self.device)
        logits = {}
        for index, draft in enumerate(self.drafts):
            if isinstance(draft, runner.LlamaRunner) and (draft is chosen or self.sync_all):
                out = draft.forward(window_tokens, window, bucket, at_end)
                if draft is chosen or every:
                    logits[index] = models.fit_vocab(out[:, 0], self.vocab)
        return logits

    def reach_of(self, gamma: int) -> int:
        """Cache slots past the pending token's that a step of an arm of `gamma` writes: γ, or the K·γ of the paths
        decoder's tree (its one arm)."""
        return self.reach if self.paths else gamma

    def paths_step(self, bucket: int, key: torch.Tensor, prefixes: torch.Tensor | None, last: torch.Tensor,
                   out_offsets: torch.Tensor) -> None:
        """The paths decoder's step (`fast.FastPathsDecoder`): every model draft re-reads its window and drafts γ on
        its own stream (prompt lookup proposes, verified with q one-hot at its tokens); the target scores the tree
        of the K chains in one forward (root: the pending token at `last`); multi-path verification keeps the
        longest exact prefix and names its path, whose keys and values `keep_path` moves into place; the commit
        appends as for one chain. The verification is one Triton launch where the session verifies with Triton
        (`kernels.paths`, reading the step key's `prefixes` from memory), else `paths.verify_paths_reference`:
        both draw the same numbers from the key."""
        b, params, gamma = self.buffers, self.sampling, self.gamma
        starts = self.windows(bucket, last, gamma, None, every=True)  # sync "all": Γ = γ, every model draft
        chains, chain_log_probs = [], []
        for index, draft in enumerate(self.drafts):
            if isinstance(draft, PromptLookupDrafter):  # fixed proposals: verified with q one-hot at them
                tokens = self._lookup(draft, bucket, gamma)
                chains.append(tokens)
                chain_log_probs.append(draft_log_probs(None, tokens, params, self.vocab))
                continue
            tokens, log_probs = self._chain(index, starts[index], key, bucket, gamma)
            chains.append(tokens)
            chain_log_probs.append(log_probs)
        drafted, drafted_log_probs = torch.stack(chains, 1), torch.stack(chain_log_probs, 1)  # [B, K, γ], [.., V]
        nodes = torch.cat([b.seq.gather(1, last[:, None]), drafted.flatten(1)], 1)           # [B, 1 + K·γ]
        along = self.target.tree_forward(nodes, last, self.tree, bucket)[:, self.path_nodes]  # [B, K, γ+1, V]
        if self.verify_triton:
            from flashspec.kernels.paths import verify_paths_triton

            log_p, q = paths_inputs(along, drafted_log_probs, drafted, params, draft_is_log_probs=True)
            tokens, num_accepted, path = verify_paths_triton(log_p, q, drafted, key, prefixes)
        else:
            out = verify_paths_reference(along, drafted_log_probs, drafted, params, key, draft_is_log_probs=True)
            tokens, num_accepted, path = out.tokens, out.num_accepted, out.path
        self.target.keep_path(last, self.path_nodes[path])
        self.commit(b, tokens, num_accepted, out_offsets,
                    nonfinite_rows(along.flatten(1, 2), drafted_log_probs.flatten(1, 2)))

    def plain_step(self, bucket: int, key: torch.Tensor, last: torch.Tensor, out_offsets: torch.Tensor) -> None:
        """The plain arm's step: one target forward of the pending token and one token drawn from its warped p
        with the step's key on the sample stream at position 0 (the eager engine's draw), committed in the
        [B, Γ+1] layout (-1 past the first column, never emitted). With "all" the model drafts still re-read
        their window, so none lags; under lazy sync they catch up when next chosen."""
        b = self.buffers
        if self.sync_all:
            self.windows(bucket, last, 0, None)
        logits = self.target.forward(b.seq.gather(1, last[:, None]), last[:, None], bucket)[:, 0]
        token, _ = self.sample(logits, self.sampling, key, position=self.draw_positions[0],
                               stream=self.draw_streams[rng.STREAM_SAMPLE])
        padded = torch.nn.functional.pad(token[:, None], (0, self.max_gamma), value=-1)
        self.commit(b, padded, torch.zeros_like(token), out_offsets, nonfinite_rows(logits[:, None], None))

    def _lookup(self, drafter: PromptLookupDrafter, width: int, gamma: int) -> torch.Tensor:
        """Prompt lookup over each row's last `width` tokens, right-aligned as the drafter reads them."""
        b = self.buffers
        index = torch.arange(width, device=self.device)[None] - (width - b.lengths)[:, None]
        valid = index >= 0
        tokens = b.seq.gather(1, index.clamp(min=0, max=self.capacity - 1))
        return drafter.propose_tokens(tokens, valid, gamma)

    def launch(self, arm: int, bucket: int, catch_up: int = 0) -> int:
        """Run one step (after the catch-up of `arm`'s draft over `catch_up` tokens, when > 0):
        replay their graphs (each captured on first use) or run them eagerly. Returns how many graphs
        were captured (0, 1 or 2; when any, the step's time is mostly capture)."""
        work = [(("step", arm, bucket), lambda: self.step(arm, bucket))]
        if catch_up:
            work.insert(0, (("catch_up", arm, bucket, catch_up), lambda: self.catch_up(arm, bucket, catch_up)))
        captured = 0
        for key, run in work:
            if not self.use_graphs:
                run()
                continue
            graph = self.graphs.get(key)
            if graph is None:
                graph = self.graphs[key] = self._capture(run)
                captured += 1
            graph.replay()
        return captured

    def close(self) -> None:
        """Drop every graph this session and its runners hold, now: a runner and its prefill graphs refer to
        each other, so without this they (and their caches) wait for the garbage collector."""
        self.graphs.clear()
        for model in self.runners():
            model.release_graphs()

    def runners(self) -> list[runner.LlamaRunner]:
        """The target's runner, then each model draft's (prompt-lookup drafts have none)."""
        return [self.target, *(d for d in self.drafts if isinstance(d, runner.LlamaRunner))]

    def prefilled(self) -> list[runner.LlamaRunner]:
        """The runners a request's prefill fills: the target's, and every model draft's under `draft_sync="all"`.
        A lazily synced draft reads the whole context in the catch-up before its first step instead (`run`), so a
        draft the policy does not play in a request costs it nothing."""
        return self.runners() if self.sync_all else [self.target]

    @property
    def prefill_graphs(self) -> int:
        """Prefill graphs this session's runners hold, one per runner and width bucket (the fast path
        builds no other `GraphedStep`)."""
        return sum(model.captures for model in self.runners())

    def catches_up(self, draft: int) -> bool:
        """Whether draft `draft` (an index; -1 for the plain arm, which has none) reads what it missed before its
        window: a model draft under lazy sync."""
        return draft >= 0 and isinstance(self.drafts[draft], runner.LlamaRunner) and not self.sync_all

    def capture_all(self, lengths: Sequence[int]) -> int:
        """`FastSpeculativeDecoder.capture_graphs` for this session: returns how many graphs it captured."""
        if not self.use_graphs:
            return 0
        b = self.buffers
        saved = b.lengths.clone()
        captured = -self.prefill_graphs  # plus the prefill graphs held at the end
        try:
            for bucket in sorted({runner.bucket_for(min(n, self.capacity), self.capacity) for n in lengths}):
                for arm, (draft, gamma) in enumerate(self.arms):
                    reach = self.reach_of(gamma)
                    if bucket < reach + 1:  # the step loop never attends over fewer slots than γ+1 (1 + K·γ)
                        continue
                    b.lengths.fill_(capture_fill(bucket, self.capacity, reach, max(reach, self.max_gamma)))
                    work = {("step", arm, bucket): lambda arm=arm, bucket=bucket: self.step(arm, bucket)}
                    for n in (catch_up_choices(bucket) if self.catches_up(draft) else ()):
                        work[("catch_up", arm, bucket, n)] = (
                            lambda arm=arm, bucket=bucket, n=n: self.catch_up(arm, bucket, n))
                    for key, run in work.items():
                        if key not in self.graphs:
                            self.graphs[key] = self._capture(run)
                            captured += 1
                for model in self.prefilled():  # a prompt whose width has this bucket: its prefill's graph
                    model.prefill_graph(self.batch, bucket)  # its warm-ups write the scratch slot only
        finally:
            b.lengths.copy_(saved)
        return captured + self.prefill_graphs

    def _capture(self, run: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """Capture `run` (a step or a catch-up). Warm-up runs are frozen: they rewrite cache slots
        the next real step writes again, and commit nothing."""
        b = self.buffers
        b.frozen.fill_(True)
        try:
            graph, _ = runner.capture(run, warmup=2)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as error:  # e.g. a kernel (a quantized matmul) that synchronises with the host
            raise RuntimeError(f"capturing a fast step in a CUDA graph (its warm-up runs or the capture) failed: "
                               f"{error}. Pass graphs=False to run the steps without graphs") from error
        finally:
            b.frozen.fill_(False)
        return graph

    # ------------------------------------------------------------------------------- the host loop
    def run(self, decoder: Any, budgets: list[int], lengths: list[int],
            stats: GenerationStats, on_step: Callable[[StepEvent], None] | None) -> list[int]:
        """Launch steps until every row is done; read each step's outcome `lag` steps later."""
        b, lag = self.buffers, decoder.lag
        cuda = self.device.type == "cuda"
        width = max(lengths)
        slots = lag + 1
        pinned = torch.zeros((slots, self.batch, self.max_gamma + 4), dtype=torch.long, pin_memory=cuda)
        done_host = torch.zeros((slots, self.batch), dtype=torch.bool, pin_memory=cuda)
        events = [torch.cuda.Event(enable_timing=True) if cuda else None for _ in range(slots)]
        last_end = torch.cuda.Event(enable_timing=True) if cuda else None
        if cuda:
            last_end.record()
        issued: list[Launch] = []
        num_generated = [0] * self.batch
        active = [budget > 0 for budget in budgets]
        known_max = width  # the longest row as of the last step read
        # Per draft model (arms sharing a draft share its cache): at most how many tokens were appended
        # since its cache was last complete: the γ+1 of each step from its last run on (1 for a plain step);
        # the prefill counts as a step of the largest γ (with one γ: the draft is (steps away)·(γ+1) behind). A draft
        # the prefill left out (`prefilled`) is behind by everything: its first catch-up reads the whole bucket.
        behind = [self.max_gamma + 1 if self.sync_all else self.capacity + self.max_gamma + 1] * len(self.drafts)
        read = 0

        def consume() -> bool:
            """Read the oldest unread step's outcome; True when every row is done."""
            nonlocal read, known_max, last_end
            launch = issued[read]
            step, arm, gamma = launch.step, launch.arm, launch.gamma
            slot = step % slots
            if cuda:
                events[slot].synchronize()
                latency = last_end.elapsed_time(events[slot]) / 1e3
                last_end = events[slot]
            else:
                latency = time.perf_counter() - launch.launched
            if decoder.step_costs is not None and not launch.captured:
                # the step's cost: device time between step ends on CUDA, its synchronous launch on a CPU
                decoder.step_costs.observe(arm, latency if cuda else launch.host_s, launch.switched)
            outcome = pinned[slot].tolist()
            accepted, kept = [row[-3] for row in outcome], [row[-2] for row in outcome]
            rows = [row for row in range(self.batch) if active[row]]
            # the step's logits held NaN or +inf in a row still generating: its tokens are arbitrary (no extra sync:
            # the flag rides the outcome copy read here)
            check_finite([row[-1] for row in outcome], rows, step, decoder.arm_names[arm])
            update_policy(decoder.policy, arm, [accepted[row] for row in rows], gamma, decoder.step_costs)
            if rows:
                stats.record(StepRecord(step=step, arm=arm, gamma=gamma,
                                        num_accepted=[accepted[row] for row in rows],
                                        kept=[kept[row] for row in rows], latency_s=latency))
            for row in range(self.batch):
                num_generated[row] += kept[row]
                active[row] = not bool(done_host[slot, row])
            known_max = max(length + count for length, count in zip(lengths, num_generated))
            if decoder.tp is not None:  # tensor parallel: compare emitted tokens across ranks every K steps
                decoder.tp.guard_step(step, arm, [outcome[row][: kept[row]] for row in range(self.batch)])
            if on_step is not None and rows:
                on_step(StepEvent(step=step, arm=arm, new_tokens=[outcome[row][: kept[row]] for row in range(self.batch)],
                                  num_generated=list(num_generated), gamma=gamma))
            read += 1
            return not any(active)

        finished = not any(active)
        step = 0
        previous_draft: int | None = None
        while not finished:
            if step - read >= lag:
                finished = consume()
                if finished:
                    break
            arm = decoder.choose_arm()
            draft, gamma = self.arms[arm]
            # the longest row is at most the last read length plus γ+1 per unread step
            reach = self.reach_of(gamma)
            bound = min(known_max + sum(launch.gamma + 1 for launch in issued[read:]), self.capacity - reach - 1)
            bucket = runner.bucket_for(bound + reach, self.capacity)
            catch_up = 0
            if self.catches_up(draft):
                catch_up = catch_up_tokens(behind[draft], gamma, bucket)
                behind[draft] = 0
                self.catch_ups[catch_up] += 1
            behind = [count + gamma + 1 for count in behind]
            launched = time.perf_counter()
            captured = self.launch(arm, bucket, catch_up)
            host_s = time.perf_counter() - launched
            decoder.graphs_captured += captured
            slot = step % slots
            pinned[slot].copy_(b.outcome, non_blocking=True)
            done_host[slot].copy_(b.done, non_blocking=True)
            if cuda:
                events[slot].record()
            issued.append(Launch(step, arm, gamma, launched, host_s, captured > 0,
                                  None if previous_draft is None else draft != previous_draft))
            previous_draft = draft
            step += 1
        while read < len(issued):  # drain: steps launched after the last row finished append nothing
            consume()
        if decoder.tp is not None:
            decoder.tp.guard_check(read - 1)
        return num_generated


