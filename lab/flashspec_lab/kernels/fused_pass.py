"""Verification in one launch: grid (row blocks, V-splits). Every program reduces its V-chunk of all 2γ+1
rows of its row block (the γ+1 target rows, the γ draft rows) to the stats partials, exactly as
`_stats_kernel` does; the last program of the row block to finish (an atomic ticket, acquire-release, so
it sees every other program's partials) runs the sampling pass's program over the whole vocabulary:
the accept test, then the race over the one position each row samples from. Same partials, same
race, same tie-breaking as the two launches, so the same tokens for the same V-splits.

No program waits for another (a spin-wait would deadlock Triton's interpreter, which runs programs one
after another, and a GPU whose grid does not fit at once); the price is that one program streams the
sampled row alone. See `flashspec.kernels.verify` for the whole step."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec.kernels.sample_pass import _sample_program
from flashspec.kernels.stats_pass import _chunk_stats


@triton.jit(do_not_specialize=["accept_prefix", "sample_prefix"])
def _fused_kernel(
    target_ptr,  # [B, γ+1, V] target logits, contiguous
    draft_ptr,  # [B, γ, V] draft logits, contiguous (not read unless HAS_DRAFT)
    tokens_ptr,  # [B, γ] drafted token ids, contiguous
    part_max_ptr,  # [B, 2γ+1, S] fp32 work: chunk maxima
    part_sum_ptr,  # [B, 2γ+1, S] fp32 work: chunk sums (not used when GREEDY)
    part_idx_ptr,  # [B, 2γ+1, S] int32 work: chunk argmax (GREEDY only)
    counter_ptr,  # [row blocks] int32 tickets, zero between calls (the last program resets its own)
    out_tokens_ptr,  # [B, γ+1] int64 out
    out_accepted_ptr,  # [B] int64 out
    batch,  # B
    gamma,  # γ
    vocab,  # V
    num_splits,  # S
    scale,  # T or float32(1/T), as for _stats_kernel
    accept_prefix,  # as for _sample_kernel
    sample_prefix,
    CHUNK: tl.constexpr,  # V-elements per split, a multiple of STATS_BLOCK_V
    ROW: tl.constexpr,  # V rounded up to a multiple of BLOCK_V: what the last program streams
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    GREEDY: tl.constexpr,
    SPLIT: tl.constexpr,  # S > 1: the programs of a row block meet through the ticket counter
    PRECISE: tl.constexpr,
    PREFIX_IN_MEMORY: tl.constexpr,
    LANES: tl.constexpr,  # as for _sample_kernel
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,  # power of two >= γ+1
    BLOCK_S: tl.constexpr,  # power of two >= S
    STATS_BLOCK_V: tl.constexpr,  # vocabulary tile of the stats part
    BLOCK_V: tl.constexpr,  # vocabulary tile of the sample part
):
    pid_b = tl.program_id(0)
    split = tl.program_id(1)
    for position in tl.static_range(BLOCK_P):
        if position <= gamma:
            _chunk_stats(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr,
                         pid_b, position, split, batch, gamma, vocab, num_splits, scale,
                         CHUNK, SCALE_MODE, HAS_DRAFT, GREEDY, BLOCK_B, STATS_BLOCK_V, 0)
    if SPLIT:
        tl.debug_barrier()  # every thread's partials precede the release below
        ticket = tl.atomic_add(counter_ptr + pid_b, 1, sem="acq_rel", scope="gpu")
        if ticket == num_splits - 1:  # the last program of this row block: every partial is written
            _sample_program(target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr,
                            part_max_ptr, part_idx_ptr, counter_ptr, part_max_ptr, out_tokens_ptr, out_accepted_ptr,
                            pid_b, split * 0, batch, gamma, vocab, num_splits, 1, scale, accept_prefix, sample_prefix,
                            ROW, SCALE_MODE, HAS_DRAFT, GREEDY, False, PRECISE, PREFIX_IN_MEMORY, True, LANES, False,
                            BLOCK_B, BLOCK_P, BLOCK_S, 1, BLOCK_V)
            tl.atomic_xchg(counter_ptr + pid_b, 0)  # ready for the next call
    else:
        tl.debug_barrier()  # the partials of other threads of this program
        _sample_program(target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr,
                        part_max_ptr, part_idx_ptr, counter_ptr, part_max_ptr, out_tokens_ptr, out_accepted_ptr,
                        pid_b, split * 0, batch, gamma, vocab, num_splits, 1, scale, accept_prefix, sample_prefix,
                        ROW, SCALE_MODE, HAS_DRAFT, GREEDY, False, PRECISE, PREFIX_IN_MEMORY, True, LANES, False,
                        BLOCK_B, BLOCK_P, BLOCK_S, 1, BLOCK_V)
