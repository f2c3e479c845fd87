"""The verify step's dependency chain with almost no arithmetic: a latency floor for its design.

The step cannot start sampling before every V-chunk's statistics are in, and cannot write a token before every
chunk's race winner is in; on a GPU that is a chain of dependent global-memory round trips and two launches,
whatever the math. `chain_step` runs that chain at a launch plan's grids, each program doing the least its
place in the chain asks: launch 1 loads one tile of its chunk, stores one partial and takes a ticket, and the
last program of each row reads the partials and stores one word (the accept outcome's place); launch 2 reads
that word, loads one tile of the row it names, stores its tile's maximum and takes a ticket, and the last
program of each row reduces the winners and writes a token. `flashspec bench verify` times it as a warm CUDA
graph replay (`chain_floor_us`) beside the real step.

`chain_step(..., one_launch=True)` is the chain of a step with no second launch (`_chain_one`): launch 1 as
above, and the last program of each row goes on to load, from that word, the tiles a sampler drawing its proposals
from per-block statistics would read (`ONE_LAUNCH_TILES` tiles of a sampling block: eight proposals, each a tile of
p and of q) and write the token: the latency floor of folding the sampling into the stats launch.

The cooperative plan's chain is one launch (`_chain_coop`): each program loads one tile of its chunk at every
position, stores one partial, waits at its row's barrier, reads the row's partials, loads one tile of the row
they name, stores its maximum and takes a ticket; the last program of the row writes the token.
"""
from __future__ import annotations

from dataclasses import dataclass

import contextlib

import numpy as np
import torch
import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec_lab.kernels import coop_pass
from flashspec_lab.kernels.coop_pass import _row_barrier, barrier_phases
from flashspec.kernels.plan import LaunchPlan
from flashspec.kernels.rng import device_function
from flashspec.kernels.shims import (INT32_MAX, _max, _max_index, _min, _sum, gdc_launch_dependents, gdc_wait,
                                     interpreting)
from flashspec.sampling import SAMPLE_BLOCK


@device_function
def _partial_and_ticket(x_ptr, part_ptr, counter_ptr, vocab, positions, splits,
                        CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, position, split) of grid (rows, positions, splits): one tile at the start of its chunk ->
    one partial, then its ticket (the row's last program draws positions * splits - 1)."""
    row = tl.program_id(0)
    position = tl.program_id(1)
    split = tl.program_id(2)
    cols = split * CHUNK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + (row * positions + position).to(tl.int64) * vocab + cols, mask=cols < vocab, other=0.0)
    slot = (row * positions + position) * splits + split
    tl.store(part_ptr + slot + tl.arange(0, 1), _sum(x.to(tl.float32)[None, :], axis=1))
    return tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")


@device_function
def _row_word(part_ptr, counter_ptr, row, positions, splits, BLOCK_S: tl.constexpr):
    """The row's last program: the sum of the row's partials ([1]); resets the row's ticket counter."""
    every = tl.arange(0, BLOCK_S)
    parts = tl.load(part_ptr + row * positions * splits + every, mask=every < positions * splits, other=0.0,
                    volatile=True)
    tl.atomic_xchg(counter_ptr + row, 0)
    return _sum(parts[None, :], axis=1)


@triton.jit
def _chain_first(x_ptr, part_ptr, counter_ptr, word_ptr, vocab, positions, splits,
                 CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    """Grid (rows, positions, splits): one tile at the start of this program's chunk -> one partial; the
    row's last program sums the partials into one word. PDL: as `_stats_kernel`'s."""
    if PDL:
        gdc_launch_dependents()
    ticket = _partial_and_ticket(x_ptr, part_ptr, counter_ptr, vocab, positions, splits, CHUNK, BLOCK)
    if ticket == positions * splits - 1:
        row = tl.program_id(0)
        tl.store(word_ptr + row + tl.arange(0, 1), _row_word(part_ptr, counter_ptr, row, positions, splits, BLOCK_S))


@triton.jit
def _chain_one(x_ptr, part_ptr, counter_ptr, out_ptr, vocab, positions, splits,
               CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, TILES: tl.constexpr,
               TILE: tl.constexpr):
    """The chain of a one-launch step: `_chain_first`'s grid and partials, and the row's last program goes on to
    the token itself: from the row's word (so the loads wait for it), TILES tiles of TILE columns of the last
    position, spread over V, loaded at once (one dependent round trip: what a sampler that draws its proposals
    from per-block statistics of the stats pass loads) -> the first column of the largest, the row's token."""
    ticket = _partial_and_ticket(x_ptr, part_ptr, counter_ptr, vocab, positions, splits, CHUNK, BLOCK)
    if ticket == positions * splits - 1:
        row = tl.program_id(0)
        word = _row_word(part_ptr, counter_ptr, row, positions, splits, BLOCK_S)
        last = positions - 1 + (word != word).to(tl.int32)  # NaN-proof: always the last position
        stride = tl.maximum(tl.cdiv(vocab, TILE) // TILES, 1)  # tiles apart, in tiles
        cols = tl.reshape((tl.arange(0, TILES) * stride)[:, None] * TILE + tl.arange(0, TILE)[None, :],
                          [1, TILES * TILE])
        x = tl.load(x_ptr + (row * positions + last).to(tl.int64)[:, None] * vocab + cols, mask=cols < vocab,
                    other=float("-inf")).to(tl.float32)
        top = _max(x, axis=1)
        tl.store(out_ptr + row + tl.arange(0, 1), _min(tl.where(x == top[:, None], cols, INT32_MAX), axis=1))


@device_function
def _race_tile(x_ptr, win_val_ptr, win_idx_ptr, counter_ptr, out_ptr, row, split, position, positions, vocab, splits,
               CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """The sampling end of the chain: one tile of `position` ([1]) at the start of this program's chunk -> its
    maximum and first column; the row's last program (a ticket) writes the first column of the largest."""
    cols = split * CHUNK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + (row * positions + position).to(tl.int64)[:, None] * vocab + cols[None, :],
                mask=(cols < vocab)[None, :], other=float("-inf")).to(tl.float32)
    best, arg = _max_index(x, axis=1)
    tl.store(win_val_ptr + row * splits + split + tl.arange(0, 1), best)
    tl.store(win_idx_ptr + row * splits + split + tl.arange(0, 1), (split * CHUNK + arg).to(tl.int32))
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel", scope="gpu")
    if ticket == splits - 1:
        every = tl.arange(0, BLOCK_S)
        values = tl.load(win_val_ptr + row * splits + every, mask=every < splits, other=float("-inf"),
                         volatile=True)[None, :]
        indices = tl.load(win_idx_ptr + row * splits + every, mask=every < splits, other=INT32_MAX,
                          volatile=True)[None, :]
        top = _max(values, axis=1)
        tl.store(out_ptr + row + tl.arange(0, 1), _min(tl.where(values == top[:, None], indices, INT32_MAX), axis=1))
        tl.atomic_xchg(counter_ptr + row, 0)


@triton.jit
def _chain_second(x_ptr, word_ptr, win_val_ptr, win_idx_ptr, counter_ptr, out_ptr, vocab, positions, splits,
                  CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False):
    """Grid (rows, splits): read the row's word, load one tile of the row it names (the last position,
    reached through the word so the load waits for it), store the tile's maximum; the row's last program
    writes the first column of the largest. PDL: as `_sample_kernel`'s."""
    if PDL:
        gdc_wait()
    row = tl.program_id(0)
    split = tl.program_id(1)
    word = tl.load(word_ptr + row + tl.arange(0, 1))
    position = positions - 1 + (word != word).to(tl.int32)  # NaN-proof: always the last position
    _race_tile(x_ptr, win_val_ptr, win_idx_ptr, counter_ptr, out_ptr, row, split, position, positions, vocab, splits,
               CHUNK, BLOCK, BLOCK_S)


@triton.jit
def _chain_coop(x_ptr, part_ptr, win_val_ptr, win_idx_ptr, counter_ptr, out_ptr, batch, vocab, positions, splits,
                CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr,
                PHASE: tl.constexpr):
    """Grid (rows, splits), all resident: one [positions, BLOCK] tile at the start of this program's chunk ->
    one partial; the row's barrier; the row's partials -> the position to sample (always the last); one tile
    of it -> its maximum; the row's last program writes the first column of the largest. PHASE as
    `_coop_kernel`'s (1 and 2: either side of the barrier, for the interpreter)."""
    row = tl.program_id(0)
    split = tl.program_id(1)
    cols = split * CHUNK + tl.arange(0, BLOCK)
    position = tl.arange(0, BLOCK_P)
    rows = (row * positions + position).to(tl.int64) * vocab
    if PHASE != 2:
        x = tl.load(x_ptr + rows[:, None] + cols[None, :],
                    mask=(position < positions)[:, None] & (cols < vocab)[None, :], other=0.0)
        total = _sum(_sum(x.to(tl.float32), axis=1)[None, :], axis=1)
        tl.store(part_ptr + row * splits + split + tl.arange(0, 1), total)
    if PHASE == 0:
        _row_barrier(counter_ptr + batch + row, counter_ptr + 2 * batch + row, splits)
    if PHASE != 1:
        every = tl.arange(0, BLOCK_S)
        parts = tl.load(part_ptr + row * splits + every, mask=every < splits, other=0.0, volatile=True)
        word = _sum(parts[None, :], axis=1)
        last = positions - 1 + (word != word).to(tl.int32)  # NaN-proof: always the last position
        _race_tile(x_ptr, win_val_ptr, win_idx_ptr, counter_ptr, out_ptr, row, split, last, positions, vocab, splits,
                   CHUNK, BLOCK, BLOCK_S)


ONE_LAUNCH_TILES = 16  # `_chain_one`: eight proposals, a tile of the target's and of the draft's logits each


@dataclass
class ChainStep:
    """The two probe launches bound to one set of logits: `run()` launches both; `token` [B] int32 then holds,
    per row, the first column of the largest logit among the tiles launch 2 loaded."""

    launches: list[tuple]  # (kernel, grid, args, meta) of launch 1, then launch 2 (or the one cooperative launch)
    token: torch.Tensor

    def run(self) -> None:
        with np.errstate(all="ignore") if interpreting() else contextlib.nullcontext():
            for kernel, grid, args, meta in self.launches:
                for each in barrier_phases(meta) if "PHASE" in meta else [meta]:
                    kernel[grid](*args, **each)


def chain_step(target_logits: torch.Tensor, plan: LaunchPlan, one_launch: bool = False) -> ChainStep:
    """The probe at `plan`'s grids for `target_logits` [B, γ+1, V]: one row per program, the plan's splits,
    tile widths and warps. one_launch: the chain of a step that samples in its stats launch (`_chain_one` at
    the plan's stats grid); not for a cooperative plan, whose chain is one launch already."""
    batch, positions, vocab = target_logits.shape
    device = target_logits.device
    if plan.structure == coop_pass.NAME:
        if one_launch:
            raise ValueError("one_launch: a cooperative plan's chain is one launch already; pass a two-launch plan")
        return _coop_chain_step(target_logits, plan)
    if one_launch:
        return _one_launch_chain_step(target_logits, plan)
    sample_splits = plan.sample_splits
    sample_chunk = plan.sample_chunk if sample_splits > 1 else triton.next_power_of_2(vocab)
    parts = torch.empty(batch * positions * plan.stats_splits, dtype=torch.float32, device=device)
    words = torch.empty(batch, dtype=torch.float32, device=device)
    win_val = torch.empty(batch * sample_splits, dtype=torch.float32, device=device)
    win_idx = torch.empty(batch * sample_splits, dtype=torch.int32, device=device)
    counters = torch.zeros(2 * batch, dtype=torch.int32, device=device)
    token = torch.empty(batch, dtype=torch.int32, device=device)
    first = (_chain_first, (batch, positions, plan.stats_splits),
             (target_logits, parts, counters, words, vocab, positions, plan.stats_splits),
             dict(CHUNK=plan.stats_chunk, BLOCK=plan.stats_block_v,
                  BLOCK_S=triton.next_power_of_2(positions * plan.stats_splits), PDL=plan.pdl,
                  num_warps=plan.stats_warps))
    second = (_chain_second, (batch, sample_splits),
              (target_logits, words, win_val, win_idx, counters[batch:], token, vocab, positions, sample_splits),
              dict(CHUNK=sample_chunk, BLOCK=min(plan.sample_block_v, sample_chunk),
                   BLOCK_S=triton.next_power_of_2(sample_splits), PDL=plan.pdl, num_warps=plan.sample_warps,
                   **({"launch_pdl": True} if plan.pdl else {})))
    return ChainStep(launches=[first, second], token=token)


def _one_launch_chain_step(target_logits: torch.Tensor, plan: LaunchPlan) -> ChainStep:
    """`chain_step(..., one_launch=True)`: `_chain_one` at the plan's stats grid, tile width and warps."""
    batch, positions, vocab = target_logits.shape
    device = target_logits.device
    parts = torch.empty(batch * positions * plan.stats_splits, dtype=torch.float32, device=device)
    counters = torch.zeros(batch, dtype=torch.int32, device=device)
    token = torch.empty(batch, dtype=torch.int32, device=device)
    launch = (_chain_one, (batch, positions, plan.stats_splits),
              (target_logits, parts, counters, token, vocab, positions, plan.stats_splits),
              dict(CHUNK=plan.stats_chunk, BLOCK=plan.stats_block_v,
                   BLOCK_S=triton.next_power_of_2(positions * plan.stats_splits), TILES=ONE_LAUNCH_TILES,
                   TILE=SAMPLE_BLOCK, num_warps=plan.stats_warps))
    return ChainStep(launches=[launch], token=token)


def _coop_chain_step(target_logits: torch.Tensor, plan: LaunchPlan) -> ChainStep:
    """`chain_step` of a cooperative plan: one launch at its grid (a cooperative launch on a GPU)."""
    batch, positions, vocab = target_logits.shape
    device = target_logits.device
    coop = plan.params
    splits = coop.splits
    parts = torch.empty(batch * splits, dtype=torch.float32, device=device)
    win_val = torch.empty(batch * splits, dtype=torch.float32, device=device)
    win_idx = torch.empty(batch * splits, dtype=torch.int32, device=device)
    counters = torch.zeros(3 * batch, dtype=torch.int32, device=device)
    token = torch.empty(batch, dtype=torch.int32, device=device)
    meta = dict(CHUNK=coop.chunk, BLOCK=coop.block_v, BLOCK_P=triton.next_power_of_2(positions),
                BLOCK_S=triton.next_power_of_2(splits), PHASE=0, num_warps=coop.warps,
                **({} if interpreting() else {"launch_cooperative_grid": True}))
    launch = (_chain_coop, (batch, splits),
              (target_logits, parts, win_val, win_idx, counters, token, batch, vocab, positions, splits), meta)
    return ChainStep(launches=[launch], token=token)
