"""Launch 1 of verification: one streaming pass over every logit row, reduced per V-chunk to an online
log-sum-exp partial (max, sum of exp(x - max)) -- or, greedy, to a (max, first argmax) partial.
Grid (row blocks, γ+1 positions, V-splits); `_stats_accept_kernel` also runs the accept test, once per row
block. See `flashspec.kernels.verify` for the whole step."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec.kernels.rng import device_function
from flashspec.kernels.sample_pass import _accept, _store_accept
from flashspec.kernels.shims import _fold_first_max, _lanes_lse, _online_lse, _scale, gdc_launch_dependents


# ----------------------------------------------------------------------------- the partials' layout
@device_function
def _store_partials(part_max_ptr, part_sum_ptr, rows64, positions, split, gamma, num_splits,
                    p_max, p_sum, q_max, q_sum, target_ok, draft_ok, HAS_DRAFT: tl.constexpr):
    """Store one V-chunk's log-sum-exp partials where every reader looks for them: [B, 2γ+1, S], the target's row
    at `position` in slot `position` and the draft's (HAS_DRAFT 1: logits) in slot γ+1+`position`. `rows64` and
    `positions` broadcast: [BLOCK_B] rows at one position, or one row at [BLOCK_P] positions."""
    width = 2 * gamma + 1
    out_target = (rows64 * width + positions) * num_splits + split
    tl.store(part_max_ptr + out_target, p_max, mask=target_ok)
    tl.store(part_sum_ptr + out_target, p_sum, mask=target_ok)
    if HAS_DRAFT == 1:
        out_draft = (rows64 * width + gamma + 1 + positions) * num_splits + split
        tl.store(part_max_ptr + out_draft, q_max, mask=draft_ok)
        tl.store(part_sum_ptr + out_draft, q_sum, mask=draft_ok)


# ----------------------------------------------------------------------------- launch 1
@device_function
def _chunk_stats(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr,
                 pid_b, position, split, batch, gamma, vocab, num_splits, scale,
                 CHUNK: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, GREEDY: tl.constexpr,
                 BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, LANE_ELEMS: tl.constexpr):
    """The partials of one V-chunk (`split`) of the target row at `position` and of the draft row at the
    same position (when there is one and it holds logits), for the BLOCK_B rows of row block `pid_b`. LANE_ELEMS > 0: each lane of
    LANE_ELEMS consecutive logits of a tile (the elements one thread loads) keeps its own running (max, sum) over
    the tiles, and the lanes meet once at the end, instead of the whole tile reducing across threads per tile."""
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    rows64 = rows.to(tl.int64)  # int64 offsets: B·(γ+1)·V overflows int32 past 2**31
    target_row = (rows64 * (gamma + 1) + position) * vocab
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    first = split.to(tl.int64) * CHUNK
    if GREEDY:  # a (max, first argmax) partial in the log-sum-exp partials' slot
        out_target = (rows64 * (2 * gamma + 1) + position) * num_splits + split
        best = tl.full([BLOCK_B], float("-inf"), tl.float32)
        best_idx = tl.zeros([BLOCK_B], tl.int32)
        for start in range(0, CHUNK, BLOCK_V):
            cols = first + start + lanes
            mask = row_ok[:, None] & (cols < vocab)[None, :]
            x = tl.load(target_ptr + target_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            best, best_idx = _fold_first_max(best, best_idx, x.to(tl.float32), (first + start).to(tl.int32))
        tl.store(part_max_ptr + out_target, best, mask=row_ok)
        tl.store(part_idx_ptr + out_target, best_idx, mask=row_ok)
    else:
        # A [BLOCK_B] mask, not a scalar: Triton 3.9's interpreter stores `tensor & scalar-compare`
        # as int32, which its loads and stores reject ("mask has unsupported dtype").
        has_draft_row = (rows * 0 + position) < gamma
        draft_row = (rows64 * gamma + position) * vocab
        if LANE_ELEMS > 0:  # per-lane partials, met once after the loop
            p_max = tl.full([BLOCK_B, BLOCK_V // LANE_ELEMS], float("-inf"), tl.float32)
            p_sum = tl.zeros([BLOCK_B, BLOCK_V // LANE_ELEMS], tl.float32)
            q_max = tl.full([BLOCK_B, BLOCK_V // LANE_ELEMS], float("-inf"), tl.float32)
            q_sum = tl.zeros([BLOCK_B, BLOCK_V // LANE_ELEMS], tl.float32)
        else:
            p_max = tl.full([BLOCK_B], float("-inf"), tl.float32)
            p_sum = tl.zeros([BLOCK_B], tl.float32)
            q_max = tl.full([BLOCK_B], float("-inf"), tl.float32)
            q_sum = tl.zeros([BLOCK_B], tl.float32)
        for start in range(0, CHUNK, BLOCK_V):
            cols = first + start + lanes
            mask = row_ok[:, None] & (cols < vocab)[None, :]
            x = tl.load(target_ptr + target_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            x = _scale(x.to(tl.float32), scale, SCALE_MODE)
            if LANE_ELEMS > 0:
                p_max, p_sum = _online_lse(p_max, p_sum, tl.reshape(x, [BLOCK_B, BLOCK_V // LANE_ELEMS, LANE_ELEMS]), 2)
            else:
                p_max, p_sum = _online_lse(p_max, p_sum, x)
            if HAS_DRAFT == 1:  # logits: their log-sum-exp (log-probs, HAS_DRAFT 2, are normalised already)
                y = tl.load(
                    draft_ptr + draft_row[:, None] + cols[None, :],
                    mask=mask & has_draft_row[:, None],
                    other=float("-inf"),
                )
                y = _scale(y.to(tl.float32), scale, SCALE_MODE)
                if LANE_ELEMS > 0:
                    q_max, q_sum = _online_lse(q_max, q_sum,
                                               tl.reshape(y, [BLOCK_B, BLOCK_V // LANE_ELEMS, LANE_ELEMS]), 2)
                else:
                    q_max, q_sum = _online_lse(q_max, q_sum, y)
        if LANE_ELEMS > 0:
            p_max, p_sum = _lanes_lse(p_max, p_sum)
            q_max, q_sum = _lanes_lse(q_max, q_sum)
        _store_partials(part_max_ptr, part_sum_ptr, rows64, position, split, gamma, num_splits,
                        p_max, p_sum, q_max, q_sum, row_ok, row_ok & has_draft_row, HAS_DRAFT)


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
    HAS_DRAFT: tl.constexpr,  # 1: draft logits, 2: draft log-probs (not streamed), 0: none (deterministic, greedy)
    GREEDY: tl.constexpr,  # T = 0: partial argmax of the target instead of log-sum-exp
    BLOCK_B: tl.constexpr,  # rows per program
    BLOCK_V: tl.constexpr,  # vocabulary tile
    PDL: tl.constexpr = False,  # the sampling launch is a programmatic dependent launch: let it start now
    LANE_ELEMS: tl.constexpr = 0,  # > 0: per-lane partials over LANE_ELEMS logits each (`_chunk_stats`)
):
    if PDL:
        gdc_launch_dependents()
    # position 0..γ: the target row at it, and (position < γ) the draft row at it
    _chunk_stats(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr,
                 tl.program_id(0), tl.program_id(1), tl.program_id(2), batch, gamma, vocab, num_splits, scale,
                 CHUNK, SCALE_MODE, HAS_DRAFT, GREEDY, BLOCK_B, BLOCK_V, LANE_ELEMS)


@triton.jit(do_not_specialize=["accept_prefix"])
def _stats_accept_kernel(
    target_ptr,  # as for _stats_kernel
    draft_ptr,
    tokens_ptr,  # [B, γ] drafted token ids (any integer dtype), contiguous
    part_max_ptr,  # [B, 2γ+1, S] fp32 out, as for _stats_kernel
    part_sum_ptr,
    counter_ptr,  # [row blocks] int32 tickets, zero between calls (the last program resets its own)
    info_ptr,  # [B, 6] 32-bit words out: each row's accept outcome (`_store_accept`)
    batch,  # B
    gamma,  # γ
    vocab,  # V
    num_splits,  # S
    scale,  # as for _stats_kernel
    accept_prefix,  # as for _sample_kernel
    CHUNK: tl.constexpr,
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    PRECISE: tl.constexpr,
    PREFIX_IN_MEMORY: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,  # power of two >= γ+1
    BLOCK_S: tl.constexpr,  # power of two >= S
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr = False,  # as for _stats_kernel
    LANE_ELEMS: tl.constexpr = 0,  # as for _stats_kernel
):
    """`_stats_kernel` at T > 0, and then the last of the (γ+1)·S programs of a row block to finish (an
    acquire-release ticket: it sees every partial) runs the accept test once for the block and stores its
    outcome, so the sampling programs read six words per row instead of each redoing the test."""
    if PDL:
        gdc_launch_dependents()
    pid_b = tl.program_id(0)
    _chunk_stats(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, part_sum_ptr,
                 pid_b, tl.program_id(1), tl.program_id(2), batch, gamma, vocab, num_splits, scale,
                 CHUNK, SCALE_MODE, HAS_DRAFT, False, BLOCK_B, BLOCK_V, LANE_ELEMS)
    tl.debug_barrier()  # every thread's partials precede the release below
    ticket = tl.atomic_add(counter_ptr + pid_b, 1, sem="acq_rel", scope="gpu")
    if ticket == (gamma + 1) * num_splits - 1:
        # a new name: a compiled branch may not change the type of a value defined before it (pointer -> int32)
        if PREFIX_IN_MEMORY:
            prefix = tl.load(accept_prefix)
        else:
            prefix = accept_prefix
        rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        row_ok = rows < batch
        _, num_accepted, _, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token = _accept(
            target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_sum_ptr, rows, row_ok,
            gamma, vocab, num_splits, scale, prefix,
            SCALE_MODE, HAS_DRAFT, False, PRECISE, True, BLOCK_B, BLOCK_P, BLOCK_S)
        _store_accept(info_ptr, rows.to(tl.int64), row_ok, num_accepted, n_p_max, n_p_log_sum, n_q_max,
                      n_q_log_sum, n_token)
        tl.atomic_xchg(counter_ptr + pid_b, 0)  # ready for the sampling pass and the next call
