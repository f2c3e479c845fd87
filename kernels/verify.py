"""Speculative verification in two Triton launches, with no host sync (book/design.md §1, §4).

Launch 1, `_stats_kernel` -- one streaming pass over every logit row. Grid
(row blocks, γ+1 positions, V-splits); each program reduces one V-chunk of the target row
at its position and of the draft row at the same position to an online log-sum-exp partial
(max, sum of exp(x - max)) -- or, greedy, to a (max, first argmax) partial.

Launch 2, `_sample_kernel` -- accept, then residual/bonus sample. Grid (row blocks,
V-splits). Every program first redoes the accept test of its rows from the ≤ 2γ+1
partials and the two logits at each drafted token (O(1) in V per candidate), so it knows
n = the first rejection without waiting for anyone; then it streams its V-chunk of the
one position it samples from (the first rejected, or the bonus position γ): an
exponential race (Gumbel-max) over log max(0, p - q), or over log p for the bonus, with
counter-based noise. It writes its chunk's winner; the last program of its row block
to finish (an atomic ticket) reduces the chunk winners and writes tokens/num_accepted.
So B = 1 still spreads each pass over the whole GPU, and nothing returns to the host.

Both kernels take BLOCK_B rows per program: 1 on a GPU with a real vocabulary; many when the
vocabulary is tiny or when Triton runs in its CPU interpreter, where each program costs
milliseconds of Python.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language import core as tlcore
from triton.language.extra import libdevice

from flashspec import rng
from flashspec.kernels import rng as krng
from flashspec.kernels.rng import device_function
from flashspec.sampling import SamplingParams, truncate_logits

# How a logit is scaled by the temperature, chosen to round exactly as torch does it:
# torch divides on the CPU and multiplies by float32(1/T) on CUDA (a CPU-scalar divisor).
SCALE_NONE = 0
SCALE_DIVIDE = 1
SCALE_MULTIPLY = 2

INT32_MAX = tl.constexpr(2**31 - 1)  # constexpr: read inside the kernels


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1, read at import:
    Triton itself reads it when it is first imported)."""
    return _INTERPRET


_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


def _cdiv(a: int, b: int) -> int:
    """Ceiling division on host ints (triton.cdiv is a jit helper, slow to call from Python)."""
    return -(-a // b)


# ----------------------------------------------------------------------------- reductions
# tl.max / tl.sum / tl.min are jit functions: the interpreter re-patches the language on each
# call (~5 ms). Interpreted, call the builtin reduce with the stock combine functions instead
# (the interpreter maps those to numpy); compiled, use the ordinary reductions. `tlcore` must
# be a global of this module for the interpreter to patch triton.language.core's builtins.
if interpreting():

    def _max(x, axis):
        return tlcore.reduce(x, axis, tl.standard._elementwise_max)

    def _min(x, axis):
        return tlcore.reduce(x, axis, tl.standard._elementwise_min)

    def _sum(x, axis):
        return tlcore.reduce(x, axis, tl.standard._sum_combine)

    def _max_index(x, axis):
        """(max, first index of the max) along `axis`."""
        return tlcore._reduce_with_indices(x, axis, tl.standard._argmax_combine_tie_break_left)

else:

    @triton.jit
    def _max(x, axis: tl.constexpr):
        return tl.max(x, axis)

    @triton.jit
    def _min(x, axis: tl.constexpr):
        return tl.min(x, axis)

    @triton.jit
    def _sum(x, axis: tl.constexpr):
        return tl.sum(x, axis)

    @triton.jit
    def _max_index(x, axis: tl.constexpr):
        """(max, first index of the max) along `axis`."""
        return tl.max(x, axis, return_indices=True)


# ----------------------------------------------------------------------------- math helpers
@device_function
def _log(x, PRECISE: tl.constexpr):
    """Natural log; correctly rounded libdevice on a GPU (the interpreter uses numpy's)."""
    if PRECISE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@device_function
def _exp(x, PRECISE: tl.constexpr):
    if PRECISE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@device_function
def _log1p(x, PRECISE: tl.constexpr):
    """log(1 + x); the interpreter has no log1p, so it uses Goldberg's exact-ish rewrite."""
    if PRECISE:
        return libdevice.log1p(x)
    else:
        one_plus = 1.0 + x
        return tl.where(one_plus == 1.0, x, tl.log(one_plus) * (x / (one_plus - 1.0)))


@device_function
def _scale(x, scale, SCALE_MODE: tl.constexpr):
    """Logits divided by the temperature, rounded as torch rounds it on this device."""
    if SCALE_MODE == 1:
        return x / scale
    elif SCALE_MODE == 2:
        return x * scale
    else:
        return x


@device_function
def _online_lse(running_max, running_sum, x):
    """Fold a [BLOCK_B, BLOCK_V] tile into per-row (max, sum exp(x - max)); -inf safe."""
    new_max = tl.maximum(running_max, _max(x, axis=1))
    shift = tl.where(new_max == float("-inf"), 0.0, new_max)
    running_sum = running_sum * tl.exp(running_max - shift) + _sum(tl.exp(x - shift[:, None]), axis=1)
    return new_max, running_sum


@device_function
def _combine_lse(part_max, part_sum, PRECISE: tl.constexpr):
    """Reduce [BLOCK_B, BLOCK_P, BLOCK_S] chunk partials to (max, log sum exp(x - max))."""
    row_max = _max(part_max, axis=2)
    shift = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = _sum(part_sum * _exp(part_max - shift[:, :, None], PRECISE), axis=2)
    return row_max, _log(total, PRECISE)


# ----------------------------------------------------------------------------- launch 1
@triton.jit
def _stats_kernel(
    target_ptr,  # [B, γ+1, V] target logits (fp32/bf16/fp16/fp64), contiguous
    draft_ptr,  # [B, γ, V] draft logits, contiguous (not read unless HAS_DRAFT)
    part_max_ptr,  # [B, 2γ+1, S] fp32 out: max of the scaled logits in each V-chunk
    part_sum_ptr,  # [B, 2γ+1, S] fp32 out: sum of exp(logit - chunk max) (not written when GREEDY)
    part_idx_ptr,  # [B, 2γ+1, S] int32 out: first argmax of each chunk (GREEDY only)
    batch,  # B
    gamma,  # γ
    vocab,  # V
    num_splits,  # S
    scale,  # T (SCALE_MODE 1) or float32(1/T) (SCALE_MODE 2)
    CHUNK: tl.constexpr,  # V-elements per split, a multiple of BLOCK_V (constexpr: the interpreter
    #                       cannot loop to a runtime bound under numpy 2)
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,  # draft logits given (False: deterministic proposals, or greedy)
    GREEDY: tl.constexpr,  # T = 0: partial argmax of the target instead of log-sum-exp
    BLOCK_B: tl.constexpr,  # rows per program
    BLOCK_V: tl.constexpr,  # vocabulary tile
):
    pid_b = tl.program_id(0)
    position = tl.program_id(1)  # 0..γ; row j = position of the partials (draft: γ+1+position)
    split = tl.program_id(2)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    rows64 = rows.to(tl.int64)  # int64 offsets: B·(γ+1)·V overflows int32 past 2**31
    target_row = (rows64 * (gamma + 1) + position) * vocab
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    first = split.to(tl.int64) * CHUNK
    width = 2 * gamma + 1
    out_target = (rows64 * width + position) * num_splits + split
    if GREEDY:
        best = tl.full([BLOCK_B], float("-inf"), tl.float32)
        best_idx = tl.zeros([BLOCK_B], tl.int32)
        for start in range(0, CHUNK, BLOCK_V):
            cols = first + start + lanes
            mask = row_ok[:, None] & (cols < vocab)[None, :]
            x = tl.load(target_ptr + target_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            tile_max, tile_arg = _max_index(x.to(tl.float32), axis=1)
            better = tile_max > best  # strict: an earlier index keeps a tie
            best = tl.where(better, tile_max, best)
            best_idx = tl.where(better, (first + start).to(tl.int32) + tile_arg.to(tl.int32), best_idx)
        tl.store(part_max_ptr + out_target, best, mask=row_ok)
        tl.store(part_idx_ptr + out_target, best_idx, mask=row_ok)
    else:
        # A [BLOCK_B] mask, not a scalar: Triton 3.9's interpreter stores `tensor & scalar-compare`
        # as int32, which its loads and stores reject ("mask has unsupported dtype").
        has_draft_row = (rows * 0 + position) < gamma
        draft_row = (rows64 * gamma + position) * vocab
        p_max = tl.full([BLOCK_B], float("-inf"), tl.float32)
        p_sum = tl.zeros([BLOCK_B], tl.float32)
        q_max = tl.full([BLOCK_B], float("-inf"), tl.float32)
        q_sum = tl.zeros([BLOCK_B], tl.float32)
        for start in range(0, CHUNK, BLOCK_V):
            cols = first + start + lanes
            mask = row_ok[:, None] & (cols < vocab)[None, :]
            x = tl.load(target_ptr + target_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            p_max, p_sum = _online_lse(p_max, p_sum, _scale(x.to(tl.float32), scale, SCALE_MODE))
            if HAS_DRAFT:
                y = tl.load(
                    draft_ptr + draft_row[:, None] + cols[None, :],
                    mask=mask & has_draft_row[:, None],
                    other=float("-inf"),
                )
                q_max, q_sum = _online_lse(q_max, q_sum, _scale(y.to(tl.float32), scale, SCALE_MODE))
        tl.store(part_max_ptr + out_target, p_max, mask=row_ok)
        tl.store(part_sum_ptr + out_target, p_sum, mask=row_ok)
        if HAS_DRAFT:
            out_draft = (rows64 * width + gamma + 1 + position) * num_splits + split
            tl.store(part_max_ptr + out_draft, q_max, mask=row_ok & has_draft_row)
            tl.store(part_sum_ptr + out_draft, q_sum, mask=row_ok & has_draft_row)


# ----------------------------------------------------------------------------- launch 2
@device_function
def _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted, num_accepted,
                   emitted, gamma, vocab):
    """tokens[b] = drafts before n, the emitted token at n (clamped into [0, V)), then -1."""
    emitted = tl.minimum(tl.maximum(emitted, 0), vocab - 1).to(tl.int64)
    n = num_accepted[:, None]
    tokens = tl.where(positions < n, drafted, tl.where(positions == n, emitted[:, None], -1))
    mask = row_ok[:, None] & (positions <= gamma)
    tl.store(out_tokens_ptr + rows64[:, None] * (gamma + 1) + positions, tokens, mask=mask)
    tl.store(out_accepted_ptr + rows64, num_accepted.to(tl.int64), mask=row_ok)


@triton.jit(do_not_specialize=["accept_prefix", "sample_prefix"])
def _sample_kernel(
    target_ptr,  # [B, γ+1, V] target logits, contiguous
    draft_ptr,  # [B, γ, V] draft logits, contiguous (not read unless HAS_DRAFT)
    tokens_ptr,  # [B, γ] drafted token ids (any integer dtype), contiguous
    part_max_ptr,  # [B, 2γ+1, S1] fp32 in: chunk maxima from _stats_kernel
    part_sum_ptr,  # [B, 2γ+1, S1] fp32 in: chunk sums (not read when GREEDY)
    part_idx_ptr,  # [B, 2γ+1, S1] int32 in: chunk argmax (GREEDY only)
    race_val_ptr,  # [B, 2, S2] fp32 work: best race score per split (residual race, target race)
    race_idx_ptr,  # [B, 2, S2] int32 work: its index
    counter_ptr,  # [row blocks] int32 tickets, zero between calls (the last program resets its own)
    out_tokens_ptr,  # [B, γ+1] int64 out
    out_accepted_ptr,  # [B] int64 out
    batch,  # B
    gamma,  # γ
    vocab,  # V
    num_stat_splits,  # S1
    num_splits,  # S2
    scale,  # T or float32(1/T), as for _stats_kernel
    accept_prefix,  # krng.stream_prefix(key, STREAM_ACCEPT) as int32, or (PREFIX_IN_MEMORY) a pointer to it
    sample_prefix,  # krng.stream_prefix(key, STREAM_SAMPLE) as int32, or (PREFIX_IN_MEMORY) a pointer to it
    CHUNK: tl.constexpr,  # V-elements per sampling split, a multiple of BLOCK_V
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    GREEDY: tl.constexpr,
    SPLIT: tl.constexpr,  # S2 > 1: chunk winners meet through the ticket counter
    PRECISE: tl.constexpr,  # libdevice log/exp/log1p (GPU); numpy's in the interpreter
    PREFIX_IN_MEMORY: tl.constexpr,  # the prefixes live in device memory (a captured graph's key changes per replay)
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,  # power of two >= γ+1
    BLOCK_S: tl.constexpr,  # power of two >= S1
    BLOCK_S2: tl.constexpr,  # power of two >= S2
    BLOCK_V: tl.constexpr,
):
    pid_b = tl.program_id(0)
    split = tl.program_id(1)
    if PREFIX_IN_MEMORY:
        accept_prefix = tl.load(accept_prefix)
        sample_prefix = tl.load(sample_prefix)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    rows64 = rows.to(tl.int64)
    positions = tl.arange(0, BLOCK_P)[None, :]  # [1, BLOCK_P]
    width = 2 * gamma + 1

    # ---- accept: n = first rejection, from the partials and two logits per candidate
    r3 = rows64[:, None, None]
    p3 = tl.arange(0, BLOCK_P)[None, :, None]
    s3 = tl.arange(0, BLOCK_S)[None, None, :]
    target_stats = (r3 * width + p3) * num_stat_splits + s3
    stats_mask = row_ok[:, None, None] & (p3 <= gamma) & (s3 < num_stat_splits)
    is_draft = positions < gamma
    drafted = tl.load(tokens_ptr + rows64[:, None] * gamma + positions,
                      mask=row_ok[:, None] & is_draft, other=0).to(tl.int64)
    if GREEDY:
        chunk_max = tl.load(part_max_ptr + target_stats, mask=stats_mask, other=float("-inf"))
        chunk_arg = tl.load(part_idx_ptr + target_stats, mask=stats_mask, other=INT32_MAX)
        row_max = _max(chunk_max, axis=2)
        argmax = _min(tl.where(chunk_max == row_max[:, :, None], chunk_arg, INT32_MAX), axis=2)
        accepted = (drafted == argmax) & is_draft
    else:
        p_max, p_log_sum = _combine_lse(
            tl.load(part_max_ptr + target_stats, mask=stats_mask, other=float("-inf")),
            tl.load(part_sum_ptr + target_stats, mask=stats_mask, other=0.0),
            PRECISE,
        )
        token_ok = row_ok[:, None] & is_draft & (drafted >= 0) & (drafted < vocab)
        target_at_token = tl.load(target_ptr + (rows64[:, None] * (gamma + 1) + positions) * vocab + drafted,
                                  mask=token_ok, other=float("-inf"))
        log_p_x = (_scale(target_at_token.to(tl.float32), scale, SCALE_MODE) - p_max) - p_log_sum
        if HAS_DRAFT:
            draft_stats = target_stats + (gamma + 1) * num_stat_splits
            draft_mask = row_ok[:, None, None] & (p3 < gamma) & (s3 < num_stat_splits)
            q_max, q_log_sum = _combine_lse(
                tl.load(part_max_ptr + draft_stats, mask=draft_mask, other=float("-inf")),
                tl.load(part_sum_ptr + draft_stats, mask=draft_mask, other=0.0),
                PRECISE,
            )
            draft_at_token = tl.load(draft_ptr + (rows64[:, None] * gamma + positions) * vocab + drafted,
                                     mask=token_ok, other=float("-inf"))
            log_q_x = (_scale(draft_at_token.to(tl.float32), scale, SCALE_MODE) - q_max) - q_log_sum
        else:
            log_q_x = tl.zeros([BLOCK_B, BLOCK_P], tl.float32)
        index0 = tl.zeros([1, 1], tl.int32)
        accept_u = krng.uniform_from_base(krng.base_hash(accept_prefix, rows[:, None], positions), index0)
        accepted = (_log(accept_u, PRECISE) <= log_p_x - log_q_x) & is_draft
    num_accepted = _min(tl.where(accepted, BLOCK_P, positions), axis=1)  # in [0, γ]
    at_n = positions == num_accepted[:, None]

    if GREEDY:
        emitted = _sum(tl.where(at_n, argmax, 0), axis=1)
        _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted, num_accepted,
                       emitted, gamma, vocab)
    else:
        # ---- residual (n < γ) or bonus (n = γ) race over this program's V-chunk of position n
        n_p_max = _sum(tl.where(at_n, p_max, 0.0), axis=1)
        n_p_log_sum = _sum(tl.where(at_n, p_log_sum, 0.0), axis=1)
        rejected = num_accepted < gamma
        n64 = num_accepted.to(tl.int64)
        target_row = (rows64 * (gamma + 1) + n64) * vocab
        if HAS_DRAFT:
            n_q_max = _sum(tl.where(at_n, q_max, 0.0), axis=1)
            n_q_log_sum = _sum(tl.where(at_n, q_log_sum, 0.0), axis=1)
            draft_row = (rows64 * gamma + tl.minimum(n64, gamma - 1)) * vocab
        else:
            n_token = _sum(tl.where(at_n & is_draft, drafted, 0), axis=1)
        noise_base = krng.base_hash(sample_prefix, rows, num_accepted)
        lanes = tl.arange(0, BLOCK_V).to(tl.int64)
        first = split.to(tl.int64) * CHUNK
        best_w = tl.full([BLOCK_B], float("-inf"), tl.float32)
        best_w_idx = tl.zeros([BLOCK_B], tl.int32)
        best_p = tl.full([BLOCK_B], float("-inf"), tl.float32)
        best_p_idx = tl.zeros([BLOCK_B], tl.int32)
        for start in range(0, CHUNK, BLOCK_V):
            cols = first + start + lanes
            mask = row_ok[:, None] & (cols < vocab)[None, :]
            x = tl.load(target_ptr + target_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            log_p = (_scale(x.to(tl.float32), scale, SCALE_MODE) - n_p_max[:, None]) - n_p_log_sum[:, None]
            if HAS_DRAFT:
                y = tl.load(draft_ptr + draft_row[:, None] + cols[None, :],
                            mask=mask & rejected[:, None], other=float("-inf"))
                log_q = (_scale(y.to(tl.float32), scale, SCALE_MODE) - n_q_max[:, None]) - n_q_log_sum[:, None]
            else:
                log_q = tl.where(cols[None, :] == n_token[:, None], 0.0, float("-inf"))
            # log max(0, p - q) = log p + log1p(-exp(log q - log p)) where q < p, else -inf
            positive = log_q < log_p
            gap = tl.where(positive, log_q - log_p, 0.0)
            log_w = tl.where(positive, log_p + _log1p(-_exp(gap, PRECISE), PRECISE), float("-inf"))
            log_w = tl.where(rejected[:, None], log_w, log_p)
            u = krng.uniform_from_base(noise_base[:, None], cols[None, :])
            gumbel = _log(-_log(u, PRECISE), PRECISE)  # the race: argmax log w - log(-log u)
            score_w = tl.where(mask, log_w - gumbel, float("-inf"))
            score_p = tl.where(mask, log_p - gumbel, float("-inf"))
            tile_w, tile_w_arg = _max_index(score_w, axis=1)
            tile_p, tile_p_arg = _max_index(score_p, axis=1)
            offset = (first + start).to(tl.int32)
            better_w = tile_w > best_w
            best_w = tl.where(better_w, tile_w, best_w)
            best_w_idx = tl.where(better_w, offset + tile_w_arg.to(tl.int32), best_w_idx)
            better_p = tile_p > best_p
            best_p = tl.where(better_p, tile_p, best_p)
            best_p_idx = tl.where(better_p, offset + tile_p_arg.to(tl.int32), best_p_idx)

        if SPLIT:
            race_w = (rows64 * 2) * num_splits + split
            race_p = race_w + num_splits
            tl.store(race_val_ptr + race_w, best_w, mask=row_ok)
            tl.store(race_idx_ptr + race_w, best_w_idx, mask=row_ok)
            tl.store(race_val_ptr + race_p, best_p, mask=row_ok)
            tl.store(race_idx_ptr + race_p, best_p_idx, mask=row_ok)
            tl.debug_barrier()  # every thread's stores precede the release below
            ticket = tl.atomic_add(counter_ptr + pid_b, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:  # last chunk of this row block to finish: reduce all chunks
                s2 = tl.arange(0, BLOCK_S2)[None, :]
                race_mask = row_ok[:, None] & (s2 < num_splits)
                w_off = (rows64[:, None] * 2) * num_splits + s2
                all_w = tl.load(race_val_ptr + w_off, mask=race_mask, other=float("-inf"), volatile=True)
                all_w_idx = tl.load(race_idx_ptr + w_off, mask=race_mask, other=INT32_MAX, volatile=True)
                all_p = tl.load(race_val_ptr + w_off + num_splits, mask=race_mask, other=float("-inf"),
                                volatile=True)
                all_p_idx = tl.load(race_idx_ptr + w_off + num_splits, mask=race_mask, other=INT32_MAX,
                                    volatile=True)
                best_w = _max(all_w, axis=1)
                best_w_idx = _min(tl.where(all_w == best_w[:, None], all_w_idx, INT32_MAX), axis=1)
                best_p = _max(all_p, axis=1)
                best_p_idx = _min(tl.where(all_p == best_p[:, None], all_p_idx, INT32_MAX), axis=1)
                # max(0, p - q) can round to zero everywhere when p == q: fall back to p (the limit)
                emitted = tl.where(best_w > float("-inf"), best_w_idx, best_p_idx)
                _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted,
                               num_accepted, emitted, gamma, vocab)
                tl.atomic_xchg(counter_ptr + pid_b, 0)  # ready for the next call
        else:
            emitted = tl.where(best_w > float("-inf"), best_w_idx, best_p_idx)
            _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted, num_accepted,
                           emitted, gamma, vocab)


# ----------------------------------------------------------------------------- host side
@dataclass(frozen=True)
class LaunchPlan:
    """Grid and block sizes of one verify_triton call (a pure function of shapes and device)."""

    block_b: int
    stats_block_v: int
    stats_chunk: int
    stats_splits: int
    sample_block_v: int
    sample_chunk: int
    sample_splits: int
    stats_warps: int
    sample_warps: int
    block_p: int  # next power of two >= γ+1
    block_s: int  # next power of two >= stats_splits
    block_s2: int  # next power of two >= sample_splits

    @property
    def launches(self) -> int:
        return 2


@functools.lru_cache(maxsize=16)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _splits(vocab: int, block_v: int, programs_per_split: int, target_programs: int,
            max_tiles: int, most: int, forced: int | None) -> tuple[int, int]:
    """(chunk, splits): split V so the grid reaches about `target_programs` programs and no
    program loops over more than `max_tiles` tiles (a long serial loop hides no latency), but
    never into more than `most` splits (a grid axis holds at most 65535 programs, and the
    sampler reduces all splits' partials in one tile)."""
    max_splits = min(_cdiv(vocab, block_v), most)
    if forced is not None:
        wanted = forced
    else:
        wanted = max(_cdiv(target_programs, programs_per_split), _cdiv(vocab, max_tiles * block_v))
    wanted = max(1, min(int(wanted), max_splits))
    chunk = _cdiv(_cdiv(vocab, wanted), block_v) * block_v
    return chunk, _cdiv(vocab, chunk)


MAX_STATS_SPLITS = 256  # the sampler combines [γ+1, splits] log-sum-exp partials per row in one tile
MAX_SAMPLE_SPLITS = 1024  # the last program reduces [splits] race winners in one tile

# Compiled-plan constants (the benchmark sweeps some; call make_plan.cache_clear() after a change).
GPU_PLAN = {
    "stats_block_v": 4096,  # tile of the stats pass (8 warps: 16 bf16 per thread per row)
    "sample_block_v": 1024,  # tile of the sampling pass (4 warps)
    "stats_max_tiles": 4,  # tiles one stats program loops over at most
    "sample_max_tiles": 2,
    "programs_per_sm": 4,  # minimum grid, in programs per SM
    "row_tile": 2048,  # BLOCK_B * BLOCK_V for tiny vocabularies
}


@functools.lru_cache(maxsize=256)
def make_plan(batch: int, gamma: int, vocab: int, device: torch.device, greedy: bool,
              block_b: int | None = None, block_v: int | None = None,
              num_splits: int | None = None) -> LaunchPlan:
    """Choose block sizes and V-splits. On a GPU: one row per program once V is large, and
    enough V-splits for a few programs per SM. Interpreted: whole rows, few programs."""
    if device.type == "cuda" and not interpreting():
        stats_block_v = block_v or min(GPU_PLAN["stats_block_v"], triton.next_power_of_2(vocab))
        sample_block_v = block_v or min(GPU_PLAN["sample_block_v"], triton.next_power_of_2(vocab))
        tile = GPU_PLAN["row_tile"]
        index = device.index if device.index is not None else torch.cuda.current_device()
        target_programs = GPU_PLAN["programs_per_sm"] * _num_sms(index)
        stats_tiles, sample_tiles = GPU_PLAN["stats_max_tiles"], GPU_PLAN["sample_max_tiles"]
    else:
        stats_block_v = sample_block_v = block_v or min(4096, triton.next_power_of_2(vocab))
        tile = 1 << 16
        target_programs = 1
        stats_tiles = sample_tiles = 1 << 30
    if block_b is None:  # compiled: independent of B, so B does not trigger a recompile
        block_b = max(1, tile // stats_block_v)
        if interpreting() or device.type != "cuda":
            block_b = min(triton.next_power_of_2(batch), block_b)
    row_blocks = _cdiv(batch, block_b)
    stats_chunk, stats_splits = _splits(vocab, stats_block_v, row_blocks * (gamma + 1), target_programs,
                                        stats_tiles, MAX_STATS_SPLITS, num_splits)
    if greedy:
        sample_chunk, sample_splits = sample_block_v, 1  # the greedy sampler streams nothing
    else:
        sample_chunk, sample_splits = _splits(vocab, sample_block_v, row_blocks, target_programs, sample_tiles,
                                              MAX_SAMPLE_SPLITS, num_splits)
    return LaunchPlan(
        block_b=block_b,
        stats_block_v=stats_block_v,
        stats_chunk=stats_chunk,
        stats_splits=stats_splits,
        sample_block_v=sample_block_v,
        sample_chunk=sample_chunk,
        sample_splits=sample_splits,
        stats_warps=8 if stats_block_v * block_b >= 4096 else 4,
        sample_warps=4,
        block_p=triton.next_power_of_2(gamma + 1),
        block_s=triton.next_power_of_2(stats_splits),
        block_s2=triton.next_power_of_2(sample_splits),
    )


_COMPILE_OPTIONS: dict = {} if interpreting() else {"enable_fp_fusion": False}

_COUNTERS: dict[tuple[str, int | None], torch.Tensor] = {}


def _ticket_counter(device: torch.device, size: int) -> torch.Tensor:
    """Zeroed int32 tickets, kept between calls (each call's last program resets its entry).
    One buffer per device: calls on one device must not run concurrently on several streams."""
    key = (device.type, device.index)
    counter = _COUNTERS.get(key)
    if counter is None or counter.numel() < size:
        counter = torch.zeros(max(size, 1024), dtype=torch.int32, device=device)
        _COUNTERS[key] = counter
    return counter


def _round16(count: int) -> int:
    return (count + 15) // 16 * 16


@functools.lru_cache(maxsize=64)
def _prefixes(key: rng.Key) -> tuple[int, int]:
    return (krng.as_int32(krng.stream_prefix(key, rng.STREAM_ACCEPT)),
            krng.as_int32(krng.stream_prefix(key, rng.STREAM_SAMPLE)))


def _device_prefixes(key: torch.Tensor) -> torch.Tensor:
    """int32 [2]: the accept and sample stream prefixes of a device key (lo, hi), in torch ops --
    `krng.stream_prefix` without leaving the device."""
    h = rng.fmix32(rng.fmix32((key[0] ^ rng.SALT) & rng.MASK32) ^ key[1])
    prefixes = torch.stack([rng.fmix32(h ^ rng.STREAM_ACCEPT), rng.fmix32(h ^ rng.STREAM_SAMPLE)])
    return torch.where(prefixes >= 2**31, prefixes - 2**32, prefixes).to(torch.int32)


class _Launcher:
    """Launch a jit kernel; after its first launch per specialisation, call the compiled binary
    directly. Triton's own per-call path (argument binding, cache key built from a string of
    the options) costs tens of µs of host time, more than the kernels at small B. Our key
    refines Triton's specialisation -- every tensor's dtype and 16-byte alignment, every int's
    divisibility by 16, equality to 1 and int32 range, every constexpr and option -- so a cached
    binary is the one Triton itself would pick. FLASHSPEC_TRITON_FAST_LAUNCH=0 turns it off."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.binaries: dict = {}

    @staticmethod
    def _spec(arg) -> object:
        if isinstance(arg, torch.Tensor):
            return (arg.dtype, arg.data_ptr() % 16 == 0)
        if isinstance(arg, bool):
            return ("b", arg)
        if isinstance(arg, int):
            return (arg % 16 == 0, arg == 1, -(2**31) <= arg < 2**31)
        return type(arg)

    def __call__(self, grid: tuple, args: tuple, meta: dict) -> None:
        if interpreting():
            with np.errstate(all="ignore"):  # log(0), inf - inf in masked lanes are intended
                self.kernel[grid](*args, **meta)
            return
        if not FAST_LAUNCH:
            self.kernel[grid](*args, **meta)
            return
        device = torch.cuda.current_device()
        key = (device, tuple(self._spec(a) for a in args), tuple(meta.items()))
        binary = self.binaries.get(key)
        if binary is None:
            self.binaries[key] = self.kernel[grid](*args, **meta)
            return
        constexprs = tuple(meta[name] for name in self.kernel.arg_names[len(args):])
        stream = _current_stream(device)
        binary.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream,
                   binary.function, binary.packed_metadata, binary.launch_metadata(grid, stream, *args, *constexprs),
                   triton.knobs.runtime.launch_enter_hook, triton.knobs.runtime.launch_exit_hook,
                   *args, *constexprs)


FAST_LAUNCH = os.environ.get("FLASHSPEC_TRITON_FAST_LAUNCH", "1") != "0"
_STATS_LAUNCHER = _Launcher(_stats_kernel)
_SAMPLE_LAUNCHER = _Launcher(_sample_kernel)


try:  # what Triton's own launcher uses
    from torch._C import _cuda_getCurrentRawStream as _current_stream
except ImportError:  # pragma: no cover
    def _current_stream(device_index: int) -> int:
        return torch.cuda.current_stream(device_index).cuda_stream


@dataclass
class PreparedVerify:
    """One verify step with its buffers allocated and its two launches bound (no host sync).

    `run()` launches both kernels; the benchmark times `launch_stats` / `launch_sample` alone.
    """

    plan: LaunchPlan
    stats_grid: tuple[int, int, int]
    stats_args: tuple
    stats_meta: dict
    sample_grid: tuple[int, int]
    sample_args: tuple
    sample_meta: dict
    tokens: torch.Tensor
    num_accepted: torch.Tensor

    def launch_stats(self) -> None:
        _STATS_LAUNCHER(self.stats_grid, self.stats_args, self.stats_meta)

    def launch_sample(self) -> None:
        _SAMPLE_LAUNCHER(self.sample_grid, self.sample_args, self.sample_meta)

    def run(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.launch_stats()
        self.launch_sample()
        return self.tokens, self.num_accepted


def verify_triton(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams,
    key: rng.Key | torch.Tensor,
    *,
    block_b: int | None = None,
    block_v: int | None = None,
    num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton backend of `flashspec.verify` (shapes already checked there): (tokens [B, γ+1], num_accepted [B]).

    Two launches, no host sync. Top-k / top-p first truncate the logits in torch (a sort,
    O(V log V)); the kernels' fast path is temperature only. `block_b`, `block_v` and
    `num_splits` override the launch plan (tests use them to force several V-chunks).
    """
    return prepare_verify(target_logits, draft_logits, draft_tokens, params, key,
                          block_b=block_b, block_v=block_v, num_splits=num_splits).run()


def prepare_verify(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams,
    key: rng.Key | torch.Tensor,
    *,
    block_b: int | None = None,
    block_v: int | None = None,
    num_splits: int | None = None,
) -> PreparedVerify:
    """Allocate outputs and work buffers and bind both launches (see `verify_triton`).

    `key` is a host Key (its stream prefixes become launch arguments) or a device int64 tensor [2]
    (lo, hi): then the prefixes are computed on the device into a buffer the kernel reads, so a
    captured graph whose key buffer changes between replays draws new uniforms each time."""
    device = target_logits.device
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got target_logits on {device}; "
            "use backend='torch' (or TRITON_INTERPRET=1 to run the kernels on the CPU)"
        )
    batch, gamma = draft_tokens.shape
    vocab = target_logits.shape[2]
    greedy = params.greedy
    if greedy:
        draft_logits = None
        scale_mode, scale = SCALE_NONE, 1.0
    elif params.needs_truncation:
        target_logits = truncate_logits(target_logits.float() / params.temperature, params)
        if draft_logits is not None:
            draft_logits = truncate_logits(draft_logits.float() / params.temperature, params)
        scale_mode, scale = SCALE_NONE, 1.0
    elif params.temperature == 1.0:
        scale_mode, scale = SCALE_NONE, 1.0
    elif device.type == "cuda":
        scale_mode, scale = SCALE_MULTIPLY, float(np.float32(1.0) / np.float32(params.temperature))
    else:
        scale_mode, scale = SCALE_DIVIDE, float(params.temperature)
    has_draft = draft_logits is not None
    target = target_logits.contiguous()
    draft = draft_logits.contiguous() if has_draft else target
    tokens_in = draft_tokens.contiguous()

    plan = make_plan(batch, gamma, vocab, device, greedy, block_b, block_v, num_splits)
    row_blocks = _cdiv(batch, plan.block_b)
    width = 2 * gamma + 1
    split = plan.sample_splits > 1
    stats_size = _round16(batch * width * plan.stats_splits)
    race_size = _round16(batch * 2 * plan.sample_splits) if split else 0
    # two allocations (fp32 and int32 work), sliced; chunks start 64-byte aligned
    floats = torch.empty(2 * stats_size + race_size, dtype=torch.float32, device=device)
    ints = torch.empty((stats_size if greedy else 0) + race_size + 16, dtype=torch.int32, device=device)
    part_max = floats[:stats_size]
    part_sum = part_max if greedy else floats[stats_size:2 * stats_size]
    part_idx = ints[:stats_size] if greedy else ints
    race_val = floats[2 * stats_size:] if split else floats
    race_idx = ints[(stats_size if greedy else 0):] if split else ints
    counter = _ticket_counter(device, row_blocks) if split else ints
    out_tokens = torch.empty((batch, gamma + 1), dtype=torch.int64, device=device)
    out_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    prefix_in_memory = isinstance(key, torch.Tensor)
    if prefix_in_memory:
        prefixes = _device_prefixes(key)
        accept_prefix, sample_prefix = prefixes[0:1], prefixes[1:2]
    else:
        accept_prefix, sample_prefix = _prefixes(key)

    stats_args = (target, draft, part_max, part_sum, part_idx,
                  batch, gamma, vocab, plan.stats_splits, scale)
    stats_meta = dict(CHUNK=plan.stats_chunk, SCALE_MODE=scale_mode, HAS_DRAFT=has_draft, GREEDY=greedy,
                      BLOCK_B=plan.block_b, BLOCK_V=plan.stats_block_v, num_warps=plan.stats_warps,
                      **_COMPILE_OPTIONS)
    sample_args = (target, draft, tokens_in, part_max, part_sum, part_idx, race_val, race_idx, counter,
                   out_tokens, out_accepted,
                   batch, gamma, vocab, plan.stats_splits, plan.sample_splits, scale,
                   accept_prefix, sample_prefix)
    sample_meta = dict(CHUNK=plan.sample_chunk, SCALE_MODE=scale_mode, HAS_DRAFT=has_draft, GREEDY=greedy,
                       SPLIT=split, PRECISE=not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory,
                       BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_S=plan.block_s, BLOCK_S2=plan.block_s2,
                       BLOCK_V=plan.sample_block_v, num_warps=plan.sample_warps, **_COMPILE_OPTIONS)
    return PreparedVerify(
        plan=plan,
        stats_grid=(row_blocks, gamma + 1, plan.stats_splits),
        stats_args=stats_args,
        stats_meta=stats_meta,
        sample_grid=(row_blocks, plan.sample_splits),
        sample_args=sample_args,
        sample_meta=sample_meta,
        tokens=out_tokens,
        num_accepted=out_accepted,
    )
