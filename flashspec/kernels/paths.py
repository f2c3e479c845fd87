"""Multi-path verification in one Triton launch: `flashspec.paths.verify_paths(..., backend="triton")`.

The recursion of `flashspec.paths` (a node's residual starts as the target's p, every rejected sibling leaves
normalise((r - q^k)^+), an accepted token moves down one node) run per row on the device with no host sync: a
program holds BLOCK_B rows; the node's residual lives in a work row [B, V] that the program rewrites in V-tiles
after each rejection; the accept uniforms and the race noise come from the counter hash of `flashspec.kernels.rng`
at the reference's (row, depth, path) and (row, depth), so both backends draw the same numbers from one key.

The warped log-probs of the target and the drafts' probabilities arrive as dense fp32 tensors prepared in PyTorch
on the device (`flashspec.paths.paths_inputs`): top-k/top-p truncation and greedy one-hots stay in one place.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language import core as tlcore  # noqa: F401  (the interpreter patches the reductions through it)

from flashspec import rng, sampling
from flashspec.kernels import rng as krng
from flashspec.kernels.rng import device_function
from flashspec.kernels.shims import _exp, _fold_first_max, _log, _max, _max_index, _min, _sum, interpreting

# read inside the kernels: constexpr when compiled, plain ints in the interpreter's plain-Python helpers
SAMPLE_BLOCK = sampling.SAMPLE_BLOCK if interpreting() else tl.constexpr(sampling.SAMPLE_BLOCK)
BLOCK_NOISE_INDEX = sampling.BLOCK_NOISE_INDEX if interpreting() else tl.constexpr(sampling.BLOCK_NOISE_INDEX)


@device_function
def _divide(x, y, PRECISE: tl.constexpr):
    """x / y rounded as IEEE division (torch's), compiled; numpy's under the interpreter."""
    if PRECISE:
        return tl.math.div_rn(x, y)
    else:
        return x / y


@device_function
def _race_row(work_ptr, rows64, finished, base, vocab, PRECISE: tl.constexpr, ONE_BLOCK: tl.constexpr,
              BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr):
    """`flashspec.sampling.block_race` over each finished row's work row (its weights): the blocks of SAMPLE_BLOCK
    tokens race with their masses, then the tokens of the winning block; a row of one block races its tokens."""
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    if ONE_BLOCK:  # vocab <= SAMPLE_BLOCK <= BLOCK_V: one tile, the race inside the block
        mask = finished[:, None] & (lanes < vocab)[None, :]
        w = tl.load(work_ptr + rows64[:, None] * vocab + lanes[None, :], mask=mask, other=0.0)
        u = krng.uniform_from_base(base[:, None], lanes[None, :])
        score = tl.where(mask, _log(w, PRECISE) - _log(-_log(u, PRECISE), PRECISE), float("-inf"))
        _, arg = _max_index(score, axis=1)
        token = arg.to(tl.int64)
    else:
        BLOCKS: tl.constexpr = BLOCK_V // SAMPLE_BLOCK
        best = tl.full([BLOCK_B], float("-inf"), tl.float32)
        best_block = tl.zeros([BLOCK_B], tl.int64)
        for start in range(0, vocab, BLOCK_V):
            cols = start + lanes
            mask = finished[:, None] & (cols < vocab)[None, :]
            w = tl.load(work_ptr + rows64[:, None] * vocab + cols[None, :], mask=mask, other=0.0)
            masses = _sum(tl.reshape(w, [BLOCK_B, BLOCKS, SAMPLE_BLOCK]), axis=2)
            blocks = start // SAMPLE_BLOCK + tl.arange(0, BLOCKS).to(tl.int64)
            u = krng.uniform_from_base(base[:, None], (-blocks + BLOCK_NOISE_INDEX)[None, :])
            score = tl.where(masses > 0.0, _log(masses, PRECISE) - _log(-_log(u, PRECISE), PRECISE), float("-inf"))
            best, best_block = _fold_first_max(best, best_block, score, start // SAMPLE_BLOCK)
        cols = best_block[:, None] * SAMPLE_BLOCK + tl.arange(0, SAMPLE_BLOCK).to(tl.int64)[None, :]
        mask = finished[:, None] & (cols < vocab)
        w = tl.load(work_ptr + rows64[:, None] * vocab + cols, mask=mask, other=0.0)
        u = krng.uniform_from_base(base[:, None], cols)
        score = tl.where(mask, _log(w, PRECISE) - _log(-_log(u, PRECISE), PRECISE), float("-inf"))
        _, arg = _max_index(score, axis=1)
        token = best_block * SAMPLE_BLOCK + arg.to(tl.int64)
    return token


# sizes of 1 are not specialised: Triton 3.6 miscompiles the path loop once `paths` is the constant 1
@triton.jit(do_not_specialize=["accept_prefix", "sample_prefix", "batch", "paths", "gamma"])
def _paths_kernel(log_p_ptr, q_ptr, tokens_ptr, work_ptr, out_tokens_ptr, out_accepted_ptr, out_path_ptr,
                  accept_prefix, sample_prefix, batch, paths, gamma, vocab,
                  PRECISE: tl.constexpr, ONE_BLOCK: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_V: tl.constexpr, PREFIX_IN_MEMORY: tl.constexpr):
    """Rows [pid * BLOCK_B, +BLOCK_B) of one multi-path step. log_p [B, K, γ+1, V] and q [B, K, γ, V] fp32,
    tokens [B, K, γ] int64, work [B, V] fp32; writes tokens [B, γ+1] (-1 past the emitted one), the accepted
    count and the kept path [B] (int64). The stream prefixes are int32 values or, with PREFIX_IN_MEMORY,
    pointers to them (a device key's, read at launch time: a captured graph draws fresh numbers per step)."""
    if PREFIX_IN_MEMORY:  # new names: a compiled branch may not retype a value defined before it
        accept_base = tl.load(accept_prefix)
        sample_base = tl.load(sample_prefix)
    else:
        accept_base = accept_prefix
        sample_base = sample_prefix
    pid = tl.program_id(0)
    rows64 = (pid * BLOCK_B + tl.arange(0, BLOCK_B)).to(tl.int64)
    row_ok = rows64 < batch
    ks = tl.arange(0, BLOCK_K)
    active = row_ok[:, None] & (ks < paths)[None, :]
    open_rows = row_ok
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    num_accepted = tl.zeros([BLOCK_B], tl.int64)
    emitted = tl.zeros([BLOCK_B], tl.int64)
    kept = tl.zeros([BLOCK_B], tl.int64)
    for depth in range(0, gamma + 1):
        lead = _min(tl.where(active, ks[None, :], BLOCK_K), axis=1)
        lead = tl.minimum(lead, paths - 1).to(tl.int64)                     # a closed row reads a valid row
        target_row = ((rows64 * paths + lead) * (gamma + 1) + depth) * vocab
        for start in range(0, vocab, BLOCK_V):                              # the node's residual starts as p
            cols = start + lanes
            mask = open_rows[:, None] & (cols < vocab)[None, :]
            log_p = tl.load(log_p_ptr + target_row[:, None] + cols[None, :], mask=mask, other=float("-inf"))
            tl.store(work_ptr + rows64[:, None] * vocab + cols[None, :], _exp(log_p, PRECISE), mask=mask)
        tl.debug_barrier()                                                  # the stores precede every read below
        taken = tl.zeros([BLOCK_B], tl.int1)
        chosen = tl.zeros([BLOCK_B], tl.int64)
        if depth < gamma:
            for path in range(0, paths):
                on = _max(tl.where((ks[None, :] == path) & active, 1, 0), axis=1) > 0
                trying = open_rows & (taken == 0) & on
                token = tl.load(tokens_ptr + (rows64 * paths + path) * gamma + depth, mask=row_ok, other=0)
                draft_row = ((rows64 * paths + path) * gamma + depth) * vocab
                r_x = tl.load(work_ptr + rows64 * vocab + token, mask=trying, other=0.0)
                q_x = tl.load(q_ptr + draft_row + token, mask=trying, other=0.0)
                u = krng.uniform_from_base(krng.base_hash(accept_base, rows64, rows64 * 0 + depth), rows64 * 0 + path)
                accept = trying & (u * q_x <= r_x) & (r_x > 0.0)
                chosen = tl.where(accept, token, chosen)
                taken = taken | accept
                rejected = trying & (accept == 0)
                mass = tl.zeros([BLOCK_B], tl.float32)
                for start in range(0, vocab, BLOCK_V):                      # (r - q)^+ and its mass
                    cols = start + lanes
                    mask = rejected[:, None] & (cols < vocab)[None, :]
                    r = tl.load(work_ptr + rows64[:, None] * vocab + cols[None, :], mask=mask, other=0.0)
                    q = tl.load(q_ptr + draft_row[:, None] + cols[None, :], mask=mask, other=0.0)
                    mass += _sum(tl.maximum(r - q, 0.0), axis=1)
                tl.debug_barrier()
                renormalise = rejected & (mass > 0.0)                       # no mass: the rejection had probability 0
                for start in range(0, vocab, BLOCK_V):
                    cols = start + lanes
                    mask = renormalise[:, None] & (cols < vocab)[None, :]
                    r = tl.load(work_ptr + rows64[:, None] * vocab + cols[None, :], mask=mask, other=0.0)
                    q = tl.load(q_ptr + draft_row[:, None] + cols[None, :], mask=mask, other=0.0)
                    leftover = _divide(tl.maximum(r - q, 0.0), tl.where(mass > 0.0, mass, 1.0)[:, None], PRECISE)
                    tl.store(work_ptr + rows64[:, None] * vocab + cols[None, :], leftover, mask=mask)
                tl.debug_barrier()
        finished = open_rows & (taken == 0)
        base = krng.base_hash(sample_base, rows64, rows64 * 0 + depth)
        token = _race_row(work_ptr, rows64, finished, base, vocab, PRECISE, ONE_BLOCK, BLOCK_B, BLOCK_V)
        emitted = tl.where(finished, token, emitted)
        num_accepted = tl.where(finished, depth, num_accepted)
        kept = tl.where(finished, lead, kept)
        tl.store(out_tokens_ptr + rows64 * (gamma + 1) + depth, chosen, mask=open_rows & taken)
        if depth < gamma:
            drafted = tl.load(tokens_ptr + (rows64[:, None] * paths + ks[None, :]) * gamma + depth,
                              mask=row_ok[:, None] & (ks < paths)[None, :], other=-1)
            active = active & (drafted == chosen[:, None])
        open_rows = open_rows & taken
        tl.debug_barrier()                                                  # the race read the work row
    for position in range(0, gamma + 1):
        value = tl.where(position == num_accepted, emitted, -1)
        tl.store(out_tokens_ptr + rows64 * (gamma + 1) + position, value, mask=row_ok & (position >= num_accepted))
    tl.store(out_accepted_ptr + rows64, num_accepted, mask=row_ok)
    tl.store(out_path_ptr + rows64, kept, mask=row_ok)


def verify_paths_triton(log_p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, key: rng.Key | torch.Tensor,
                        prefixes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens [B, γ+1], num_accepted [B], path [B]) of one multi-path step from `flashspec.paths.paths_inputs`'s
    log_p [B, K, γ+1, V] and q [B, K, γ, V] (fp32) and the drafted tokens [B, K, γ], drawing from `key`: a host
    `rng.Key`, or a device key (lo, hi) whose stream prefixes the kernel reads from memory (`prefixes`, its
    `device_prefixes` when the caller has them already): no host sync, so the fast path's graphs capture it."""
    from flashspec.kernels.verify import _prefixes, device_prefixes  # noqa: PLC0415  (the verify backend's)

    batch, paths, gamma = tokens.shape
    vocab = log_p.shape[-1]
    device = log_p.device
    log_p, q = log_p.float().contiguous(), q.float().contiguous()
    tokens = tokens.long().contiguous()
    one_block = vocab <= sampling.SAMPLE_BLOCK
    block_v = max(16, triton.next_power_of_2(vocab)) if one_block else 1024
    if interpreting():  # each program costs Python per operation: many rows per program
        block_b = max(1, min(triton.next_power_of_2(batch), (1 << 16) // block_v))
    else:
        block_b = 1 if vocab > 4096 else max(1, min(16, 4096 // block_v))
    work = torch.empty(batch, vocab, dtype=torch.float32, device=device)
    out_tokens = torch.full((batch, gamma + 1), -1, dtype=torch.long, device=device)
    out_accepted = torch.zeros(batch, dtype=torch.long, device=device)
    out_path = torch.zeros(batch, dtype=torch.long, device=device)
    in_memory = isinstance(key, torch.Tensor)
    if in_memory:
        prefixes = device_prefixes(key) if prefixes is None else prefixes
        accept_prefix, sample_prefix = prefixes[0:1], prefixes[1:2]
    else:
        accept_prefix, sample_prefix = _prefixes(key)
    grid = (triton.cdiv(batch, block_b),)
    _paths_kernel[grid](log_p, q, tokens, work, out_tokens, out_accepted, out_path, accept_prefix, sample_prefix,
                        batch, paths, gamma, vocab, PRECISE=not interpreting(), ONE_BLOCK=one_block, BLOCK_B=block_b,
                        BLOCK_K=max(2, triton.next_power_of_2(paths)), BLOCK_V=block_v, PREFIX_IN_MEMORY=in_memory,
                        num_warps=4)
    return out_tokens, out_accepted, out_path
