"""Launch 2 of verification: every program redoes the accept test of its rows from the stats partials
and two logits per candidate (O(1) in V per candidate), then streams its V-chunk of the one position its
row samples from (first rejection, or the bonus position) in a two-level exponential race with counter-based
noise (blocks of tokens weighed by their sums, then the tokens of the winning block); the last program of a row
block to finish (an atomic ticket) reduces the chunk winners and writes tokens / num_accepted.
See `flashspec.kernels.verify` for the whole step."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches it through this module's globals)

from flashspec import sampling
from flashspec.kernels import rng as krng
from flashspec.kernels.shims import (INT32_MAX, RESHAPED_BLOCK_SUMS, _combine_lse, _draft_scale, _exp,
                                     _fold_first_max, _log, _max, _max_index, _min, _scale, _sum, gdc_wait)
from flashspec.kernels.rng import device_function


# ----------------------------------------------------------------------------- launch 2
@device_function
def _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted, num_accepted,
                   emitted, gamma, vocab):
    """tokens[b] = drafts before n, the emitted token at n (clamped into [0, V)), then -1."""
    emitted = tl.minimum(tl.maximum(emitted, 0), vocab - 1).to(tl.int64)
    n = num_accepted[:, None]
    tokens = tl.where(positions < n, drafted, tl.where(positions == n, emitted[:, None], -1))
    mask = row_ok[:, None] & (positions <= gamma)
    tl.store(out_tokens_ptr + rows64[:, None] * (gamma + 1) + positions, tokens, mask=mask)
    tl.store(out_accepted_ptr + rows64, num_accepted.to(tl.int64), mask=row_ok)


SAMPLE_BLOCK = tl.constexpr(sampling.SAMPLE_BLOCK)  # constexpr: read inside the kernels
BLOCK_NOISE_INDEX = tl.constexpr(sampling.BLOCK_NOISE_INDEX)
RESHAPE_BLOCKS = tl.constexpr(RESHAPED_BLOCK_SUMS)  # how `_block_race` sums a tile of several blocks


@device_function
def _weights(target_ptr, draft_ptr, target_row, draft_row, cols, mask, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum,
             n_token, rejected, scale,
             SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, RESIDUAL: tl.constexpr, PRECISE: tl.constexpr):
    """(w, log w) at columns `cols` (a tile: [1, BLOCK_V], or a block per row: [BLOCK_B, SAMPLE_BLOCK]) of each
    row's sampled position, as `flashspec.sampling.block_race` reads them: w = max(0, p - q) in linear space on
    rejected rows and p on the others (RESIDUAL), or w = p; log w is the target's log-prob itself where w = p.
    The draft's logits are read only for the residual of a rejected row; without them q is one-hot at n_token.
    Masked-out columns read -inf logits (w = 0)."""
    x = tl.load(target_ptr + target_row[:, None] + cols, mask=mask, other=float("-inf"))
    if RESIDUAL and HAS_DRAFT:
        y = tl.load(draft_ptr + draft_row[:, None] + cols, mask=mask & rejected[:, None], other=float("-inf"))
    else:
        y = x
    log_p = (_scale(x.to(tl.float32), scale, SCALE_MODE) - n_p_max[:, None]) - n_p_log_sum[:, None]
    p = _exp(log_p, PRECISE)
    if RESIDUAL:
        if HAS_DRAFT:
            q = _exp((_draft_scale(y.to(tl.float32), scale, SCALE_MODE, HAS_DRAFT) - n_q_max[:, None])
                     - n_q_log_sum[:, None], PRECISE)
        else:
            q = tl.where(cols == n_token[:, None], 1.0, 0.0)
        w = tl.where(rejected[:, None], tl.maximum(p - q, 0.0), p)
        log_w = tl.where(rejected[:, None], _log(w, PRECISE), log_p)
    else:
        w = p
        log_w = log_p
    return w, log_w


@device_function
def _element_race(target_ptr, draft_ptr, target_row, draft_row, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum,
                  n_token, rejected, row_ok, noise_base, first, vocab, scale,
                  CHUNK: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, RESIDUAL: tl.constexpr,
                  PRECISE: tl.constexpr, LANES: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """The exponential race (Gumbel-max) over V-chunk [first, first + CHUNK) of each row's sampled position:
    (best score, first index of it) per row of log w - log(-log u) (`_weights`). A row of at most SAMPLE_BLOCK
    tokens is one block of `block_race`, whose race inside the block this is.

    LANES: every lane keeps its own running best over the tiles and the lanes meet once at the end (one
    reduction across warps per chunk instead of one per tile); the same winner: each lane keeps its
    earliest maximum, and the smallest column among the lanes holding the maximum is the first index."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    if LANES:  # a running winner per lane
        lane_best = tl.full([BLOCK_B, BLOCK_V], float("-inf"), tl.float32)
        lane_idx = tl.zeros([BLOCK_B, BLOCK_V], tl.int32)
    else:  # a running winner per row
        best = tl.full([BLOCK_B], float("-inf"), tl.float32)
        best_idx = tl.zeros([BLOCK_B], tl.int32)
    for start in range(0, CHUNK, BLOCK_V):
        cols = first + start + lanes
        mask = row_ok[:, None] & (cols < vocab)[None, :]
        _, log_w = _weights(target_ptr, draft_ptr, target_row, draft_row, cols[None, :], mask, n_p_max, n_p_log_sum,
                            n_q_max, n_q_log_sum, n_token, rejected, scale, SCALE_MODE, HAS_DRAFT, RESIDUAL, PRECISE)
        u = krng.uniform_from_base(noise_base[:, None], cols[None, :])
        gumbel = _log(-_log(u, PRECISE), PRECISE)  # the race: argmax log w - log(-log u)
        score = tl.where(mask, log_w - gumbel, float("-inf"))
        if LANES:
            lane_better = score > lane_best  # strict: an earlier tile keeps a tie
            lane_best = tl.where(lane_better, score, lane_best)
            lane_idx = tl.where(lane_better, cols.to(tl.int32)[None, :], lane_idx)
        else:
            best, best_idx = _fold_first_max(best, best_idx, score, (first + start).to(tl.int32))
    if LANES:
        best = _max(lane_best, axis=1)
        best_idx = _min(tl.where(lane_best == best[:, None], lane_idx, INT32_MAX), axis=1)
    return best, best_idx


@device_function
def _block_race(target_ptr, draft_ptr, target_row, draft_row, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum,
                n_token, rejected, row_ok, noise_base, first, vocab, scale,
                CHUNK: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, RESIDUAL: tl.constexpr,
                PRECISE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """`flashspec.sampling.block_race` over V-chunk [first, first + CHUNK) (whole blocks: BLOCK_V and `first`
    are multiples of SAMPLE_BLOCK): the weights stream once, summed per block (no noise, no logarithm per
    token); the blocks race with their own noise; the chunk's winning block then races inside. Returns the
    winning block's score log W_c - log(-log u_c) (what the chunks compare) and the token that won inside it."""
    BLOCKS: tl.constexpr = BLOCK_V // SAMPLE_BLOCK
    best = tl.full([BLOCK_B], float("-inf"), tl.float32)
    best_block = tl.zeros([BLOCK_B], tl.int64)
    if RESHAPE_BLOCKS and BLOCKS > 1:  # the tile's blocks summed at once
        lanes = tl.arange(0, BLOCK_V).to(tl.int64)
        for start in range(0, CHUNK, BLOCK_V):
            cols = first + start + lanes
            mask = row_ok[:, None] & (cols < vocab)[None, :]
            w, _ = _weights(target_ptr, draft_ptr, target_row, draft_row, cols[None, :], mask, n_p_max,
                            n_p_log_sum, n_q_max, n_q_log_sum, n_token, rejected, scale, SCALE_MODE, HAS_DRAFT,
                            RESIDUAL, PRECISE)
            masses = _sum(tl.reshape(tl.where(mask, w, 0.0), [BLOCK_B, BLOCKS, SAMPLE_BLOCK]), axis=2)
            blocks = (first + start) // SAMPLE_BLOCK + tl.arange(0, BLOCKS).to(tl.int64)
            u = krng.uniform_from_base(noise_base[:, None], (-blocks + BLOCK_NOISE_INDEX)[None, :])
            score = tl.where(masses > 0.0, _log(masses, PRECISE) - _log(-_log(u, PRECISE), PRECISE), float("-inf"))
            best, best_block = _fold_first_max(best, best_block, score, (first + start) // SAMPLE_BLOCK)
    else:  # each block of the tile summed as its own [BLOCK_B, SAMPLE_BLOCK] tile (`RESHAPED_BLOCK_SUMS`)
        inner = tl.arange(0, SAMPLE_BLOCK).to(tl.int64)
        for start in range(0, CHUNK, BLOCK_V):
            for j in tl.static_range(BLOCKS):
                block_first = first + start + j * SAMPLE_BLOCK
                cols = block_first + inner
                mask = row_ok[:, None] & (cols < vocab)[None, :]
                w, _ = _weights(target_ptr, draft_ptr, target_row, draft_row, cols[None, :], mask, n_p_max,
                                n_p_log_sum, n_q_max, n_q_log_sum, n_token, rejected, scale, SCALE_MODE, HAS_DRAFT,
                                RESIDUAL, PRECISE)
                mass = _sum(tl.where(mask, w, 0.0), axis=1)                               # [BLOCK_B]
                block = block_first // SAMPLE_BLOCK
                u = krng.uniform_from_base(noise_base, -block + BLOCK_NOISE_INDEX)
                score = tl.where(mass > 0.0, _log(mass, PRECISE) - _log(-_log(u, PRECISE), PRECISE), float("-inf"))
                better = score > best  # strict, blocks in order: the first block of the largest score wins
                best = tl.where(better, score, best)
                best_block = tl.where(better, block, best_block)
    # the race inside the winning block (its logits were just read: L1/L2 hits)
    cols = best_block[:, None] * SAMPLE_BLOCK + tl.arange(0, SAMPLE_BLOCK).to(tl.int64)[None, :]
    mask = (row_ok & (best > float("-inf")))[:, None] & (cols < vocab)
    _, log_w = _weights(target_ptr, draft_ptr, target_row, draft_row, cols, mask, n_p_max, n_p_log_sum, n_q_max,
                        n_q_log_sum, n_token, rejected, scale, SCALE_MODE, HAS_DRAFT, RESIDUAL, PRECISE)
    u = krng.uniform_from_base(noise_base[:, None], cols)
    score = tl.where(mask, log_w - _log(-_log(u, PRECISE), PRECISE), float("-inf"))
    _, arg = _max_index(score, axis=1)
    return best, (best_block * SAMPLE_BLOCK + arg.to(tl.int64)).to(tl.int32)


@device_function
def _race(target_ptr, draft_ptr, target_row, draft_row, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token,
          rejected, row_ok, noise_base, first, vocab, scale,
          CHUNK: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, RESIDUAL: tl.constexpr,
          PRECISE: tl.constexpr, LANES: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """One chunk's part of `flashspec.sampling.block_race` of each row's sampled position: (score, token) that
    the chunks compare (largest score, then lowest token). Tiles of whole blocks race blocks (`_block_race`);
    a smaller tile only serves a row of at most one block (the plan sees to it), whose race is `_element_race`."""
    if BLOCK_V >= SAMPLE_BLOCK:
        best, best_idx = _block_race(target_ptr, draft_ptr, target_row, draft_row, n_p_max, n_p_log_sum, n_q_max,
                                     n_q_log_sum, n_token, rejected, row_ok, noise_base, first, vocab, scale,
                                     CHUNK, SCALE_MODE, HAS_DRAFT, RESIDUAL, PRECISE, BLOCK_B, BLOCK_V)
    else:
        best, best_idx = _element_race(target_ptr, draft_ptr, target_row, draft_row, n_p_max, n_p_log_sum,
                                       n_q_max, n_q_log_sum, n_token, rejected, row_ok, noise_base, first, vocab,
                                       scale, CHUNK, SCALE_MODE, HAS_DRAFT, RESIDUAL, PRECISE, LANES, BLOCK_B, BLOCK_V)
    return best, best_idx


@device_function
def _race_position(target_ptr, draft_ptr, rows, row_ok, num_accepted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum,
                   n_token, first, gamma, vocab, scale, sample_prefix,
                   CHUNK: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, PRECISE: tl.constexpr,
                   LANES: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """The races of V-chunk [first, first + CHUNK) of the one position each row samples from (its first
    rejection n, or the bonus position γ): (residual's score, its token, p's score, its token) per row (`_race`).
    A row emits the residual's winner, or p's where the residual race found nothing anywhere (p <= q everywhere)."""
    rows64 = rows.to(tl.int64)
    rejected = num_accepted < gamma
    n64 = num_accepted.to(tl.int64)
    target_row = (rows64 * (gamma + 1) + n64) * vocab
    if HAS_DRAFT:
        draft_row = (rows64 * gamma + tl.minimum(n64, gamma - 1)) * vocab
    else:
        draft_row = target_row  # unused: q is one-hot at n_token
    noise_base = krng.base_hash(sample_prefix, rows, num_accepted)
    # Only a row that rejected needs the residual; the race over p is needed only as the fallback of a row
    # whose residual race found nothing in this chunk (p <= q everywhere in it: the reduction of the chunks reads
    # p's winners only when no chunk has a residual winner). A block that accepted everything races once.
    if _max(tl.where(rejected & row_ok, 1, 0), axis=0) > 0:
        best_w, best_w_idx = _race(target_ptr, draft_ptr, target_row, draft_row, n_p_max, n_p_log_sum, n_q_max,
                                   n_q_log_sum, n_token, rejected, row_ok, noise_base, first, vocab, scale,
                                   CHUNK, SCALE_MODE, HAS_DRAFT, True, PRECISE, LANES, BLOCK_B, BLOCK_V)
        if _min(tl.where((best_w > float("-inf")) | ~row_ok, 1, 0), axis=0) == 0:
            best_p, best_p_idx = _race(target_ptr, draft_ptr, target_row, draft_row, n_p_max, n_p_log_sum,
                                       n_q_max, n_q_log_sum, n_token, rejected, row_ok, noise_base, first, vocab,
                                       scale, CHUNK, SCALE_MODE, HAS_DRAFT, False, PRECISE, LANES, BLOCK_B, BLOCK_V)
        else:  # never read: every row's residual race found a winner
            best_p = tl.full([BLOCK_B], float("-inf"), tl.float32)
            best_p_idx = tl.zeros([BLOCK_B], tl.int32)
    else:
        best_w, best_w_idx = _race(target_ptr, draft_ptr, target_row, draft_row, n_p_max, n_p_log_sum, n_q_max,
                                   n_q_log_sum, n_token, rejected, row_ok, noise_base, first, vocab, scale,
                                   CHUNK, SCALE_MODE, HAS_DRAFT, False, PRECISE, LANES, BLOCK_B, BLOCK_V)
        best_p, best_p_idx = best_w, best_w_idx
    return best_w, best_w_idx, best_p, best_p_idx


@device_function
def _drafted(tokens_ptr, rows64, row_ok, positions, gamma):
    """The drafted tokens [BLOCK_B, BLOCK_P] of the rows (0 past γ), as int64."""
    return tl.load(tokens_ptr + rows64[:, None] * gamma + positions,
                   mask=row_ok[:, None] & (positions < gamma), other=0).to(tl.int64)


@device_function
def _accept(target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr, rows, row_ok,
            gamma, vocab, num_stat_splits, scale, accept_prefix,
            SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, GREEDY: tl.constexpr, PRECISE: tl.constexpr,
            VOLATILE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr):
    """The accept test of rows `rows` from the stats partials and two logits per candidate (O(1) in V):
    (drafted [BLOCK_B, BLOCK_P], num_accepted = the first rejection in [0, γ], the greedy token at it (0 unless
    GREEDY), and at it the target's (max, log-sum) and the draft's (or, without draft logits, the drafted
    token that q is one-hot at)). VOLATILE: the partials were written by other programs of this launch."""
    rows64 = rows.to(tl.int64)
    positions = tl.arange(0, BLOCK_P)[None, :]  # [1, BLOCK_P]
    width = 2 * gamma + 1
    r3 = rows64[:, None, None]
    p3 = tl.arange(0, BLOCK_P)[None, :, None]
    s3 = tl.arange(0, BLOCK_S)[None, None, :]
    target_stats = (r3 * width + p3) * num_stat_splits + s3
    stats_mask = row_ok[:, None, None] & (p3 <= gamma) & (s3 < num_stat_splits)
    drafted = _drafted(tokens_ptr, rows64, row_ok, positions, gamma)
    zero = tl.zeros([BLOCK_B], tl.float32)
    if GREEDY:
        chunk_max = tl.load(part_max_ptr + target_stats, mask=stats_mask, other=float("-inf"), volatile=VOLATILE)
        chunk_arg = tl.load(part_idx_ptr + target_stats, mask=stats_mask, other=INT32_MAX, volatile=VOLATILE)
        row_max = _max(chunk_max, axis=2)
        argmax = _min(tl.where(chunk_max == row_max[:, :, None], chunk_arg, INT32_MAX), axis=2)
        accepted = (drafted == argmax) & (positions < gamma)
        num_accepted = _min(tl.where(accepted, BLOCK_P, positions), axis=1)  # in [0, γ]
        emitted = _sum(tl.where(positions == num_accepted[:, None], argmax, 0), axis=1)
        n_p_max, n_p_log_sum, n_q_max, n_q_log_sum = zero, zero, zero, zero
        n_token = emitted.to(tl.int64) * 0
    else:
        num_accepted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token = _accept_sampled(
            target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, drafted, rows, row_ok, positions, target_stats,
            stats_mask, gamma, vocab, num_stat_splits, scale, accept_prefix,
            SCALE_MODE, HAS_DRAFT, PRECISE, VOLATILE, BLOCK_B, BLOCK_P, BLOCK_S)
        emitted = num_accepted * 0
    return drafted, num_accepted, emitted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token


@device_function
def _accept_sampled(target_ptr, draft_ptr, part_max_ptr, part_sum_ptr, drafted, rows, row_ok, positions, target_stats,
                    stats_mask, gamma, vocab, num_stat_splits, scale, accept_prefix,
                    SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, PRECISE: tl.constexpr,
                    VOLATILE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr):
    """`_accept` at T > 0: each row's log-sum-exp from its partials, then `_accept_from_lse`."""
    p3 = tl.arange(0, BLOCK_P)[None, :, None]
    s3 = tl.arange(0, BLOCK_S)[None, None, :]
    p_max, p_log_sum = _combine_lse(
        tl.load(part_max_ptr + target_stats, mask=stats_mask, other=float("-inf"), volatile=VOLATILE),
        tl.load(part_sum_ptr + target_stats, mask=stats_mask, other=0.0, volatile=VOLATILE),
        PRECISE,
    )
    if HAS_DRAFT == 1:
        draft_stats = target_stats + (gamma + 1) * num_stat_splits
        draft_mask = row_ok[:, None, None] & (p3 < gamma) & (s3 < num_stat_splits)
        q_max, q_log_sum = _combine_lse(
            tl.load(part_max_ptr + draft_stats, mask=draft_mask, other=float("-inf"), volatile=VOLATILE),
            tl.load(part_sum_ptr + draft_stats, mask=draft_mask, other=0.0, volatile=VOLATILE),
            PRECISE,
        )
    elif HAS_DRAFT == 2:  # log-probs: normalised already
        q_max, q_log_sum = tl.zeros_like(p_max), tl.zeros_like(p_log_sum)
    else:
        q_max, q_log_sum = p_max, p_log_sum  # unused: q is one-hot at the drafted token
    return _accept_from_lse(target_ptr, draft_ptr, drafted, rows, row_ok, positions, p_max, p_log_sum, q_max,
                            q_log_sum, gamma, vocab, scale, accept_prefix, SCALE_MODE, HAS_DRAFT, PRECISE,
                            BLOCK_B, BLOCK_P)


@device_function
def _accept_from_lse(target_ptr, draft_ptr, drafted, rows, row_ok, positions, p_max, p_log_sum, q_max, q_log_sum,
                     gamma, vocab, scale, accept_prefix,
                     SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, PRECISE: tl.constexpr,
                     BLOCK_B: tl.constexpr, BLOCK_P: tl.constexpr):
    """The accept test at T > 0 given each row's (max, log-sum) [BLOCK_B, BLOCK_P] of the target (and draft)
    rows: accept x_j when log u_j <= log p(x_j) - log q(x_j). Returns n = the first rejection in [0, γ] and, at
    n, the target's and draft's (max, log-sum) (or, without draft logits, the drafted token q is one-hot at)."""
    rows64 = rows.to(tl.int64)
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
    index0 = tl.zeros([1, 1], tl.int32)
    accept_u = krng.uniform_from_base(krng.base_hash(accept_prefix, rows[:, None], positions), index0)
    accepted = (_log(accept_u, PRECISE) <= log_p_x - log_q_x) & is_draft
    num_accepted = _min(tl.where(accepted, BLOCK_P, positions), axis=1)  # in [0, γ]
    at_n = positions == num_accepted[:, None]
    n_p_max = _sum(tl.where(at_n, p_max, 0.0), axis=1)
    n_p_log_sum = _sum(tl.where(at_n, p_log_sum, 0.0), axis=1)
    if HAS_DRAFT:
        n_q_max = _sum(tl.where(at_n, q_max, 0.0), axis=1)
        n_q_log_sum = _sum(tl.where(at_n, q_log_sum, 0.0), axis=1)
        n_token = tl.zeros([BLOCK_B], tl.int64)  # unused: q is the draft's softmax
    else:
        n_q_max, n_q_log_sum = n_p_max, n_p_log_sum  # unused: q is one-hot at n_token
        n_token = _sum(tl.where(at_n & is_draft, drafted, 0), axis=1)
    return num_accepted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token


@device_function
def _store_accept(info_ptr, rows64, row_ok, num_accepted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token):
    """One row's accept outcome for the sampling pass, six 32-bit words per row in `info_ptr` (a float32
    buffer): n and the drafted token at n bit-cast from int32, then the target's and draft's (max, log-sum) at n."""
    base = info_ptr + rows64 * 6
    tl.store(base, num_accepted.to(tl.int32).to(tl.float32, bitcast=True), mask=row_ok)
    tl.store(base + 1, n_token.to(tl.int32).to(tl.float32, bitcast=True), mask=row_ok)
    tl.store(base + 2, n_p_max, mask=row_ok)
    tl.store(base + 3, n_p_log_sum, mask=row_ok)
    tl.store(base + 4, n_q_max, mask=row_ok)
    tl.store(base + 5, n_q_log_sum, mask=row_ok)


@device_function
def _sample_program(target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr, race_val_ptr,
                    race_idx_ptr, counter_ptr, info_ptr, out_tokens_ptr, out_accepted_ptr, pid_b, split,
                    batch, gamma, vocab, num_stat_splits, num_splits, scale, accept_prefix, sample_prefix,
                    CHUNK: tl.constexpr, SCALE_MODE: tl.constexpr, HAS_DRAFT: tl.constexpr, GREEDY: tl.constexpr,
                    SPLIT: tl.constexpr, PRECISE: tl.constexpr, PREFIX_IN_MEMORY: tl.constexpr,
                    VOLATILE: tl.constexpr, LANES: tl.constexpr, ACCEPTED: tl.constexpr, BLOCK_B: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_S2: tl.constexpr, BLOCK_V: tl.constexpr):
    """One program of the sampling pass (arguments as `_sample_kernel`'s): the accept test of row block
    `pid_b` -- or, ACCEPTED, its outcome as the stats pass stored it (`_store_accept`) -- then the race over
    V-chunk `split`. VOLATILE: the stats partials were written by other programs of the same launch (the
    fused kernel), so they are read past the L1 cache. LANES: `_race`'s."""
    if PREFIX_IN_MEMORY:
        accept_prefix = tl.load(accept_prefix)
        sample_prefix = tl.load(sample_prefix)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    row_ok = rows < batch
    rows64 = rows.to(tl.int64)
    positions = tl.arange(0, BLOCK_P)[None, :]  # [1, BLOCK_P]
    if ACCEPTED:  # read what the stats pass decided; the drafted tokens only where outputs are written
        base = info_ptr + rows64 * 6
        num_accepted = tl.load(base, mask=row_ok, other=0.0).to(tl.int32, bitcast=True)
        n_token = tl.load(base + 1, mask=row_ok, other=0.0).to(tl.int32, bitcast=True).to(tl.int64)
        n_p_max = tl.load(base + 2, mask=row_ok, other=0.0)
        n_p_log_sum = tl.load(base + 3, mask=row_ok, other=0.0)
        n_q_max = tl.load(base + 4, mask=row_ok, other=0.0)
        n_q_log_sum = tl.load(base + 5, mask=row_ok, other=0.0)
        drafted = tl.zeros([BLOCK_B, BLOCK_P], tl.int64)  # loaded where the outputs are written
    else:
        drafted, num_accepted, emitted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token = _accept(
            target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr, rows, row_ok,
            gamma, vocab, num_stat_splits, scale, accept_prefix,
            SCALE_MODE, HAS_DRAFT, GREEDY, PRECISE, VOLATILE, BLOCK_B, BLOCK_P, BLOCK_S)

    if GREEDY:
        _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted, num_accepted,
                       emitted, gamma, vocab)
    else:
        # ---- residual (n < γ) or bonus (n = γ) race over this program's V-chunk of position n
        best_w, best_w_idx, best_p, best_p_idx = _race_position(
            target_ptr, draft_ptr, rows, row_ok, num_accepted, n_p_max, n_p_log_sum, n_q_max, n_q_log_sum, n_token,
            split.to(tl.int64) * CHUNK, gamma, vocab, scale, sample_prefix,
            CHUNK, SCALE_MODE, HAS_DRAFT, PRECISE, LANES, BLOCK_B, BLOCK_V)

        if SPLIT:
            race_w = (rows64 * 2) * num_splits + split
            race_p = race_w + num_splits
            tl.store(race_val_ptr + race_w, best_w, mask=row_ok)
            tl.store(race_idx_ptr + race_w, best_w_idx, mask=row_ok)
            tl.store(race_val_ptr + race_p, best_p, mask=row_ok)
            tl.store(race_idx_ptr + race_p, best_p_idx, mask=row_ok)
            tl.debug_barrier()  # every thread's stores precede the release below
            ticket = tl.atomic_add(counter_ptr + pid_b, 1, sem="acq_rel", scope="gpu")
            if ticket == num_splits - 1:  # last chunk of this row block to finish: reduce all chunks
                s2 = tl.arange(0, BLOCK_S2)[None, :]
                race_mask = row_ok[:, None] & (s2 < num_splits)
                w_off = (rows64[:, None] * 2) * num_splits + s2
                all_w = tl.load(race_val_ptr + w_off, mask=race_mask, other=float("-inf"), volatile=True)
                all_w_idx = tl.load(race_idx_ptr + w_off, mask=race_mask, other=INT32_MAX, volatile=True)
                all_p = tl.load(race_val_ptr + w_off + num_splits, mask=race_mask, other=float("-inf"),
                                volatile=True)
                all_p_idx = tl.load(race_idx_ptr + w_off + num_splits, mask=race_mask, other=INT32_MAX,
                                    volatile=True)
                best_w = _max(all_w, axis=1)
                best_w_idx = _min(tl.where(all_w == best_w[:, None], all_w_idx, INT32_MAX), axis=1)
                best_p = _max(all_p, axis=1)
                best_p_idx = _min(tl.where(all_p == best_p[:, None], all_p_idx, INT32_MAX), axis=1)
                # max(0, p - q) can round to zero everywhere when p == q: fall back to p (the limit)
                emitted = tl.where(best_w > float("-inf"), best_w_idx, best_p_idx)
                if ACCEPTED:
                    drafted = _drafted(tokens_ptr, rows64, row_ok, positions, gamma)
                _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted,
                               num_accepted, emitted, gamma, vocab)
                tl.atomic_xchg(counter_ptr + pid_b, 0)  # ready for the next call
        else:
            emitted = tl.where(best_w > float("-inf"), best_w_idx, best_p_idx)
            if ACCEPTED:
                drafted = _drafted(tokens_ptr, rows64, row_ok, positions, gamma)
            _write_outputs(out_tokens_ptr, out_accepted_ptr, rows64, row_ok, positions, drafted, num_accepted,
                           emitted, gamma, vocab)


@triton.jit(do_not_specialize=["accept_prefix", "sample_prefix"])
def _sample_kernel(
    target_ptr,  # [B, γ+1, V] target logits, contiguous
    draft_ptr,  # [B, γ, V] draft logits, contiguous (not read unless HAS_DRAFT)
    tokens_ptr,  # [B, γ] drafted token ids (any integer dtype), contiguous
    part_max_ptr,  # [B, 2γ+1, S1] fp32 in: chunk maxima from _stats_kernel
    part_sum_ptr,  # [B, 2γ+1, S1] fp32 in: chunk sums (not read when GREEDY)
    part_idx_ptr,  # [B, 2γ+1, S1] int32 in: chunk argmax (GREEDY only)
    race_val_ptr,  # [B, 2, S2] fp32 work: best race score per split (residual race, target race)
    race_idx_ptr,  # [B, 2, S2] int32 work: its index
    counter_ptr,  # [row blocks] int32 tickets, zero between calls (the last program resets its own)
    info_ptr,  # [B, 6] 32-bit words in (ACCEPTED): the stats pass's accept outcome (`_store_accept`)
    out_tokens_ptr,  # [B, γ+1] int64 out
    out_accepted_ptr,  # [B] int64 out
    batch,  # B
    gamma,  # γ
    vocab,  # V
    num_stat_splits,  # S1
    num_splits,  # S2
    scale,  # T or float32(1/T), as for _stats_kernel
    accept_prefix,  # krng.stream_prefix(key, STREAM_ACCEPT) as int32, or (PREFIX_IN_MEMORY) a pointer to it
    sample_prefix,  # krng.stream_prefix(key, STREAM_SAMPLE) as int32, or (PREFIX_IN_MEMORY) a pointer to it
    CHUNK: tl.constexpr,  # V-elements per sampling split, a multiple of BLOCK_V
    SCALE_MODE: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    GREEDY: tl.constexpr,
    SPLIT: tl.constexpr,  # S2 > 1: chunk winners meet through the ticket counter
    PRECISE: tl.constexpr,  # libdevice log/exp/log1p (GPU); numpy's in the interpreter
    PREFIX_IN_MEMORY: tl.constexpr,  # the prefixes live in device memory (a captured graph's key changes per replay)
    LANES: tl.constexpr,  # per-lane running winners, reduced once per chunk (`_race`)
    ACCEPTED: tl.constexpr,  # the stats pass ran the accept test (`_stats_accept_kernel`): read its outcome
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,  # power of two >= γ+1
    BLOCK_S: tl.constexpr,  # power of two >= S1
    BLOCK_S2: tl.constexpr,  # power of two >= S2
    BLOCK_V: tl.constexpr,
    PDL: tl.constexpr = False,  # launched as a programmatic dependent of the stats launch: wait for it first
):
    if PDL:
        gdc_wait()  # every partial (and accept outcome) of the stats launch is visible past this
    _sample_program(target_ptr, draft_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_idx_ptr, race_val_ptr,
                    race_idx_ptr, counter_ptr, info_ptr, out_tokens_ptr, out_accepted_ptr, tl.program_id(0),
                    tl.program_id(1), batch, gamma, vocab, num_stat_splits, num_splits, scale, accept_prefix,
                    sample_prefix, CHUNK, SCALE_MODE, HAS_DRAFT, GREEDY, SPLIT, PRECISE, PREFIX_IN_MEMORY, False,
                    LANES, ACCEPTED, BLOCK_B, BLOCK_P, BLOCK_S, BLOCK_S2, BLOCK_V)
