"""Launch plans of the verify kernels: block sizes and V-splits, a pure function of the shapes and the
device (recorded by the benchmark; `GPU_PLAN` holds the compiled-plan constants it sweeps)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from flashspec.kernels.shims import _cdiv, interpreting


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
