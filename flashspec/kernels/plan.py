"""Launch plans of the verify kernels: block sizes, V-splits and the launch structure, a pure function of the
shapes and the device. `GPU_PLAN` holds the compiled-plan constants; `SHAPE_PLANS` overrides them (and picks the
two launches' options) per (batch, vocabulary) bucket, from the benchmark's record under the installed Triton's
version (`SHAPE_PLANS_BY_TRITON`). A launch structure (`flashspec.kernels.structures`) adds its own keys and
parameters; `make_plan` takes the one the plan keys ask for, or the default."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Hashable

import torch
import triton

from flashspec.kernels import structures
from flashspec.kernels.shims import CLUSTERS_AVAILABLE, PDL_AVAILABLE, _cdiv, interpreting
from flashspec.kernels.structures import PlanContext, check_sampling_tile
from flashspec.sampling import SAMPLE_BLOCK


@dataclass(frozen=True)
class LaunchPlan:
    """Grid and block sizes of one verify_triton call (a pure function of shapes and device): the fields every
    launch structure shares, the two launches' options, and the chosen structure with its own parameters."""

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
    precise: bool = True  # libdevice log/exp/log1p on a GPU, rounding as the reference does (False: diagnostic)
    lanes: bool = False  # the race keeps per-lane winners and reduces across lanes once per chunk
    accept_once: bool = False  # the stats launch runs the accept test once per row block (T > 0, two launches)
    pdl: bool = False  # two launches, the second a programmatic dependent launch (SM90+): it starts early, waits on-GPU
    stats_lane_elems: int = 0  # > 0: the stats pass keeps per-lane partials over this many logits (`_chunk_stats`)
    structure: str = "two_launch"  # the launch structure (`flashspec.kernels.structures`)
    params: Hashable = ()  # the structure's own parameters (its `plan`'s, frozen: plans are cache keys)

    @property
    def launches(self) -> int:
        """Kernel launches per step on a GPU."""
        return structures.get(self.structure).launches


@functools.lru_cache(maxsize=16)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=16)
def _has_clusters(device_index: int) -> bool:
    """Reductions across a thread-block cluster's blocks: an SM90+ GPU and a Triton that lowers them (>= 3.9)."""
    return CLUSTERS_AVAILABLE and torch.cuda.get_device_capability(device_index)[0] >= 9


@functools.lru_cache(maxsize=16)
def _has_pdl(device_index: int) -> bool:
    """Programmatic dependent launch: an SM90+ GPU and a Triton with grid dependency control."""
    return PDL_AVAILABLE and torch.cuda.get_device_capability(device_index)[0] >= 9


def vocab_splits(vocab: int, block_v: int, programs_per_split: int, target_programs: int,
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


# Compiled-plan constants shared by every launch structure (the benchmark sweeps some; call make_plan.cache_clear()
# after a change). A structure's own keys and defaults are its `Structure.keys` (`plan_config` merges them).
GPU_PLAN = {
    "stats_block_v": 4096,  # tile of the stats pass (8 warps: 16 bf16 per thread per row)
    "sample_block_v": 1024,  # tile of the sampling pass (4 warps)
    "stats_max_tiles": 4,  # tiles one stats program loops over at most
    "sample_max_tiles": 2,
    "programs_per_sm": 4,  # minimum grid, in programs per SM
    "row_tile": 2048,  # BLOCK_B * BLOCK_V for tiny vocabularies
    # 0: approximate log/exp (MUFU) in the sampling pass -- a diagnostic of what the per-element math costs,
    # never a default: the scores then round differently from the reference's, so a near-tie can flip a token
    "precise": 1,
    # 1: the sampling race keeps a running winner per lane and reduces across the program's lanes once per
    # chunk instead of once per tile (same tokens)
    "lanes": 0,
    # 1: the last stats program of each row block runs the accept test and stores its outcome (six words a
    # row), instead of every sampling program redoing it from the partials (same tokens; T > 0 only)
    "accept_once": 0,
    # 1: the sampling launch of the two is a programmatic dependent launch (SM90+): the stats launch lets it
    # start at once, and it waits on the GPU (griddepcontrol) for the stats launch's writes, so its launch
    # overlaps the stats pass instead of following it
    "pdl": 0,
    # > 0: the two-launch stats pass keeps a running (max, sum) per lane of this many consecutive logits and meets
    # the lanes once per program, instead of reducing each tile across the program's threads (four reductions,
    # with shuffles and barriers, per tile); 8 is the logits one thread loads at a time (a 16-byte bf16 load), so
    # the lane reductions stay inside a thread. Compiled for SM90: 455 -> 299 instructions per tile and thread
    # (`flashspec_lab.kernels.sass`); a program of one tile keeps the tile's reduction (512 against 456). 0: off
    "stats_lane_elems": 8,
}

# Per-shape overrides of GPU_PLAN on a GPU, keyed by (batch bucket, vocabulary bucket) (`shape_bucket`), one table
# per Triton version they were measured under: the same plan compiles to other code under another Triton (under
# 3.9 some two-launch plans replayed in 0.4x their 3.6 time), so the fastest plan can differ. Each table is a
# benchmark record's "plan_choice", the fastest variant per measured (B, V) by warm CUDA-graph replay on the H200,
# which `flashspec bench verify` prints ready to paste here. Every variant's tokens equalled the reference's there.
# (3, 6): results/verify_h200_70751e3.json (the device's own Triton), measured before the sampler raced blocks of
#   sampling.SAMPLE_BLOCK tokens; a sampling tile it names below one block is raised to a block. Later 3.6 runs
#   timed the cooperative and the programmatic dependent launches too; neither beat these entries by more than one
#   plan moves between two runs, so the entries stay (chapter 02 reads the comparison from the records).
# (3, 9): results/verify_h200_blocks_all_decba52.json (a carried Triton 3.9.0, the version CI pins; the two-level
#   race, ten plan variants at all six points). The table before it, the element race's choice, was
#   results/verify_triton39_h200.json's (commit 7e93be7); chapter 02 sets both runs beside the (3, 6) plans.
SHAPE_PLANS_BY_TRITON: dict[tuple[int, int], dict[tuple[int, int], dict[str, int]]] = {
    (3, 6): {
        (1, 32768): {'sample_block_v': 128, 'sample_max_tiles': 8},
        (1, 131072): {'sample_block_v': 256, 'sample_max_tiles': 4},
        (8, 32768): {'accept_once': 1, 'lanes': 1},
        (8, 131072): {'accept_once': 1, 'lanes': 1, 'sample_block_v': 256, 'sample_max_tiles': 4,
                      'stats_block_v': 2048, 'stats_max_tiles': 2},
        (64, 32768): {'accept_once': 1, 'lanes': 1, 'sample_max_tiles': 8},
        (64, 131072): {'accept_once': 1, 'lanes': 1, 'sample_block_v': 256, 'sample_max_tiles': 4,
                       'stats_block_v': 2048, 'stats_max_tiles': 2},
    },
    (3, 9): {
        (1, 32768): {'sample_block_v': 256, 'sample_max_tiles': 4, 'pdl': 1},
        (1, 131072): {'stats_lane_elems': 0},
        (8, 32768): {'lanes': 1, 'sample_max_tiles': 8},
        (8, 131072): {'lanes': 1, 'sample_max_tiles': 8},
        (64, 32768): {'lanes': 1, 'sample_max_tiles': 8},
        (64, 131072): {'lanes': 1, 'sample_max_tiles': 8},
    },
}


def triton_version(version: str) -> tuple[int, int]:
    """(major, minor) of a Triton version string ("3.9.0", "3.6.0+git1234")."""
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError) as error:
        raise ValueError(f"cannot read a Triton version from {version!r} (expected 'MAJOR.MINOR...')") from error


def shape_plans_for(version: str) -> dict[tuple[int, int], dict[str, int]]:
    """The plan table measured under the newest Triton not newer than `version` (the oldest table for a Triton
    older than every measured one)."""
    wanted = triton_version(version)
    measured = sorted(SHAPE_PLANS_BY_TRITON)
    return SHAPE_PLANS_BY_TRITON[max((v for v in measured if v <= wanted), default=measured[0])]


SHAPE_PLANS: dict[tuple[int, int], dict[str, int]] = shape_plans_for(triton.__version__)  # the installed Triton's
BATCH_BUCKETS = (1, 8, 64)  # a batch falls in the first bucket >= it, past the last one in the last
VOCAB_BUCKETS = (32768, 131072)


def shape_bucket(batch: int, vocab: int) -> tuple[int, int]:
    """(batch bucket, vocabulary bucket) of a shape, the key of `SHAPE_PLANS`."""
    def bucket(value: int, edges: tuple[int, ...]) -> int:
        return next((edge for edge in edges if value <= edge), edges[-1])

    return bucket(batch, BATCH_BUCKETS), bucket(vocab, VOCAB_BUCKETS)


def plan_config(batch: int, vocab: int, tuning: tuple[tuple[str, int], ...] | None, compiled: bool) -> dict[str, int]:
    """GPU_PLAN and every registered structure's keys, with `tuning` (the benchmark's explicit variants) applied, or
    else, on a GPU, this shape's `SHAPE_PLANS` entry. A key no registered structure knows is refused."""
    defaults = {**GPU_PLAN, **structures.plan_keys()}
    if tuning is not None:
        overrides = dict(tuning)
    else:
        overrides = SHAPE_PLANS.get(shape_bucket(batch, vocab), {}) if compiled else {}
    unknown = set(overrides) - set(defaults)
    if unknown:
        raise ValueError(f"unknown launch-plan keys {sorted(unknown)}; known: {sorted(defaults)} (a launch structure's "
                         f"keys are known once it is registered: {structures.LAB} registers the lab's structures, "
                         f"fused, coop and cluster)")
    return {**defaults, **overrides}


@functools.lru_cache(maxsize=256)
def make_plan(batch: int, gamma: int, vocab: int, device: torch.device, greedy: bool,
              block_b: int | None = None, block_v: int | None = None,
              num_splits: int | None = None, fused: bool | None = None,
              tuning: tuple[tuple[str, int], ...] | None = None, residual: str = "race") -> LaunchPlan:
    """Choose block sizes, V-splits and the launch structure. On a GPU: one row per program once V is large,
    enough V-splits for a few programs per SM, the options of this shape's `SHAPE_PLANS` entry. Interpreted:
    whole rows, few programs, the default options unless `tuning` says.
    `tuning` ((key, value) pairs of GPU_PLAN and the registered structures' keys) replaces the shape's entry (the
    benchmark's variants). The structure (`structures.choose`): the default of `residual` ("race": the two
    launches; "rejection": the one pass on the stats pass's grid) unless a structure's key asks for another;
    `fused` True asks for the fused single launch, False for the default alone."""
    compiled = device.type == "cuda" and not interpreting()
    config = plan_config(batch, vocab, tuning, compiled)
    if compiled:
        stats_block_v = block_v or min(config["stats_block_v"], triton.next_power_of_2(vocab))
        sample_block_v = block_v or min(config["sample_block_v"], triton.next_power_of_2(vocab))
        tile = config["row_tile"]
        index = device.index if device.index is not None else torch.cuda.current_device()
        sms = _num_sms(index)
        target_programs = config["programs_per_sm"] * sms
        stats_tiles, sample_tiles = config["stats_max_tiles"], config["sample_max_tiles"]
        precise = bool(config["precise"])
        pdl = bool(config["pdl"]) and _has_pdl(index)
        has_clusters = _has_clusters(index)
    else:
        stats_block_v = sample_block_v = block_v or min(4096, triton.next_power_of_2(vocab))
        tile = 1 << 16
        sms, target_programs = 0, 1
        stats_tiles = sample_tiles = 1 << 30
        precise = True  # the interpreter always uses numpy's math
        pdl = False  # grid dependency control is GPU-only
        has_clusters = True  # interpreted, a cluster's program runs as one block
    lanes = bool(config["lanes"])
    accept_once = bool(config["accept_once"])
    lane_elems = int(config["stats_lane_elems"])
    if not greedy and vocab > SAMPLE_BLOCK:  # the sampler races whole blocks of tokens (`sampling.block_race`)
        # a table's tile below one block (measured before the sampler raced blocks) becomes one
        sample_block_v = check_sampling_tile("sample_block_v", sample_block_v if block_v else
                                             max(sample_block_v, SAMPLE_BLOCK), vocab)
    if block_b is None:  # compiled: independent of B, so B does not trigger a recompile
        block_b = max(1, tile // stats_block_v)
        if not compiled:
            block_b = min(triton.next_power_of_2(batch), block_b)
    row_blocks = _cdiv(batch, block_b)
    stats_warps = 8 if stats_block_v * block_b >= 4096 else 4
    if lane_elems < 0 or (lane_elems & (lane_elems - 1)):
        raise ValueError(f"stats_lane_elems={lane_elems}: 0 (off) or a power of two")
    stats_chunk, stats_splits = vocab_splits(vocab, stats_block_v, row_blocks * (gamma + 1), target_programs,
                                             stats_tiles, MAX_STATS_SPLITS, num_splits)
    if greedy or stats_block_v % max(lane_elems, 1) or (compiled and (
            stats_block_v // (32 * stats_warps) < lane_elems  # a lane would span threads: it would shuffle again
            or stats_chunk <= stats_block_v)):  # one tile per program: the lanes would meet once anyway
        lane_elems = 0  # (greedy: the stats pass keeps an argmax, not log-sum-exp partials)
    if greedy:
        sample_chunk, sample_splits = sample_block_v, 1  # the greedy sampler streams nothing
    else:
        sample_chunk, sample_splits = vocab_splits(vocab, sample_block_v, row_blocks, target_programs, sample_tiles,
                                                   MAX_SAMPLE_SPLITS, num_splits)
    context = PlanContext(batch=batch, gamma=gamma, vocab=vocab, greedy=greedy, compiled=compiled, config=config,
                          block_v=block_v, num_splits=num_splits, row_blocks=row_blocks, stats_block_v=stats_block_v,
                          stats_tiles=stats_tiles, target_programs=target_programs, sms=sms, has_clusters=has_clusters)
    structure, params = structures.choose(context, residual, fused)
    shared = dict(precise=precise, lanes=lanes, accept_once=accept_once and not greedy, pdl=pdl,
                  stats_lane_elems=lane_elems)
    shared.update(structure.fixes)
    return LaunchPlan(
        block_b=block_b,
        stats_block_v=stats_block_v,
        stats_chunk=stats_chunk,
        stats_splits=stats_splits,
        sample_block_v=sample_block_v,
        sample_chunk=sample_chunk,
        sample_splits=sample_splits,
        stats_warps=stats_warps,
        sample_warps=4,
        block_p=triton.next_power_of_2(gamma + 1),
        block_s=triton.next_power_of_2(stats_splits),
        block_s2=triton.next_power_of_2(sample_splits),
        structure=structure.name,
        params=params,
        **shared,
    )
