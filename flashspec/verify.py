"""Speculative verification: from target logits, draft logits and drafted tokens, emit the accepted
prefix and one more token, so that the output is distributed exactly as the target (book/design.md §1).

`verify` is the public entry point; `verify_reference` is the vectorised PyTorch ground truth
that the Triton backend must match bit for bit given the same key.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flashspec import rng
from flashspec.sampling import (METHODS, NEG_INF, PROPOSAL_POSITION, REJECTION_PROPOSALS, RESIDUALS, SamplingParams,
                                block_race, check_method, check_residual, rejection_proposals, residual_by_rejection,
                                warp_logits)

BACKENDS = ("auto", "torch", "triton")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


@dataclass(frozen=True)
class VerifyOutput:
    """Result of one verification step for B rows.

    tokens:       LongTensor [B, γ+1] -- accepted drafts, the emitted token at index
                  `num_accepted`, then -1.
    num_accepted: LongTensor [B] in [0, γ].
    """

    tokens: torch.Tensor
    num_accepted: torch.Tensor

    @property
    def num_emitted(self) -> torch.Tensor:
        """Tokens emitted per row (num_accepted + 1: every step emits at least one)."""
        return self.num_accepted + 1


def verify(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams | None = None,
    generator: torch.Generator | int | None = None,
    backend: str = "auto",
    validate: bool | None = None,
    draft_is_log_probs: bool = False,
    residual: str = "race",
    method: str = "token",
) -> VerifyOutput:
    """Verify γ drafted tokens per row against the target (book/design.md §1).

    Args:
        target_logits: [B, γ+1, V] float; position i scores the token after the prefix plus
            drafts 0..i-1, position γ is the bonus position.
        draft_logits: [B, γ, V] float, exactly the logits the draft sampled from, or None for
            deterministic proposals (q one-hot at the drafted token).
        draft_tokens: [B, γ] integer token ids in [0, V).
        params: SamplingParams shared by draft and target (default T=1, no truncation).
        generator: torch.Generator, int seed (same int -> same output) or None (torch's default).
        backend: "auto" (Triton on CUDA when available, else PyTorch), "torch" or "triton".
        validate: check values (token range, NaN/inf rows). None = only when the tensors are on
            the CPU, where it costs no device sync; True forces it (one sync on a GPU).
        draft_is_log_probs: `draft_logits` holds the draft's warped log-probabilities instead of its logits:
            exactly the log-probs it sampled from (temperature, top-k and top-p applied, each row normalised;
            `flashspec.sampling.sample_from_logits` returns them). The verifier then needs no pass over the
            draft's vocabulary to normalise it (the Triton backend streams the target's logits only).
        residual: how a rejected row draws its token from the residual max(0, p - q) (both exact, different
            random streams): "race" streams the residual over V after the accept test (two launches on a GPU);
            "rejection" draws `sampling.REJECTION_PROPOSALS` proposals from p and accepts each with probability
            max(0, 1 - q/p), racing the whole residual only if all fail (`sampling.residual_by_rejection`), so a
            GPU verifies in one launch (kernels/one_pass.py).
        method: "token" (default) accepts each draft by its own ratio up to the first rejection; "block" judges the
            chain as a whole (`block_acceptance`): it may keep a prefix past a draft that token verification would
            reject, emits its correction from max(0, w·p - q) (w the prefix's capped cumulative ratio), and accepts
            at least as many tokens in expectation. Both emit exactly the target's distribution; at T = 0 they are
            the same. "block" samples its correction by race (`residual` must stay "race").
    """
    params = SamplingParams() if params is None else params
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a flashspec.SamplingParams, got {type(params).__name__}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_method(method, residual)
    check_shapes(target_logits, draft_logits, draft_tokens)
    if draft_is_log_probs and draft_logits is None:
        raise ValueError("draft_is_log_probs=True needs draft_logits (the draft's log-probs); pass them, or "
                         "draft_is_log_probs=False for deterministic proposals")
    if validate is None:
        validate = target_logits.device.type == "cpu"
    if validate:
        check_values(target_logits, draft_logits, draft_tokens, params, draft_is_log_probs)
    return verify_with_key(target_logits, draft_logits, draft_tokens, params, rng.key_from_generator(generator),
                           backend, draft_is_log_probs, residual, method)


def verify_with_key(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams,
    key: rng.Key | torch.Tensor,
    backend: str = "auto",
    draft_is_log_probs: bool = False,
    residual: str = "race",
    method: str = "token",
) -> VerifyOutput:
    """`verify` drawing from `key` (a host `rng.Key` or a device key [2]) with no checks: for the engines, whose
    step key comes from their run's seed (`rng.step_key`) and whose inputs they built themselves."""
    if backend == "auto":
        backend = "triton" if target_logits.is_cuda and _triton_available() else "torch"
    if backend == "triton":
        from flashspec.kernels import verify_triton

        tokens, num_accepted = verify_triton(target_logits, draft_logits, draft_tokens, params, key,
                                             draft_is_log_probs=draft_is_log_probs, residual=residual, method=method)
        return VerifyOutput(tokens=tokens, num_accepted=num_accepted)
    return verify_reference(target_logits, draft_logits, draft_tokens, params, key, draft_is_log_probs, residual,
                            method)


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def check_shapes(
    target_logits: torch.Tensor, draft_logits: torch.Tensor | None, draft_tokens: torch.Tensor
) -> None:
    """Raise ValueError naming the argument when shapes, dtypes or devices do not fit together."""
    for name, tensor in (("target_logits", target_logits), ("draft_tokens", draft_tokens)):
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if target_logits.dim() != 3:
        raise ValueError(f"target_logits must be [B, gamma+1, V], got shape {tuple(target_logits.shape)}")
    if target_logits.dtype not in FLOAT_DTYPES:
        raise ValueError(f"target_logits must be a float tensor (fp32/bf16/fp16), got {target_logits.dtype}")
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, gamma], got shape {tuple(draft_tokens.shape)}")
    if draft_tokens.dtype not in INT_DTYPES:
        raise ValueError(
            f"draft_tokens must hold integer token ids, got {draft_tokens.dtype}; cast with .long()"
        )
    batch, gamma = draft_tokens.shape
    if gamma < 1:
        raise ValueError("draft_tokens must hold gamma >= 1 drafted tokens per row, got gamma = 0")
    if batch < 1:
        raise ValueError("draft_tokens must have at least one row (B >= 1)")
    if tuple(target_logits.shape[:2]) != (batch, gamma + 1):
        raise ValueError(
            f"target_logits must be [B, gamma+1, V] = [{batch}, {gamma + 1}, V] to match draft_tokens "
            f"{tuple(draft_tokens.shape)}, got {tuple(target_logits.shape)}"
        )
    vocab = target_logits.shape[2]
    if vocab < 1:
        raise ValueError("target_logits has an empty vocabulary axis (V = 0)")
    if draft_tokens.device != target_logits.device:
        raise ValueError(
            f"draft_tokens is on {draft_tokens.device} but target_logits on {target_logits.device}; "
            "move them to one device"
        )
    if draft_logits is None:
        return
    if not isinstance(draft_logits, torch.Tensor):
        raise ValueError(f"draft_logits must be a torch.Tensor or None, got {type(draft_logits).__name__}")
    if draft_logits.dtype not in FLOAT_DTYPES:
        raise ValueError(f"draft_logits must be a float tensor (fp32/bf16/fp16), got {draft_logits.dtype}")
    if draft_logits.dim() != 3 or tuple(draft_logits.shape[:2]) != (batch, gamma):
        raise ValueError(
            f"draft_logits must be [B, gamma, V] = [{batch}, {gamma}, V], got {tuple(draft_logits.shape)}"
        )
    if draft_logits.shape[2] != vocab:
        raise ValueError(
            f"draft_logits vocabulary ({draft_logits.shape[2]}) differs from target_logits ({vocab}); "
            "draft and target must share one tokenizer"
        )
    if draft_logits.device != target_logits.device:
        raise ValueError(
            f"draft_logits is on {draft_logits.device} but target_logits on {target_logits.device}"
        )


def check_values(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams,
    draft_is_log_probs: bool = False,
) -> None:
    """Raise ValueError for token ids out of range, for logits rows no distribution can come from, and (with
    `draft_is_log_probs`) for draft rows that are not normalised log-probabilities."""
    vocab = target_logits.shape[2]
    if bool(((draft_tokens < 0) | (draft_tokens >= vocab)).any()):
        bad = draft_tokens[(draft_tokens < 0) | (draft_tokens >= vocab)][0].item()
        raise ValueError(f"draft_tokens must lie in [0, V) = [0, {vocab}), found {bad}")
    _check_logit_rows("target_logits", target_logits)
    if draft_logits is not None:
        _check_logit_rows("draft_logits", draft_logits)
        if draft_is_log_probs:
            _check_log_prob_rows(draft_logits)
        if not params.greedy:
            log_q = draft_log_probs(draft_logits, draft_tokens, params, vocab, draft_is_log_probs).gather(
                -1, draft_tokens.long().unsqueeze(-1))
            if bool(torch.isneginf(log_q).any()):
                raise ValueError(
                    "draft_tokens contains a token with zero probability under the warped draft_logits; "
                    "pass exactly the logits (and the same SamplingParams) the draft sampled from"
                )


LOG_PROB_ROW_TOLERANCE = 1e-3  # |logsumexp| of a row of log-probs: far above fp32 rounding, far below any mistake


def _check_log_prob_rows(log_probs: torch.Tensor) -> None:
    """Each row of `draft_logits` given as log-probs must sum to one."""
    totals = torch.logsumexp(log_probs.double(), dim=-1)
    bad = totals.abs() > LOG_PROB_ROW_TOLERANCE
    if bool(bad.any()):
        row, position = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"draft_logits row ({row}, {position}) is not a row of log-probabilities (its logsumexp is "
            f"{float(totals[row, position]):.4g}, not 0; {int(bad.sum())} such rows) but draft_is_log_probs=True; "
            "pass the log-probs the "
            "draft sampled from (e.g. the second value `flashspec.sampling.sample_from_logits` returns), or its "
            "logits with draft_is_log_probs=False"
        )


def _check_logit_rows(name: str, logits: torch.Tensor) -> None:
    if bool(torch.isnan(logits).any()):
        raise ValueError(f"{name} contains NaN; a distribution needs finite logits (or -inf to exclude a token)")
    if bool(torch.isposinf(logits).any()):
        raise ValueError(f"{name} contains +inf; use finite logits (or -inf to exclude a token)")
    if bool(torch.isneginf(logits).all(dim=-1).any()):
        raise ValueError(f"{name} has a row that is -inf everywhere: no token can be sampled from it")


def verify_reference(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams,
    key: rng.Key | torch.Tensor,
    draft_is_log_probs: bool = False,
    residual: str = "race",
    method: str = "token",
) -> VerifyOutput:
    """Vectorised PyTorch verification: the ground truth for every other backend. `key` may be a
    device tensor [2] (see `rng.step_key`): then nothing here leaves the device (graph-safe).
    `draft_is_log_probs`: `draft_logits` holds the draft's warped log-probs (read as given); `residual`, `method`:
    as `verify`'s (greedy, both methods accept the prefix that matches the target's argmax)."""
    check_method(method, residual)
    batch, gamma = draft_tokens.shape
    vocab = target_logits.shape[2]
    device = target_logits.device
    tokens_in = draft_tokens.long()
    rows = torch.arange(batch, device=device)
    log_p = warp_logits(target_logits, params)  # [B, γ+1, V]
    if params.greedy:
        accepted = tokens_in == log_p[:, :gamma].argmax(dim=-1)
    else:
        log_q = draft_log_probs(draft_logits, tokens_in, params, vocab, draft_is_log_probs)
        log_p_x = log_p[:, :gamma].gather(-1, tokens_in.unsqueeze(-1)).squeeze(-1)
        log_q_x = log_q.gather(-1, tokens_in.unsqueeze(-1)).squeeze(-1)
        accept_u = rng.uniforms(key, rng.STREAM_ACCEPT, batch, gamma, 1, device=device)[..., 0]
        accepted = torch.log(accept_u) <= log_p_x - log_q_x
    if method == "block" and not params.greedy:
        num_accepted, log_weight = block_acceptance(log_p, log_q, log_p_x, log_q_x, accept_u)
    else:
        num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # index of the first rejection, or γ
        log_weight = None

    log_p_n = log_p[rows, num_accepted]  # [B, V]: the position whose token we emit
    if params.greedy:
        emitted = log_p_n.argmax(dim=-1)
    else:
        log_q_n = log_q[rows, num_accepted.clamp(max=gamma - 1)]
        rejected = (num_accepted < gamma).unsqueeze(-1)
        p_n = log_p_n.exp()
        # the block residual is max(0, w·p - q): the target's row scaled by the kept prefix's weight (1: token)
        p_scaled = p_n if log_weight is None else (log_p_n + log_weight[:, None]).exp()
        base = rng.base_hash(key, rng.STREAM_SAMPLE, rows.view(batch, 1), num_accepted.view(batch, 1))
        from_target, _ = block_race(p_n, log_p_n, base)  # the bonus (and, racing, the limit below)
        if residual == "rejection":
            bases = proposal_bases(key, num_accepted)
            from_residual = residual_by_rejection(log_p_n, log_q_n, bases, base)  # its fallback races with `base`
            emitted = torch.where(rejected[:, 0], from_residual, from_target)
        else:
            # the residual max(0, p - q) in linear space: its block sums are what the two-level race weighs
            weights = torch.where(rejected, (p_scaled - log_q_n.exp()).clamp(min=0.0), p_n)
            log_weights = torch.where(rejected, weights.log(), log_p_n)
            from_residual, has_mass = block_race(weights, log_weights, base)
            # max(0, p - q) can round to zero everywhere when p == q; then any rejection had
            # probability ~0 and sampling p is the limit of the residual. Keeps ids in [0, V).
            emitted = torch.where(has_mass, from_residual, from_target)

    positions = torch.arange(gamma + 1, device=device).view(1, gamma + 1)
    out = torch.full((batch, gamma + 1), -1, dtype=torch.long, device=device)
    out[:, :gamma] = torch.where(positions[:, :gamma] < num_accepted.view(batch, 1), tokens_in, -1)
    out[rows, num_accepted] = emitted
    return VerifyOutput(tokens=out, num_accepted=num_accepted)


def block_acceptance(log_p: torch.Tensor, log_q: torch.Tensor, log_p_x: torch.Tensor, log_q_x: torch.Tensor,
                     accept_u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's accept test: (τ [B] in [0, γ], log w_τ [B], 0 where τ = γ).

    w_0 = 1 and w_{n+1} = min(w_n · p_n(x_n) / q_n(x_n), 1): the capped cumulative ratio of the first n+1 drafts
    (in log space L_n = S_n - max_{k <= n} S_k, S_n the sum of the first n log-ratios). Z_n = sum_x max(0, w_n p_n(x)
    - q_n(x)) is the residual mass left after prefix n. Prefix n in 1..γ-1 passes with probability
    h_n = Z_n / (Z_n + 1 - w_n) (1 where w_n = 1 and Z_n = 0), prefix γ with h_γ = w_γ, each on its own uniform
    (`accept_u[:, n - 1]`), and τ is the longest prefix that passed (0 if none): a failure does not end the scan.
    These thresholds make P(τ >= n | the first n drafts) = w_n, which is what the proof (chapter 7) needs.
    `log_p` [B, γ+1, V] and `log_q` [B, γ, V] are the warped log-probs, `log_p_x`, `log_q_x` [B, γ] theirs at the
    drafted tokens."""
    batch, gamma = log_p_x.shape
    device = log_p_x.device
    sums = torch.cat([torch.zeros(batch, 1, device=device), torch.cumsum(log_p_x - log_q_x, dim=1)], dim=1)
    log_w = sums - torch.cummax(sums, dim=1).values                          # [B, γ+1], log w_0 = 0
    inner = log_w[:, 1:gamma]                                                # n = 1..γ-1
    mass = ((inner[..., None] + log_p[:, 1:gamma]).exp() - log_q[:, 1:gamma].exp()).clamp(min=0.0).sum(-1)
    denominator = mass + 1.0 - inner.exp()
    h = torch.where(denominator > 0, mass / denominator.clamp(min=torch.finfo(mass.dtype).tiny), 1.0)
    log_h = torch.cat([h.log(), log_w[:, gamma:]], dim=1)                    # [B, γ]: n = 1..γ
    passed = torch.log(accept_u) <= log_h
    prefix = torch.arange(1, gamma + 1, device=device).view(1, gamma)
    tau = torch.where(passed, prefix, 0).max(dim=1).values
    rows = torch.arange(batch, device=device)
    return tau, torch.where(tau < gamma, log_w[rows, tau], 0.0)


def proposal_bases(key: rng.Key | torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """The hashes [B, K] of the K = REJECTION_PROPOSALS proposals each row draws from p at its first rejection
    `num_accepted` [B] (residual="rejection"): the sample stream's, at positions past any step's."""
    batch = num_accepted.shape[0]
    rows = torch.arange(batch, device=num_accepted.device).view(batch, 1)
    positions = PROPOSAL_POSITION + num_accepted.view(batch, 1) * REJECTION_PROPOSALS + torch.arange(
        REJECTION_PROPOSALS, device=num_accepted.device).view(1, REJECTION_PROPOSALS)
    return rng.base_hash(key, rng.STREAM_SAMPLE, rows, positions)


def rejection_fallbacks(target_logits: torch.Tensor, draft_logits: torch.Tensor | None, draft_tokens: torch.Tensor,
                        params: SamplingParams, key: rng.Key | torch.Tensor,
                        draft_is_log_probs: bool = False) -> dict[str, int]:
    """How a step with residual="rejection" ends its rows: {"rows", "rejected" (rows that drew from the residual),
    "fallback" (rejected rows none of whose proposals passed, which race the residual over V)}. For the
    benchmark and the book: what the one-launch kernel's slow path costs depends on how often it runs."""
    out = verify_reference(target_logits, draft_logits, draft_tokens, params, key, draft_is_log_probs, "rejection")
    batch, gamma = draft_tokens.shape
    if params.greedy:
        return {"rows": batch, "rejected": int((out.num_accepted < gamma).sum()), "fallback": 0}
    rows = torch.arange(batch, device=target_logits.device)
    log_p_n = warp_logits(target_logits, params)[rows, out.num_accepted]
    log_q = draft_log_probs(draft_logits, draft_tokens, params, target_logits.shape[2], draft_is_log_probs)
    log_q_n = log_q[rows, out.num_accepted.clamp(max=gamma - 1)]
    _, accepted = rejection_proposals(log_p_n, log_q_n, proposal_bases(key, out.num_accepted))
    rejected = out.num_accepted < gamma
    return {"rows": batch, "rejected": int(rejected.sum()), "fallback": int((rejected & ~accepted.any(dim=1)).sum())}


def draft_log_probs(
    draft_logits: torch.Tensor | None, draft_tokens: torch.Tensor, params: SamplingParams, vocab: int,
    given: bool = False,
) -> torch.Tensor:
    """Warped draft log-probs [B, γ, V]; deterministic proposals are log one-hot at the token; `given`: the
    caller's log-probs, as fp32."""
    if draft_logits is None:
        one_hot = torch.full(
            (*draft_tokens.shape, vocab), NEG_INF, dtype=torch.float32, device=draft_tokens.device
        )
        return one_hot.scatter(-1, draft_tokens.long().unsqueeze(-1), 0.0)
    if given:
        return draft_logits.float()
    return warp_logits(draft_logits, params)


def residual_log_weights(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """log max(0, p - q), elementwise, computed as log p + log1p(-exp(log q - log p)) where q < p."""
    positive = log_q < log_p
    safe_gap = torch.where(positive, log_q - log_p, torch.zeros_like(log_p))
    return torch.where(positive, log_p + torch.log1p(-torch.exp(safe_gap)), torch.full_like(log_p, NEG_INF))
