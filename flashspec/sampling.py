"""Sampling parameters and the one warping function applied identically to draft and target.

Order (book/design.md §1): divide logits by the temperature, *then* normalise in log space, then
top-k, then top-p (renormalised).  Temperature 0 means greedy: a one-hot distribution at the
argmax (lowest index on ties, like `torch.argmax`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashspec import rng

NEG_INF = float("-inf")
# Below this, logits / T lose their meaning in float32 (huge values, overflow to inf for large
# logits) and every row collapses onto one token; temperature 0 is the greedy limit.
MIN_TEMPERATURE = 1e-4


@dataclass(frozen=True)
class SamplingParams:
    """How to turn logits into a distribution: `temperature` (0 = greedy), `top_k` (0 = off), `top_p` (1 = off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        try:
            temperature = float(self.temperature)
        except OverflowError:  # an int too large for a float
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {self.temperature}") from None
        if not math.isfinite(temperature) or temperature < 0:
            raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {self.temperature}")
        if 0 < temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"temperature {self.temperature} is below {MIN_TEMPERATURE}: logits / T overflow float32 and every "
                "row collapses onto one token; use temperature=0 for greedy decoding"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 turns it off), got {self.top_k!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 turns it off), got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def needs_truncation(self) -> bool:
        """True when top-k or top-p change the support (the kernels' fast path handles neither)."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)


def truncate_logits(scaled_logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Set logits outside the top-k / top-p support to -inf (input already divided by T, float32).

    Top-k keeps every token tied with the k-th largest; top-p keeps the smallest prefix of the
    sorted distribution whose mass reaches `top_p` (always at least one token).
    """
    logits = scaled_logits
    vocab = logits.shape[-1]
    if params.top_k > 0 and params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, NEG_INF)
    return logits


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities (float32, same shape) of the warped distribution; -inf off its support.

    Greedy (T = 0) gives log one-hot at the argmax.  Used for both draft and target.
    """
    logits = logits.float()
    if params.greedy:
        best = logits.argmax(dim=-1, keepdim=True)
        return torch.full_like(logits, NEG_INF).scatter(-1, best, 0.0)
    scaled = truncate_logits(logits / params.temperature, params)
    return torch.log_softmax(scaled, dim=-1)


def gumbel_argmax(log_weights: torch.Tensor, noise_uniforms: torch.Tensor) -> torch.Tensor:
    """Index of max(log w - log(-log u)) along the last axis: a sample from normalise(w).

    This is the exponential race (argmin E/w with E = -log u) written in log space; ties go
    to the lowest index.  `noise_uniforms` must lie strictly inside (0, 1).
    """
    scores = log_weights - torch.log(-torch.log(noise_uniforms))
    return scores.argmax(dim=-1)


# The verifier samples its residual / bonus token in two levels: a race between blocks of SAMPLE_BLOCK
# consecutive token ids, weighted by each block's total weight, then a race inside the chosen block. Block c's
# noise is drawn at index BLOCK_NOISE_INDEX - c of the same hash, an index no token id reaches.
SAMPLE_BLOCK = 256
BLOCK_NOISE_INDEX = (1 << 32) - 1


def block_race(weights: torch.Tensor, log_weights: torch.Tensor,
               base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one index per row [B, V] from normalise(weights) in two levels; (index [B], has_mass [B]).

    Exact by the chain rule: block c wins its race with probability W_c / W (W_c the sum of the block's weights,
    an exponential race between blocks with their own noise), and token v wins the race inside its block with
    probability w_v / W_c. Why two levels: a GPU then streams V weights once, summing them per block (a few
    instructions per token), and draws noise and logarithms only for the blocks and the SAMPLE_BLOCK tokens of
    the chosen one, instead of two logarithms and a hash for every token. `log_weights` is log(weights) as the
    caller wants it read inside the block (the target's log-probs where weights = p); `base` [B, 1] the rows'
    `rng.base_hash`. A row of at most SAMPLE_BLOCK tokens is one block: the race inside it is `gumbel_argmax`.
    has_mass: some weight is positive (elsewhere the index is meaningless)."""
    rows, vocab = weights.shape
    device = weights.device
    has_mass = (weights > 0).any(dim=-1)
    if vocab <= SAMPLE_BLOCK:
        noise = rng.uniform_from_base(base, torch.arange(vocab, device=device).view(1, vocab))
        return gumbel_argmax(log_weights, noise), has_mass
    blocks = -(-vocab // SAMPLE_BLOCK)
    padded = torch.nn.functional.pad(weights, (0, blocks * SAMPLE_BLOCK - vocab))
    masses = padded.view(rows, blocks, SAMPLE_BLOCK).sum(dim=-1)
    block_ids = torch.arange(blocks, device=device).view(1, blocks)
    block_noise = rng.uniform_from_base(base, BLOCK_NOISE_INDEX - block_ids)
    block_scores = torch.where(masses > 0, masses.log() - torch.log(-torch.log(block_noise)),
                               torch.full_like(masses, NEG_INF))
    chosen = block_scores.argmax(dim=-1, keepdim=True)  # [B, 1]
    cols = chosen * SAMPLE_BLOCK + torch.arange(SAMPLE_BLOCK, device=device).view(1, SAMPLE_BLOCK)
    inside = cols < vocab
    noise = rng.uniform_from_base(base, cols)
    scores = torch.where(inside, log_weights.gather(-1, cols.clamp(max=vocab - 1)) - torch.log(-torch.log(noise)),
                         torch.full(cols.shape, NEG_INF, device=device))
    return chosen[:, 0] * SAMPLE_BLOCK + scores.argmax(dim=-1), has_mass


# The accept uniform of a proposal of `residual_by_rejection` is drawn at this index of the proposal's hash: no
# token id (< 2**31) and no block of `block_race` (index BLOCK_NOISE_INDEX - block, above 2**32 - 2**23) reaches it.
PROPOSAL_ACCEPT_INDEX = 1 << 31
# The verifier's residual by rejection (`flashspec.verify`, residual="rejection") draws REJECTION_PROPOSALS proposals
# at the first rejection n; proposal k's hash is the sample stream's at position PROPOSAL_POSITION + n * K + k of its
# row, a position no step reaches (the bonus and the fallback race use positions 0..γ), so every draw is independent.
REJECTION_PROPOSALS = 8
PROPOSAL_POSITION = 1 << 30


def residual_by_rejection(log_p: torch.Tensor, log_q: torch.Tensor, bases: torch.Tensor,
                          fallback_base: torch.Tensor) -> torch.Tensor:
    """Sample one index per row [B, V] from the residual normalise(max(0, p - q)) by rejection from p; [B].

    Proposal k of a row is t_k ~ p (`block_race` with the noise of `bases[:, k]`), accepted with probability
    max(0, 1 - q_t / p_t) (its own uniform, at PROPOSAL_ACCEPT_INDEX of the same hash); the row takes its first
    accepted proposal, and if all K fail, an exact draw from the residual with the independent noise of
    `fallback_base` ([B, 1]). Exact: an accepted proposal is t with probability proportional to
    p_t · max(0, 1 - q_t / p_t) = max(0, p_t - q_t), and the fallback is the residual itself, so whichever way the
    row ends its token has the residual's law. Why: a GPU can draw the proposals from per-block sums of p kept by
    the pass that already streams p, and read q only in the proposals' blocks, where the residual's own block sums
    need both normalisers first (a second pass over V). A proposal is accepted with probability
    a = sum max(0, p - q), so the fallback runs with probability (1 - a)^K. Where max(0, p - q) is zero everywhere
    in floating point (p = q), no proposal is accepted and the row keeps its first proposal, a draw from p (the
    limit, as `flashspec.verify.verify_reference` does)."""
    drawn, accepted = rejection_proposals(log_p, log_q, bases)
    first = accepted.long().argmax(dim=1, keepdim=True)  # the first accepted proposal (0 when none is)
    residual = (log_p.exp() - log_q.exp()).clamp(min=0.0)
    fallback, has_mass = block_race(residual, residual.log(), fallback_base)
    return torch.where(accepted.any(dim=1), drawn.gather(1, first)[:, 0],
                       torch.where(has_mass, fallback, drawn[:, 0]))


def rejection_proposals(log_p: torch.Tensor, log_q: torch.Tensor,
                        bases: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The proposals of `residual_by_rejection`: (each row's K draws from p [B, K], whether each passed its
    accept test against the residual [B, K]); a row none of whose proposals passed falls back to an exact draw."""
    rows, _ = log_p.shape
    proposals = bases.shape[1]
    many = log_p.exp().repeat_interleave(proposals, dim=0)
    drawn, _ = block_race(many, log_p.repeat_interleave(proposals, dim=0), bases.reshape(-1, 1))
    drawn = drawn.view(rows, proposals)
    log_p_t, log_q_t = log_p.gather(1, drawn), log_q.gather(1, drawn)
    keep = torch.log1p(-torch.exp(torch.where(log_q_t < log_p_t, log_q_t - log_p_t, torch.zeros_like(log_p_t))))
    accept_u = rng.uniform_from_base(bases, torch.tensor(PROPOSAL_ACCEPT_INDEX, device=log_p.device))
    return drawn, (log_q_t < log_p_t) & (torch.log(accept_u) <= keep)


def sample_from_logits(
    logits: torch.Tensor,
    params: SamplingParams,
    key: rng.Key,
    position: int | torch.Tensor = 0,
    stream: int | torch.Tensor = rng.STREAM_DRAFT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of `logits` [B, V] from its warped distribution.

    Returns (tokens [B], the warped log-probs [B, V] the token was drawn from).  Drafts use
    this with their own stream so their noise never feeds the verifier. `position` and `stream` may be int64
    0-d tensors holding the same values (the same draws): a compiled caller then compiles this once for every
    position and stream instead of once per Python int.
    """
    log_probs = warp_logits(logits, params)
    if params.greedy:
        return log_probs.argmax(dim=-1), log_probs
    rows, vocab = log_probs.shape
    row = torch.arange(rows, device=logits.device).view(rows, 1)
    at = torch.full_like(row, position) if isinstance(position, int) else row * 0 + position
    base = rng.base_hash(key, stream, row, at)
    noise = rng.uniform_from_base(base, torch.arange(vocab, device=logits.device).view(1, vocab))
    return gumbel_argmax(log_probs, noise), log_probs


RESIDUALS = ("race", "rejection")


def check_residual(residual: str) -> None:
    """Raise ValueError unless `residual` names one of the residual samplers."""
    if residual not in RESIDUALS:
        raise ValueError(f"residual must be one of {RESIDUALS} (how a rejected row samples max(0, p - q)), "
                         f"got {residual!r}")


# How the drafted chain is judged (`flashspec.verify`'s `method`): "token", each draft by its own ratio p/q up to the
# first rejection (Leviathan et al.); "block", the chain as a whole by its capped cumulative ratio and the residual
# mass left after each prefix (Sun et al., block verification): exact too, never fewer accepted tokens in expectation.
METHODS = ("token", "block")


def check_method(method: str, residual: str = "race") -> None:
    """Raise ValueError unless `method` names a verification method that can draw with `residual`."""
    check_residual(residual)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS} (how the drafted chain is judged), got {method!r}")
    if method == "block" and residual != "race":
        raise ValueError("method='block' draws its correction from the block residual by race; residual="
                         f"{residual!r} applies to method='token' only (pass residual='race')")
