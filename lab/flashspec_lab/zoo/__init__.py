"""Offline model zoo: a byte-level BPE tokenizer, a Llama target and domain-specialised drafts, trained here.

No machine the project runs on can download weights, and random-init models give meaningless acceptance
rates, so the zoo trains its own family from the offline corpora of `flashspec_lab.corpora`:

- a tokenizer (byte-level BPE, `tokenizers`) saved as a transformers fast tokenizer;
- a target `LlamaForCausalLM`, the largest model, trained longest on the mixture of all domains;
- a generalist draft trained on the same mixture, and one specialist draft per domain made the way
  domain models usually are: the generalist's weights fine-tuned on that domain alone -- every draft
  several times smaller than the target.

Why fine-tuned and not trained from scratch: with the text these machines have (about a million tokens
per domain), a specialist trained from scratch for the generalist's budget sees its domain for several
epochs and ends up *no better* than the equal-size generalist on it, which learns from three times as
much text (measured on both sizes: margins from -0.12 to +0.09 in Σ min(p, q), results/zoo_design/).  A
specialist that starts from the generalist keeps what transfers and spends its fine-tuning steps on its
domain, which is the comparison that matters to a server choosing drafts: is a domain fine-tune worth
serving next to the base draft?

Two sizes: ``cpu`` (vocabulary 2048, builds in minutes on 2 CPU cores; tests, notebooks and CI use it)
and ``gpu`` (vocabulary 32000 like Llama-2/TinyLlama, builds in minutes on one H200; benchmarks).
Builds are deterministic given the seed and cached under ``$FLASHSPEC_CACHE/zoo/<key>`` (default
``~/.cache/flashspec/zoo/<key>``), the key hashing the config and the corpus SHA-256.  Every model
folder is a plain ``save_pretrained`` folder (config, safetensors, tokenizer) that
``from_pretrained`` loads, exactly like a hub checkpoint.

The modules, in the order a build uses them: `config` (sizes), `cache` (the cache folder), `training`
(tokenizer, models, training plan), `build`, `load` (manifest checks, cache lookup, `load_zoo`) and
`measure` (perplexity and acceptance).  The command line, ``flashspec zoo ...``, is `experiments/zoo.py`.
"""
from flashspec_lab.zoo.build import HELDOUT, MANIFEST, PROMPTS, build_zoo, prompt_windows
from flashspec_lab.zoo.cache import (
    CACHE_ENV,
    STALE_BUILD_SECONDS,
    ZooCacheError,
    ZooCacheWarning,
    cache_path,
    cache_root,
    check_cache_root,
)
from flashspec_lab.zoo.config import (
    GENERALIST,
    SIZES,
    ZOO_FORMAT,
    ModelSpec,
    ZooConfig,
    component_seed,
    draft_names,
    get_config,
)
from flashspec_lab.zoo.load import Zoo, check_zoo_dir, load_zoo, zoo_dir
from flashspec_lab.zoo.measure import (
    engine_acceptance,
    engine_acceptance_matrix,
    expected_acceptance,
    expected_acceptance_matrix,
    get_model,
    heldout_windows,
    model_names,
    perplexity,
    perplexity_table,
    prompt_batch,
    specialisation_margins,
)
from flashspec_lab.zoo.training import (
    PlanStep,
    count_parameters,
    encode_text,
    learning_rate,
    make_model,
    sample_batch,
    train_model,
    train_plan,
    train_tokenizer,
    training_plan,
    weights_sha256,
)

__all__ = [
    "CACHE_ENV", "GENERALIST", "HELDOUT", "MANIFEST", "PROMPTS", "SIZES", "STALE_BUILD_SECONDS", "ZOO_FORMAT",
    "ModelSpec", "PlanStep", "Zoo", "ZooCacheError", "ZooCacheWarning", "ZooConfig",
    "build_zoo", "cache_path", "cache_root", "check_cache_root", "check_zoo_dir", "component_seed",
    "count_parameters", "draft_names", "encode_text", "engine_acceptance", "engine_acceptance_matrix",
    "expected_acceptance", "expected_acceptance_matrix", "get_config", "get_model", "heldout_windows",
    "learning_rate", "load_zoo", "make_model", "model_names", "perplexity", "perplexity_table", "prompt_batch",
    "prompt_windows", "sample_batch", "specialisation_margins", "train_model", "train_plan", "train_tokenizer",
    "training_plan", "weights_sha256", "zoo_dir",
]
