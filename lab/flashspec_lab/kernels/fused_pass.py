"""Verification in one launch: grid (row blocks, V-splits). Every program reduces its V-chunk of all 2γ+1
rows of its row block (the γ+1 target rows, the γ draft rows) to the stats partials, exactly as
`_stats_kernel` does; the last program of the row block to finish (an atomic ticket, acquire-release, so
it sees every other program's partials) runs the sampling pass's program over the whole vocabulary:
the accept test, then the race over the one position each row samples from. Same partials, same
race, same tie-breaking as the two launches, so the same tokens for the same V-splits.

No program waits for another (a spin-wait would deadlock Triton's interpreter, which runs programs one
after another, and a GPU whose grid does not fit at once); the price is that one program streams the
sampled row alone. See `flashspec.kernels.verify` for the whole step.

`STRUCTURE` is this launch as a launch structure (`flashspec.kernels.structures`, registered by
`flashspec_lab.kernels`): asked for by `fused=True` or the plan key "fused", with the T = 0 steps as well.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec.kernels.launcher import _COMPILE_OPTIONS, _Launcher, _ticket_counter
from flashspec.kernels.plan import MAX_STATS_SPLITS, vocab_splits
from flashspec.kernels.sample_pass import _sample_program
from flashspec.kernels.shims import _cdiv, interpreting
from flashspec.kernels.stats_pass import _chunk_stats
from flashspec.kernels.structures import FUSED, Launch, PlanContext, Structure, Work


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


# ----------------------------------------------------------------------------- the launch structure
_FUSED_LAUNCHER = _Launcher(_fused_kernel)


@dataclass(frozen=True)
class FusedParams:
    """The fused launch's V-splits (its programs each cover all 2γ+1 rows, in the stats pass's tile)."""

    splits: int
    chunk: int
    block_s: int  # next power of two >= splits


def plan(context: PlanContext) -> FusedParams:
    """As many V-splits as the stats pass would give one position (its grid has no position axis)."""
    chunk, splits = vocab_splits(context.vocab, context.stats_block_v, context.row_blocks, context.target_programs,
                                 context.stats_tiles, MAX_STATS_SPLITS, context.num_splits)
    return FusedParams(splits=splits, chunk=chunk, block_s=triton.next_power_of_2(splits))


def launchers(plan) -> tuple[_Launcher]:
    return (_FUSED_LAUNCHER,)


def work(plan, batch: int, gamma: int, greedy: bool, vocab: int) -> Work:
    """The partials of every row at every split (the last program reads them: no chunk winners)."""
    return Work(stats=batch * (2 * gamma + 1) * plan.params.splits)


def bind(plan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int], scale: float, flags: dict,
         prefix: tuple, device: torch.device, addresses: bool) -> tuple[Launch]:
    """The one fused launch, bound to fresh partial buffers (`work`, as for the two launches)."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    fused = plan.params
    row_blocks = _cdiv(batch, plan.block_b)
    split = fused.splits > 1
    counter = _ticket_counter(device, row_blocks, addresses) if split else work["ints"]
    args = (target, draft, tokens_in, work["part_max"], work["part_sum"], work["part_idx"], counter, out_tokens,
            out_accepted, batch, gamma, vocab, fused.splits, scale, accept_prefix, sample_prefix)
    meta = dict(CHUNK=fused.chunk, ROW=_cdiv(vocab, plan.sample_block_v) * plan.sample_block_v, **flags,
                SPLIT=split, PRECISE=plan.precise and not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory,
                LANES=plan.lanes,
                BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_S=fused.block_s,
                STATS_BLOCK_V=plan.stats_block_v, BLOCK_V=plan.sample_block_v, num_warps=plan.stats_warps,
                **_COMPILE_OPTIONS)
    return (Launch(FUSED, _FUSED_LAUNCHER, (row_blocks, fused.splits), args, meta),)


STRUCTURE = Structure(
    name=FUSED, residual="race", launches=1, launchers=launchers, bind=bind, work=work, plan=plan,
    keys={FUSED: 0},  # 1: one launch (stats, then the last program of each row block samples the whole row)
    priority=0,
    fixes={"accept_once": False, "pdl": False})  # its accept test runs in the last program; one launch
