"""Drafts distilled from a pretrained target: the draft pool of a real model.

A draft for a pretrained target must share its tokenizer and imitate its distribution, and untrained cuts
of the target (its first few layers plus its head) accept poorly.
The standard remedy is distillation (DistillSpec): train the draft on the target's own distributions.
Here a draft is the target's architecture cut to a few decoder layers:

- its layers start as copies of chosen target layers (`ZooConfig.draft_init_layers`, e.g. the first and
  the last), its final norm and embedding are the target's;
- the embedding (tied to the output head, as in SmolLM2) stays frozen: it is most of a small draft's
  parameters, the target already learned it, and a server can share one copy between target and drafts;
- the loss is the forward KL divergence KL(p_target || q_draft) at temperature 1 over every position of
  windows of the offline corpora, the target's logits computed on the fly (no stored teacher outputs).

After training, each draft's output temperature is fitted (`calibrate`): a draft trained by forward KL
spreads its mass to cover the target's, and dividing its logits by a fitted τ can raise the exact acceptance
Σ min(p, q) at T = 1. τ is chosen on training windows (never the held-out text the pool is measured on) from
`TEMPERATURE_GRID`, which holds τ = 1, so the fit never lowers the acceptance there, and folded into the draft's
weights (its final norm's scale): the calibrated draft is just another model, so the engine's output
distribution stays the target's.

The pool follows the zoo's recipe: a generalist distilled on the mixture of all domains, then one
specialist per domain fine-tuned from it on that domain alone.  `TEACHERS` names the targets a zoo size can
distil from: ``smollm2`` (flashspec.real's SmolLM2-135M-Instruct), ``tiny`` (a tiny random Llama with
a character tokenizer: the same code path in seconds, for tests) and ``smollm2-shape`` (SmolLM2's shapes
with random weights and the character tokenizer: step times and GPU checks without the wheel).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from flashspec import models
from flashspec.models import draft_from_teacher
from flashspec_lab.zoo.config import ZooConfig, component_seed
from flashspec_lab.zoo.training import PlanStep, sample_batch, train_model, train_plan, training_plan, weights_sha256


def _smollm2(device: torch.device) -> tuple[torch.nn.Module, Any]:
    from flashspec import real

    return real.load_real("smollm2", device=device, dtype=torch.float32)


def _tiny(device: torch.device) -> tuple[torch.nn.Module, Any]:
    tokenizer = models.char_tokenizer()
    config = models.llama_config(vocab_size=len(tokenizer), hidden_size=32, num_layers=3, num_heads=2,
                                 num_kv_heads=1, intermediate_size=64, max_positions=512, initializer_range=0.2,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=2)
    config.tie_word_embeddings = True  # like SmolLM2
    return models.model_from_config(config, seed=7, device=device), tokenizer


def _smollm2_shape(device: torch.device) -> tuple[torch.nn.Module, Any]:
    tokenizer = models.char_tokenizer()
    return models.model_from_config(models.smollm2_135m_config(), seed=7, device=device), tokenizer


GPU_TEACHERS = ("smollm2",)  # teachers whose pools take hours to distil on a CPU (minutes on one H200)

TEACHERS: dict[str, Callable[[torch.device], tuple[torch.nn.Module, Any]]] = {
    "smollm2": _smollm2, "tiny": _tiny,
    "smollm2-shape": _smollm2_shape,  # SmolLM2-135M's shapes, random weights: timings and GPU checks, no wheel
}


def load_teacher(name: str, device: str | torch.device) -> tuple[torch.nn.Module, Any]:
    """(model in float32, eval mode, on `device`; tokenizer) of a teacher named in TEACHERS."""
    if name not in TEACHERS:
        raise ValueError(f"teacher must be one of {sorted(TEACHERS)}, got {name!r}")
    model, tokenizer = TEACHERS[name](torch.device(device))
    return model.eval(), tokenizer


def teacher_record(name: str) -> dict[str, Any]:
    """What identifies a teacher's weights, for the manifest."""
    if name == "smollm2":
        from flashspec import real

        spec = real.REAL_MODELS["smollm2"]
        return {"teacher": name, "weights": spec.weights, "source": spec.requirement, "gguf_sha256": spec.sha256}
    return {"teacher": name, "weights": f"random, seed 7 (flashspec_lab.zoo.distill.TEACHERS[{name!r}])"}


def init_layers(config: ZooConfig, teacher_layers: int) -> tuple[int, ...]:
    """The teacher layers the drafts' layers start from: the config's, else spread evenly over depth."""
    depth = config.draft.num_layers
    chosen = config.draft_init_layers or tuple(round(i * (teacher_layers - 1) / max(1, depth - 1))
                                               for i in range(depth))
    if len(chosen) != depth or not all(0 <= layer < teacher_layers for layer in chosen):
        raise ValueError(f"draft_init_layers must name {depth} of the teacher's layers 0..{teacher_layers - 1}, "
                         f"got {chosen}")
    return tuple(chosen)


def forward_kl(teacher_logits: torch.Tensor, draft_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(softmax(teacher) || softmax(draft)), in float32 ([..., V] logits)."""
    vocab = teacher_logits.shape[-1]
    log_p = torch.log_softmax(teacher_logits.float().reshape(-1, vocab), dim=-1)
    log_q = torch.log_softmax(draft_logits.float().reshape(-1, vocab), dim=-1)
    return torch.nn.functional.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def kl_to(teacher: torch.nn.Module) -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    """`training.train_model`'s loss for distilling from `teacher`: `forward_kl` of the model's logits
    against the teacher's (computed without gradients) on the windows' inputs."""
    def loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        inputs = batch[:, :-1]
        with torch.no_grad():
            teacher_logits = teacher(input_ids=inputs).logits
        return forward_kl(teacher_logits, model(input_ids=inputs).logits)

    return loss


def distill_model(draft: torch.nn.Module, teacher: torch.nn.Module, streams: list[torch.Tensor], steps: int,
                  config: ZooConfig, peak_lr: float, seed: int, device: torch.device, desc: str,
                  progress: bool = True) -> list[float]:
    """Train `draft`'s trainable parameters to minimise `forward_kl` against `teacher` on random windows of
    `streams` (`training.train_model`'s loop and schedule, the draft batch size). Returns the loss per step."""
    teacher.to(device).eval()
    return train_model(draft, streams, steps, config, peak_lr, seed, device, desc, progress, config.draft_batch_size,
                       loss=kl_to(teacher))


def seconds_per_step(config: ZooConfig, teacher: torch.nn.Module, device: torch.device, steps: int = 8,
                     features: bool = False) -> float:
    """Measured seconds of one distillation step at `config`'s shapes (random token windows, after two
    warm-up steps) of a token draft or, with `features`, of the feature draft (`distill_features`'s loss), for
    fitting a build into a time budget (`steps_for_budget`). Each timed run builds a fresh draft and optimiser,
    so the result is the difference of a run of 2 × `steps` and one of `steps`, divided by `steps`: the fixed
    cost of a run cancels (counted whole in one short run, it overstates a step)."""
    vocab = teacher.config.vocab_size
    ids = [torch.randint(0, vocab, (config.draft_batch_size * (config.context + 1) * 4,),
                         generator=torch.Generator().manual_seed(0))]

    def train(count: int, desc: str) -> None:
        if features:
            from flashspec.features import FeatureDraft

            draft = FeatureDraft.from_target(teacher, (teacher.config.num_hidden_layers - 1,), config.feature_layers)
            teacher.to(device).eval()
            train_model(draft, ids, count, config, config.draft_lr, 0, device, desc, False, config.draft_batch_size,
                        loss=feature_loss(teacher, config.feature_layers, config.feature_depths))
        else:
            draft = draft_from_teacher(teacher, init_layers(config, teacher.config.num_hidden_layers))
            distill_model(draft, teacher, ids, count, config, config.draft_lr, 0, device, desc, progress=False)

    def timed(count: int) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        train(count, "timing")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    train(2, "warm-up")
    short = timed(steps)
    return max(timed(2 * steps) - short, 0.0) / steps or short / steps  # noise can make the difference ≤ 0


def steps_for_budget(config: ZooConfig, step_seconds: float, budget_seconds: float,
                     feature_step_seconds: float = 0.0) -> ZooConfig:
    """`config` with its generalist, specialist and feature-draft steps scaled together (same proportion,
    multiples of 50) so that the whole pool trains in about `budget_seconds` at `step_seconds` per token-draft
    step and `feature_step_seconds` per feature-draft step."""
    total = (step_seconds * (config.draft_steps + len(config.domains) * config.specialist_steps)
             + feature_step_seconds * config.feature_steps)
    scale = budget_seconds / total
    names = ("draft_steps", "specialist_steps", *(("feature_steps",) if config.feature_steps else ()))
    rounded = {name: max(50, int(getattr(config, name) * scale) // 50 * 50) for name in names}
    return config.with_overrides(**rounded)


def distill_plan(config: ZooConfig) -> list[PlanStep]:
    """The pool in training order: the zoo's plan without its target (the teacher is the target): the
    generalist on every domain, then one specialist per domain fine-tuned from it."""
    return [step for step in training_plan(config) if step.name != "target"]


def distill_pool(config: ZooConfig, teacher: torch.nn.Module, train_ids: dict[str, torch.Tensor],
                 device: torch.device, progress: bool = True) -> Iterator[tuple[PlanStep, torch.nn.Module, list[float]]]:
    """Distil the plan's drafts in order (`training.train_plan`, the generalist starting from the teacher's
    `init_layers`); yields (step, draft on the CPU, losses) after each one."""
    if config.teacher is None:
        raise ValueError("distill_pool needs a config with a teacher (e.g. size 'smollm2')")
    layers = init_layers(config, teacher.config.num_hidden_layers)
    teacher.to(device).eval()
    return train_plan(distill_plan(config), config, None, train_ids, device, progress,
                      start=lambda step: draft_from_teacher(teacher, layers), loss=kl_to(teacher))


TEMPERATURE_GRID = tuple(round(0.5 + 0.05 * i, 2) for i in range(21))  # 0.5, 0.55, ..., 1.5 (1.0 included)


@torch.no_grad()
def overlap_by_temperature(teacher: torch.nn.Module, draft: torch.nn.Module, windows: torch.Tensor,
                           temperatures: tuple[float, ...], device: torch.device,
                           batch_size: int = 16) -> dict[float, float]:
    """τ -> mean over the [N, C] windows' positions of Σ_v min(p_v, q_τ,v), p the teacher's softmax at T = 1
    and q_τ = softmax(draft logits / τ): the exact acceptance at T = 1 of the draft with its logits divided by τ.
    A feature draft (`flashspec.features.FeatureDraft`) reads the teacher's states: its first drafted token's."""
    from flashspec.features import FeatureDraft, previous_states, target_states

    totals = dict.fromkeys(temperatures, 0.0)
    count = 0
    teacher.to(device).eval()
    draft = draft.to(device).eval()
    for start in range(0, windows.shape[0], batch_size):
        batch = windows[start:start + batch_size].to(device)
        if isinstance(draft, FeatureDraft):
            states, teacher_logits = target_states(teacher, batch, draft.feature_layers)
            logits = draft(batch, previous_states(states))[1].float()
        else:
            teacher_logits, logits = teacher(input_ids=batch).logits, draft(input_ids=batch).logits.float()
        p = torch.softmax(teacher_logits.float(), dim=-1)
        for temperature in temperatures:
            totals[temperature] += float(torch.minimum(p, torch.softmax(logits / temperature, dim=-1)).sum())
        count += batch.numel()
    draft.to("cpu")
    return {temperature: total / count for temperature, total in totals.items()}


def foldable(draft: torch.nn.Module) -> bool:
    """Whether `fold_temperature` can fold a temperature into `draft`: any token draft, and a feature draft
    with a `reduce` map (two or more target states) to take the compensating 1/τ."""
    from flashspec.features import FeatureDraft

    return not isinstance(draft, FeatureDraft) or isinstance(draft.reduce, torch.nn.Linear)


def fold_temperature(draft: torch.nn.Module, temperature: float) -> torch.nn.Module:
    """A copy of `draft` whose logits are its own divided by `temperature`: its final RMSNorm's weight scaled
    by 1/τ (the head is linear in it, and the tied embedding is left as it is).

    A feature draft feeds that normed state back as its next input, in place of its reduced target states,
    through the same columns of `fc`: those columns are scaled by τ and the `reduce` map by 1/τ, so every
    depth's input is what it was and only the logits change."""
    from flashspec.features import FeatureDraft

    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not foldable(draft):
        raise ValueError("a feature draft's temperature folds into its reduce map: it needs two or more "
                         f"feature_layers, got {draft.feature_layers}")
    scaled = copy.deepcopy(draft)
    with torch.no_grad():
        if isinstance(scaled, FeatureDraft):
            hidden = scaled.body.config.hidden_size
            scaled.body.model.norm.weight.div_(temperature)
            scaled.reduce.weight.div_(temperature)
            scaled.fc.weight[:, hidden:].mul_(temperature)
        else:
            scaled.model.norm.weight.div_(temperature)
    return scaled


def calibrate(draft: torch.nn.Module, teacher: torch.nn.Module, streams: list[torch.Tensor], config: ZooConfig,
              device: torch.device, label: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(`draft` with its fitted temperature folded in, the fit's record): τ from `TEMPERATURE_GRID` with the
    largest `overlap_by_temperature` on `config.calibration_tokens` tokens of random training windows of
    `streams` (seeded by `label`); the smallest such τ on a tie. The draft passed in is left as it is."""
    started = time.perf_counter()
    count = max(1, config.calibration_tokens // config.context)
    generator = torch.Generator().manual_seed(component_seed(config.seed, "calibrate:" + label))
    windows = sample_batch(streams, count, config.context, generator)[:, :-1]
    table = overlap_by_temperature(teacher, draft, windows, TEMPERATURE_GRID, device)
    best = max(TEMPERATURE_GRID, key=lambda temperature: (table[temperature], -temperature))
    record = {"temperature": best, "sum_min_t1_by_temperature": {str(t): v for t, v in table.items()},
              "calibration_tokens": int(windows.numel()), "uncalibrated_weights_sha256": weights_sha256(draft),
              "seconds": time.perf_counter() - started}
    return fold_temperature(draft, best), record


FEATURE_DRAFT = "draft-features"  # the zoo's folder and model name of its feature draft


def feature_loss(teacher: torch.nn.Module, feature_layers: tuple[int, ...], depths: int,
                 noise: float = 0.2) -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    """`training.train_model`'s loss for a `flashspec.features.FeatureDraft`: `forward_kl` against the teacher,
    summed over depths 1..`depths` unrolled as a real step sees them (`features.unroll`, exact regime), the
    teacher's states (with uniform noise of width `noise` at depth 1) and logits computed on the fly."""
    from flashspec import features

    def loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        tokens = batch[:, :-1]
        states, logits = features.target_states(teacher, tokens, feature_layers)
        unrolled = features.unroll(model, tokens, states, depths, "exact", noise)
        return unrolled_kl(logits, unrolled)

    return loss


def unrolled_kl(logits: torch.Tensor, unrolled: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """`forward_kl` of the teacher's [B, C, V] logits against each depth k of `features.unroll`, summed."""
    return sum(forward_kl(logits[:, k:], out) for k, (_, out) in enumerate(unrolled, start=1))


def distill_features(config: ZooConfig, teacher: torch.nn.Module, train_ids: dict[str, torch.Tensor],
                     device: torch.device, progress: bool = True) -> tuple[torch.nn.Module, list[float]]:
    """The zoo's feature draft: one decoder layer started from the teacher's last, fed its states at
    `config.feature_layers`, trained `config.feature_steps` steps on every domain by `feature_loss`
    (`config.feature_depths` deep; the generalist's learning rate and batch). Returns (draft on the CPU, losses)."""
    from flashspec.features import FeatureDraft

    if not config.feature_steps or not config.feature_layers:
        raise ValueError("distill_features needs a config with feature_layers and feature_steps > 0")
    torch.manual_seed(component_seed(config.seed, "init:" + FEATURE_DRAFT))
    draft = FeatureDraft.from_target(teacher, (teacher.config.num_hidden_layers - 1,), config.feature_layers)
    teacher.to(device).eval()
    losses = train_model(draft, [train_ids[d] for d in config.domains], config.feature_steps, config,
                         config.draft_lr, component_seed(config.seed, "batches:" + FEATURE_DRAFT), device,
                         FEATURE_DRAFT, progress, config.draft_batch_size,
                         loss=feature_loss(teacher, config.feature_layers, config.feature_depths))
    return draft.to("cpu").eval(), losses
