"""Verification in one cooperative launch: grid (rows, V-splits), every program resident at once.

The two-launch step pays for its shape twice: a second launch, and a second load of the sampled row after
the partials are in. Here each program loads its V-chunk of all 2γ+1 rows of its row (the γ+1 target rows
and the γ draft rows, as [γ+1, BLOCK_V] tiles: one round trip for every position at once), stores their
log-sum-exp partials, and waits at a barrier for the other programs of its row. Past the barrier every
program knows every partial, so it runs the sampling pass's program on its own chunk (`_sample_program`:
the accept test from the partials, the race over the one position its row samples from, chunk winners
meeting through a ticket, the last program writing the tokens). Same partials, same race, same
tie-breaking as the two launches, so the same tokens.

The barrier is a spin on a per-row counter. It needs every program of a row on the GPU at once, which a
cooperative launch guarantees (or refuses to start); `make_plan` keeps the grid within the SMs it was
given. Triton's interpreter runs programs one after another, so a spin would never end there: it runs the
kernel as two launches instead, PHASE 1 (the partials) then PHASE 2 (everything past the barrier), which
is the same code either side of the barrier. See `flashspec.kernels.verify` for the whole step.

`STRUCTURE` is this launch as a launch structure (`flashspec.kernels.structures`, registered by
`flashspec_lab.kernels`): asked for by the plan key "coop", at T > 0 where its grid fits on the GPU at once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec.kernels.launcher import _COMPILE_OPTIONS, _Launcher, _ticket_counter
from flashspec.kernels.plan import MAX_STATS_SPLITS, vocab_splits
from flashspec.kernels.rng import device_function
from flashspec.kernels.sample_pass import _sample_program
from flashspec.kernels.shims import _cdiv, _online_lse, _scale, interpreting
from flashspec.kernels.stats_pass import _store_partials
from flashspec.kernels.structures import Launch, PlanContext, Structure, Work


def barrier_phases(meta: dict) -> list[dict]:
    """The launches one launch of a kernel with a `PHASE` barrier stands for: itself on a GPU; interpreted,
    its two halves either side of the barrier, one after the other (a spin would never end there)."""
    return [{**meta, "PHASE": phase} for phase in (1, 2)] if interpreting() else [meta]


@device_function
def _row_partials(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, row, split, gamma, vocab, num_splits, scale,
                  CHUNK: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr,
                  BLOCK_P: tl.constexpr, BLOCK_V: tl.constexpr):
    """The log-sum-exp partials of V-chunk `split` of every target row (positions 0..γ) and every draft row
    (0..γ-1) of batch row `row`, stored where `_chunk_stats` stores them."""
    positions = tl.arange(0, BLOCK_P)
    row64 = row.to(tl.int64)  # int64 offsets: B·(γ+1)·V overflows int32 past 2**31
    target_rows = (row64 * (gamma + 1) + positions) * vocab
    draft_rows = (row64 * gamma + positions) * vocab
    target_ok = positions <= gamma
    draft_ok = positions < gamma
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    first = split.to(tl.int64) * CHUNK
    p_max = tl.full([BLOCK_P], float("-inf"), tl.float32)
    p_sum = tl.zeros([BLOCK_P], tl.float32)
    q_max = tl.full([BLOCK_P], float("-inf"), tl.float32)
    q_sum = tl.zeros([BLOCK_P], tl.float32)
    for start in range(0, CHUNK, BLOCK_V):
        cols = first + start + lanes
        col_ok = (cols < vocab)[None, :]
        x = tl.load(target_ptr + target_rows[:, None] + cols[None, :], mask=target_ok[:, None] & col_ok,
                    other=float("-inf"))
        p_max, p_sum = _online_lse(p_max, p_sum, _scale(x.to(tl.float32), scale, SCALE_MODE))
        if HAS_DRAFT == 1:  # logits (log-probs are normalised already: `_accept_sampled` reads no partials)
            y = tl.load(draft_ptr + draft_rows[:, None] + cols[None, :], mask=draft_ok[:, None] & col_ok,
                        other=float("-inf"))
            q_max, q_sum = _online_lse(q_max, q_sum, _scale(y.to(tl.float32), scale, SCALE_MODE))
    _store_partials(part_max_ptr, part_sum_ptr, row64, positions, split, gamma, num_splits,
                    p_max, p_sum, q_max, q_sum, target_ok, draft_ok, HAS_DRAFT)


@device_function
def _row_barrier(arrive_ptr, depart_ptr, num_splits):
    """Wait until all `num_splits` programs of this row have arrived (acquire: their partials are visible),
    then count this program out; the last one out resets both counters for the next call."""
    tl.debug_barrier()  # every thread's partials precede the release below
    seen = tl.atomic_add(arrive_ptr, 1, sem="acq_rel", scope="gpu") + 1
    while seen < num_splits:
        seen = tl.atomic_add(arrive_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()  # no thread reads a partial before the wait is over
    out = tl.atomic_add(depart_ptr, 1, sem="acq_rel", scope="gpu")
    if out == num_splits - 1:  # nobody is spinning on arrive any more
        tl.atomic_xchg(arrive_ptr, 0)
        tl.atomic_xchg(depart_ptr, 0)


@triton.jit(do_not_specialize=["accept_prefix", "sample_prefix"])
def _coop_kernel(
    target_ptr,  # [B, γ+1, V] target logits, contiguous
    draft_ptr,  # [B, γ, V] draft logits, contiguous (not read unless HAS_DRAFT)
    tokens_ptr,  # [B, γ] drafted token ids, contiguous
    part_max_ptr,  # [B, 2γ+1, S] fp32 work: chunk maxima
    part_sum_ptr,  # [B, 2γ+1, S] fp32 work: chunk sums of exp(x - max)
    race_val_ptr,  # [B, 2, S] fp32 work: best race score per split (residual race, target race)
    race_idx_ptr,  # [B, 2, S] int32 work: its index
    counter_ptr,  # [3B] int32, zero between calls: race tickets, then barrier arrivals, then departures
    out_tokens_ptr,  # [B, γ+1] int64 out
    out_accepted_ptr,  # [B] int64 out
    batch,  # B
    gamma,  # γ
    vocab,  # V
    num_splits,  # S
    scale,  # T or float32(1/T), as for _stats_kernel
    accept_prefix,  # as for _sample_kernel
    sample_prefix,
    CHUNK: tl.constexpr,  # V-elements per split, a multiple of BLOCK_V
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    PHASE: tl.constexpr,  # 0: the whole step (a cooperative launch); 1: the partials only; 2: the rest
    PRECISE: tl.constexpr,
    PREFIX_IN_MEMORY: tl.constexpr,
    LANES: tl.constexpr,  # as for _sample_kernel
    BLOCK_P: tl.constexpr,  # power of two >= γ+1
    BLOCK_S: tl.constexpr,  # power of two >= S
    BLOCK_V: tl.constexpr,  # vocabulary tile
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    if PHASE != 2:
        _row_partials(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, row, split, gamma, vocab, num_splits,
                      scale, CHUNK, SCALE_MODE, HAS_DRAFT, BLOCK_P, BLOCK_V)
    if PHASE == 0:
        _row_barrier(counter_ptr + batch + row, counter_ptr + 2 * batch + row, num_splits)
    if PHASE != 1:
        _sample_program(target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_sum_ptr, race_val_ptr,
                        race_idx_ptr, counter_ptr, part_sum_ptr, out_tokens_ptr, out_accepted_ptr, row, split,
                        batch, gamma, vocab, num_splits, num_splits, scale, accept_prefix, sample_prefix,
                        CHUNK, SCALE_MODE, HAS_DRAFT, False, True, PRECISE, PREFIX_IN_MEMORY, PHASE == 0, LANES,
                        False, 1, BLOCK_P, BLOCK_S, BLOCK_S, BLOCK_V)


# ----------------------------------------------------------------------------- the launch structure
NAME = "coop"


class _PhasedLauncher(_Launcher):
    """A `_Launcher` of a kernel with a `PHASE` barrier: one launch on a GPU, its two halves interpreted
    (`barrier_phases`)."""

    def __call__(self, grid: tuple, args: tuple, meta: dict, key: int | None = None) -> None:
        for phase in barrier_phases(meta):
            super().__call__(grid, args, phase, key)


_COOP_LAUNCHER = _PhasedLauncher(_coop_kernel)


@dataclass(frozen=True)
class CoopParams:
    """The cooperative launch's grid (B, splits), every program resident at once, and its tile."""

    splits: int
    chunk: int
    block_v: int  # each load covers all γ+1 positions of this many logits
    warps: int
    block_s: int  # next power of two >= splits


def plan(context: PlanContext) -> CoopParams | None:
    """One tile per program where the grid allows, at most `coop_programs_per_sm` programs per SM in all (every
    program must be resident at once: none interpreted, where the barrier's halves run as two launches); None at
    T = 0 (the greedy sampler streams nothing) or where even whole rows would not fit."""
    if context.greedy:
        return None
    block_v = context.sampling_tile("coop_block_v", context.tile("coop_block_v"))
    capacity = int(context.config["coop_programs_per_sm"]) * context.sms if context.compiled else 1 << 30
    if capacity < context.batch:
        return None
    tiles = _cdiv(context.vocab, block_v)
    chunk, splits = vocab_splits(context.vocab, block_v, 1, tiles, tiles,
                                 min(capacity // context.batch, MAX_STATS_SPLITS), context.num_splits)
    return CoopParams(splits=splits, chunk=chunk, block_v=block_v,
                      warps=8 if block_v * triton.next_power_of_2(context.gamma + 1) > 4096 else 4,
                      block_s=triton.next_power_of_2(splits))


def launchers(plan) -> tuple[_Launcher]:
    return (_COOP_LAUNCHER,)


def work(plan, batch: int, gamma: int, greedy: bool, vocab: int) -> Work:
    """The partials of every row at every split, and each split's race winner."""
    return Work(stats=batch * (2 * gamma + 1) * plan.params.splits, race=batch * 2 * plan.params.splits)


def bind(plan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int], scale: float, flags: dict,
         prefix: tuple, device: torch.device, addresses: bool) -> tuple[Launch]:
    """The one cooperative launch, bound to fresh work buffers (`work`, as for the two launches). Its counters: a
    race ticket, a barrier arrival count and a departure count per row, zero between calls."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    coop = plan.params
    counter = _ticket_counter(device, 3 * batch, addresses)
    args = (target, draft, tokens_in, work["part_max"], work["part_sum"], work["race_val"], work["race_idx"], counter,
            out_tokens, out_accepted, batch, gamma, vocab, coop.splits, scale, accept_prefix, sample_prefix)
    meta = dict(CHUNK=coop.chunk, SCALE_MODE=flags["SCALE_MODE"], HAS_DRAFT=flags["HAS_DRAFT"], PHASE=0,
                PRECISE=plan.precise and not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory, LANES=plan.lanes,
                BLOCK_P=plan.block_p, BLOCK_S=coop.block_s, BLOCK_V=coop.block_v, num_warps=coop.warps,
                **_COMPILE_OPTIONS, **({} if interpreting() else {"launch_cooperative_grid": True}))
    return (Launch(NAME, _COOP_LAUNCHER, (batch, coop.splits), args, meta),)


STRUCTURE = Structure(
    name=NAME, residual="race", launches=1, launchers=launchers, bind=bind, work=work, plan=plan,
    # coop 1: one cooperative launch at T > 0: every program loads its chunk of all 2γ+1 rows, meets the other
    # programs of its row at a barrier, then samples from its own chunk; off where the programs would not all fit
    # on the GPU at once. coop_block_v: its tile ([γ+1 rounded up to a power of two, coop_block_v] logits per
    # load); coop_programs_per_sm: the most programs its grid puts on one SM (all must be resident at once)
    keys={NAME: 0, "coop_block_v": 512, "coop_programs_per_sm": 1},
    priority=2,
    fixes={"pdl": False})  # one launch
