"""Measurements on a zoo: held-out perplexity, exact teacher-forced acceptance, engine-measured acceptance.

The exact per-token acceptance of speculative sampling at temperature T on held-out text is the mean over
positions of Σ_v min(p_v, q_v); the engine measures the same α from its steps (`flashspec.stats`), with
sampling noise.  `specialisation_margins` says how far each specialist beats the best other draft.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from flashspec_lab.zoo.load import Zoo

def model_names(zoo: Zoo) -> list[str]:
    """"target" then the drafts in zoo order (specialists by domain, then the generalist)."""
    return ["target", *zoo.drafts]


def get_model(zoo: Zoo, name: str) -> torch.nn.Module:
    if name == "target":
        return zoo.target
    if name not in zoo.drafts:
        raise ValueError(f"model name must be 'target' or one of {list(zoo.drafts)}, got {name!r}")
    return zoo.drafts[name]


def heldout_windows(ids: torch.Tensor, context: int, max_tokens: int) -> torch.Tensor:
    """Non-overlapping [N, context + 1] windows covering up to `max_tokens` predicted tokens."""
    count = min(max_tokens // context, (ids.numel() - 1) // context)
    if count < 1:
        raise ValueError(f"held-out ids ({ids.numel()}) shorter than one window of {context + 1}")
    return torch.stack([ids[i * context:i * context + context + 1] for i in range(count)])


@torch.no_grad()
def _window_logits(model: torch.nn.Module, windows: torch.Tensor, batch_size: int,
                   target: torch.nn.Module | None = None) -> list[torch.Tensor]:
    """The model's logits on each batch of windows (inputs: all but the last token). A feature draft
    (`flashspec.features`) reads `target`'s states at the position before, zeros before the first, as on the
    fast path."""
    from flashspec.features import FeatureDraft, previous_states, target_states

    device = next(model.parameters()).device
    out = []
    for i in range(0, windows.shape[0], batch_size):
        tokens = windows[i:i + batch_size, :-1].to(device)
        if not isinstance(model, FeatureDraft):
            out.append(model(input_ids=tokens).logits.float())
            continue
        if target is None:
            raise ValueError("a feature draft's logits need the target whose states it reads")
        states, _ = target_states(target, tokens, model.feature_layers)
        out.append(model(tokens, previous_states(states))[1].float())
    return out


@torch.no_grad()
def perplexity(model: torch.nn.Module, ids: torch.Tensor, context: int, max_tokens: int,
               batch_size: int = 16, target: torch.nn.Module | None = None) -> float:
    """exp(mean next-token negative log-likelihood) on held-out windows (`target`: whose states a feature
    draft reads)."""
    windows = heldout_windows(ids, context, max_tokens)
    total, count = 0.0, 0
    for start, logits in zip(range(0, windows.shape[0], batch_size),
                             _window_logits(model, windows, batch_size, target)):
        labels = windows[start:start + batch_size, 1:].to(logits.device)
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                         reduction="sum"))
        count += labels.numel()
    return math.exp(total / count)


def perplexity_table(zoo: Zoo, max_tokens: int | None = None,
                     models: dict[str, torch.nn.Module] | None = None) -> dict[str, dict[str, float]]:
    """Held-out perplexity, model name -> domain -> perplexity, of the zoo's models (or of `models`)."""
    config = zoo.manifest["config"]
    budget = config["eval_tokens"] if max_tokens is None else max_tokens
    models = {name: get_model(zoo, name) for name in model_names(zoo)} if models is None else models
    return {name: {d: perplexity(model, zoo.heldout[d], config["context"], budget, target=zoo.target)
                   for d in zoo.domains} for name, model in models.items()}


@torch.no_grad()
def expected_acceptance(target: torch.nn.Module, draft: torch.nn.Module, ids: torch.Tensor, context: int,
                        max_tokens: int, temperature: float = 1.0, batch_size: int = 16) -> float:
    """Mean over held-out positions of Σ_v min(p_v, q_v): the exact per-token acceptance probability of
    speculative sampling at temperature T on teacher-forced text (no sampling noise)."""
    from flashspec.sampling import SamplingParams, warp_logits

    params = SamplingParams(temperature=temperature)
    windows = heldout_windows(ids, context, max_tokens)
    total, count = 0.0, 0
    for target_logits, draft_logits in zip(_window_logits(target, windows, batch_size),
                                           _window_logits(draft, windows, batch_size, target)):
        p = warp_logits(target_logits, params).exp()
        q = warp_logits(draft_logits.to(p.device), params).exp()
        overlap = torch.minimum(p, q).sum(dim=-1)
        total += float(overlap.sum())
        count += overlap.numel()
    return total / count


def expected_acceptance_matrix(zoo: Zoo, max_tokens: int | None = None,
                               drafts: dict[str, torch.nn.Module] | None = None,
                               temperature: float = 1.0) -> dict[str, dict[str, float]]:
    """Draft name -> domain -> mean Σ min(p, q) at `temperature` (0: argmax agreement) on held-out text, of the
    zoo's drafts (or `drafts`)."""
    config = zoo.manifest["config"]
    budget = config["eval_tokens"] if max_tokens is None else max_tokens
    drafts = zoo.drafts if drafts is None else drafts
    return {name: {d: expected_acceptance(zoo.target, draft, zoo.heldout[d], config["context"], budget, temperature)
                   for d in zoo.domains} for name, draft in drafts.items()}


def prompt_batch(zoo: Zoo, domain: str, num_prompts: int | None = None) -> torch.Tensor:
    """The held-out prompts of one domain as a LongTensor [P, prompt_tokens] (equal lengths, no padding)."""
    prompts = zoo.prompts[domain][:num_prompts] if num_prompts else zoo.prompts[domain]
    return torch.tensor(prompts, dtype=torch.long)


def engine_acceptance(zoo: Zoo, draft_name: str, domain: str, gamma: int = 4, max_new_tokens: int = 48,
                      num_prompts: int | None = None, seed: int = 0, temperature: float = 1.0,
                      backend: str = "auto") -> dict[str, Any]:
    """Speculative generation with one fixed draft on a domain's prompts (batched), via the engine.

    Returns the engine's summary (`flashspec.stats`): mean_acceptance (accepted / drafted), token_acceptance
    (per-token α), mean_accepted_length, tokens/s...
    """
    from flashspec.drafters import ModelDrafter
    from flashspec.engine import SpeculativeDecoder
    from flashspec.sampling import SamplingParams

    decoder = SpeculativeDecoder(zoo.target, drafts=[ModelDrafter(get_model(zoo, draft_name), name=draft_name)],
                                 policy="fixed", gamma=gamma, policy_kwargs={"arm": 0}, backend=backend)
    input_ids = prompt_batch(zoo, domain, num_prompts).to(decoder.device)
    result = decoder.generate(input_ids, max_new_tokens=max_new_tokens,
                              sampling=SamplingParams(temperature=temperature), seed=seed, ignore_eos=True,
                              timing=True)
    summary = result.stats.summary()
    return {key: summary.get(key) for key in ("mean_acceptance", "mean_accepted_length", "mean_tokens_per_step",
                                              "tokens_per_s", "generated_tokens", "steps", "batch_size",
                                              "token_acceptance")}


def engine_acceptance_matrix(zoo: Zoo, gamma: int = 4, max_new_tokens: int = 48, num_prompts: int | None = None,
                             seed: int = 0, progress: bool = True,
                             backend: str = "auto") -> dict[str, dict[str, dict[str, Any]]]:
    """Draft name -> domain -> engine summary (γ = `gamma`, T = 1)."""
    from tqdm.auto import tqdm

    cells = [(name, d) for name in zoo.drafts for d in zoo.domains]
    matrix: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in zoo.drafts}
    for name, domain in tqdm(cells, desc="acceptance matrix", disable=not progress):
        matrix[name][domain] = engine_acceptance(zoo, name, domain, gamma, max_new_tokens, num_prompts, seed,
                                                 backend=backend)
    return matrix


def specialisation_margins(acceptance: dict[str, dict[str, float]], domains: tuple[str, ...] | list[str],
                           required: float = 0.10) -> dict[str, Any]:
    """Per domain: the specialist's acceptance minus the best other draft's; pass when every margin >= `required`."""
    margins = {}
    for domain in domains:
        others = [acceptance[name][domain] for name in acceptance if name != domain]
        margins[domain] = acceptance[domain][domain] - max(others)
    return {"margins": margins, "required": required, "passed": all(m >= required for m in margins.values())}

