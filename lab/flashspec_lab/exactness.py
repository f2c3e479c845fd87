"""Exactness harness: toy autoregressive models whose sequence probabilities can be enumerated,
a speculative sampling loop around any verifier, goodness-of-fit tests, and the buggy verifiers
(negative controls) that a harness with real power must reject.

The harness is in the library (not only in tests) so the book can run the same checks it
describes.  Ground-truth probabilities are computed in float64 numpy by an implementation of
the warping that is independent of `flashspec.sampling`, so a warping bug cannot hide by
being present on both sides.  The goodness-of-fit tests need scipy (the ``dev`` extra), imported
when a test runs.  The suite's grid of configurations and its results file are
`experiments/exactness.py`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from flashspec import rng
from flashspec.sampling import SamplingParams, gumbel_argmax, sample_from_logits, warp_logits
from flashspec.verify import VerifyOutput, block_acceptance, draft_log_probs, residual_log_weights, verify

CONTEXT_PERIOD = 3  # toy logits depend on the last two tokens and the position modulo this


@dataclass(frozen=True)
class ToyModel:
    """An autoregressive toy LM over `vocab` tokens: logits depend on (prev2, prev1, position % 3).

    `table[prev2, prev1, phase]` holds the logits; index `vocab` stands for beginning-of-text.
    """

    table: torch.Tensor  # [V+1, V+1, CONTEXT_PERIOD, V] float32
    deterministic: bool = False  # proposes its argmax with draft_logits=None (one-hot q)

    @property
    def vocab(self) -> int:
        return self.table.shape[-1]

    def logits(self, prev2: torch.Tensor, prev1: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        return self.table[prev2, prev1, position % CONTEXT_PERIOD]


def make_toy(
    vocab: int,
    seed: int,
    scale: float = 1.5,
    support: Sequence[int] | None = None,
    deterministic: bool = False,
) -> ToyModel:
    """A random toy model; `support` restricts it to those tokens (others get -inf logits)."""
    generator = torch.Generator().manual_seed(seed)
    table = scale * torch.randn(vocab + 1, vocab + 1, CONTEXT_PERIOD, vocab, generator=generator)
    if support is not None:
        mask = torch.ones(vocab, dtype=torch.bool)
        mask[list(support)] = False
        table[..., mask] = float("-inf")
    return ToyModel(table=table, deterministic=deterministic)


# ----------------------------------------------------------------------------------------------
# Ground truth (float64 numpy, independent of flashspec.sampling)


def reference_warp(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Warped probabilities of one logits vector, in float64: T, then top-k, then top-p."""
    logits = np.asarray(logits, dtype=np.float64)
    if params.temperature == 0:
        probs = np.zeros_like(logits)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    scaled = logits / params.temperature
    if 0 < params.top_k < len(scaled):
        kth = np.sort(scaled)[::-1][params.top_k - 1]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        mass_before = np.cumsum(probs[order]) - probs[order]
        gap = np.abs(mass_before - params.top_p)
        if np.any((gap < 1e-5) & (probs[order] > 0)):
            raise ValueError("top_p falls within 1e-5 of a cumulative-mass boundary; pick another seed")
        keep = np.zeros(len(probs), dtype=bool)
        keep[order[(mass_before < params.top_p)]] = True
        keep[order[0]] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs


def exact_sequence_probs(
    model: ToyModel, params: SamplingParams, length: int, prompt: tuple[int, int] | None = None
) -> np.ndarray:
    """P(first `length` generated tokens = s) for every s in V^length, in lexicographic order."""
    vocab = model.vocab
    prompt = (vocab, vocab) if prompt is None else prompt
    table = model.table.double().numpy()
    probs = np.zeros(vocab**length)
    for index, sequence in enumerate(itertools.product(range(vocab), repeat=length)):
        prev2, prev1, prob = prompt[0], prompt[1], 1.0
        for position, token in enumerate(sequence):
            prob *= reference_warp(table[prev2, prev1, position % CONTEXT_PERIOD], params)[token]
            if prob == 0.0:
                break
            prev2, prev1 = prev1, token
        probs[index] = prob
    return probs


# ----------------------------------------------------------------------------------------------
# The speculative sampling loop


@dataclass(frozen=True)
class DraftNoise:
    """What a negative control needs to (wrongly) reuse the draft's randomness."""

    key: rng.Key
    row_offset: int


class Verifier(Protocol):
    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_logits: torch.Tensor | None,
        draft_tokens: torch.Tensor,
        params: SamplingParams,
        generator: int,
        draft_noise: DraftNoise,
    ) -> VerifyOutput: ...


def library_verifier(backend: str = "torch", device: str | torch.device | None = None,
                     draft_log_probs: bool = False, residual: str = "race", method: str = "token") -> Verifier:
    """The real `flashspec.verify` on one backend, in the harness's verifier signature.

    `device` moves the inputs there (e.g. "cuda" for the compiled Triton kernels) and the
    outputs back to the CPU, where the harness keeps its state. `draft_log_probs`: the draft's
    warped log-probs are passed in place of its logits (`draft_is_log_probs=True`). `residual`, `method`: `verify`'s.
    """

    def run(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
        given = draft_log_probs and draft_logits is not None
        if given:
            draft_logits = warp_logits(draft_logits, params)
        if device is not None:
            target_logits, draft_tokens = target_logits.to(device), draft_tokens.to(device)
            draft_logits = None if draft_logits is None else draft_logits.to(device)
        out = verify(target_logits, draft_logits, draft_tokens, params, generator=generator, backend=backend,
                     draft_is_log_probs=given, residual=residual, method=method)
        return VerifyOutput(tokens=out.tokens.cpu(), num_accepted=out.num_accepted.cpu())

    return run


# A selector picks, per row, which draft's proposal to verify, from the step number, the
# proposals and the target's warped log-probs at the first position.  Looking at the target's
# distribution is harmless; looking at the proposals breaks exactness (book/design.md §1).
Selector = Callable[[int, list["ToyProposal"], torch.Tensor], torch.Tensor]


@dataclass
class ToyProposal:
    """γ tokens a toy draft proposed, their logits, and the key of the noise that drew them."""

    tokens: torch.Tensor  # [N, γ]
    logits: torch.Tensor | None  # [N, γ, V], or None for a deterministic draft
    key: rng.Key


def round_robin_selector(step: int, proposals: list[ToyProposal], first_log_probs: torch.Tensor) -> torch.Tensor:
    """Exact: the arm depends on the step number only (a function of the past)."""
    rows = proposals[0].tokens.shape[0]
    return torch.full((rows,), step % len(proposals), dtype=torch.long)


def cherry_picking_selector(step: int, proposals: list[ToyProposal], first_log_probs: torch.Tensor) -> torch.Tensor:
    """NOT exact (book/design.md §1): per row, the draft whose first proposed token the target likes most."""
    scores = [first_log_probs.gather(1, proposal.tokens[:, :1]).squeeze(1) for proposal in proposals]
    return torch.stack(scores, dim=1).argmax(dim=1)


@dataclass
class LoopState:
    prev2: torch.Tensor
    prev1: torch.Tensor
    count: torch.Tensor  # tokens generated so far per row
    generated: torch.Tensor  # [N, length], -1 until filled


def sample_sequences(
    target: ToyModel,
    drafts: Sequence[ToyModel],
    params: SamplingParams,
    gamma: int,
    num_sequences: int,
    length: int,
    seed: int,
    verifier: Verifier | None = None,
    rows_per_call: int | None = None,
    selector: Selector = round_robin_selector,
    prompt: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Generate `num_sequences` continuations of `prompt` by speculative decoding; return the
    first `length` tokens of each, [N, length].

    Each step: every draft proposes γ tokens from its warped distribution (own noise stream),
    the selector picks one proposal per row, the target scores γ+1 positions, and `verifier`
    is called on chunks of `rows_per_call` rows (one call per chunk, each with its own seed).
    """
    verifier = library_verifier() if verifier is None else verifier
    vocab = target.vocab
    rows = num_sequences
    rows_per_call = rows if rows_per_call is None else rows_per_call
    prompt = (vocab, vocab) if prompt is None else prompt
    state = LoopState(
        prev2=torch.full((rows,), prompt[0], dtype=torch.long),
        prev1=torch.full((rows,), prompt[1], dtype=torch.long),
        count=torch.zeros(rows, dtype=torch.long),
        generated=torch.full((rows, length), -1, dtype=torch.long),
    )
    step = 0
    while bool((state.count < length).any()):
        proposals = [
            propose(draft, state, params, gamma, rng.Key.from_seed(rng.derive_seed(seed, step, index, 1)))
            for index, draft in enumerate(drafts)
        ]
        first_log_probs = warp_logits(target.logits(state.prev2, state.prev1, state.count), params)
        choice = selector(step, proposals, first_log_probs)
        draft_tokens, draft_logits = _gather_proposals(proposals, choice)
        target_logits = score_positions(target, state, draft_tokens)
        # The arm chosen for row r decides which draft noise a buggy verifier might reuse.
        noise_key = proposals[int(choice[0])].key
        outputs = []
        for chunk, start in enumerate(range(0, rows, rows_per_call)):
            stop = min(start + rows_per_call, rows)
            outputs.append(
                verifier(
                    target_logits[start:stop],
                    None if draft_logits is None else draft_logits[start:stop],
                    draft_tokens[start:stop],
                    params,
                    rng.derive_seed(seed, step, chunk, 2),
                    DraftNoise(key=noise_key, row_offset=start),
                )
            )
        tokens = torch.cat([out.tokens for out in outputs]).cpu()
        num_accepted = torch.cat([out.num_accepted for out in outputs]).cpu()
        append_tokens(state, tokens, num_accepted)
        step += 1
    return state.generated


def propose(draft: ToyModel, state: LoopState, params: SamplingParams, gamma: int, key: rng.Key) -> ToyProposal:
    """γ tokens sampled autoregressively from the draft's warped distribution."""
    prev2, prev1, position = state.prev2, state.prev1, state.count
    tokens, logits = [], []
    for index in range(gamma):
        step_logits = draft.logits(prev2, prev1, position + index)
        if draft.deterministic:
            token = step_logits.argmax(dim=-1)
        else:
            token, _ = sample_from_logits(step_logits, params, key, position=index, stream=rng.STREAM_DRAFT)
        tokens.append(token)
        logits.append(step_logits)
        prev2, prev1 = prev1, token
    return ToyProposal(
        tokens=torch.stack(tokens, dim=1),
        logits=None if draft.deterministic else torch.stack(logits, dim=1),
        key=key,
    )


def _gather_proposals(proposals: list[ToyProposal], choice: torch.Tensor):
    tokens = torch.stack([p.tokens for p in proposals], dim=1)  # [N, K, γ]
    rows = torch.arange(tokens.shape[0])
    chosen_tokens = tokens[rows, choice]
    if any(p.logits is None for p in proposals):
        if not all(p.logits is None for p in proposals):
            raise ValueError("drafts must be all deterministic or all stochastic in one harness run")
        return chosen_tokens, None
    logits = torch.stack([p.logits for p in proposals], dim=1)  # [N, K, γ, V]
    return chosen_tokens, logits[rows, choice]


def score_positions(target: ToyModel, state: LoopState, draft_tokens: torch.Tensor) -> torch.Tensor:
    """Target logits [N, γ+1, V] for the prefix plus drafts 0..i-1, i = 0..γ."""
    prev2, prev1, position = state.prev2, state.prev1, state.count
    logits = []
    for index in range(draft_tokens.shape[1] + 1):
        logits.append(target.logits(prev2, prev1, position + index))
        if index < draft_tokens.shape[1]:
            prev2, prev1 = prev1, draft_tokens[:, index]
    return torch.stack(logits, dim=1)


def append_tokens(state: LoopState, tokens: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Append each row's emitted tokens (indices 0..num_accepted) to the loop state."""
    length = state.generated.shape[1]
    rows = torch.arange(tokens.shape[0])
    for index in range(tokens.shape[1]):
        emitted = index <= num_accepted
        token = tokens[:, index]
        record = emitted & (state.count < length)
        state.generated[rows[record], state.count[record]] = token[record]
        state.prev2 = torch.where(emitted, state.prev1, state.prev2)
        state.prev1 = torch.where(emitted, token, state.prev1)
        state.count = state.count + emitted.long()


# ----------------------------------------------------------------------------------------------
# Goodness of fit


@dataclass(frozen=True)
class FitResult:
    statistic: float
    dof: int
    p_value: float
    impossible: int  # samples that fell on sequences of probability zero

    def passes(self, alpha: float) -> bool:
        return self.impossible == 0 and self.p_value >= alpha


def sequence_index(sequences: torch.Tensor, vocab: int) -> np.ndarray:
    """Lexicographic index of each row of `sequences` [N, L] in V^L."""
    weights = vocab ** np.arange(sequences.shape[1] - 1, -1, -1)
    return sequences.numpy().astype(np.int64) @ weights


def chi_square_test(sequences: torch.Tensor, exact_probs: np.ndarray, vocab: int, min_expected: float = 5.0) -> FitResult:
    """Pearson χ² of observed sequence counts against exact probabilities.

    Cells with expected count < `min_expected` are pooled into one cell; any sample on a
    zero-probability sequence is counted in `impossible` and fails the test outright.
    """
    if bool((sequences < 0).any()):
        raise ValueError("sequences contains -1: the loop stopped before every row had its length")
    counts = np.bincount(sequence_index(sequences, vocab), minlength=len(exact_probs)).astype(np.float64)
    total = counts.sum()
    impossible = int(counts[exact_probs == 0].sum())
    expected = exact_probs * total
    big = expected >= min_expected
    observed_cells = list(counts[big])
    expected_cells = list(expected[big])
    small_mass = expected[~big & (exact_probs > 0)].sum()
    if small_mass > 0:
        observed_cells.append(counts[~big & (exact_probs > 0)].sum())
        expected_cells.append(small_mass)
    observed_arr, expected_arr = np.array(observed_cells), np.array(expected_cells)
    expected_arr *= observed_arr.sum() / expected_arr.sum()
    if len(observed_arr) < 2:
        return FitResult(statistic=0.0, dof=0, p_value=1.0 if impossible == 0 else 0.0, impossible=impossible)
    from scipy import stats

    statistic, p_value = stats.chisquare(observed_arr, expected_arr)
    return FitResult(float(statistic), len(observed_arr) - 1, float(p_value) if impossible == 0 else 0.0, impossible)


def ks_first_token_test(first_tokens: torch.Tensor, probs: np.ndarray) -> FitResult:
    """The paper's gate: Kolmogorov–Smirnov distance between the empirical and exact CDF of
    token ids, D = max_k |F_n(k) - F(k)|, with the continuous-case p-value (conservative for a
    discrete distribution)."""
    samples = first_tokens.numpy().astype(np.int64)
    counts = np.bincount(samples, minlength=len(probs))
    distance = float(np.abs(np.cumsum(counts) / len(samples) - np.cumsum(probs)).max())
    impossible = int(counts[probs == 0].sum())
    from scipy import stats

    p_value = float(stats.kstwo.sf(distance, len(samples)))
    return FitResult(distance, 0, p_value if impossible == 0 else 0.0, impossible)


def marginal_first_token(model: ToyModel, params: SamplingParams, prompt: tuple[int, int] | None = None) -> np.ndarray:
    vocab = model.vocab
    prompt = (vocab, vocab) if prompt is None else prompt
    return reference_warp(model.table.double().numpy()[prompt[0], prompt[1], 0], params)


# ----------------------------------------------------------------------------------------------
# Negative controls: verifiers with the bugs found in the wild. Each must FAIL the harness.


def _accept_pieces(target_logits, draft_logits, draft_tokens, params, accept_uniforms):
    gamma = draft_tokens.shape[1]
    vocab = target_logits.shape[2]
    tokens = draft_tokens.long()
    log_p = warp_logits(target_logits, params)
    log_q = draft_log_probs(draft_logits, tokens, params, vocab)
    log_p_x = log_p[:, :gamma].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    log_q_x = log_q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    accepted = torch.log(accept_uniforms) <= log_p_x - log_q_x
    return log_p, log_q, accepted


def _sample_rows(log_weights: torch.Tensor, key: rng.Key, positions: torch.Tensor, stream: int) -> torch.Tensor:
    rows, vocab = log_weights.shape
    row = torch.arange(rows).view(rows, 1)
    noise = rng.uniform_from_base(rng.base_hash(key, stream, row, positions.view(rows, 1)), torch.arange(vocab).view(1, vocab))
    return gumbel_argmax(log_weights, noise)


def _emit(draft_tokens, num_accepted, emitted_token, gamma):
    rows = torch.arange(draft_tokens.shape[0])
    out = torch.full((draft_tokens.shape[0], gamma + 1), -1, dtype=torch.long)
    positions = torch.arange(gamma).view(1, gamma)
    out[:, :gamma] = torch.where(positions < num_accepted.view(-1, 1), draft_tokens.long(), -1)
    out[rows, num_accepted] = emitted_token
    return VerifyOutput(tokens=out, num_accepted=num_accepted)


def _residual_or_bonus(log_p, log_q, num_accepted, gamma):
    rows = torch.arange(log_p.shape[0])
    log_p_n = log_p[rows, num_accepted]
    log_q_n = log_q[rows, num_accepted.clamp(max=gamma - 1)]
    rejected = (num_accepted < gamma).unsqueeze(-1)
    weights = torch.where(rejected, residual_log_weights(log_p_n, log_q_n), log_p_n)
    return torch.where(torch.isfinite(weights).any(-1, keepdim=True), weights, log_p_n)


def leaky_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
    """BUG: keeps every individually accepted draft, also those after the first rejection."""
    key = rng.Key.from_seed(generator)
    batch, gamma = draft_tokens.shape
    u = rng.uniforms(key, rng.STREAM_ACCEPT, batch, gamma, 1)[..., 0]
    log_p, log_q, accepted = _accept_pieces(target_logits, draft_logits, draft_tokens, params, u)
    first_reject = accepted.long().cumprod(1).sum(1)
    kept = accepted.clone()
    # compact the accepted drafts to the front, then the residual token at the first rejection
    order = torch.argsort((~kept).long(), dim=1, stable=True)
    compacted = draft_tokens.long().gather(1, order)
    num_kept = kept.long().sum(1)
    weights = _residual_or_bonus(log_p, log_q, first_reject, gamma)
    emitted = _sample_rows(weights, key, first_reject, rng.STREAM_SAMPLE)
    return _emit(compacted, num_kept, emitted, gamma)


def residual_bonus_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
    """BUG: when all γ drafts pass, overwrites the last draft with a residual sample at γ-1
    instead of drawing a bonus token from the target at position γ."""
    key = rng.Key.from_seed(generator)
    batch, gamma = draft_tokens.shape
    u = rng.uniforms(key, rng.STREAM_ACCEPT, batch, gamma, 1)[..., 0]
    log_p, log_q, accepted = _accept_pieces(target_logits, draft_logits, draft_tokens, params, u)
    num_accepted = accepted.long().cumprod(1).sum(1)
    all_passed = num_accepted == gamma
    position = torch.where(all_passed, num_accepted - 1, num_accepted)
    rows = torch.arange(batch)
    log_p_n = log_p[rows, position]
    log_q_n = log_q[rows, position.clamp(max=gamma - 1)]
    weights = residual_log_weights(log_p_n, log_q_n)
    weights = torch.where(torch.isfinite(weights).any(-1, keepdim=True), weights, log_p_n)
    emitted = _sample_rows(weights, key, position, rng.STREAM_SAMPLE)
    return _emit(draft_tokens, position, emitted, gamma)


def draft_noise_accept_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
    """BUG: the accept test reuses the uniform the draft drew for the token it proposed."""
    batch, gamma = draft_tokens.shape
    rows = torch.arange(batch).view(batch, 1) + draft_noise.row_offset
    positions = torch.arange(gamma).view(1, gamma)
    base = rng.base_hash(draft_noise.key, rng.STREAM_DRAFT, rows, positions)
    u = rng.uniform_from_base(base, draft_tokens.long())
    key = rng.Key.from_seed(generator)
    log_p, log_q, accepted = _accept_pieces(target_logits, draft_logits, draft_tokens, params, u)
    num_accepted = accepted.long().cumprod(1).sum(1)
    weights = _residual_or_bonus(log_p, log_q, num_accepted, gamma)
    emitted = _sample_rows(weights, key, num_accepted, rng.STREAM_SAMPLE)
    return _emit(draft_tokens, num_accepted, emitted, gamma)


def draft_noise_residual_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
    """BUG: the residual/bonus sample reuses the draft's Gumbel noise at that position."""
    batch, gamma = draft_tokens.shape
    key = rng.Key.from_seed(generator)
    u = rng.uniforms(key, rng.STREAM_ACCEPT, batch, gamma, 1)[..., 0]
    log_p, log_q, accepted = _accept_pieces(target_logits, draft_logits, draft_tokens, params, u)
    num_accepted = accepted.long().cumprod(1).sum(1)
    weights = _residual_or_bonus(log_p, log_q, num_accepted, gamma)
    rows = torch.arange(batch).view(batch, 1) + draft_noise.row_offset
    position = num_accepted.clamp(max=gamma - 1).view(batch, 1)
    noise = rng.uniform_from_base(
        rng.base_hash(draft_noise.key, rng.STREAM_DRAFT, rows, position), torch.arange(weights.shape[1]).view(1, -1)
    )
    return _emit(draft_tokens, num_accepted, gumbel_argmax(weights, noise), gamma)


def late_temperature_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
    """BUG: divides log-softmax output by T (temperature after normalisation, never renormalised)."""
    key = rng.Key.from_seed(generator)
    batch, gamma = draft_tokens.shape
    tokens = draft_tokens.long()
    log_p = torch.log_softmax(target_logits.float(), -1) / params.temperature
    log_q = torch.log_softmax(draft_logits.float(), -1) / params.temperature
    log_p_x = log_p[:, :gamma].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    log_q_x = log_q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    u = rng.uniforms(key, rng.STREAM_ACCEPT, batch, gamma, 1)[..., 0]
    num_accepted = (torch.log(u) <= log_p_x - log_q_x).long().cumprod(1).sum(1)
    weights = _residual_or_bonus(log_p, log_q, num_accepted, gamma)
    emitted = _sample_rows(weights, key, num_accepted, rng.STREAM_SAMPLE)
    return _emit(draft_tokens, num_accepted, emitted, gamma)


def residual_from_target_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
    """BUG: after a rejection, draws the replacement from the target p instead of the residual max(0, p - q) (what
    rejection from p becomes without its accept test)."""
    key = rng.Key.from_seed(generator)
    batch, gamma = draft_tokens.shape
    u = rng.uniforms(key, rng.STREAM_ACCEPT, batch, gamma, 1)[..., 0]
    log_p, _, accepted = _accept_pieces(target_logits, draft_logits, draft_tokens, params, u)
    num_accepted = accepted.long().cumprod(1).sum(1)
    emitted = _sample_rows(log_p[torch.arange(batch), num_accepted], key, num_accepted, rng.STREAM_SAMPLE)
    return _emit(draft_tokens, num_accepted, emitted, gamma)


def _block_verifier(correction_weight: bool, residual_mass: bool) -> Verifier:
    """Block verification with one of its two pieces dropped: `correction_weight` False draws the correction from
    the token residual max(0, p - q) instead of max(0, w·p - q); `residual_mass` False accepts prefix n < γ with
    probability w_n itself instead of Z_n / (Z_n + 1 - w_n)."""

    def run(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
        key = rng.Key.from_seed(generator)
        batch, gamma = draft_tokens.shape
        tokens = draft_tokens.long()
        u = rng.uniforms(key, rng.STREAM_ACCEPT, batch, gamma, 1)[..., 0]
        log_p = warp_logits(target_logits, params)
        log_q = draft_log_probs(draft_logits, tokens, params, target_logits.shape[2])
        log_p_x = log_p[:, :gamma].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        log_q_x = log_q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        if residual_mass:
            num_accepted, log_weight = block_acceptance(log_p, log_q, log_p_x, log_q_x, u)
        else:
            sums = torch.cat([torch.zeros(batch, 1), torch.cumsum(log_p_x - log_q_x, 1)], 1)
            log_w = sums - torch.cummax(sums, 1).values
            prefix = torch.arange(1, gamma + 1).view(1, gamma)
            num_accepted = torch.where(torch.log(u) <= log_w[:, 1:], prefix, 0).max(1).values
            log_weight = torch.where(num_accepted < gamma, log_w[torch.arange(batch), num_accepted], 0.0)
        if not correction_weight:
            log_weight = torch.zeros_like(log_weight)
        rows = torch.arange(batch)
        scaled = log_p.clone()
        scaled[rows, num_accepted] = log_p[rows, num_accepted] + log_weight[:, None]
        weights = _residual_or_bonus(scaled, log_q, num_accepted, gamma)
        emitted = _sample_rows(weights, key, num_accepted, rng.STREAM_SAMPLE)
        return _emit(draft_tokens, num_accepted, emitted, gamma)

    return run


block_token_residual_verifier = _block_verifier(correction_weight=False, residual_mass=True)
block_token_residual_verifier.__doc__ = ("BUG: block verification whose correction is drawn from the token residual "
                                         "max(0, p - q) instead of the block residual max(0, w·p - q).")
block_ratio_threshold_verifier = _block_verifier(correction_weight=True, residual_mass=False)
block_ratio_threshold_verifier.__doc__ = ("BUG: block verification that accepts every prefix with probability w_n, "
                                          "its capped cumulative ratio, without the residual-mass threshold.")


NEGATIVE_CONTROLS: dict[str, Verifier] = {
    "post_rejection_leak": leaky_verifier,
    "bonus_from_residual": residual_bonus_verifier,
    "accept_reuses_draft_noise": draft_noise_accept_verifier,
    "residual_reuses_draft_noise": draft_noise_residual_verifier,
    "temperature_after_log_softmax": late_temperature_verifier,
    "residual_from_target": residual_from_target_verifier,
    "block_token_residual": block_token_residual_verifier,
    "block_ratio_threshold": block_ratio_threshold_verifier,
}


def paper_gate(
    verifier: Verifier,
    target: ToyModel,
    params: SamplingParams | None = None,
    num_samples: int = 10_000,
    seed: int = 3,
) -> FitResult:
    """The paper's own test: γ = 1, draft = target, KS over `num_samples` first tokens (default params: T = 1)."""
    params = SamplingParams(1.0) if params is None else params
    first = sample_sequences(target, [target], params, 1, num_samples, 1, seed=seed, verifier=verifier)[:, 0]
    return ks_first_token_test(first, marginal_first_token(target, params))
