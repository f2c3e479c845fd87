"""How the zoo trains: its tokenizer, its models, and the plan that trains the target and every draft.

`training_plan` lists the models of a zoo in training order (the target and the generalist on the mixture of
all domains, then one specialist per domain fine-tuned from the generalist, or trained from scratch for the
comparison in ``results/zoo_design``); `train_plan` carries a plan out.  The build and the design sweeps
(`experiments/zoo_design.py`) both train through them.
"""
from __future__ import annotations

import copy
import contextlib
import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from flashspec import models
from flashspec_lab import corpora
from flashspec_lab.zoo.cache import say
from flashspec_lab.zoo.config import GENERALIST, SPECIAL_TOKENS, ModelSpec, ZooConfig, component_seed


def train_tokenizer(texts: list[str], vocab_size: int) -> "transformers.PreTrainedTokenizerFast":  # noqa: F821
    """Byte-level BPE (every byte representable, no unknown token) wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise ValueError(f"vocab_size must exceed the 256 byte symbols plus specials, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def encode_text(tokenizer: Any, text: str, chunk_chars: int = 200_000) -> torch.Tensor:
    """Token ids of a long text (LongTensor [N]), encoded in document-aligned chunks, in parallel."""
    documents = text.split(corpora.DOCUMENT_SEPARATOR)
    chunks, current, size = [], [], 0
    for document in documents:
        current.append(document)
        size += len(document)
        if size >= chunk_chars:
            chunks.append(corpora.DOCUMENT_SEPARATOR.join(current))
            current, size = [], 0
    if current:
        chunks.append(corpora.DOCUMENT_SEPARATOR.join(current))
    encoded = tokenizer.backend_tokenizer.encode_batch(chunks, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for piece in encoded:
        ids.extend(piece.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def make_model(spec: ModelSpec, config: ZooConfig, tokenizer: Any, seed: int) -> torch.nn.Module:
    """A freshly initialised LlamaForCausalLM of shape `spec` (weights fixed by `seed`), on the CPU, in float32."""
    from transformers import LlamaConfig

    llama_config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads, max_position_embeddings=max(2048, 4 * config.context),
        tie_word_embeddings=spec.tie_embeddings, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return models.model_from_config(llama_config, seed=seed)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def weights_sha256(model: torch.nn.Module) -> str:
    """SHA-256 over the state dict (sorted names, float32 bytes): equal hashes mean identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def sample_batch(streams: list[torch.Tensor], batch_size: int, context: int,
                 generator: torch.Generator) -> torch.Tensor:
    """[batch, context+1] random windows; row i comes from stream i mod len(streams) (a balanced mixture)."""
    rows = []
    for row in range(batch_size):
        stream = streams[row % len(streams)]
        start = int(torch.randint(0, stream.numel() - context - 1, (1,), generator=generator))
        rows.append(stream[start:start + context + 1])
    return torch.stack(rows)


def learning_rate(step: int, total: int, peak: float, warmup_fraction: float) -> float:
    """Linear warm-up then cosine decay to a tenth of the peak."""
    warmup = max(1, int(total * warmup_fraction))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def next_token_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's next-token predictions on [B, context + 1] windows."""
    logits = model(input_ids=batch[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def train_model(model: torch.nn.Module, streams: list[torch.Tensor], steps: int, config: ZooConfig,
                peak_lr: float, seed: int, device: torch.device, desc: str, progress: bool = True,
                batch_size: int | None = None,
                loss: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] = next_token_loss) -> list[float]:
    """Train the model's trainable parameters on random windows of `streams` (a balanced mixture) to
    minimise `loss(model, window batch)` (default: next-token cross-entropy) with AdamW, warm-up then
    cosine; bf16 autocast on a GPU that computes bf16 (fp32 on older ones). Returns the loss of every step."""
    from tqdm.auto import tqdm

    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]  # frozen ones get no gradient: AdamW skips them
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=peak_lr, betas=(0.9, 0.95), eps=1e-8, fused=True,
    )
    generator = torch.Generator().manual_seed(seed)
    # bf16 autocast where the GPU computes bf16; fp32 where it would be emulated (a T4: fp16 would need loss scaling)
    bf16 = device.type == "cuda" and models.half_dtype(device) == torch.bfloat16
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    losses = []
    bar = tqdm(range(steps), desc=desc, disable=not progress, mininterval=1.0, leave=False)
    for step in bar:
        batch = sample_batch(streams, batch_size or config.batch_size, config.context, generator).to(device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak_lr, config.warmup_fraction)
        with autocast:
            value = loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(value.detach()))
        if step % 20 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    model.eval()
    return losses


@dataclass(frozen=True)
class PlanStep:
    """One model of a zoo: its name, shape, training domains and budget, and the model it starts from
    (None: a fresh initialisation seeded from the name)."""

    name: str
    spec: ModelSpec
    domains: tuple[str, ...]
    steps: int
    lr: float
    batch_size: int
    start_from: str | None = None


def training_plan(config: ZooConfig, specialists_from: str | None = f"draft-{GENERALIST}") -> list[PlanStep]:
    """The zoo's models in training order: target, generalist draft, then one specialist per domain.

    Specialists start from the trained generalist (`specialists_from`, the zoo's recipe) or, with None, from a
    fresh initialisation trained on their domain for the generalist's budget (the recipe it replaced).
    """
    generalist = f"draft-{GENERALIST}"
    plan = [PlanStep("target", config.target, tuple(config.domains), config.target_steps, config.target_lr,
                     config.batch_size),
            PlanStep(generalist, config.draft, tuple(config.domains), config.draft_steps, config.draft_lr,
                     config.draft_batch_size)]
    for domain in config.domains:
        if specialists_from is None:
            plan.append(PlanStep(f"draft-{domain}", config.draft, (domain,), config.draft_steps, config.draft_lr,
                                 config.draft_batch_size))
        else:
            plan.append(PlanStep(f"draft-{domain}", config.draft, (domain,), config.specialist_steps,
                                 config.specialist_lr, config.draft_batch_size, specialists_from))
    return plan


def train_plan(plan: list[PlanStep], config: ZooConfig, tokenizer: Any, train_ids: dict[str, torch.Tensor],
               device: torch.device, progress: bool = True,
               trained: dict[str, torch.nn.Module] | None = None,
               start: Callable[[PlanStep], torch.nn.Module] | None = None,
               loss: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] = next_token_loss,
               ) -> Iterator[tuple[PlanStep, torch.nn.Module, list[float]]]:
    """Train the plan's models in order; yields (step, model on the CPU, losses) after each one.

    A model another step starts from is kept (in `trained`, which may also bring models trained elsewhere);
    the others are the caller's to keep or drop.  A step with no model to start from starts from
    `start(step)` (default: a fresh initialisation, `make_model`); `loss` is `train_model`'s.  Seeds come
    from `config.seed` and the model's name.
    """
    trained = {} if trained is None else trained
    needed = {step.start_from for step in plan if step.start_from}
    for step in plan:
        origin = f"fine-tuning {step.start_from}" if step.start_from else "training"
        say(f"flashspec zoo [{config.size}]: {origin} {step.name} on {'+'.join(step.domains)} ({step.steps} steps)",
            progress)
        if step.start_from is not None:
            model = copy.deepcopy(trained[step.start_from])
        elif start is not None:
            model = start(step)
        else:
            model = make_model(step.spec, config, tokenizer, component_seed(config.seed, "init:" + step.name))
        losses = train_model(model, [train_ids[d] for d in step.domains], step.steps, config, step.lr,
                             component_seed(config.seed, "batches:" + step.name), device, step.name, progress,
                             step.batch_size, loss)
        model.to("cpu")
        if step.name in needed:
            trained[step.name] = model
        yield step, model, losses
