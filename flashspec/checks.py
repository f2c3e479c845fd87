"""Input checks of the request front both engines share (`flashspec.front`): prompts, budgets, token ids,
padding, and the on-device non-finite flag. Each raises a ValueError
(FloatingPointError for bad logits) that names the argument and the fix."""
from __future__ import annotations

from typing import Any

import torch

from flashspec import models


def nonfinite_rows(target_logits: torch.Tensor, draft_logits: torch.Tensor | None) -> torch.Tensor:
    """[B] int64 on the device: 1 where a row's target or draft logits hold NaN or +inf, or a
    position whose logits are all -inf (no distribution to sample from). One max per position:
    the max propagates NaN and +inf and is -inf only for an all -inf position."""
    bad = ~torch.isfinite(target_logits.amax(dim=-1)).all(dim=-1)
    if draft_logits is not None:
        bad = bad | ~torch.isfinite(draft_logits.amax(dim=-1)).all(dim=-1)
    return bad.long()


def check_finite(flags: list[int], active_rows: list[int], step: int, arm_name: str) -> None:
    """Raise when an active row's logits were flagged by `nonfinite_rows`: a model that returns NaN
    would otherwise make the verifier emit arbitrary tokens."""
    bad = [row for row in active_rows if flags[row]]
    if bad:
        raise FloatingPointError(
            f"non-finite logits (NaN, +inf or an all -inf row) at step {step}, rows {bad}, from the target or "
            f"the draft {arm_name!r}; check the model's weights and dtype (fp16 overflow is a common cause; "
            "try dtype=torch.bfloat16 or float32)"
        )


def check_token_ids(name: str, value: Any, vocab_size: int) -> set[int]:
    """`value` (an id or a list of ids) as a set, each in [0, vocab_size); ValueError otherwise."""
    try:
        ids = models.as_id_set(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a token id or a list of ids, got {value!r}") from None
    outside = sorted(token for token in ids if not 0 <= token < vocab_size)
    if outside:
        raise ValueError(f"{name} {outside} lies outside the target's vocabulary [0, {vocab_size}); pass valid ids")
    return ids


def check_prompt(
    input_ids: Any, attention_mask: Any, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate prompts; return (input_ids [B, P] long, mask [B, P] bool). Padding must be on the left."""
    if not isinstance(input_ids, torch.Tensor):
        raise ValueError(f"input_ids must be a LongTensor [B, P], got {type(input_ids).__name__}")
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if input_ids.dim() != 2 or input_ids.shape[0] < 1:
        raise ValueError(f"input_ids must be [B, P] with B >= 1, got shape {tuple(input_ids.shape)}")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise ValueError(f"input_ids must hold integer token ids, got {input_ids.dtype}")
    if input_ids.shape[1] == 0:
        raise ValueError("input_ids is an empty prompt; give at least one token per row (e.g. the BOS token)")
    input_ids = input_ids.long()
    if attention_mask is None:
        mask = torch.ones_like(input_ids, dtype=torch.bool)
    else:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}, "
                f"got {getattr(attention_mask, 'shape', type(attention_mask).__name__)}"
            )
        mask = attention_mask.to(input_ids.device).bool()
        if bool((mask[:, 1:].long() < mask[:, :-1].long()).any()):
            raise ValueError("attention_mask has right padding; pad prompts on the left (tokenizer.padding_side='left')")
    empty = (~mask.any(dim=1)).nonzero()
    if empty.numel():
        raise ValueError(f"prompt row {int(empty[0, 0])} is empty (attention_mask all zero); give it at least one token")
    real = input_ids[mask]
    if bool(((real < 0) | (real >= vocab_size)).any()):
        raise ValueError(f"input_ids must lie in [0, {vocab_size}) (the target's vocabulary)")
    return input_ids, mask


def check_budgets(max_new_tokens: Any, batch: int) -> list[int]:
    """max_new_tokens (an int, a 0-d integer tensor, or one per row) as one int >= 0 per row."""
    many = isinstance(max_new_tokens, (list, tuple)) or (
        isinstance(max_new_tokens, torch.Tensor) and max_new_tokens.dim() > 0)
    values = list(max_new_tokens.tolist() if isinstance(max_new_tokens, torch.Tensor) else max_new_tokens) if many \
        else [max_new_tokens] * batch
    if len(values) != batch:
        raise ValueError(f"max_new_tokens has {len(values)} entries but there are {batch} rows")
    budgets = []
    for value in values:
        if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.dtype.is_floating_point:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"max_new_tokens must be an int >= 0 (or one per row), got {max_new_tokens!r}")
        budgets.append(value)
    return budgets


def resolve_pad(pad_token_id: int | None, target: torch.nn.Module, stop_ids: set[int]) -> int:
    """The id written after a row ends: the argument, the target's pad, its EOS, else 0."""
    if pad_token_id is not None:
        return int(pad_token_id)
    special = models.special_token_ids(target)
    for candidate in (special["pad_token_id"], special["eos_token_id"]):
        ids = sorted(models.as_id_set(candidate))
        if ids:
            return ids[0]
    return min(stop_ids) if stop_ids else 0
