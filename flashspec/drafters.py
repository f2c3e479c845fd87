"""Drafters: whatever proposes γ tokens per row for the target to verify.

One small protocol (`Drafter`) and two implementations: `ModelDrafter` (any Hugging Face causal LM
sharing the target's tokenizer; samples from its warped distribution and returns the logits it
sampled from) and `PromptLookupDrafter` (model-free n-gram lookup in the context; a deterministic
proposal, verified with a one-hot q).  Drafters are told which of their cached tokens survived a
step (`rollback`) and catch up lazily on tokens they have not seen the next time they propose.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from flashspec import models, rng
from flashspec.sampling import SamplingParams, sample_from_logits


@dataclass(frozen=True)
class DraftContext:
    """What a drafter sees at one step.

    tokens:        LongTensor [B, S], every row's sequence so far, RIGHT-aligned (all rows end at
                   column S-1; rows can have different lengths).
    valid:         BoolTensor [B, S], False left of a row's start and on prompt padding.
    position_ids:  LongTensor [B, S], the position of each token.
    lengths:       per row, the number of tokens of its sequence (host ints; compact indexing).
    next_position: LongTensor [B], the position of the first token to draft.
    gamma:         how many tokens to propose per row.
    sampling:      the SamplingParams shared with the target.
    key:           this step's counter-based key (the verifier's too: never draw from its streams).
    stream:        the stream this drafter samples on (`rng.draft_stream` of its index in the pool).
    """

    tokens: torch.Tensor
    valid: torch.Tensor
    position_ids: torch.Tensor
    lengths: list[int]
    next_position: torch.Tensor
    gamma: int
    sampling: SamplingParams
    key: rng.Key
    stream: int = rng.STREAM_DRAFT


@dataclass(frozen=True)
class Proposal:
    """γ drafted tokens per row and the raw logits they were sampled from (None = deterministic); `log_probs`,
    when the drafter keeps them: the warped log-probs it sampled from ([B, γ, V]), which the verifier reads in
    place of the logits (`flashspec.verify(..., draft_is_log_probs=True)`: no pass over the draft's vocabulary)."""

    tokens: torch.Tensor
    logits: torch.Tensor | None
    log_probs: torch.Tensor | None = None


@runtime_checkable
class Drafter(Protocol):
    """The protocol a user's own drafter implements.

    `reset(batch_size)` starts a new generation; `propose(context)` returns a Proposal of
    `context.gamma` tokens per row, drawn only from the past and the step key on `context.stream` (never from the
    verifier's streams); `rollback(num_valid)` says, per row, that only the first `num_valid[r]`
    tokens of row r's sequence are known to match what the drafter has cached.
    """

    name: str

    def reset(self, batch_size: int) -> None: ...

    def propose(self, context: DraftContext) -> Proposal: ...

    def rollback(self, num_valid: list[int]) -> None: ...


class ModelDrafter:
    """A Hugging Face causal LM as a drafter, with its own KV cache.

    The cache covers a prefix of each row; `propose` first feeds the tokens it has not seen (lazy
    catch-up: one chunked forward, rows right-aligned, already-seen positions masked), then samples
    γ tokens one forward at a time. Like the target's cache, columns a row rejected become holes
    in the drafter's attention mask, and columns that are holes in every row are cropped.
    """

    def __init__(self, model: torch.nn.Module, name: str | None = None, vocab_size: int | None = None) -> None:
        if not hasattr(model, "config") or not callable(model):
            raise ValueError(f"ModelDrafter needs a Hugging Face causal LM, got {type(model).__name__}")
        if name is not None and not isinstance(name, str):
            raise ValueError(f"name must be a string or None, got {type(name).__name__}")
        self.model = model
        self.name = name or getattr(model.config, "_name_or_path", None) or type(model).__name__
        # the target's vocabulary: a draft whose embedding is padded to another size proposes only ids below it
        self.vocab_size = vocab_size
        self.cache: Any = None
        self.mask: torch.Tensor | None = None
        self.seen: list[int] = []
        self.draft_start = 0
        self.proposal_lengths: list[int] | None = None

    @property
    def cached_tokens(self) -> list[int]:
        """Per row, how many tokens of the sequence the cache holds."""
        return list(self.seen)

    def reset(self, batch_size: int) -> None:
        self.cache = models.new_cache(self.model)
        self.mask = None
        self.seen = [0] * batch_size
        self.proposal_lengths = None

    def propose(self, context: DraftContext) -> Proposal:
        batch, width = context.tokens.shape
        if self.cache is None or len(self.seen) != batch:
            self.reset(batch)
        device = context.tokens.device
        if self.mask is None:
            self.mask = torch.zeros((batch, 0), dtype=torch.long, device=device)
        unseen = [max(length - seen, 0) for length, seen in zip(context.lengths, self.seen)]
        chunk = max(1, max(unseen))
        first_new = chunk - torch.tensor(unseen, dtype=torch.long, device=device).view(-1, 1)
        fresh = torch.arange(chunk, device=device).view(1, -1) >= first_new
        self.mask = torch.cat([self.mask, (context.valid[:, width - chunk :] & fresh).long()], dim=1)
        logits = self._logits(context.tokens[:, width - chunk :], context.position_ids[:, width - chunk :])
        ones = torch.ones((batch, 1), dtype=torch.long, device=device)
        drafted, drafted_logits, drafted_log_probs = [], [], []
        for index in range(context.gamma):
            token, log_probs = sample_from_logits(logits, context.sampling, context.key, position=index,
                                                  stream=context.stream)
            drafted.append(token)
            drafted_logits.append(logits)
            drafted_log_probs.append(log_probs)
            if index == context.gamma - 1:
                break
            self.mask = torch.cat([self.mask, ones], dim=1)
            logits = self._logits(token.unsqueeze(1), (context.next_position + index).view(-1, 1))
        self.draft_start = self.mask.shape[1] - (context.gamma - 1)
        self.proposal_lengths = list(context.lengths)
        self.seen = [length + context.gamma - 1 for length in context.lengths]
        return Proposal(tokens=torch.stack(drafted, dim=1), logits=torch.stack(drafted_logits, dim=1),
                        log_probs=torch.stack(drafted_log_probs, dim=1))

    def _logits(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """The last position's logits [B, V] after `tokens`, over the target's vocabulary (`models.fit_vocab`); an
        id past the draft's embedding rows (a target with a larger padded embedding emitted it) reads as its last
        row: the draft only proposes, and the target's verdict keeps the output exact."""
        embedding = self.model.get_input_embeddings()
        if embedding is not None:
            tokens = tokens.clamp(max=embedding.num_embeddings - 1)
        logits = models.forward_logits(self.model, tokens, self.cache, attention_mask=self.mask,
                                       position_ids=position_ids, logits_to_keep=1)[:, -1]
        return logits if self.vocab_size is None else models.fit_vocab(logits, self.vocab_size)

    def rollback(self, num_valid: list[int]) -> None:
        if self.proposal_lengths is None:  # not the drafter of this step: its cache is a prefix already
            self.seen = [min(seen, valid) for seen, valid in zip(self.seen, num_valid)]
            return
        width = self.mask.shape[1] - self.draft_start
        keep_count = [min(max(valid - length, 0), width) for valid, length in zip(num_valid, self.proposal_lengths)]
        if width > 0:
            keep = torch.arange(width, device=self.mask.device).view(1, -1) < torch.tensor(
                keep_count, dtype=torch.long, device=self.mask.device
            ).view(-1, 1)
            self.mask[:, self.draft_start :] = keep.long()
            columns = self.draft_start + max(keep_count)
            models.crop_cache(self.cache, columns)
            self.mask = self.mask[:, :columns]
        self.seen = [min(seen, valid) for seen, valid in zip(self.seen, num_valid)]
        self.proposal_lengths = None


class PromptLookupDrafter:
    """Model-free drafts: find the most recent earlier occurrence of the context's last n tokens
    (n from `max_ngram` down to `min_ngram`) and propose the γ tokens that followed it.

    The proposal is a deterministic function of the context (verified with a one-hot q). When the
    continuation runs into the end of the context it repeats periodically; a row with no match
    proposes its last token γ times. Vectorised on the device: no host sync.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, name: str = "prompt-lookup") -> None:
        for option, value in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{option} must be an int >= 1 (n-gram length), got {value!r}")
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.name = name

    def reset(self, batch_size: int) -> None:
        return None

    def rollback(self, num_valid: list[int]) -> None:
        return None

    def propose(self, context: DraftContext) -> Proposal:
        return Proposal(tokens=self.propose_tokens(context.tokens, context.valid, context.gamma), logits=None)

    def propose_tokens(self, tokens: torch.Tensor, valid: torch.Tensor, gamma: int) -> torch.Tensor:
        """[B, γ] proposals from right-aligned rows `tokens` [B, S] (`valid` marks real tokens)."""
        batch, length = tokens.shape
        device = tokens.device
        start = torch.full((batch,), -1, dtype=torch.long, device=device)
        for ngram in range(self.max_ngram, self.min_ngram - 1, -1):
            if length <= ngram:
                continue
            found = lookup_ngram(tokens, valid, ngram)
            start = torch.where(start < 0, found, start)
        has_match = start >= 0
        period = torch.where(has_match, length - start, torch.ones_like(start))
        first = torch.where(has_match, start, torch.full_like(start, length - 1))
        offsets = torch.arange(gamma, device=device).view(1, -1)
        index = first.view(-1, 1) + offsets % period.view(-1, 1)
        return tokens.gather(1, index)


def lookup_ngram(tokens: torch.Tensor, valid: torch.Tensor, ngram: int) -> torch.Tensor:
    """Per row, the index just after the most recent earlier occurrence of the last `ngram` tokens
    (an occurrence that ends before the last token), or -1 when there is none."""
    length = tokens.shape[1]
    windows = tokens[:, : length - 1].unfold(1, ngram, 1)  # [B, length-ngram, ngram]
    window_valid = valid[:, : length - 1].unfold(1, ngram, 1).all(dim=-1)
    tail = tokens[:, length - ngram :].unsqueeze(1)
    tail_valid = valid[:, length - ngram :].all(dim=-1, keepdim=True)
    matches = (windows == tail).all(dim=-1) & window_valid & tail_valid
    candidates = torch.arange(1, matches.shape[1] + 1, device=tokens.device).view(1, -1)
    last = (matches.long() * candidates).max(dim=1).values  # 1 + window index, 0 = none
    return torch.where(last > 0, last - 1 + ngram, torch.full_like(last, -1))


def as_drafter(draft: Any, index: int, vocab_size: int | None = None) -> Any:
    """Wrap a bare HF model in a ModelDrafter (proposing over the target's `vocab_size` ids); pass drafters
    through; reject anything else."""
    if isinstance(draft, ModelDrafter):
        if vocab_size is not None and draft.vocab_size is None:
            draft.vocab_size = vocab_size
        return draft
    if isinstance(draft, PromptLookupDrafter):
        return draft
    if getattr(draft, "feature_layers", None) is not None:  # flashspec.features.FeatureDraft
        raise ValueError(f"drafts[{index}] is a FeatureDraft: it reads the target's hidden states, which only the "
                         "fast path hands to drafts; use flashspec.fast.FastSpeculativeDecoder (a Llama-family "
                         "target)")
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "config"):
        path = str(getattr(draft.config, "_name_or_path", "") or "").rstrip("/")
        return ModelDrafter(draft, name=f"draft{index}:{path.rsplit('/', 1)[-1]}" if path else f"draft{index}",
                            vocab_size=vocab_size)
    if all(callable(getattr(draft, method, None)) for method in ("reset", "propose", "rollback")):
        if not hasattr(draft, "name"):
            raise ValueError(f"drafts[{index}] implements the Drafter protocol but has no `name` attribute")
        return draft
    raise ValueError(
        f"drafts[{index}] must be a Hugging Face causal LM or a Drafter (reset/propose/rollback/name), "
        f"got {type(draft).__name__}"
    )
