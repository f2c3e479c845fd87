"""Verification in one launch of one program per row, the program spread over a thread-block cluster.

Every other plan splits a row's vocabulary over programs that meet through global memory: partials stored,
a ticket or a barrier taken, partials read back, and, for the sample, winners stored and reduced by the last
program. Each meeting is a dependent round trip to L2, and the chain of them, not the bytes, set the time of
the step at small B (`chain_probe`). Here one program owns the whole row -- its 2γ+1 logit rows -- and the
GPU spreads it over `num_ctas` blocks of a thread-block cluster (SM90+, Triton >= 3.9): the program's tiles
are split across the blocks, and its reductions across them run through distributed shared memory, never
global memory.

So the program makes as few cross-block reductions as it can: pass 1 loads the target's and the draft's tiles
together, keeps a running (max, sum of exp) per lane over the whole vocabulary and reduces across lanes once, at the end (`_combine_lse` over the lanes, as
over V-chunks elsewhere); the accept test reads two logits per candidate; pass 2 runs `_race_position` over
the whole row of the one sampled position with per-lane winners (`LANES`), reduced once. Two reductions of
substance per step and no atomics. The same accept test and race as the other plans; the log-sum-exp is summed
in a different order, so tokens equal theirs except where a rounding decides (the exactness tests hold it
to the same reference).

Triton's interpreter runs the program as one block (`num_ctas` changes where the work runs, not what it
computes), so the tests check this kernel on the CPU. See `flashspec.kernels.verify` for the whole step.

`STRUCTURE` is this launch as a launch structure (`flashspec.kernels.structures`, registered by
`flashspec_lab.kernels`): asked for by the plan key "cluster", at T > 0 where the GPU has clusters (elsewhere the
plan stays as it would be without it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec.kernels.launcher import _COMPILE_OPTIONS, _Launcher
from flashspec.kernels.rng import device_function
from flashspec.kernels.sample_pass import _accept_from_lse, _drafted, _race_position, _write_outputs
from flashspec.kernels.shims import _cdiv, _combine_lse, _scale, interpreting
from flashspec.kernels.structures import Launch, PlanContext, Structure, Work


@device_function
def _lane_lse(lane_max, lane_sum, x):
    """Fold a tile into per-lane (max, sum exp(x - max)) with one exp per element; -inf safe."""
    above = x > lane_max
    gap = tl.where(above, lane_max - x, x - lane_max)  # -|x - max|, NaN only where both are -inf
    scaled = tl.where(x == float("-inf"), 0.0, tl.exp(gap))
    lane_sum = tl.where(above, lane_sum * scaled + 1.0, lane_sum + scaled)
    return tl.maximum(lane_max, x), lane_sum


@device_function
def _rows_lse(target_ptr, draft_ptr, target_rows, draft_rows, target_ok, draft_ok, vocab, scale,
              ROW: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, PRECISE: tl.constexpr,
              STAGES: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_V: tl.constexpr):
    """(max, log sum exp(x - max)) [1, BLOCK_P] of the target rows and of the draft rows starting at
    `target_rows` / `draft_rows` [BLOCK_P] (int64 element offsets; the masks cover the padding), over the whole
    vocabulary in one loop (both rows' tiles in flight at once): per-lane running partials, reduced across lanes
    once. STAGES: tiles the compiler may prefetch ahead (software pipelining)."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    p_lane_max = tl.full([BLOCK_P, BLOCK_V], float("-inf"), tl.float32)
    p_lane_sum = tl.zeros([BLOCK_P, BLOCK_V], tl.float32)
    q_lane_max = tl.full([BLOCK_P, BLOCK_V], float("-inf"), tl.float32)
    q_lane_sum = tl.zeros([BLOCK_P, BLOCK_V], tl.float32)
    for start in tl.range(0, ROW, BLOCK_V, num_stages=STAGES):
        cols = start + lanes
        col_ok = (cols < vocab)[None, :]
        x = tl.load(target_ptr + target_rows[:, None] + cols[None, :], mask=target_ok[:, None] & col_ok,
                    other=float("-inf"))
        if HAS_DRAFT == 1:  # logits (log-probs are normalised already)
            y = tl.load(draft_ptr + draft_rows[:, None] + cols[None, :], mask=draft_ok[:, None] & col_ok,
                        other=float("-inf"))
            q_lane_max, q_lane_sum = _lane_lse(q_lane_max, q_lane_sum, _scale(y.to(tl.float32), scale, SCALE_MODE))
        p_lane_max, p_lane_sum = _lane_lse(p_lane_max, p_lane_sum, _scale(x.to(tl.float32), scale, SCALE_MODE))
    p_max, p_log_sum = _combine_lse(p_lane_max[None, :, :], p_lane_sum[None, :, :], PRECISE)
    if HAS_DRAFT == 1:
        q_max, q_log_sum = _combine_lse(q_lane_max[None, :, :], q_lane_sum[None, :, :], PRECISE)
    elif HAS_DRAFT == 2:
        q_max, q_log_sum = tl.zeros_like(p_max), tl.zeros_like(p_log_sum)
    else:
        q_max, q_log_sum = p_max, p_log_sum  # unused: q is one-hot at the drafted token
    return p_max, p_log_sum, q_max, q_log_sum


@triton.jit(do_not_specialize=["accept_prefix", "sample_prefix"])
def _cluster_kernel(
    target_ptr,  # [B, γ+1, V] target logits, contiguous
    draft_ptr,  # [B, γ, V] draft logits, contiguous (not read unless HAS_DRAFT)
    tokens_ptr,  # [B, γ] drafted token ids, contiguous
    out_tokens_ptr,  # [B, γ+1] int64 out
    out_accepted_ptr,  # [B] int64 out
    gamma,  # γ
    vocab,  # V
    scale,  # T or float32(1/T), as for _stats_kernel
    accept_prefix,  # as for _sample_kernel
    sample_prefix,
    ROW: tl.constexpr,  # V rounded up to a multiple of BLOCK_V
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    PRECISE: tl.constexpr,
    PREFIX_IN_MEMORY: tl.constexpr,
    STAGES: tl.constexpr,  # software-pipelining depth of the log-sum-exp loop
    BLOCK_P: tl.constexpr,  # power of two >= γ+1
    BLOCK_V: tl.constexpr,  # vocabulary tile of the whole program (split across its cluster's blocks)
):
    if PREFIX_IN_MEMORY:
        accept_prefix = tl.load(accept_prefix)
        sample_prefix = tl.load(sample_prefix)
    rows = tl.program_id(0) + tl.zeros([1], tl.int32)  # one batch row, as a [BLOCK_B = 1] block
    row_ok = rows >= 0
    row64 = tl.program_id(0).to(tl.int64)  # int64 offsets: B·(γ+1)·V overflows int32 past 2**31
    positions = tl.arange(0, BLOCK_P)
    p_max, p_log_sum, q_max, q_log_sum = _rows_lse(
        target_ptr, draft_ptr, (row64 * (gamma + 1) + positions) * vocab, (row64 * gamma + positions) * vocab,
        positions <= gamma, positions < gamma, vocab, scale, ROW, SCALE_MODE, HAS_DRAFT, PRECISE, STAGES, BLOCK_P,
        BLOCK_V)
    positions = positions[None, :]
    drafted = _drafted(tokens_ptr, rows.to(tl.int64), row_ok, positions, gamma)
    num_accepted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token = _accept_from_lse(
        target_ptr, draft_ptr, drafted, rows, row_ok, positions, p_max, p_log_sum, q_max, q_log_sum,
        gamma, vocab, scale, accept_prefix, SCALE_MODE, HAS_DRAFT, PRECISE, 1, BLOCK_P)
    best_w, best_w_idx, best_p, best_p_idx = _race_position(
        target_ptr, draft_ptr, rows, row_ok, num_accepted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token,
        row64 * 0, gamma, vocab, scale, sample_prefix, ROW, SCALE_MODE, HAS_DRAFT, PRECISE, True, 1, BLOCK_V)
    # max(0, p - q) can round to zero everywhere when p == q: fall back to p (the limit)
    emitted = tl.where(best_w > float("-inf"), best_w_idx, best_p_idx)
    _write_outputs(out_tokens_ptr, out_accepted_ptr, rows.to(tl.int64), row_ok, positions, drafted, num_accepted,
                   emitted, gamma, vocab)


# ----------------------------------------------------------------------------- the launch structure
NAME = "cluster"
CLUSTER_SIZES = (1, 2, 4, 8, 16)  # 16 is beyond the portable 8: Hopper allows it
_CLUSTER_LAUNCHER = _Launcher(_cluster_kernel)


@dataclass(frozen=True)
class ClusterParams:
    """The cluster launch's program: `ctas` blocks (1 interpreted) sharing a tile of `block_v` logits."""

    ctas: int
    block_v: int
    warps: int  # per block
    stages: int  # software-pipelining depth of its log-sum-exp loop


def plan(context: PlanContext) -> ClusterParams | None:
    """The plan keys' cluster on a GPU (the tile: `cluster_block_v` logits per block); one block interpreted. None
    at T = 0 or where the GPU has no clusters."""
    ctas = int(context.config["cluster_ctas"]) if context.compiled else 1
    if ctas not in CLUSTER_SIZES:
        raise ValueError(f"cluster_ctas={ctas}: a thread-block cluster has 1, 2, 4, 8 or 16 blocks")
    if context.greedy or not context.has_clusters:
        return None
    block_v = context.sampling_tile("cluster_block_v", context.tile("cluster_block_v", scale=ctas))
    if not context.compiled:
        return ClusterParams(ctas=1, block_v=block_v, warps=4, stages=1)
    return ClusterParams(ctas=ctas, block_v=block_v, warps=int(context.config["cluster_warps"]),
                         stages=int(context.config["cluster_stages"]))


def launchers(plan) -> tuple[_Launcher]:
    return (_CLUSTER_LAUNCHER,)


def work(plan, batch: int, gamma: int, greedy: bool, vocab: int) -> Work:
    """Nothing: its blocks meet on chip."""
    return Work(stats=0)


def bind(plan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int], scale: float, flags: dict,
         prefix: tuple, device: torch.device, addresses: bool) -> tuple[Launch]:
    """The one cluster launch: a program per row, `ctas` blocks each. No work buffers and no counters."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    cluster = plan.params
    args = (target, draft, tokens_in, out_tokens, out_accepted, gamma, vocab, scale, accept_prefix, sample_prefix)
    meta = dict(ROW=_cdiv(vocab, cluster.block_v) * cluster.block_v, SCALE_MODE=flags["SCALE_MODE"],
                HAS_DRAFT=flags["HAS_DRAFT"], PRECISE=plan.precise and not interpreting(),
                PREFIX_IN_MEMORY=prefix_in_memory, STAGES=cluster.stages, BLOCK_P=plan.block_p,
                BLOCK_V=cluster.block_v,
                num_warps=cluster.warps, **_COMPILE_OPTIONS,
                **({} if interpreting() else {"num_ctas": cluster.ctas}))
    return (Launch(NAME, _CLUSTER_LAUNCHER, (batch,), args, meta),)


STRUCTURE = Structure(
    name=NAME, residual="race", launches=1, launchers=launchers, bind=bind, work=work, plan=plan,
    # cluster 1: one launch at T > 0, one program per row whose blocks form a thread-block cluster of `cluster_ctas`
    # (2, 4, 8 or 16) and reduce through distributed shared memory (SM90+, Triton >= 3.9). cluster_block_v: each
    # block's share of the program's tile ([γ+1 rounded up to a power of two, cluster_ctas * cluster_block_v] logits
    # per load): 32 logits per thread at 4 warps. cluster_stages: tiles its log-sum-exp loop prefetches ahead
    # (Triton's num_stages; 1: none)
    keys={NAME: 0, "cluster_ctas": 8, "cluster_block_v": 512, "cluster_warps": 4, "cluster_stages": 3},
    priority=1,
    fixes={"pdl": False})  # one launch
