"""The verification a user would write in plain PyTorch: the honest speed baseline for the kernels.

Softmax over the vocabulary, gather p and q at the drafted tokens, one `torch.rand` accept test per
candidate, and the residual (or bonus) token by `torch.multinomial`, vectorised over the batch. It has
the same semantics as `flashspec.verify` (book/design.md §1) and is exact, but draws from torch's
generator instead of the counter-based streams, so it matches `flashspec.verify` in distribution,
not token for token. `flashspec.verify(backend="torch")` stays the bit-exact oracle of the kernels;
this function is what their speed is compared against.

`sampler="race"` draws the residual / bonus token as the argmax of weights / Exp(1) noise (an exponential
race, exact) instead of `torch.multinomial`, whose input check reads a value back to the host: the form a
user would write to capture the step in a CUDA graph.
"""
from __future__ import annotations

import torch

from flashspec.sampling import SamplingParams, warp_logits
from flashspec.verify import VerifyOutput


def verify_pytorch(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    sampler: str = "multinomial",
) -> VerifyOutput:
    """Verify γ drafted tokens per row (shapes as `flashspec.verify`) with torch's own sampling.

    `generator` must live on the logits' device (None: torch's default generator). `sampler`:
    "multinomial" (torch.multinomial) or "race" (argmax of weights / Exp(1), no host sync).
    """
    if sampler not in ("multinomial", "race"):
        raise ValueError(f"sampler must be 'multinomial' or 'race', got {sampler!r}")
    batch, gamma = draft_tokens.shape
    tokens = draft_tokens.long()
    rows = torch.arange(batch, device=target_logits.device)
    p = warp_logits(target_logits, params).exp()                          # [B, γ+1, V]
    if draft_logits is None:  # deterministic proposals: q is one-hot at the drafted token
        q = torch.zeros_like(p[:, :gamma]).scatter_(-1, tokens.unsqueeze(-1), 1.0)
    else:
        q = warp_logits(draft_logits, params).exp()                       # [B, γ, V]
    p_x = p[:, :gamma].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)     # [B, γ]
    q_x = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    u = torch.rand((batch, gamma), generator=generator, device=p.device)
    accepted = u * q_x < p_x                                              # u < p/q without dividing by q
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)             # first rejection, or γ
    p_n = p[rows, num_accepted]                                           # [B, V]
    q_n = q[rows, num_accepted.clamp(max=gamma - 1)]
    weights = torch.where((num_accepted < gamma).unsqueeze(-1), (p_n - q_n).clamp(min=0), p_n)
    weights = torch.where((weights.sum(-1, keepdim=True) > 0), weights, p_n)  # empty residual: p = q, draw p
    if sampler == "race":  # P(argmax w / E = i) = w_i / sum w for E ~ Exp(1) i.i.d.
        noise = torch.empty_like(weights).exponential_(generator=generator)
        emitted = (weights / noise).argmax(dim=-1)
    else:
        emitted = torch.multinomial(weights, 1, generator=generator).squeeze(1)
    positions = torch.arange(gamma + 1, device=p.device).view(1, -1)
    out = torch.full((batch, gamma + 1), -1, dtype=torch.long, device=p.device)
    out[:, :gamma] = torch.where(positions[:, :gamma] < num_accepted.view(-1, 1), tokens, -1)
    out[rows, num_accepted] = emitted
    return VerifyOutput(tokens=out, num_accepted=num_accepted)
