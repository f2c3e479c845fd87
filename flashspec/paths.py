"""Multi-path verification: K drafted chains judged together, by recursive rejection sampling down the tree they
form, so that a step keeps the longest prefix any of them shares with an exact sample of the target.

Each path k is a chain of γ tokens drafted from its own distribution q^k (several drafts, several samples of one
draft, or deterministic proposals such as prompt lookup), sampled independently of the other paths given the
prefix. Paths that agree on their first d tokens share that node of the tree. At the node reached so far, the
target's distribution p is the first residual; the active paths' next tokens are tried in path order, token x of
path k accepted with probability min(1, r(x) / q^k(x)), and after each rejection the residual becomes
normalise((r - q^k)^+). An accepted token moves the step one node down, keeping the paths that drafted it; if all
are rejected, the step emits a token of the last residual, and at depth γ the bonus token of p. At each node the
emitted token has law p (the recursion: min(q, r) + (r - q)^+ = r), and the deeper tokens of the kept paths are
still fresh samples of their drafts given the new prefix, so the step's output has the target's law (chapter 7).

What must hold: a path's tokens are samples of the q^k it is verified with, or any tokens at all verified with
q^k one-hot at them (proposals treated as certain are exact too, only accepted less often: with r(x) instead of
min(1, r(x) / q^k(x))); which paths are verified, and in which order, is decided before they are drafted; and each
rejected sibling leaves the residual (r - q^k)^+, never r unchanged. Keeping only the path the target likes, trying
the paths in the order of the target's liking, or testing every sibling against r unchanged changes the law;
`flashspec_lab.exactness_paths` holds those variants as negative controls.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flashspec import rng
from flashspec.sampling import SamplingParams, block_race, warp_logits
from flashspec.verify import BACKENDS, VerifyOutput, _triton_available, check_shapes, check_values, draft_log_probs


@dataclass(frozen=True)
class PathsOutput(VerifyOutput):
    """One multi-path step for B rows: `VerifyOutput`'s `tokens` and `num_accepted`, and `path` [B], the first
    path whose first `num_accepted` tokens are the accepted ones (the one whose target keys and values a cache
    keeps)."""

    path: torch.Tensor


def verify_paths(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams | None = None,
    generator: torch.Generator | int | None = None,
    draft_is_log_probs: bool = False,
    validate: bool = True,
    backend: str = "auto",
) -> PathsOutput:
    """Verify K drafted paths of γ tokens per row together (the module docstring gives the algorithm).

    Args:
        target_logits: [B, K, γ+1, V]: the target's logits along path k (position i scores the token after the
            prefix plus the path's first i tokens; paths that share a prefix share those rows).
        draft_logits: [B, K, γ, V]: the logits path k was sampled from, or None when every path is deterministic
            (q one-hot at its tokens). A deterministic path among sampled ones: pass log one-hot rows
            (0 at the token, -inf elsewhere) with `draft_is_log_probs=True`.
        draft_tokens: [B, K, γ] integer token ids in [0, V).
        params: SamplingParams shared by drafts and target (default T = 1).
        generator: torch.Generator, int seed or None, as for `flashspec.verify`.
        draft_is_log_probs: `draft_logits` holds the drafts' warped log-probs.
        validate: check values (token range, NaN/inf rows).
        backend: "auto" (Triton on CUDA when available, else PyTorch), "torch" or "triton"; both draw the same
            numbers from one key.
    """
    params = SamplingParams() if params is None else params
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a flashspec.SamplingParams, got {type(params).__name__}")
    for name, tensor, dims in (("target_logits", target_logits, 4), ("draft_tokens", draft_tokens, 3),
                               ("draft_logits", draft_logits, 4)):
        if tensor is not None and (not isinstance(tensor, torch.Tensor) or tensor.dim() != dims):
            shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ValueError(f"{name} must be a {dims}-d tensor ([B, K, ...]), got {shape}")
    if draft_is_log_probs and draft_logits is None:
        raise ValueError("draft_is_log_probs=True needs draft_logits; pass them, or draft_is_log_probs=False")
    batch, paths, gamma = draft_tokens.shape
    if target_logits.shape[:3] != (batch, paths, gamma + 1):
        raise ValueError(f"target_logits must be [B, K, gamma+1, V] = [{batch}, {paths}, {gamma + 1}, V] to match "
                         f"draft_tokens {tuple(draft_tokens.shape)}: they disagree on B or K, or on gamma; got "
                         f"{tuple(target_logits.shape)}")
    if draft_logits is not None and draft_logits.shape != (batch, paths, gamma, target_logits.shape[3]):
        raise ValueError(f"draft_logits must be [B, K, gamma, V] = {(batch, paths, gamma, target_logits.shape[3])}, "
                         f"got {tuple(draft_logits.shape)}")
    flat = [None if t is None else t.flatten(0, 1) for t in (target_logits, draft_logits, draft_tokens)]
    check_shapes(*flat)  # dtypes and devices
    if validate:
        check_values(*flat, params, draft_is_log_probs)
    key = rng.key_from_generator(generator)
    if backend == "auto":
        backend = "triton" if target_logits.is_cuda and _triton_available() else "torch"
    if backend == "triton":
        from flashspec.kernels.paths import verify_paths_triton  # noqa: PLC0415  (Triton is imported on demand)

        log_p, q = paths_inputs(target_logits, draft_logits, draft_tokens, params, draft_is_log_probs)
        tokens, num_accepted, path = verify_paths_triton(log_p, q, draft_tokens, key)
        return PathsOutput(tokens=tokens, num_accepted=num_accepted, path=path)
    return verify_paths_reference(target_logits, draft_logits, draft_tokens, params, key, draft_is_log_probs)


def paths_inputs(target_logits: torch.Tensor, draft_logits: torch.Tensor | None, draft_tokens: torch.Tensor,
                 params: SamplingParams, draft_is_log_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """What both backends verify with: the target's warped log-probs [B, K, γ+1, V] and the drafts'
    probabilities q [B, K, γ, V] (fp32; one-hot at the drafted tokens when greedy or deterministic)."""
    batch, paths, gamma = draft_tokens.shape
    vocab = target_logits.shape[-1]
    log_p = warp_logits(target_logits, params)
    tokens = draft_tokens.long()
    if params.greedy:
        return log_p, torch.nn.functional.one_hot(tokens, vocab).float()     # the argmax is all that counts
    flat = None if draft_logits is None else draft_logits.flatten(0, 1)
    q = draft_log_probs(flat, tokens.flatten(0, 1), params, vocab, draft_is_log_probs)
    return log_p, q.view(batch, paths, gamma, vocab).exp()


def verify_paths_reference(target_logits: torch.Tensor, draft_logits: torch.Tensor | None,
                           draft_tokens: torch.Tensor, params: SamplingParams, key: rng.Key | torch.Tensor,
                           draft_is_log_probs: bool = False) -> PathsOutput:
    """`verify_paths` without checks, drawing from `key`: uniform (row, depth, path) of the accept stream decides
    path k's test at a depth; the residual or bonus token races on the sample stream at (row, depth)."""
    batch, paths, gamma = draft_tokens.shape
    device = target_logits.device
    tokens_in = draft_tokens.long()
    rows = torch.arange(batch, device=device)
    log_p, q = paths_inputs(target_logits, draft_logits, draft_tokens, params, draft_is_log_probs)
    uniforms = rng.uniforms(key, rng.STREAM_ACCEPT, batch, gamma, paths, device=device)  # [B, γ, K]
    active = torch.ones(batch, paths, dtype=torch.bool, device=device)
    open_rows = torch.ones(batch, dtype=torch.bool, device=device)               # every depth so far accepted
    num_accepted = torch.zeros(batch, dtype=torch.long, device=device)
    out = torch.full((batch, gamma + 1), -1, dtype=torch.long, device=device)
    emitted = torch.zeros(batch, dtype=torch.long, device=device)
    for depth in range(gamma + 1):
        lead = active.long().argmax(dim=1)                                        # the node's first path
        p_node = log_p[rows, lead, depth].exp()                                   # [B, V]
        if depth == gamma:
            break
        residual = p_node.clone()
        taken = torch.zeros(batch, dtype=torch.bool, device=device)
        chosen = torch.zeros(batch, dtype=torch.long, device=device)
        for path in range(paths):
            trying = open_rows & ~taken & active[:, path]
            x = tokens_in[:, path, depth]
            q_path = q[:, path, depth]                                            # [B, V]
            r_x, q_x = residual.gather(1, x[:, None])[:, 0], q_path.gather(1, x[:, None])[:, 0]
            accept = trying & (uniforms[:, depth, path] * q_x <= r_x) & (r_x > 0)
            chosen = torch.where(accept, x, chosen)
            taken |= accept
            rejected = trying & ~accept
            residual = torch.where(rejected[:, None], residual_after_rejection(residual, q_path), residual)
        finished = open_rows & ~taken
        emitted = torch.where(finished, _race(residual, key, depth), emitted)
        num_accepted = torch.where(finished, depth, num_accepted)
        out[:, depth] = torch.where(open_rows & taken, chosen, out[:, depth])
        active &= tokens_in[:, :, depth] == chosen[:, None]
        open_rows &= taken
    num_accepted = torch.where(open_rows, gamma, num_accepted)
    emitted = torch.where(open_rows, _race(p_node, key, gamma), emitted)
    positions = torch.arange(gamma + 1, device=device).view(1, gamma + 1)
    out = torch.where(positions < num_accepted[:, None], out, -1)
    out[rows, num_accepted] = emitted
    path = torch.where(open_rows, lead, _first_path(tokens_in, out, num_accepted))
    return PathsOutput(tokens=out, num_accepted=num_accepted, path=path)


def residual_after_rejection(residual: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalise((r - q)^+) per row [B, V]: what is left of r once a token drawn from q was rejected. Where
    (r - q)^+ has no mass, a rejection had probability 0 and r is returned."""
    leftover = (residual - q).clamp(min=0.0)
    mass = leftover.sum(dim=1, keepdim=True)
    return torch.where(mass > 0, leftover / mass.clamp(min=torch.finfo(mass.dtype).tiny), residual)


def _race(weights: torch.Tensor, key: rng.Key | torch.Tensor, depth: int) -> torch.Tensor:
    """A token of normalise(weights) [B, V], raced on the sample stream at (row, depth)."""
    batch = weights.shape[0]
    rows = torch.arange(batch, device=weights.device).view(batch, 1)
    base = rng.base_hash(key, rng.STREAM_SAMPLE, rows, torch.full_like(rows, depth))
    token, _ = block_race(weights, weights.log(), base)
    return token


def _first_path(tokens: torch.Tensor, out: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """Per row, the first path whose first `num_accepted` tokens are the accepted ones."""
    gamma = tokens.shape[2]
    positions = torch.arange(gamma, device=tokens.device).view(1, 1, gamma)
    agrees = (tokens == out[:, None, :gamma]) | (positions >= num_accepted.view(-1, 1, 1))
    return agrees.all(dim=2).long().argmax(dim=1)
