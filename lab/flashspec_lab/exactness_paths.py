"""The exactness harness for multi-path verification (`flashspec.paths`): every draft of the pool drafts its
chain each step, `samples` chains per draft, and all of them are verified together; the joint law of the first
tokens is then tested against enumeration as for one chain (`flashspec_lab.exactness`).

The negative controls are the ways of getting it almost right: testing every sibling against the node's target
distribution unchanged (no residual after a rejection), and choosing the paths from what they drafted (keeping only
the path whose first token the target likes most, or trying the paths in the order of the target's liking). Not
among them: treating sampled siblings as certain (q one-hot), which is exact and only accepts less often
(`certain_siblings_verifier`, tested as exact).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from unittest import mock

import torch

from flashspec import paths, rng
from flashspec.paths import PathsOutput, verify_paths
from flashspec.sampling import SamplingParams, warp_logits
from flashspec_lab.exactness import LoopState, ToyModel, append_tokens, propose, score_positions

# (target logits [N, K, γ+1, V], draft logits [N, K, γ, V] or None, tokens [N, K, γ], params, seed) -> output
PathsVerifier = Callable[[torch.Tensor, "torch.Tensor | None", torch.Tensor, SamplingParams, int], PathsOutput]


BACKENDS = ("torch", "triton")


def library_paths_verifier(backend: str = "torch") -> PathsVerifier:
    """`flashspec.paths.verify_paths` on one backend in the harness's signature."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

    def run(target_logits, draft_logits, draft_tokens, params, seed):
        return verify_paths(target_logits, draft_logits, draft_tokens, params, generator=seed, backend=backend)

    return on_triton_device(run) if backend == "triton" else run


def on_triton_device(verifier: PathsVerifier) -> PathsVerifier:
    """`verifier` run on the GPU when there is one (its outputs brought back), else where the inputs are (the
    Triton interpreter runs on CPU tensors)."""
    if not torch.cuda.is_available():
        return verifier

    def run(target_logits, draft_logits, draft_tokens, params, seed):
        out = verifier(target_logits.cuda(), None if draft_logits is None else draft_logits.cuda(),
                       draft_tokens.cuda(), params, seed)
        return PathsOutput(tokens=out.tokens.cpu(), num_accepted=out.num_accepted.cpu(), path=out.path.cpu())

    return run


def sample_sequences_paths(target: ToyModel, drafts: Sequence[ToyModel], params: SamplingParams, gamma: int,
                           num_sequences: int, length: int, seed: int, verifier: PathsVerifier | None = None,
                           samples: int = 1) -> torch.Tensor:
    """`num_sequences` continuations by multi-path speculative decoding; the first `length` tokens of each.

    Each step, draft d drafts `samples` chains of γ tokens (each on its own noise), in a fixed path order
    (draft-major), the target scores every path, and `verifier` judges them together."""
    verifier = library_paths_verifier() if verifier is None else verifier
    vocab = target.vocab
    state = LoopState(prev2=torch.full((num_sequences,), vocab, dtype=torch.long),
                      prev1=torch.full((num_sequences,), vocab, dtype=torch.long),
                      count=torch.zeros(num_sequences, dtype=torch.long),
                      generated=torch.full((num_sequences, length), -1, dtype=torch.long))
    step = 0
    while bool((state.count < length).any()):
        proposals = [propose(draft, state, params, gamma, rng.Key.from_seed(rng.derive_seed(seed, step, d, s, 1)))
                     for d, draft in enumerate(drafts) for s in range(samples)]
        tokens = torch.stack([proposal.tokens for proposal in proposals], dim=1)           # [N, K, γ]
        logits = None if any(p.logits is None for p in proposals) else torch.stack(
            [proposal.logits for proposal in proposals], dim=1)
        if logits is None and not all(p.logits is None for p in proposals):
            raise ValueError("drafts must be all deterministic or all stochastic in one harness run")
        target_logits = torch.stack([score_positions(target, state, tokens[:, k]) for k in range(tokens.shape[1])],
                                    dim=1)
        out = verifier(target_logits, logits, tokens, params, rng.derive_seed(seed, step, 2))
        append_tokens(state, out.tokens, out.num_accepted)
        step += 1
    return state.generated


def certain_siblings_verifier(target_logits, draft_logits, draft_tokens, params, seed) -> PathsOutput:
    """EXACT, less efficient: sampled paths verified as if certain (q one-hot at the drafted tokens)."""
    return verify_paths(target_logits, None, draft_tokens, params, generator=seed)


def unchanged_residual_verifier(target_logits, draft_logits, draft_tokens, params, seed) -> PathsOutput:
    """BUG: every sibling tested against the node's target distribution, the residual never updated."""
    with mock.patch.object(paths, "residual_after_rejection", lambda residual, q: residual):
        return verify_paths(target_logits, draft_logits, draft_tokens, params, generator=seed)


def _first_scores(target_logits: torch.Tensor, draft_tokens: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's warped log-prob [N, K] of each path's first drafted token."""
    first = warp_logits(target_logits[:, :, 0], params)                                  # [N, K, V]
    return first.gather(2, draft_tokens[:, :, :1].long())[..., 0]


def _reorder(tensor: torch.Tensor | None, order: torch.Tensor) -> torch.Tensor | None:
    if tensor is None:
        return None
    index = order.view(*order.shape, *([1] * (tensor.dim() - 2))).expand(*order.shape, *tensor.shape[2:])
    return tensor.gather(1, index)


def best_path_verifier(target_logits, draft_logits, draft_tokens, params, seed, backend: str = "torch"
                       ) -> PathsOutput:
    """BUG: only the path whose first token the target likes most is verified (the paths chosen by their samples)."""
    order = _first_scores(target_logits, draft_tokens, params).argsort(dim=1, descending=True)[:, :1]
    return verify_paths(_reorder(target_logits, order), _reorder(draft_logits, order),
                        _reorder(draft_tokens, order), params, generator=seed, backend=backend)


def liked_first_verifier(target_logits, draft_logits, draft_tokens, params, seed, backend: str = "torch"
                         ) -> PathsOutput:
    """BUG: every path verified, but tried in the order of the target's liking for its first token."""
    order = _first_scores(target_logits, draft_tokens, params).argsort(dim=1, descending=True, stable=True)
    return verify_paths(_reorder(target_logits, order), _reorder(draft_logits, order),
                        _reorder(draft_tokens, order), params, generator=seed, backend=backend)


PATHS_NEGATIVE_CONTROLS: dict[str, PathsVerifier] = {
    "unchanged_residual": unchanged_residual_verifier,
    "best_path_only": best_path_verifier,
    "liked_path_first": liked_first_verifier,
}
# the controls that choose the paths run through either backend's verifier (the residual control patches the
# PyTorch reference's update, so it has no Triton twin)
BACKEND_CONTROLS = ("best_path_only", "liked_path_first")
