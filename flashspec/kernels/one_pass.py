"""Verification in one launch, the residual drawn by rejection from p (`flashspec.verify`, residual="rejection").

Grid (row blocks, γ+1 positions, V-splits), as `_stats_kernel`'s. Every program streams its V-chunk of the target
rows at its position (and of the draft row there, given the draft's logits) once, as `_stats_kernel` does, and keeps
besides its log-sum-exp partial one (max, sum of exp(x - max)) pair per sampling block of
`flashspec.sampling.SAMPLE_BLOCK` tokens. The last program of a row block to finish (an acquire-release ticket: it
sees every partial) then does what needs no second pass over V:

* the accept test from the partials and two logits per candidate (`_accept`);
* all accepted: the bonus token, `sampling.block_race` over p from the block pairs (the blocks' masses), then
  the race inside the winning block (one block of logits read);
* a rejection at n: `sampling.REJECTION_PROPOSALS` proposals drawn from p at n the same way, each accepted with
  probability max(0, 1 - q/p) read at its token (`sampling.residual_by_rejection`); the first accepted is the
  token. Only if every proposal fails does the program race the residual max(0, p - q) over the whole row
  alone (`_race`, the two launches' sampler: probability (1 - a)^K for a residual of mass a, at most 4.3% of
  rows at K = 8).

So no program waits for another and nothing streams V twice but that fallback. Same tokens as
`flashspec.verify.verify_reference(..., residual="rejection")`. See `flashspec.kernels.verify` for the step.

`STRUCTURE` is this launch as a launch structure (`flashspec.kernels.structures`): the default, and only, structure
of residual="rejection", on the stats pass's grid.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec import sampling
from flashspec.kernels import rng as krng
from flashspec.kernels.launcher import _COMPILE_OPTIONS, _Launcher, _ticket_counter
from flashspec.kernels.rng import device_function
from flashspec.kernels.sample_pass import _accept, _race, _write_outputs
from flashspec.kernels.shims import (_cdiv, _draft_scale, _exp, _log, _log1p, _max, _max_index, _min, _online_lse,
                                     _scale, _sum, _sum_exp_term, interpreting)
from flashspec.kernels.stats_pass import _chunk_stats, _store_partials
from flashspec.kernels.structures import Launch, PlanContext, Structure, Work

BLOCK_NOISE_INDEX = tl.constexpr(sampling.BLOCK_NOISE_INDEX)
PROPOSAL_ACCEPT_INDEX = tl.constexpr(sampling.PROPOSAL_ACCEPT_INDEX)
PROPOSAL_POSITION = tl.constexpr(sampling.PROPOSAL_POSITION)


@device_function
def _chunk_block_stats(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, block_max_ptr, block_sum_ptr,
                       pid_b, position, split, batch, gamma, vocab, num_splits, num_blocks, scale,
                       CHUNK: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr,
                       SB: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """V-chunk `split` of the BLOCK_B rows of row block `pid_b` at `position`: the target's (max, sum exp(x - max))
    per sampling block of SB tokens, stored, and folded into the chunk's partial; the draft's partial there
    (logits only), as `_chunk_stats`."""
    BLOCKS: tl.constexpr = BLOCK_V // SB
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    rows64 = rows.to(tl.int64)
    target_row = (rows64 * (gamma + 1) + position) * vocab
    draft_row = (rows64 * gamma + position) * vocab
    has_draft_row = (rows * 0 + position) < gamma
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    first = split.to(tl.int64) * CHUNK
    block_row = (rows64 * (gamma + 1) + position) * num_blocks
    p_max = tl.full([BLOCK_B], float("-inf"), tl.float32)
    p_sum = tl.zeros([BLOCK_B], tl.float32)
    q_max = tl.full([BLOCK_B], float("-inf"), tl.float32)
    q_sum = tl.zeros([BLOCK_B], tl.float32)
    for start in range(0, CHUNK, BLOCK_V):
        cols = first + start + lanes
        mask = row_ok[:, None] & (cols < vocab)[None, :]
        x = tl.load(target_ptr + target_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
        x = tl.reshape(_scale(x.to(tl.float32), scale, SCALE_MODE), [BLOCK_B, BLOCKS, SB])
        b_max = _max(x, axis=2)  # [BLOCK_B, BLOCKS]
        b_shift = tl.where(b_max == float("-inf"), 0.0, b_max)
        b_sum = _sum(_sum_exp_term(x - b_shift[:, :, None]), axis=2)
        blocks = (first + start) // SB + tl.arange(0, BLOCKS).to(tl.int64)
        block_ok = row_ok[:, None] & (blocks < num_blocks)[None, :]
        tl.store(block_max_ptr + block_row[:, None] + blocks[None, :], b_max, mask=block_ok)
        tl.store(block_sum_ptr + block_row[:, None] + blocks[None, :], b_sum, mask=block_ok)
        new_max = tl.maximum(p_max, _max(b_max, axis=1))
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        p_sum = p_sum * tl.exp(p_max - shift) + _sum(b_sum * tl.exp(b_max - shift[:, None]), axis=1)
        p_max = new_max
        if HAS_DRAFT == 1:  # logits: their log-sum-exp (log-probs are normalised already)
            y = tl.load(draft_ptr + draft_row[:, None] + cols[None, :], mask=mask & has_draft_row[:, None],
                        other=float("-inf"))
            q_max, q_sum = _online_lse(q_max, q_sum, _scale(y.to(tl.float32), scale, SCALE_MODE))
    _store_partials(part_max_ptr, part_sum_ptr, rows64, position, split, gamma, num_splits,
                    p_max, p_sum, q_max, q_sum, row_ok, row_ok & has_draft_row, HAS_DRAFT)


@device_function
def _block_pairs(block_max_ptr, block_sum_ptr, rows64, row_ok, gamma, num_blocks,
                 BLOCK_P: tl.constexpr, BLOCK_NB: tl.constexpr):
    """Every position's block pairs (max, sum) [BLOCK_B, BLOCK_P, BLOCK_NB] of the rows, loaded before the accept
    test says which position a row samples from: one dependent round trip less than loading that position's."""
    p3 = tl.arange(0, BLOCK_P)[None, :, None]
    blocks = tl.arange(0, BLOCK_NB).to(tl.int64)[None, None, :]
    at = (rows64[:, None, None] * (gamma + 1) + p3) * num_blocks + blocks
    mask = row_ok[:, None, None] & (p3 <= gamma) & (blocks < num_blocks)
    b_max = tl.load(block_max_ptr + at, mask=mask, other=float("-inf"), volatile=True)
    b_sum = tl.load(block_sum_ptr + at, mask=mask, other=0.0, volatile=True)
    return b_max, b_sum


@device_function
def _propose(target_ptr, draft_ptr, b_max_all, b_sum_all, rows, row_ok, num_accepted, n_p_max,
             n_p_log_sum, n_q_max, n_q_log_sum, n_token, gamma, vocab, scale, sample_prefix,
             SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, PRECISE: tl.constexpr, PROPOSALS: tl.constexpr,
             ONE_BLOCK: tl.constexpr, SB: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_NB: tl.constexpr):
    """The PROPOSALS draws from p at each row's position n (`sampling.block_race` from the block pairs, then the
    race inside the chosen block) and their accept tests against the residual: (tokens [BLOCK_B, K], accepted
    [BLOCK_B, K]). A row that accepted every draft draws its bonus: all its proposals use the sample stream's
    hash at n (the first is the bonus; the accept tests are then meaningless and unread). ONE_BLOCK: the row
    (V <= SB) is one block, whose race is the whole draw (`block_race` draws no block noise then). `b_max_all`,
    `b_sum_all`: `_block_pairs`. The draft's logits are read over the proposals' blocks with the target's (one
    round trip), not at the drawn tokens after the race."""
    ks = tl.arange(0, PROPOSALS)
    rejected = num_accepted < gamma
    rows64 = rows.to(tl.int64)
    n64 = num_accepted.to(tl.int64)
    sample_base = krng.base_hash(sample_prefix, rows, num_accepted)  # [BLOCK_B]
    proposal_base = krng.base_hash(sample_prefix, rows[:, None],
                                   num_accepted[:, None] * PROPOSALS + ks[None, :] + PROPOSAL_POSITION)
    bases = tl.where(rejected[:, None], proposal_base, sample_base[:, None])  # [BLOCK_B, K]
    if ONE_BLOCK:
        chosen = bases.to(tl.int64) * 0
    else:  # the blocks' masses of p at n, sum exp(x - block max) * exp(block max - max - log-sum), raced
        blocks = tl.arange(0, BLOCK_NB).to(tl.int64)
        at_n = tl.arange(0, BLOCK_P)[None, :, None] == num_accepted[:, None, None]
        b_max = _max(tl.where(at_n, b_max_all, float("-inf")), axis=1)  # [BLOCK_B, BLOCK_NB] at position n
        b_sum = _sum(tl.where(at_n, b_sum_all, 0.0), axis=1)
        shift = tl.where(b_max == float("-inf"), 0.0, (b_max - n_p_max[:, None]) - n_p_log_sum[:, None])
        masses = b_sum * _exp(shift, PRECISE)
        log_masses = tl.where(masses > 0.0, _log(tl.where(masses > 0.0, masses, 1.0), PRECISE), float("-inf"))
        u = krng.uniform_from_base(bases[:, :, None], (-blocks + BLOCK_NOISE_INDEX)[None, None, :])
        block_score = tl.where((masses > 0.0)[:, None, :],
                               log_masses[:, None, :] - _log(-_log(u, PRECISE), PRECISE), float("-inf"))
        _, chosen = _max_index(block_score, axis=2)  # [BLOCK_B, K]: the first block of the largest score
        chosen = chosen.to(tl.int64)
    # the race inside each proposal's block
    lanes = tl.arange(0, SB).to(tl.int64)
    cols = chosen[:, :, None] * SB + lanes[None, None, :]  # [BLOCK_B, K, SB]
    inside = row_ok[:, None, None] & (cols < vocab)
    target_row = (rows64 * (gamma + 1) + n64) * vocab
    x = tl.load(target_ptr + target_row[:, None, None] + cols, mask=inside, other=float("-inf"))
    if HAS_DRAFT:  # the draft's row at n over the same blocks, read with the target's
        draft_row = (rows64 * gamma + tl.minimum(n64, gamma - 1)) * vocab
        y = tl.load(draft_ptr + draft_row[:, None, None] + cols, mask=inside & rejected[:, None, None],
                    other=float("-inf"))
    log_p = ((_scale(x.to(tl.float32), scale, SCALE_MODE) - n_p_max[:, None, None])
             - n_p_log_sum[:, None, None])
    noise = krng.uniform_from_base(bases[:, :, None], cols)
    score = tl.where(inside, log_p - _log(-_log(noise, PRECISE), PRECISE), float("-inf"))
    _, arg = _max_index(score, axis=2)
    arg = arg.to(tl.int64)
    tokens = chosen * SB + arg  # [BLOCK_B, K]
    won = lanes[None, None, :] == arg[:, :, None]
    log_p_t = _sum(tl.where(won, log_p, 0.0), axis=2)
    # accept proposal t with probability max(0, 1 - q_t / p_t)
    if HAS_DRAFT:
        log_q = ((_draft_scale(y.to(tl.float32), scale, SCALE_MODE, HAS_DRAFT) - n_q_max[:, None, None])
                 - n_q_log_sum[:, None, None])
        log_q_t = _sum(tl.where(won, log_q, 0.0), axis=2)
    else:  # q one-hot at the drafted token
        log_q_t = tl.where(tokens == n_token[:, None], 0.0, float("-inf"))
    above = log_q_t < log_p_t
    keep = _log1p(-_exp(tl.where(above, log_q_t - log_p_t, 0.0), PRECISE), PRECISE)
    accept_u = krng.uniform_from_base(bases, tokens * 0 + PROPOSAL_ACCEPT_INDEX)
    accepted = above & (_log(accept_u, PRECISE) <= keep)
    return tokens, accepted


@triton.jit(do_not_specialize=["accept_prefix", "sample_prefix"])
def _one_pass_kernel(
    target_ptr,  # [B, γ+1, V] target logits, contiguous
    draft_ptr,  # [B, γ, V] draft logits or log-probs, contiguous (not read unless HAS_DRAFT)
    tokens_ptr,  # [B, γ] drafted token ids (any integer dtype), contiguous
    part_max_ptr,  # [B, 2γ+1, S] fp32 work: chunk maxima
    part_sum_ptr,  # [B, 2γ+1, S] fp32 work: chunk sums (not used when GREEDY)
    part_idx_ptr,  # [B, 2γ+1, S] int32 work: chunk argmax (GREEDY only)
    block_max_ptr,  # [B, γ+1, NB] fp32 work: each sampling block's max (not used when GREEDY)
    block_sum_ptr,  # [B, γ+1, NB] fp32 work: each sampling block's sum of exp(x - its max)
    counter_ptr,  # [row blocks] int32 tickets, zero between calls (the last program resets its own)
    out_tokens_ptr,  # [B, γ+1] int64 out
    out_accepted_ptr,  # [B] int64 out
    batch,  # B
    gamma,  # γ
    vocab,  # V
    num_splits,  # S
    num_blocks,  # NB = ceil(V / SB)
    scale,  # T or float32(1/T), as for _stats_kernel
    accept_prefix,  # as for _sample_kernel
    sample_prefix,
    CHUNK: tl.constexpr,  # V-elements per split, a multiple of BLOCK_V
    ROW: tl.constexpr,  # V rounded up to a multiple of SAMPLE_BLOCK_V: what the fallback race streams
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,  # 1: draft logits, 2: draft log-probs, 0: none (deterministic, greedy)
    GREEDY: tl.constexpr,
    PRECISE: tl.constexpr,
    PREFIX_IN_MEMORY: tl.constexpr,
    PROPOSALS: tl.constexpr,  # sampling.REJECTION_PROPOSALS
    ONE_BLOCK: tl.constexpr,  # V <= sampling.SAMPLE_BLOCK: the row is one sampling block (no block pairs kept)
    SB: tl.constexpr,  # tokens per sampling block: sampling.SAMPLE_BLOCK, or V rounded up to a power of two
    BLOCK_B: tl.constexpr,  # rows per program
    BLOCK_P: tl.constexpr,  # power of two >= γ+1
    BLOCK_S: tl.constexpr,  # power of two >= S
    BLOCK_NB: tl.constexpr,  # power of two >= NB
    BLOCK_V: tl.constexpr,  # vocabulary tile of the streaming part, a multiple of SB (unless ONE_BLOCK)
    SAMPLE_BLOCK_V: tl.constexpr,  # vocabulary tile of the fallback race
    STOP: tl.constexpr = 0,  # diagnostics of where the time goes (wrong tokens): 1 stop after the streaming part,
    #                          2 after the accept test (the emitted token is the first draw's position, unsampled)
):
    pid_b = tl.program_id(0)
    position = tl.program_id(1)
    split = tl.program_id(2)
    if GREEDY or ONE_BLOCK:  # no block pairs to keep
        _chunk_stats(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr, pid_b, position, split, batch,
                     gamma, vocab, num_splits, scale, CHUNK, SCALE_MODE, HAS_DRAFT, GREEDY, BLOCK_B, BLOCK_V, 0)
    else:
        _chunk_block_stats(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, block_max_ptr, block_sum_ptr,
                           pid_b, position, split, batch, gamma, vocab, num_splits, num_blocks, scale,
                           CHUNK, SCALE_MODE, HAS_DRAFT, SB, BLOCK_B, BLOCK_V)
    if STOP == 1:  # diagnostic: the streaming part alone
        return
    tl.debug_barrier()  # every thread's partials precede the release below
    ticket = tl.atomic_add(counter_ptr + pid_b, 1, sem="acq_rel", scope="gpu")
    if ticket == (gamma + 1) * num_splits - 1:  # the last program of this row block: every partial is written
        if PREFIX_IN_MEMORY:  # new names: a compiled branch may not retype a value defined before it
            accept = tl.load(accept_prefix)
            sample = tl.load(sample_prefix)
        else:
            accept = accept_prefix
            sample = sample_prefix
        rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
        row_ok = rows < batch
        rows64 = rows.to(tl.int64)
        positions = tl.arange(0, BLOCK_P)[None, :]
        if not (GREEDY or ONE_BLOCK):
            b_max_all, b_sum_all = _block_pairs(block_max_ptr, block_sum_ptr, rows64, row_ok, gamma, num_blocks,
                                                BLOCK_P, BLOCK_NB)
        else:  # unused
            b_max_all = tl.zeros([BLOCK_B, BLOCK_P, BLOCK_NB], tl.float32)
            b_sum_all = b_max_all
        drafted, num_accepted, emitted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token = _accept(
            target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr, rows, row_ok,
            gamma, vocab, num_splits, scale, accept, SCALE_MODE, HAS_DRAFT, GREEDY, PRECISE, True, BLOCK_B, BLOCK_P,
            BLOCK_S)
        if not GREEDY and STOP != 2:
            tokens, accepted = _propose(
                target_ptr, draft_ptr, b_max_all, b_sum_all, rows, row_ok, num_accepted, n_p_max,
                n_p_log_sum, n_q_max, n_q_log_sum, n_token, gamma, vocab, scale, sample,
                SCALE_MODE, HAS_DRAFT, PRECISE, PROPOSALS, ONE_BLOCK, SB, BLOCK_P, BLOCK_NB)
            ks = tl.arange(0, PROPOSALS)[None, :]
            first = _min(tl.where(accepted, ks, PROPOSALS), axis=1)  # each row's first accepted proposal, or K
            # the first accepted proposal; the first proposal where none was (a bonus row's: its draw from p)
            emitted = _sum(tl.where(ks == (first % PROPOSALS)[:, None], tokens, 0), axis=1).to(tl.int32)
            rejected = num_accepted < gamma
            fallback = rejected & row_ok & (first == PROPOSALS)
            if _max(tl.where(fallback, 1, 0), axis=0) > 0:  # a row whose proposals all failed: race the residual
                n64 = num_accepted.to(tl.int64)
                best_w, best_w_idx = _race(
                    target_ptr, draft_ptr, (rows64 * (gamma + 1) + n64) * vocab,
                    (rows64 * gamma + tl.minimum(n64, gamma - 1)) * vocab, n_p_max, n_p_log_sum, n_q_max,
                    n_q_log_sum, n_token, rejected, row_ok, krng.base_hash(sample, rows, num_accepted),
                    (pid_b * 0).to(tl.int64), vocab, scale, ROW, SCALE_MODE, HAS_DRAFT, True, PRECISE, False, BLOCK_B,
                    SAMPLE_BLOCK_V)
                # no residual mass anywhere (p == q in floating point): the first proposal, a draw from p
                emitted = tl.where(fallback & (best_w > float("-inf")), best_w_idx, emitted)
        _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted, num_accepted,
                       emitted, gamma, vocab)
        tl.atomic_xchg(counter_ptr + pid_b, 0)  # ready for the next call


# ----------------------------------------------------------------------------- the launch structure
NAME = "one_pass"
_ONE_PASS_LAUNCHER = _Launcher(_one_pass_kernel)


@dataclass(frozen=True)
class OnePassParams:
    """The one-pass plan's own parameter (`LaunchPlan.params`)."""

    stop: int = 0  # diagnostic, never a default: the kernel stops early (`_one_pass_kernel`'s STOP)


def plan(context: PlanContext) -> OnePassParams:
    """Its stats tile must hold whole sampling blocks (each block's sum stays in the program that streams it)."""
    if not context.greedy and context.vocab > sampling.SAMPLE_BLOCK and context.stats_block_v < sampling.SAMPLE_BLOCK:
        raise ValueError(f"block_v={context.stats_block_v}: the one-pass plan keeps each block of "
                         f"{sampling.SAMPLE_BLOCK} tokens' sum in the program that streams it; use a power of two "
                         f">= {sampling.SAMPLE_BLOCK} (V = {context.vocab})")
    return OnePassParams(stop=int(context.config["one_pass_stop"]))


def launchers(plan) -> tuple[_Launcher]:
    return (_ONE_PASS_LAUNCHER,)


def work(plan, batch: int, gamma: int, greedy: bool, vocab: int) -> Work:
    """The stats partials, and a (max, sum) pair per sampling block of every target row where V spans blocks."""
    spans = not greedy and vocab > sampling.SAMPLE_BLOCK
    return Work(stats=batch * (2 * gamma + 1) * plan.stats_splits,
                blocks=batch * (gamma + 1) * _cdiv(vocab, sampling.SAMPLE_BLOCK) if spans else 0)


def bind(plan, inputs: tuple, outputs: tuple, work: dict, shape: tuple[int, int, int], scale: float, flags: dict,
         prefix: tuple, device: torch.device, addresses: bool) -> tuple[Launch]:
    """The one launch: grid (row blocks, γ+1, V-splits), a ticket per row block."""
    target, draft, tokens_in = inputs
    out_tokens, out_accepted = outputs
    batch, gamma, vocab = shape
    accept_prefix, sample_prefix, prefix_in_memory = prefix
    one_block = vocab <= sampling.SAMPLE_BLOCK
    num_blocks = 1 if one_block else _cdiv(vocab, sampling.SAMPLE_BLOCK)
    args = (target, draft, tokens_in, work["part_max"], work["part_sum"], work["part_idx"], work["block_max"],
            work["block_sum"], _ticket_counter(device, _cdiv(batch, plan.block_b), addresses), out_tokens, out_accepted,
            batch, gamma, vocab, plan.stats_splits, num_blocks, scale, accept_prefix, sample_prefix)
    meta = dict(CHUNK=plan.stats_chunk, ROW=_cdiv(vocab, plan.sample_block_v) * plan.sample_block_v, **flags,
                PRECISE=plan.precise and not interpreting(), PREFIX_IN_MEMORY=prefix_in_memory,
                PROPOSALS=sampling.REJECTION_PROPOSALS, ONE_BLOCK=one_block,
                SB=triton.next_power_of_2(vocab) if one_block else sampling.SAMPLE_BLOCK,
                BLOCK_B=plan.block_b, BLOCK_P=plan.block_p, BLOCK_S=plan.block_s,
                BLOCK_NB=triton.next_power_of_2(num_blocks),
                BLOCK_V=plan.stats_block_v, SAMPLE_BLOCK_V=plan.sample_block_v, STOP=plan.params.stop,
                num_warps=plan.stats_warps,
                **_COMPILE_OPTIONS)
    return (Launch(NAME, _ONE_PASS_LAUNCHER, (_cdiv(batch, plan.block_b), gamma + 1, plan.stats_splits), args, meta),)


STRUCTURE = Structure(
    name=NAME, residual="rejection", launches=1, launchers=launchers, bind=bind, work=work, plan=plan,
    # diagnostic, never a default (its tokens are wrong): the kernel stops after its streaming part (1) or after the
    # accept test (2), to split its time between streaming, the accept test and the proposals
    keys={"one_pass_stop": 0},
    default=True,
    fixes={"accept_once": False, "pdl": False, "stats_lane_elems": 0})  # its own accept test, one launch, no lanes
