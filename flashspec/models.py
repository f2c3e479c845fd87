"""Loading target and draft models, building tiny ones from config, and checking that two models can
be paired (same vocabulary, same special tokens).

`load_model` keeps the real loading path (hub ids where there is internet, local folders always,
4-bit NF4 through bitsandbytes); `tiny_llama` and `char_tokenizer` build models and a tokenizer from
code so tests, the CLI default and benchmarks need no download.
"""
from __future__ import annotations

import copy
import importlib
import string
from typing import Any

import torch

DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
QUANTIZATIONS = (None, "nf4")
SPECIAL_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | str | None:
    """Turn "bf16" / "float16" / torch.float32 / "auto" / None into what `from_pretrained` takes."""
    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return DTYPE_NAMES[dtype.lower()]
    raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, 'auto', a torch.dtype or None, got {dtype!r}")


def half_dtype(device: str | torch.device | None = None) -> torch.dtype:
    """The 16-bit float a model should run in on `device` (default: the current CUDA device, else the CPU): bf16
    where the hardware computes it (CUDA compute capability >= 8.0, and CPUs), fp16 where bf16 would only be
    emulated (a T4 is 7.5). `torch.cuda.is_bf16_supported()` counts emulation and says True on a T4, so the
    capability is asked instead."""
    device = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    if device.type != "cuda":
        return torch.bfloat16
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def nf4_compute_dtype() -> torch.dtype:
    """The dtype NF4 matmuls run in: `half_dtype()` of the GPU (bf16 from Ampere on, fp16 on a T4)."""
    return half_dtype()


def load_model(
    name_or_path: str,
    dtype: str | torch.dtype | None = "auto",
    quantization: str | None = None,
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
) -> torch.nn.Module:
    """Load a Hugging Face causal LM in eval mode.

    Args:
        name_or_path: a local folder, or a hub id where the machine can reach the hub.
        dtype: "auto" (the checkpoint's), "bf16", "fp16", "fp32", a torch.dtype, or None (fp32).
        quantization: None, or "nf4" for bitsandbytes 4-bit NF4 weights (needs a CUDA GPU and
            `pip install flashspec[nf4]`); compute runs in bf16, or fp16 where bf16 is unsupported.
        device: where to put the model (default: CUDA if available, else CPU), checked before the
            checkpoint is read (`resolve_device`). Ignored for NF4, which bitsandbytes places on the
            GPU itself.
        trust_remote_code: off unless asked; only turn it on for code you have read.
    """
    from transformers import AutoModelForCausalLM

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    target_device = resolve_device(device)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    resolved = resolve_dtype(dtype)
    if quantization == "nf4":
        kwargs["quantization_config"] = nf4_config()
        kwargs["device_map"] = "auto"
        if resolved not in (None, "auto"):
            kwargs["dtype"] = resolved
    else:
        if resolved is not None:
            kwargs["dtype"] = resolved
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except OSError as error:
        raise ValueError(
            f"could not load a causal LM from {name_or_path!r}: {error}. Pass a local folder with config.json "
            "and weights, or a hub id on a machine with internet access"
        ) from error
    if quantization is None:
        model = model.to(target_device)
    return model.eval()


def nf4_config(compute_dtype: torch.dtype | None = None, require_cuda: bool = True) -> Any:
    """A BitsAndBytesConfig for 4-bit NF4 weights (double-quantised absmax); a clear error where
    bitsandbytes or a GPU is missing. `compute_dtype` is what the matmuls run in (default
    `nf4_compute_dtype()`); `require_cuda=False` lets bitsandbytes' CPU backend run it (tests)."""
    try:
        importlib.import_module("bitsandbytes")
    except ImportError as error:
        raise ValueError(
            "quantization='nf4' needs bitsandbytes: `pip install flashspec[nf4]` (CUDA GPU only)"
        ) from error
    if require_cuda and not torch.cuda.is_available():
        raise ValueError("quantization='nf4' needs a CUDA GPU (bitsandbytes 4-bit kernels); use quantization=None")
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=nf4_compute_dtype() if compute_dtype is None else compute_dtype,
        bnb_4bit_use_double_quant=True,
    )


def nf4_unavailable_reason(device: str | torch.device) -> str | None:
    """Why NF4 weights cannot run on `device` here (None when they can): bitsandbytes missing, no
    CUDA, or (on the CPU) a bitsandbytes without a working CPU 4-bit backend, found by running one
    tiny NF4 matmul."""
    device = torch.device(device)
    try:
        import bitsandbytes as bnb
    except ImportError:
        return "bitsandbytes is not installed (`pip install flashspec[nf4]`)"
    if device.type == "cuda":
        return None if torch.cuda.is_available() else "NF4 on cuda needs a CUDA GPU"
    if device.type != "cpu":
        return f"NF4 is only wired for cuda and cpu, not {device.type}"
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            dense = torch.nn.Linear(64, 8, bias=False)
        layer = bnb.nn.Linear4bit(64, 8, bias=False, compute_dtype=torch.float32, quant_type="nf4")
        layer.weight = bnb.nn.Params4bit(dense.weight.data.clone(), requires_grad=False, quant_type="nf4")
        layer = layer.to("cpu")
        probe = torch.ones(1, 64)
        with torch.no_grad():
            error = (layer(probe) - dense(probe)).abs().max().item()
        scale = dense(probe).abs().max().item()
    except Exception as failure:  # any failure inside bitsandbytes means: no CPU backend here
        return f"bitsandbytes {getattr(bnb, '__version__', '?')} cannot run NF4 on the CPU ({failure})"
    if not error <= 0.25 * scale:
        return f"bitsandbytes {bnb.__version__}'s CPU NF4 matmul is wrong (error {error:.3g} vs scale {scale:.3g})"
    return None


def quantize_nf4(model: torch.nn.Module, device: str | torch.device | None = None,
                 compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """`model` reloaded with NF4 weights, as `load_model(path, quantization="nf4")` loads a checkpoint:
    saved to a temporary folder and read back through transformers' bitsandbytes path, so the decoder
    layers' linear weights become `bitsandbytes.nn.Linear4bit` while embeddings, norms and the LM
    head keep the model's dtype. For random-weight benchmarks and tests (no checkpoint on disk).

    Args:
        model: a HF causal LM (any device; its state is copied, it is left unchanged).
        device: where the NF4 model lives (default: CUDA if available, else CPU; the CPU needs a
            bitsandbytes with a CPU 4-bit backend, see `nf4_unavailable_reason`).
        compute_dtype: the matmuls' dtype (default: the model's dtype on the CPU, else
            `nf4_compute_dtype()`).
    """
    import tempfile

    from transformers import AutoModelForCausalLM

    device = default_device() if device is None else torch.device(device)
    reason = nf4_unavailable_reason(device)
    if reason is not None:
        raise ValueError(f"quantize_nf4 cannot run on {device}: {reason}")
    dtype = next(model.parameters()).dtype
    if compute_dtype is None:
        compute_dtype = dtype if device.type == "cpu" else nf4_compute_dtype()
    config = nf4_config(compute_dtype, require_cuda=device.type == "cuda")
    target = str(device) if device.type == "cpu" or device.index is not None else "cuda:0"
    with tempfile.TemporaryDirectory(prefix="flashspec-nf4-") as folder:
        model.save_pretrained(folder)
        quantized = AutoModelForCausalLM.from_pretrained(folder, quantization_config=config, dtype=dtype,
                                                         device_map={"": target})
    return quantized.eval()


def is_nf4(model: torch.nn.Module) -> bool:
    """True when some of `model`'s linear layers hold bitsandbytes 4-bit weights."""
    return any(type(module).__name__ in ("Linear4bit", "LinearNF4") for module in model.modules())


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer saved beside a model (same hub id or folder)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def available_devices() -> list[str]:
    """The devices this torch build can put a model on here: the CPU, each visible CUDA device, MPS."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    return found


def resolve_device(device: str | torch.device | None) -> torch.device:
    """`device` as a torch.device this torch build can run a model on here (None: CUDA when available, else
    the CPU). Reads nothing, so loaders call it first: a ValueError naming `device`, the devices there are and
    the fix, instead of a failure after the checkpoint is loaded."""
    if device is None:
        return default_device()
    shown = repr(str(device)) if isinstance(device, torch.device) else repr(device)
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"device={shown} is not a torch device; pass 'cpu', 'cuda' or 'cuda:0' "
                         f"(or None for {default_device()})") from None
    if parsed.type == "cpu":
        return parsed
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count and (parsed.index is None or parsed.index < count):
            return parsed
        why = (f"only {count} CUDA device{' is' if count == 1 else 's are'} visible" if count else
               f"this torch ({torch.__version__}) has no CUDA (a CPU-only build, or no GPU visible)")
    else:
        backend = torch.backends.mps if parsed.type == "mps" else getattr(torch, parsed.type, None)
        is_available = getattr(backend, "is_available", None)
        if callable(is_available) and is_available():
            return parsed
        why = f"this torch ({torch.__version__}) cannot run models on {parsed.type} here"
    fallback = "cuda:0" if torch.cuda.is_available() else "cpu"
    raise ValueError(f"device={shown} is not available: {why}; this machine has: {', '.join(available_devices())}. "
                     f"Pass device={fallback!r} (or None for {default_device()})")


def llama_config(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_positions: int = 2048,
    initializer_range: float = 0.02,
    bos_token_id: int | None = 1,
    eos_token_id: int | None = 2,
    pad_token_id: int | None = None,
) -> Any:
    """A LlamaConfig from the few numbers that define a model's shape."""
    from transformers import LlamaConfig

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads if num_kv_heads is None else num_kv_heads,
        intermediate_size=4 * hidden_size if intermediate_size is None else intermediate_size,
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        tie_word_embeddings=False,
    )


def tinyllama_1b_config(**overrides: Any) -> Any:
    """TinyLlama-1.1B's shape: hidden 2048, 22 layers, 32 heads, 4 KV heads, V = 32000."""
    shape = dict(vocab_size=32000, hidden_size=2048, num_layers=22, num_heads=32, num_kv_heads=4,
                 intermediate_size=5632, max_positions=2048)
    return llama_config(**{**shape, **overrides})


def llama_7b_config(**overrides: Any) -> Any:
    """Llama-2-7B's shape: hidden 4096, 32 layers, 32 heads (no GQA), MLP 11008, V = 32000."""
    shape = dict(vocab_size=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=32,
                 intermediate_size=11008, max_positions=4096)
    return llama_config(**{**shape, **overrides})


def llama_68m_config(**overrides: Any) -> Any:
    """llama-68m's shape: hidden 768, 2 layers, 12 heads, V = 32000."""
    shape = dict(vocab_size=32000, hidden_size=768, num_layers=2, num_heads=12, num_kv_heads=12,
                 intermediate_size=3072, max_positions=2048)
    return llama_config(**{**shape, **overrides})


def smollm2_135m_config(**overrides: Any) -> Any:
    """SmolLM2-135M's shape: hidden 576, 30 layers, 9 heads, 3 KV heads, MLP 1536, V = 49152, tied embeddings."""
    shape = dict(vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3,
                 intermediate_size=1536, max_positions=8192, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    config = llama_config(**{**shape, **overrides})
    config.tie_word_embeddings = True
    return config


def model_from_config(
    config: Any, seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> torch.nn.Module:
    """A LlamaForCausalLM with random weights drawn from `seed` (the global RNG is left untouched)."""
    from transformers import LlamaForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def tiny_llama(
    vocab_size: int = 16,
    hidden_size: int = 16,
    num_layers: int = 1,
    num_heads: int = 2,
    num_kv_heads: int | None = None,
    max_positions: int = 128,
    initializer_range: float = 0.02,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    **special_tokens: int | None,
) -> torch.nn.Module:
    """A tiny random Llama for tests and the CLI default (no download). A large `initializer_range`
    (e.g. 0.5) gives peaked, context-dependent distributions, which statistical tests need."""
    config = llama_config(
        vocab_size=vocab_size, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, max_positions=max_positions, initializer_range=initializer_range,
        **special_tokens,
    )
    return model_from_config(config, seed=seed, dtype=dtype, device=device)


def char_tokenizer() -> Any:
    """A character-level tokenizer over printable ASCII, built in code (no download).

    Ids: 0 <unk>, 1 <s>, 2 </s> (also the pad token), then one id per printable character.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for char in string.printable:
        if char not in vocab and char not in "\r\x0b\x0c":
            vocab[char] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )


def draft_from_teacher(teacher: torch.nn.Module, layers: tuple[int, ...]) -> torch.nn.Module:
    """A float32 CPU copy of `teacher` keeping only the decoder layers `layers` (in that order), with its
    embedding, final norm and head; the embedding and head are frozen."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = [config.layer_types[i] for i in layers]
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    source = teacher.model
    with torch.no_grad():
        draft.model.embed_tokens.load_state_dict(source.embed_tokens.state_dict())
        draft.model.norm.load_state_dict(source.norm.state_dict())
        for index, layer in enumerate(layers):
            draft.model.layers[index].load_state_dict(source.layers[layer].state_dict())
        if not config.tie_word_embeddings:
            draft.lm_head.load_state_dict(teacher.lm_head.state_dict())
    draft.tie_weights()
    for parameter in (draft.model.embed_tokens.weight, draft.lm_head.weight):
        parameter.requires_grad_(False)
    return draft.to("cpu", torch.float32).eval()


def vocab_size_of(model: torch.nn.Module) -> int:
    """Rows of the output projection (what the logits really have), falling back to the config."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "out_features"):
        return int(head.out_features)
    return int(model.config.vocab_size)


def special_token_ids(model: torch.nn.Module) -> dict[str, Any]:
    """bos/eos/pad ids from the generation config (preferred) or the model config."""
    found: dict[str, Any] = {}
    generation_config = getattr(model, "generation_config", None)
    for field in SPECIAL_TOKEN_FIELDS:
        value = getattr(generation_config, field, None) if generation_config is not None else None
        if value is None:
            value = getattr(model.config, field, None)
        found[field] = value
    return found


def max_positions_of(model: torch.nn.Module) -> int | None:
    """The longest sequence the model was built for (None when the config does not say)."""
    for field in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(model.config, field, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_compatible(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    target_tokenizer: Any = None,
    draft_tokenizer: Any = None,
    draft_name: str = "draft",
) -> None:
    """Raise ValueError unless `draft` can propose tokens for `target`: one tokenizer. When given, the two
    tokenizers must be identical; the special-token ids must agree where both define them. The embeddings may
    have different row counts (a family pads them to different sizes, e.g. Qwen2.5-0.5B's 151936 and 7B's 152064
    over one 151665-token tokenizer) when the tokenizers are given and fit in both, or when both models name the
    same bos and eos ids: the draft's logits are then cut or padded to the target's vocabulary (`fit_vocab`)."""
    target_special, draft_special = special_token_ids(target), special_token_ids(draft)
    for field in ("bos_token_id", "eos_token_id"):
        mine, theirs = as_id_set(target_special[field]), as_id_set(draft_special[field])
        if mine and theirs and mine != theirs:
            raise ValueError(
                f"{draft_name} has {field}={draft_special[field]} but the target has {target_special[field]}: "
                "draft and target must share one tokenizer and its special tokens"
            )
    tokenizers = target_tokenizer is not None and draft_tokenizer is not None
    if tokenizers:
        if target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
            raise ValueError(f"{draft_name}'s tokenizer vocabulary differs from the target's tokenizer")
        if target_tokenizer.all_special_ids != draft_tokenizer.all_special_ids:
            raise ValueError(f"{draft_name}'s tokenizer special tokens differ from the target's tokenizer")
    target_vocab, draft_vocab = vocab_size_of(target), vocab_size_of(draft)
    if target_vocab == draft_vocab:
        return
    if tokenizers:
        tokens = len(target_tokenizer)
        if tokens > min(target_vocab, draft_vocab):
            raise ValueError(f"{draft_name}'s embedding has {draft_vocab} rows and the target's {target_vocab}, but "
                             f"their tokenizer has {tokens} tokens: both embeddings must cover it")
        return
    named = all(as_id_set(target_special[field]) and as_id_set(draft_special[field])
                for field in ("bos_token_id", "eos_token_id"))
    if not named:
        raise ValueError(
            f"{draft_name}'s embedding has {draft_vocab} rows but the target's {target_vocab}, and the models name no "
            "common bos/eos ids: a draft must share the target's tokenizer (pick a draft from the same model "
            "family; padded embeddings of one tokenizer are fine when the configs name their special tokens)"
        )


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """`logits` [..., V'] over `vocab` ids: cut to the first `vocab`, or padded with -inf (ids the draft cannot
    propose), so a draft whose embedding is padded to another size proposes only ids the target has."""
    width = logits.shape[-1]
    if width == vocab:
        return logits
    if width > vocab:
        return logits[..., :vocab]
    return torch.nn.functional.pad(logits, (0, vocab - width), value=float("-inf"))


def as_id_set(value: Any) -> set[int]:
    if value is None:
        return set()
    if isinstance(value, (list, tuple, set)):
        return {int(v) for v in value}
    if isinstance(value, torch.Tensor):
        return {int(v) for v in value.flatten().tolist()}
    return {int(value)}


# --- The model call and its KV cache: the one place a static-cache / CUDA-graph fast path replaces. ---


def new_cache(model: torch.nn.Module) -> Any:
    """An empty DynamicCache for `model` (works on transformers 5.17 and the current release)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # releases whose DynamicCache takes no config
        return DynamicCache()


def cache_keyword(model: torch.nn.Module) -> str:
    """The forward keyword that takes the KV cache: `cache` on new releases, `past_key_values` on 5.17
    (which silently ignores `cache=`). Read from the signature once per model."""
    import inspect

    cached = getattr(model, "_flashspec_cache_keyword", None)
    if cached is not None:
        return cached
    parameters = inspect.signature(model.forward).parameters
    keyword = "cache" if "cache" in parameters else "past_key_values"
    try:
        model._flashspec_cache_keyword = keyword
    except AttributeError:  # pragma: no cover - frozen modules
        pass
    return keyword


def forward_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    cache: Any,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    logits_to_keep: int = 0,
) -> torch.Tensor:
    """Run `model` on `input_ids` [B, n] after the `cache`d prefix (which it extends in place) and
    return logits [B, n or logits_to_keep, V]. `attention_mask` covers cache + new tokens."""
    kwargs: dict[str, Any] = {cache_keyword(model): cache, "use_cache": True}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    if position_ids is not None:
        kwargs["position_ids"] = position_ids
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    with torch.no_grad():
        return model(input_ids=input_ids, **kwargs).logits


def cache_length(cache: Any) -> int:
    return int(cache.get_seq_length())


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first `length` positions of `cache`. Uses `crop(-k)` (remove k), the form both
    transformers 5.17 and the current release accept; `crop(0)` is never called (5.17 reads it
    as an absolute length of zero)."""
    remove = cache_length(cache) - length
    if remove > 0:
        cache.crop(-remove)
