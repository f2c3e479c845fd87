"""Block verification in Triton (`flashspec.verify(..., method="block")`): three launches, no host sync.

1. `_stats_kernel`, as the two launches' first: every row's log-sum-exp partials.
2. `_block_mass_kernel`, grid (row blocks, max(γ-1, 1), V-splits): every program combines its rows' partials,
   reads the target's and draft's logits at the drafted tokens (O(1) in V per candidate) and forms the capped
   cumulative weights w_n (`flashspec.verify.block_acceptance`); then it streams its V-chunk of position n (the
   target's row and the draft's) and sums max(0, w_n p_n - q_n): one chunk of the residual mass Z_n that prefix n
   leaves. The last program of a row block to finish (an acquire-release ticket: it sees every chunk) runs the
   block accept test -- prefix n passes with probability Z_n / (Z_n + 1 - w_n), prefix γ with w_γ, τ is the
   longest that passed -- and stores τ's outcome where the sampling launch reads it (`_store_accept`), with the
   target's log-sum at τ raised by -log w_τ, so the sampler's p is w_τ p and its residual max(0, w_τ p - q).
3. `_sample_kernel` with ACCEPTED: the two-level race of position τ, as for token verification.

Same tokens as `flashspec.verify.verify_reference(..., method="block")`. Greedy decoding never comes here: at
T = 0 the two methods accept the same prefix, and the two launches run it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec.kernels import rng as krng
from flashspec.kernels import two_launch
from flashspec.kernels.launcher import _COMPILE_OPTIONS, _Launcher, _ticket_counter
from flashspec.kernels.sample_pass import _drafted, _store_accept
from flashspec.kernels.shims import _cdiv, _combine_lse, _draft_scale, _exp, _log, _max, _scale, _sum, interpreting
from flashspec.kernels.structures import Launch, PlanContext, Structure, Work

NAME = "block_pass"
SAMPLER = "block"  # the `Structure.residual` key `flashspec.kernels.verify` asks for under method="block"


@triton.jit(do_not_specialize=["accept_prefix"])
def _block_mass_kernel(
    target_ptr,  # [B, γ+1, V] target logits, contiguous
    draft_ptr,  # [B, γ, V] draft logits or log-probs, contiguous (not read unless HAS_DRAFT)
    tokens_ptr,  # [B, γ] drafted token ids (any integer dtype), contiguous
    part_max_ptr,  # [B, 2γ+1, S] fp32 in: the stats launch's chunk maxima
    part_sum_ptr,  # [B, 2γ+1, S] fp32 in: its chunk sums
    mass_ptr,  # [B, γ, S] fp32 work: each chunk's sum of max(0, w_n p_n - q_n) at position n (1 <= n < γ)
    counter_ptr,  # [row blocks] int32 tickets, zero between calls (the last program resets its own)
    info_ptr,  # [B, 6] 32-bit words out: τ's outcome for the sampling launch (`_store_accept`)
    batch,  # B
    gamma,  # γ
    vocab,  # V
    num_splits,  # S (the stats launch's)
    scale,  # T or float32(1/T), as for _stats_kernel
    accept_prefix,  # krng.stream_prefix(key, STREAM_ACCEPT) as int32, or (PREFIX_IN_MEMORY) a pointer to it
    CHUNK: tl.constexpr,  # V-elements per split (the stats launch's chunk)
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,  # 1: draft logits, 2: draft log-probs, 0: none (deterministic proposals)
    PRECISE: tl.constexpr,
    PREFIX_IN_MEMORY: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,  # power of two >= γ+1
    BLOCK_S: tl.constexpr,  # power of two >= S
    BLOCK_V: tl.constexpr,
):
    pid_b = tl.program_id(0)
    n = tl.program_id(1) + 1  # the prefix whose residual mass this program sums (none when γ = 1)
    split = tl.program_id(2)
    if PREFIX_IN_MEMORY:
        prefix = tl.load(accept_prefix)
    else:
        prefix = accept_prefix
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    rows64 = rows.to(tl.int64)
    positions = tl.arange(0, BLOCK_P)[None, :]  # [1, BLOCK_P]
    width = 2 * gamma + 1
    r3 = rows64[:, None, None]
    p3 = tl.arange(0, BLOCK_P)[None, :, None]
    s3 = tl.arange(0, BLOCK_S)[None, None, :]
    target_stats = (r3 * width + p3) * num_splits + s3
    split_ok = s3 < num_splits
    p_max, p_log_sum = _combine_lse(
        tl.load(part_max_ptr + target_stats, mask=row_ok[:, None, None] & (p3 <= gamma) & split_ok,
                other=float("-inf")),
        tl.load(part_sum_ptr + target_stats, mask=row_ok[:, None, None] & (p3 <= gamma) & split_ok, other=0.0),
        PRECISE)
    if HAS_DRAFT == 1:
        draft_stats = target_stats + (gamma + 1) * num_splits
        draft_mask = row_ok[:, None, None] & (p3 < gamma) & split_ok
        q_max, q_log_sum = _combine_lse(tl.load(part_max_ptr + draft_stats, mask=draft_mask, other=float("-inf")),
                                        tl.load(part_sum_ptr + draft_stats, mask=draft_mask, other=0.0), PRECISE)
    elif HAS_DRAFT == 2:  # log-probs: normalised already
        q_max, q_log_sum = tl.zeros_like(p_max), tl.zeros_like(p_log_sum)
    else:
        q_max, q_log_sum = p_max, p_log_sum  # unused: q is one-hot at the drafted token
    # the log-ratios at the drafted tokens, then log w_n = S_n - max_{k <= n} S_k (S_n: the first n ratios' sum)
    drafted = _drafted(tokens_ptr, rows64, row_ok, positions, gamma)
    is_draft = positions < gamma
    token_ok = row_ok[:, None] & is_draft & (drafted >= 0) & (drafted < vocab)
    target_at_token = tl.load(target_ptr + (rows64[:, None] * (gamma + 1) + positions) * vocab + drafted,
                              mask=token_ok, other=float("-inf"))
    log_p_x = (_scale(target_at_token.to(tl.float32), scale, SCALE_MODE) - p_max) - p_log_sum
    if HAS_DRAFT:
        draft_at_token = tl.load(draft_ptr + (rows64[:, None] * gamma + positions) * vocab + drafted,
                                 mask=token_ok, other=float("-inf"))
        log_q_x = (_draft_scale(draft_at_token.to(tl.float32), scale, SCALE_MODE, HAS_DRAFT) - q_max) - q_log_sum
    else:
        log_q_x = tl.zeros([BLOCK_B, BLOCK_P], tl.float32)
    ratio = tl.where(is_draft, log_p_x - log_q_x, 0.0)
    k3 = tl.arange(0, BLOCK_P)[None, None, :]
    sums = _sum(tl.where(k3 < p3, ratio[:, None, :], 0.0), axis=2)  # [BLOCK_B, BLOCK_P]: S_n, S_0 = 0
    log_w = sums - _max(tl.where(k3 <= p3, sums[:, None, :], float("-inf")), axis=2)
    if n < gamma:  # stream V-chunk `split` of position n: sum max(0, w_n p_n - q_n)
        at_n = positions == n
        log_w_n = _sum(tl.where(at_n, log_w, 0.0), axis=1)
        n_p_max = _sum(tl.where(at_n, p_max, 0.0), axis=1)
        n_p_log_sum = _sum(tl.where(at_n, p_log_sum, 0.0), axis=1)
        n_q_max = _sum(tl.where(at_n, q_max, 0.0), axis=1)
        n_q_log_sum = _sum(tl.where(at_n, q_log_sum, 0.0), axis=1)
        n_token = _sum(tl.where(at_n, drafted, 0), axis=1)
        target_row = (rows64 * (gamma + 1) + n) * vocab
        draft_row = (rows64 * gamma + n) * vocab
        lanes = tl.arange(0, BLOCK_V).to(tl.int64)
        first = split.to(tl.int64) * CHUNK
        mass = tl.zeros([BLOCK_B], tl.float32)
        for start in range(0, CHUNK, BLOCK_V):
            cols = first + start + lanes
            mask = row_ok[:, None] & (cols < vocab)[None, :]
            x = tl.load(target_ptr + target_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            log_p = (_scale(x.to(tl.float32), scale, SCALE_MODE) - n_p_max[:, None]) - n_p_log_sum[:, None]
            weighted = _exp(log_p + log_w_n[:, None], PRECISE)
            if HAS_DRAFT:
                y = tl.load(draft_ptr + draft_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
                q = _exp((_draft_scale(y.to(tl.float32), scale, SCALE_MODE, HAS_DRAFT) - n_q_max[:, None])
                         - n_q_log_sum[:, None], PRECISE)
            else:
                q = tl.where(cols[None, :] == n_token[:, None], 1.0, 0.0)
            mass += _sum(tl.where(mask, tl.maximum(weighted - q, 0.0), 0.0), axis=1)
        tl.store(mass_ptr + (rows64 * gamma + n) * num_splits + split, mass, mask=row_ok)
    tl.debug_barrier()  # every thread's stores precede the release below
    ticket = tl.atomic_add(counter_ptr + pid_b, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(1) * num_splits - 1:  # the last program of this row block: the accept test
        mass_offsets = (r3 * gamma + p3) * num_splits + s3
        mass_mask = row_ok[:, None, None] & (p3 >= 1) & (p3 < gamma) & split_ok
        total = _sum(tl.load(mass_ptr + mass_offsets, mask=mass_mask, other=0.0, volatile=True), axis=2)
        denominator = total + 1.0 - _exp(log_w, PRECISE)
        h = tl.where(denominator > 0.0, total / tl.maximum(denominator, 1.1754943508222875e-38), 1.0)
        log_h = tl.where(positions == gamma, log_w, _log(h, PRECISE))
        index0 = tl.zeros([1, 1], tl.int32)
        u = krng.uniform_from_base(krng.base_hash(prefix, rows[:, None], tl.maximum(positions - 1, 0)), index0)
        passed = (_log(u, PRECISE) <= log_h) & (positions >= 1) & (positions <= gamma)
        tau = _max(tl.where(passed, positions, 0), axis=1)  # the longest prefix that passed, 0 if none
        at_tau = positions == tau[:, None]
        kept_weight = tl.where(positions < gamma, log_w, 0.0)  # the bonus at τ = γ is drawn from p itself
        _store_accept(info_ptr, rows64, row_ok, tau,
                      _sum(tl.where(at_tau, p_max, 0.0), axis=1),
                      _sum(tl.where(at_tau, p_log_sum - kept_weight, 0.0), axis=1),
                      _sum(tl.where(at_tau, q_max, 0.0), axis=1),
                      _sum(tl.where(at_tau, q_log_sum, 0.0), axis=1),
                      _sum(tl.where(at_tau & is_draft, drafted, 0), axis=1))
        tl.atomic_xchg(counter_ptr + pid_b, 0)  # ready for the sampling launch and the next call


_MASS_LAUNCHER = _Launcher(_block_mass_kernel)


def launchers(plan) -> tuple[_Launcher, _Launcher, _Launcher]:
    """The stats launch's launcher, the mass launch's, the sampling launch's."""
    return (two_launch.STATS_LAUNCHER, _MASS_LAUNCHER, two_launch.SAMPLE_LAUNCHER)


def work(plan, batch: int, gamma: int, greedy: bool, vocab: int) -> Work:
    """The two launches' buffers, and the mass partials [B, γ, S] (in the block-sums slot)."""
    shared = two_launch.work(plan, batch, gamma, greedy, vocab)
    return Work(stats=shared.stats, race=shared.race, blocks=batch * gamma * plan.stats_splits)


def plan(context: PlanContext) -> tuple | None:
    """No parameters of its own; greedy decoding takes the two launches (the methods agree at T = 0)."""
    return None if context.greedy else ()


def bind(plan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int], scale: float, flags: dict,
         prefix: tuple, device: torch.device, addresses: bool) -> tuple[Launch, Launch, Launch]:
    """The stats launch, the mass launch and the sampling launch (ACCEPTED: it reads the mass launch's outcome)."""
    target, draft, tokens_in = inputs
    batch, gamma, _ = shape
    accept_prefix, _, prefix_in_memory = prefix
    stats, sample = two_launch.bind(plan, inputs, outputs, work, shape, scale, flags, prefix, device, addresses,
                                    accept_test=False)
    row_blocks = _cdiv(batch, plan.block_b)
    counter = _ticket_counter(device, row_blocks, addresses)
    mass_args = (target, draft, tokens_in, work["part_max"], work["part_sum"], work["block_max"], counter,
                 work["info"], batch, gamma, shape[2], plan.stats_splits, scale, accept_prefix)
    mass_meta = dict(CHUNK=plan.stats_chunk, SCALE_MODE=flags["SCALE_MODE"], HAS_DRAFT=flags["HAS_DRAFT"],
                     PRECISE=plan.precise and not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory,
                     BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_S=plan.block_s, BLOCK_V=plan.stats_block_v,
                     num_warps=plan.stats_warps, **_COMPILE_OPTIONS)
    mass = Launch("mass", _MASS_LAUNCHER, (row_blocks, max(gamma - 1, 1), plan.stats_splits), mass_args, mass_meta)
    return stats, mass, sample


STRUCTURE = Structure(name=NAME, residual=SAMPLER, launches=3, launchers=launchers, bind=bind, work=work, plan=plan,
                      default=True, fixes={"accept_once": True, "pdl": False})
