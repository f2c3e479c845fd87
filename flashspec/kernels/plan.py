"""Launch plans of the verify kernels: block sizes, V-splits and one launch or two, a pure function of the
shapes and the device. `GPU_PLAN` holds the compiled-plan constants; `SHAPE_PLANS` overrides them (and picks
the two launches, the fused single launch or the cooperative one) per (batch, vocabulary) bucket, from the
benchmark's record under the installed Triton's version (`SHAPE_PLANS_BY_TRITON`)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton

from flashspec.kernels.shims import CLUSTERS_AVAILABLE, PDL_AVAILABLE, _cdiv, interpreting
from flashspec.sampling import SAMPLE_BLOCK


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
    fused: bool = False  # one launch (`_fused_kernel`) instead of the stats and sample launches
    fused_splits: int = 1  # V-splits of the fused launch (its programs each cover all 2γ+1 rows)
    fused_chunk: int = 0
    block_s3: int = 1  # next power of two >= fused_splits
    precise: bool = True  # libdevice log/exp/log1p on a GPU, rounding as the reference does (False: diagnostic)
    lanes: bool = False  # the race keeps per-lane winners and reduces across lanes once per chunk
    accept_once: bool = False  # the stats launch runs the accept test once per row block (T > 0, two launches)
    coop: bool = False  # one cooperative launch (`_coop_kernel`, T > 0): one row per program, a barrier per row
    coop_splits: int = 1  # V-splits of the cooperative launch (the grid is (B, coop_splits), all resident)
    coop_chunk: int = 0
    coop_block_v: int = 0  # its vocabulary tile (each load covers all γ+1 positions)
    coop_warps: int = 4
    block_s4: int = 1  # next power of two >= coop_splits
    pdl: bool = False  # two launches, the second a programmatic dependent launch (SM90+): it starts early, waits on-GPU
    cluster: bool = False  # one launch, one program per row spread over a thread-block cluster (`_cluster_kernel`)
    cluster_ctas: int = 1  # blocks per program (the cluster size; 1 interpreted)
    cluster_block_v: int = 0  # the program's vocabulary tile, split across its blocks
    cluster_warps: int = 4  # warps per block
    cluster_stages: int = 1  # software-pipelining depth of its log-sum-exp loop
    stats_lane_elems: int = 0  # > 0: the stats pass keeps per-lane partials over this many logits (`_chunk_stats`)
    one_pass: bool = False  # one launch, the residual by rejection (`kernels/one_pass.py`) on the stats grid
    #                         (residual="rejection"; every other plan races the residual)
    one_pass_stop: int = 0  # diagnostic, never a default: the one-pass kernel stops early (`_one_pass_kernel`'s STOP)

    @property
    def launches(self) -> int:
        return 1 if self.fused or self.coop or self.cluster or self.one_pass else 2


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


def _coop_splits(batch: int, vocab: int, block_v: int, capacity: int, forced: int | None) -> tuple[int, int] | None:
    """(chunk, splits) of the cooperative launch: one tile per program where the grid allows, and at most
    `capacity` programs in all, since every program must be resident at once; None when even whole rows
    would not fit."""
    if capacity < batch:
        return None
    tiles = _cdiv(vocab, block_v)
    return _splits(vocab, block_v, 1, tiles, tiles, min(capacity // batch, MAX_STATS_SPLITS), forced)


# Compiled-plan constants (the benchmark sweeps some; call make_plan.cache_clear() after a change).
GPU_PLAN = {
    "stats_block_v": 4096,  # tile of the stats pass (8 warps: 16 bf16 per thread per row)
    "sample_block_v": 1024,  # tile of the sampling pass (4 warps)
    "stats_max_tiles": 4,  # tiles one stats program loops over at most
    "sample_max_tiles": 2,
    "programs_per_sm": 4,  # minimum grid, in programs per SM
    "row_tile": 2048,  # BLOCK_B * BLOCK_V for tiny vocabularies
    "fused": 0,  # 1: one launch (stats, then the last program of each row block samples the whole row)
    # 0: approximate log/exp (MUFU) in the sampling pass -- a diagnostic of what the per-element math costs,
    # never a default: the scores then round differently from the reference's, so a near-tie can flip a token
    "precise": 1,
    # 1: the sampling race keeps a running winner per lane and reduces across the program's lanes once per
    # chunk instead of once per tile (same tokens)
    "lanes": 0,
    # 1: the last stats program of each row block runs the accept test and stores its outcome (six words a
    # row), instead of every sampling program redoing it from the partials (same tokens; T > 0 only)
    "accept_once": 0,
    # 1: one cooperative launch at T > 0 (kernels/coop_pass.py): every program loads its chunk of all 2γ+1 rows,
    # meets the other programs of its row at a barrier, then samples from its own chunk; off where the
    # programs would not all fit on the GPU at once
    "coop": 0,
    "coop_block_v": 512,  # its tile: [γ+1 rounded up to a power of two, coop_block_v] logits per load
    "coop_programs_per_sm": 1,  # the most programs its grid puts on one SM (all must be resident at once)
    # 1: the sampling launch of the two is a programmatic dependent launch (SM90+): the stats launch lets it
    # start at once, and it waits on the GPU (griddepcontrol) for the stats launch's writes, so its launch
    # overlaps the stats pass instead of following it
    "pdl": 0,
    # 1: one launch at T > 0 (kernels/cluster_pass.py), one program per row whose blocks form a thread-block
    # cluster of `cluster_ctas` (2, 4, 8 or 16) and reduce through distributed shared memory (SM90+, Triton >= 3.9;
    # elsewhere the plan stays as it would be without it)
    "cluster": 0,
    "cluster_ctas": 8,
    "cluster_block_v": 512,  # each block's share of the program's tile ([γ+1 rounded up to a power of two,
    # cluster_ctas * cluster_block_v] logits per load): 32 logits per thread at 4 warps
    "cluster_warps": 4,
    "cluster_stages": 3,  # tiles its log-sum-exp loop prefetches ahead (Triton's num_stages; 1: none)
    # > 0: the two-launch stats pass keeps a running (max, sum) per lane of this many consecutive logits and meets
    # the lanes once per program, instead of reducing each tile across the program's threads (four reductions,
    # with shuffles and barriers, per tile); 8 is the logits one thread loads at a time (a 16-byte bf16 load), so
    # the lane reductions stay inside a thread. Compiled for SM90: 455 -> 299 instructions per tile and thread
    # (`flashspec_lab.kernels.sass`); a program of one tile keeps the tile's reduction (512 against 456). 0: off
    "stats_lane_elems": 8,
    # diagnostic, never a default (its tokens are wrong): the one-pass kernel (residual="rejection") stops after its
    # streaming part (1) or after the accept test (2), to split its time between streaming, the accept test and the
    # proposals
    "one_pass_stop": 0,
}
CLUSTER_SIZES = (1, 2, 4, 8, 16)  # 16 is beyond the portable 8: Hopper allows it

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


def gpu_plan_for(batch: int, vocab: int, tuning: tuple[tuple[str, int], ...] | None = None) -> dict[str, int]:
    """GPU_PLAN with this shape's `SHAPE_PLANS` entry applied, or with `tuning` (the benchmark's explicit
    variants) applied instead of the entry."""
    overrides = SHAPE_PLANS.get(shape_bucket(batch, vocab), {}) if tuning is None else dict(tuning)
    unknown = set(overrides) - set(GPU_PLAN)
    if unknown:
        raise ValueError(f"unknown launch-plan keys {sorted(unknown)}; known: {sorted(GPU_PLAN)}")
    return {**GPU_PLAN, **overrides}


@functools.lru_cache(maxsize=256)
def make_plan(batch: int, gamma: int, vocab: int, device: torch.device, greedy: bool,
              block_b: int | None = None, block_v: int | None = None,
              num_splits: int | None = None, fused: bool | None = None,
              tuning: tuple[tuple[str, int], ...] | None = None, residual: str = "race") -> LaunchPlan:
    """Choose block sizes, V-splits and one launch or two. On a GPU: one row per program once V is large,
    enough V-splits for a few programs per SM, the launch count of this shape's `SHAPE_PLANS` entry
    unless `fused` says (`fused` False: two launches, never the cooperative one, which runs at T > 0 only and
    where its grid fits on the GPU at once). Interpreted: whole rows, few programs, two launches unless `fused`
    or `tuning` says.
    `tuning` ((key, value) pairs of GPU_PLAN) replaces the shape's entry (the benchmark's variants).
    `residual` "rejection": the one launch of the residual by rejection (`LaunchPlan.one_pass`) on the stats pass's
    grid (its stats tile holds whole sampling blocks); the table's launch-structure keys do not apply to it."""
    one_pass = residual == "rejection"
    if one_pass:
        fused = False
    two_asked = fused is False
    if device.type == "cuda" and not interpreting():
        config = gpu_plan_for(batch, vocab, tuning)
        stats_block_v = block_v or min(config["stats_block_v"], triton.next_power_of_2(vocab))
        sample_block_v = block_v or min(config["sample_block_v"], triton.next_power_of_2(vocab))
        tile = config["row_tile"]
        index = device.index if device.index is not None else torch.cuda.current_device()
        target_programs = config["programs_per_sm"] * _num_sms(index)
        stats_tiles, sample_tiles = config["stats_max_tiles"], config["sample_max_tiles"]
        fused = bool(config["fused"]) if fused is None else fused
        precise = bool(config["precise"])
        lanes = bool(config["lanes"])
        accept_once = bool(config["accept_once"])
        coop = bool(config["coop"])
        coop_block_v = block_v or min(config["coop_block_v"], triton.next_power_of_2(vocab))
        coop_capacity = config["coop_programs_per_sm"] * _num_sms(index)
        pdl = bool(config["pdl"]) and _has_pdl(index)
        cluster = bool(config["cluster"]) and _has_clusters(index)
        cluster_ctas = int(config["cluster_ctas"])
        if cluster_ctas not in CLUSTER_SIZES:
            raise ValueError(f"cluster_ctas={cluster_ctas}: a thread-block cluster has 1, 2, 4, 8 or 16 blocks")
        cluster_block_v = block_v or min(config["cluster_block_v"] * cluster_ctas, triton.next_power_of_2(vocab))
        cluster_warps = int(config["cluster_warps"])
        cluster_stages = int(config["cluster_stages"])
        lane_elems = int(config["stats_lane_elems"])
    else:
        stats_block_v = sample_block_v = block_v or min(4096, triton.next_power_of_2(vocab))
        tile = 1 << 16
        target_programs = 1
        stats_tiles = sample_tiles = 1 << 30
        fused = bool(fused)
        precise = True  # the interpreter always uses numpy's math
        # tests run both races and both places of the accept test in the interpreter
        lanes = bool(tuning and dict(tuning).get("lanes", 0))
        accept_once = bool(tuning and dict(tuning).get("accept_once", 0))
        coop = bool(tuning and dict(tuning).get("coop", 0))
        coop_block_v = stats_block_v
        coop_capacity = 1 << 30  # interpreted, the cooperative kernel runs as two launches: no residency limit
        pdl = False  # grid dependency control is GPU-only
        cluster = bool(tuning and dict(tuning).get("cluster", 0))
        cluster_ctas, cluster_block_v, cluster_warps, cluster_stages = 1, stats_block_v, 4, 1  # one block
        lane_elems = int(dict(tuning or ()).get("stats_lane_elems", GPU_PLAN["stats_lane_elems"]))
    if not greedy and vocab > SAMPLE_BLOCK:  # the sampler races whole blocks of tokens (`sampling.block_race`)
        if not block_v:  # a table's tile below one block (measured before the sampler raced blocks) becomes one
            sample_block_v, coop_block_v, cluster_block_v = (max(width, SAMPLE_BLOCK) for width in
                                                             (sample_block_v, coop_block_v, cluster_block_v))
        for name, width in (("sample_block_v", sample_block_v), ("coop_block_v", coop_block_v),
                            ("cluster_block_v", cluster_block_v)):
            if width < SAMPLE_BLOCK:
                raise ValueError(f"{name}={width}: a sampling tile holds whole blocks of {SAMPLE_BLOCK} tokens once "
                                 f"V > {SAMPLE_BLOCK} (V = {vocab}); use a power of two >= {SAMPLE_BLOCK}")
    if one_pass and not greedy and vocab > SAMPLE_BLOCK and stats_block_v < SAMPLE_BLOCK:
        raise ValueError(f"block_v={stats_block_v}: the one-pass plan keeps each block of {SAMPLE_BLOCK} tokens' sum "
                         f"in the program that streams it; use a power of two >= {SAMPLE_BLOCK} (V = {vocab})")
    if block_b is None:  # compiled: independent of B, so B does not trigger a recompile
        block_b = max(1, tile // stats_block_v)
        if interpreting() or device.type != "cuda":
            block_b = min(triton.next_power_of_2(batch), block_b)
    row_blocks = _cdiv(batch, block_b)
    stats_warps = 8 if stats_block_v * block_b >= 4096 else 4
    if lane_elems < 0 or (lane_elems & (lane_elems - 1)):
        raise ValueError(f"stats_lane_elems={lane_elems}: 0 (off) or a power of two")
    stats_chunk, stats_splits = _splits(vocab, stats_block_v, row_blocks * (gamma + 1), target_programs,
                                        stats_tiles, MAX_STATS_SPLITS, num_splits)
    compiled = device.type == "cuda" and not interpreting()
    if greedy or stats_block_v % max(lane_elems, 1) or (compiled and (
            stats_block_v // (32 * stats_warps) < lane_elems  # a lane would span threads: it would shuffle again
            or stats_chunk <= stats_block_v)):  # one tile per program: the lanes would meet once anyway
        lane_elems = 0  # (greedy: the stats pass keeps an argmax, not log-sum-exp partials)
    if greedy:
        sample_chunk, sample_splits = sample_block_v, 1  # the greedy sampler streams nothing
    else:
        sample_chunk, sample_splits = _splits(vocab, sample_block_v, row_blocks, target_programs, sample_tiles,
                                              MAX_SAMPLE_SPLITS, num_splits)
    fused_chunk, fused_splits = _splits(vocab, stats_block_v, row_blocks, target_programs, stats_tiles,
                                        MAX_STATS_SPLITS, num_splits)
    coop_fit = None
    if coop and not greedy and not two_asked:
        coop_fit = _coop_splits(batch, vocab, coop_block_v, coop_capacity, num_splits)
    coop_chunk, coop_splits = coop_fit or (0, 1)
    cluster = cluster and not greedy and not two_asked and not fused and not one_pass
    if one_pass:
        coop_fit, accept_once, pdl, lane_elems = None, False, False, 0
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
        fused=fused,
        fused_splits=fused_splits,
        fused_chunk=fused_chunk,
        block_s3=triton.next_power_of_2(fused_splits),
        precise=precise,
        lanes=lanes,
        accept_once=accept_once and not greedy and not fused,
        coop=coop_fit is not None and not fused and not cluster,
        coop_splits=coop_splits,
        coop_chunk=coop_chunk,
        coop_block_v=coop_block_v if coop_fit else 0,
        coop_warps=8 if coop_block_v * triton.next_power_of_2(gamma + 1) > 4096 else 4,
        block_s4=triton.next_power_of_2(coop_splits),
        pdl=pdl and not fused and coop_fit is None and not cluster,
        cluster=cluster,
        cluster_ctas=cluster_ctas if cluster else 1,
        cluster_block_v=cluster_block_v if cluster else 0,
        cluster_warps=cluster_warps if cluster else 4,  # other plans keep the defaults: no key of theirs moves
        cluster_stages=cluster_stages if cluster else 1,
        stats_lane_elems=lane_elems,
        one_pass=one_pass,
        one_pass_stop=int(dict(tuning or ()).get("one_pass_stop", 0)) if one_pass else 0,
    )
