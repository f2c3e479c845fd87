"""Peers side by side: FlashSpec's fast path beside gpt-fast and Hugging Face on the same weights.

Each system runs in its own process (`run_system`), on random-weight bf16 models of a named shape
(`SHAPES`: TinyLlama-1.1B with a llama-68m draft, SmolLM2-135M, Llama-2-7B), drawn from one seed on the
device so every process holds the same weights. One request: a `prompt_tokens` prompt, batch 1, T = 1
(no top-k or top-p), `new_tokens` new tokens with EOS ignored. A request's tok/s is its new tokens over its
wall time (prefill included, the device synchronised at both ends): what gpt-fast's own `generate.py`
reports. The first request compiles and captures (its wall time is recorded as `first_request_s`); the
next `repeats` are timed.

gpt-fast is not part of this repository: pass the path of a checkout of pytorch-labs/gpt-fast. Its
`generate.py` and `model.py` are imported from there (its tokenizer module is replaced by a stub: the
prompt is token ids), its decode step compiled as its own `main` does (`mode="reduce-overhead"`,
`fullgraph=True`, with the inductor settings `generate.py` sets at import). `gpt_fast_state_dict` is the
weight conversion: gpt-fast rotates interleaved pairs, Hugging Face rotates halves, so the q and k rows of
each head are permuted; q/k/v are stacked into `wqkv`; gate, up and down become w1, w3 and w2. The
converted model's logits are compared with Hugging Face's before any timing (`logits_cosine`).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

import flashspec as fs
from flashspec import models
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder
from flashspec_lab import provenance

# shape -> (target config builder, draft config builder or None)
SHAPES: dict[str, tuple[Callable[..., Any], Callable[..., Any] | None]] = {
    "tinyllama-1.1b": (models.tinyllama_1b_config, models.llama_68m_config),
    "smollm2-135m": (models.smollm2_135m_config, None),
    "llama-2-7b": (models.llama_7b_config, None),
}
SYSTEMS = ("flashspec", "gpt-fast", "hf")
# what the speculative run changes in gpt-fast at run time, recorded with its result
CLONE_PATCH = ("decode_one_token's outputs cloned after each CUDA-graph replay (the draft loop keeps them across "
               "replays, which torch refuses to read once overwritten)")
MIN_COSINE = 0.99  # converted gpt-fast logits against Hugging Face's, below which nothing is timed


# ------------------------------------------------------------------------------------------ models


def smoke_config(builder: Callable[..., Any]) -> Any:
    """A few-layer, narrow version of a shape (CPU smoke runs): its head layout and tying kept."""
    config = builder()
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    groups = heads // kv_heads
    config.num_hidden_layers, config.vocab_size = 2, 256
    config.num_key_value_heads = 2
    config.num_attention_heads = 2 * groups
    config.hidden_size, config.intermediate_size = 16 * config.num_attention_heads, 64
    config.head_dim = 16
    return config


def build_models(shape: str, device: torch.device, smoke: bool = False
                 ) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The shape's target (seed 1) and draft (seed 2, or None), random weights, on `device` in its half dtype
    (float32 on a CPU): the same weights in every process on one machine."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {sorted(SHAPES)}, got {shape!r}")
    dtype = models.half_dtype(device) if device.type == "cuda" else torch.float32
    built = []
    for seed, builder in ((1, SHAPES[shape][0]), (2, SHAPES[shape][1])):
        if builder is None:
            built.append(None)
            continue
        config = smoke_config(builder) if smoke else builder()
        built.append(models.model_from_config(config, seed=seed, dtype=dtype, device=device))
    return built[0], built[1]


def prompt_ids(tokens: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """[1, tokens] random ids below min(vocab, 1000), from `seed` (the same prompt for every system)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, min(vocab, 1000), (1, tokens), generator=generator)


# ---------------------------------------------------------------------------------------- gpt-fast


def interleave_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """q or k rows from Hugging Face's rotate-half order to interleaved pairs: within each head, row 2j
    is HF row j and row 2j + 1 is HF row j + head_dim / 2."""
    rows, columns = weight.shape
    head_dim = rows // heads
    return weight.view(heads, 2, head_dim // 2, columns).transpose(1, 2).reshape(rows, columns)


def gpt_fast_args(config: Any, block_size: int) -> dict[str, Any]:
    """gpt-fast `ModelArgs` keywords for a Llama config."""
    params = getattr(config, "rope_parameters", None) or {}
    return dict(block_size=block_size, vocab_size=config.vocab_size, n_layer=config.num_hidden_layers,
                n_head=config.num_attention_heads, dim=config.hidden_size,
                intermediate_size=config.intermediate_size, n_local_heads=config.num_key_value_heads,
                rope_base=float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
                norm_eps=config.rms_norm_eps)


@torch.no_grad()
def gpt_fast_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A Hugging Face Llama's weights in gpt-fast's names and layout (q/k rows interleaved per head)."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    body = model.model
    state = {"tok_embeddings.weight": body.embed_tokens.weight, "norm.weight": body.norm.weight,
             "output.weight": model.lm_head.weight}
    for index, layer in enumerate(body.layers):
        attn, mlp, name = layer.self_attn, layer.mlp, f"layers.{index}."
        state[name + "attention.wqkv.weight"] = torch.cat([interleave_rows(attn.q_proj.weight, heads),
                                                           interleave_rows(attn.k_proj.weight, kv_heads),
                                                           attn.v_proj.weight])
        state[name + "attention.wo.weight"] = attn.o_proj.weight
        state[name + "feed_forward.w1.weight"] = mlp.gate_proj.weight
        state[name + "feed_forward.w3.weight"] = mlp.up_proj.weight
        state[name + "feed_forward.w2.weight"] = mlp.down_proj.weight
        state[name + "attention_norm.weight"] = layer.input_layernorm.weight
        state[name + "ffn_norm.weight"] = layer.post_attention_layernorm.weight
    return state


def checkout_commit(path: Path | None) -> str | None:
    """The commit a gpt-fast checkout is at: its own git repository's HEAD, else the first line of a
    `COMMIT` file beside its code (a copy made without .git), else None. Never the repository that holds
    the copy: git asked inside a folder without .git answers for the folder above."""
    if path is None:
        return None
    if (path / ".git").exists():
        try:
            return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return provenance._sha_from_git_folder(path / ".git")
    try:
        lines = (path / "COMMIT").read_text().split()
    except OSError:
        return None
    return lines[0] if lines else None


@contextlib.contextmanager
def gpt_fast_path(checkout: Path) -> Iterator[None]:
    """`checkout` on sys.path, with a stub `tokenizer` module (its real one imports sentencepiece and
    tiktoken; the prompt here is token ids)."""
    if not (checkout / "generate.py").is_file() or not (checkout / "model.py").is_file():
        raise ValueError(f"--gpt-fast must be a checkout of pytorch-labs/gpt-fast (generate.py, model.py); "
                         f"{checkout} has none")
    stub = types.ModuleType("tokenizer")
    stub.get_tokenizer = None
    saved = sys.modules.get("tokenizer")
    sys.modules["tokenizer"] = stub
    sys.path.insert(0, str(checkout))
    try:
        yield
    finally:
        sys.path.remove(str(checkout))
        if saved is not None:
            sys.modules["tokenizer"] = saved


def gpt_fast_model(module: Any, hf: torch.nn.Module, block_size: int) -> torch.nn.Module:
    """gpt-fast's `Transformer` holding `hf`'s weights (converted; the tensors HF keeps as they are are shared)."""
    args = module.ModelArgs(**gpt_fast_args(hf.config, block_size))
    with torch.device("meta"):
        model = module.Transformer(args)
    model.load_state_dict(gpt_fast_state_dict(hf), assign=True)
    return model.eval()


@torch.no_grad()
def logits_cosine(hf: torch.nn.Module, ours: torch.nn.Module, prompt: torch.Tensor) -> float:
    """Cosine similarity of every position's logits, Hugging Face against gpt-fast's model (lowest position)."""
    device = next(hf.parameters()).device
    prompt = prompt.to(device)
    expected = hf(prompt).logits.float()[0]
    with torch.device(device):  # gpt-fast makes its caches on the default device
        ours.setup_caches(max_batch_size=1, max_seq_length=prompt.shape[1])
    got = ours(prompt, torch.arange(prompt.shape[1], device=device)).float()[0]
    return float(torch.nn.functional.cosine_similarity(got, expected, dim=-1).min())


# ------------------------------------------------------------------------------------------ timing


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compile_frames() -> list[dict[str, Any]]:
    """Every frame torch.compile compiled in this process since the last `clear_compile_frames`, in order:
    its function, where it is, and its seconds (the whole frame; of them, inductor's)."""
    metrics = getattr(torch._dynamo.utils, "get_compilation_metrics", lambda: [])()
    return [{"function": m.co_name, "where": f"{Path(m.co_filename or '?').name}:{m.co_firstlineno}",
             "compile_s": m.entire_frame_compile_time_s, "inductor_s": m.inductor_compile_time_s,
             "failed": m.fail_reason} for m in metrics]


def clear_compile_frames() -> None:
    getattr(torch._dynamo.utils, "clear_compilation_metrics", lambda: None)()


def first_request_breakdown(first_s: float, frames: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a first request's seconds went: the compiled frames (summed per function and place, largest
    first), their total, and the rest (eager runs, graph captures, Triton kernels built on first launch)."""
    per: dict[tuple[str, str], dict[str, Any]] = {}
    for frame in frames:
        entry = per.setdefault((frame["function"], frame["where"]), {
            "function": frame["function"], "where": frame["where"], "frames": 0, "compile_s": 0.0})
        entry["frames"] += 1
        entry["compile_s"] += frame["compile_s"] or 0.0
    compile_s = sum(entry["compile_s"] for entry in per.values())
    return {"compile_s": compile_s, "other_s": first_s - compile_s,
            "by_function": sorted(per.values(), key=lambda entry: -entry["compile_s"])}


def timed(request: Callable[[], int], device: torch.device, repeats: int, label: str = "") -> dict[str, Any]:
    """Run `request` (returns the tokens it generated) once (compiles, captures), then `repeats` times;
    tok/s of each timed one, and where the first request's time went (`first_request_breakdown`). Progress
    goes to stderr under `label`."""
    sync(device)
    clear_compile_frames()
    start = time.perf_counter()
    request()
    sync(device)
    first = time.perf_counter() - start
    breakdown = first_request_breakdown(first, compile_frames())
    print(f"  {label}: first request {first:.1f} s ({breakdown['compile_s']:.1f} s compiling "
          f"{sum(entry['frames'] for entry in breakdown['by_function'])} frames)", file=sys.stderr, flush=True)
    rates = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        tokens = request()
        sync(device)
        rates.append(tokens / (time.perf_counter() - start))
        print(f"  {label}: {rates[-1]:.1f} tok/s", file=sys.stderr, flush=True)
    ordered = sorted(rates)
    return {"tok_s": rates, "tok_s_median": ordered[len(ordered) // 2], "tok_s_min": ordered[0],
            "tok_s_max": ordered[-1], "first_request_s": first, "first_request": breakdown}


Keep = Callable[[str, dict[str, Any]], None]  # records one method's result as soon as it is measured


def run_flashspec(shape: str, device: torch.device, settings: dict[str, Any], keep: Keep) -> None:
    """FlashSpec's fast path: plain, and speculative where the shape has a draft."""
    target, draft = build_models(shape, device, settings["smoke"])
    prompt = prompt_ids(settings["prompt_tokens"], target.config.vocab_size).to(device)
    sampling = fs.SamplingParams(1.0)
    compile_option = settings["compile"] or False
    decoders = {} if settings.get("speculative_only") else {
        "plain": FastPlainDecoder(target, compile=compile_option, compile_scope=settings["compile_scope"])}
    if draft is not None and not settings.get("plain_only"):
        decoders["speculative"] = FastSpeculativeDecoder(target, [draft], gamma=settings["gamma"],
                                                         compile=compile_option,
                                                         compile_scope=settings["compile_scope"])
    for method, decoder in decoders.items():
        steps: list[int] = []

        def request(decoder: Any = decoder, steps: list[int] = steps) -> int:
            result = decoder.generate(prompt, max_new_tokens=settings["new_tokens"], sampling=sampling, seed=0,
                                      ignore_eos=True)
            steps.append(len(result.stats.steps))
            return int(result.num_generated.sum())

        record = timed(request, device, settings["repeats"], f"flashspec {method}")
        record["graphs_captured"] = decoder.graphs_captured  # over all its requests (the first captures)
        keep(method, {**record, "tokens_per_step": settings["new_tokens"] / steps[-1]})


def run_gpt_fast(shape: str, device: torch.device, settings: dict[str, Any], keep: Keep) -> None:
    """gpt-fast's `generate`: plain, or speculative with `--gpt-fast-speculative`'s checkout."""
    for method, key in (("plain", "gpt_fast"), ("speculative", "gpt_fast_speculative")):
        checkout = settings.get(key)
        if checkout is None or (method == "speculative" and (SHAPES[shape][1] is None or settings.get("plain_only"))):
            continue
        if method == "plain" and settings.get("speculative_only"):
            continue
        keep(method, _gpt_fast_method(shape, device, settings, Path(checkout), method == "speculative"))


def _gpt_fast_method(shape: str, device: torch.device, settings: dict[str, Any], checkout: Path,
                     speculative: bool) -> dict[str, Any]:
    with gpt_fast_path(checkout):
        for name in ("generate", "model"):
            sys.modules.pop(name, None)
        import generate as gen  # noqa: PLC0415 - gpt-fast's, from the checkout
        import model as gpt_model  # noqa: PLC0415
    hf_target, hf_draft = build_models(shape, device, settings["smoke"])
    prompt = prompt_ids(settings["prompt_tokens"], hf_target.config.vocab_size)[0].to(device)
    block = settings["prompt_tokens"] + settings["new_tokens"] + settings["gamma"] + 1
    target = gpt_fast_model(gpt_model, hf_target, block)
    cosine = {"target": logits_cosine(hf_target, target, prompt[None])}
    draft = None
    if speculative:
        draft = gpt_fast_model(gpt_model, hf_draft, block)
        cosine["draft"] = logits_cosine(hf_draft, draft, prompt[None])
    del hf_target, hf_draft
    if min(cosine.values()) < MIN_COSINE:
        return {"error": f"converted logits disagree with Hugging Face's: cosine {cosine}", "logits_cosine": cosine}
    if settings["compile"] and device.type == "cuda":  # as gpt-fast's main() does
        compiled = gen.decode_one_token = torch.compile(gen.decode_one_token, mode="reduce-overhead", fullgraph=True)
        if speculative:
            gen.model_forward = torch.compile(gen.model_forward, mode="reduce-overhead", fullgraph=True)
            # its draft loop keeps each step's (token, probs) while the next replay overwrites the graph's
            # outputs (torch 2.11 raises on the read): clone them, the smallest fix, recorded below
            gen.decode_one_token = functools.wraps(compiled)(
                lambda *a, **k: tuple(t.clone() for t in compiled(*a, **k)))
    extra = {"batch_size": 1} if "batch_size" in inspect.signature(gen.generate).parameters else {}
    accepted: list[list[int]] = []

    def request() -> int:
        sequence, stats = gen.generate(target, prompt, settings["new_tokens"], **extra, interactive=False,
                                       draft_model=draft, speculate_k=settings["gamma"], temperature=1.0,
                                       top_k=None)
        accepted.append(stats["accept_counts"])
        return sequence.shape[-1] - prompt.shape[0]

    torch.manual_seed(1234)
    record = timed(request, device, settings["repeats"], f"gpt-fast {'speculative' if speculative else 'plain'}")
    record["logits_cosine"] = cosine
    if speculative and settings["compile"] and device.type == "cuda":
        record["runtime_patch"] = CLONE_PATCH
    if speculative:
        counts = accepted[-1]
        record["tokens_per_step"] = sum((i + 1) * c for i, c in enumerate(counts)) / max(1, sum(counts))
    return record


def run_hf(shape: str, device: torch.device, settings: dict[str, Any], keep: Keep) -> None:
    """Hugging Face `generate` (pure sampling at T = 1) and assisted generation with the draft."""
    target, draft = build_models(shape, device, settings["smoke"])
    prompt = prompt_ids(settings["prompt_tokens"], target.config.vocab_size).to(device)
    sampling = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0,
                    max_new_tokens=settings["new_tokens"], min_new_tokens=settings["new_tokens"])
    methods: dict[str, dict[str, Any]] = {} if settings.get("speculative_only") else {"plain": {}}
    if draft is not None and not settings.get("plain_only"):
        methods["assisted"] = {"assistant_model": draft, "num_assistant_tokens": settings["gamma"],
                               "num_assistant_tokens_schedule": "constant"}
    for method, options in methods.items():
        def request(options: dict[str, Any] = options) -> int:
            sequence = target.generate(prompt, attention_mask=torch.ones_like(prompt), **sampling, **options)
            return sequence.shape[1] - prompt.shape[1]

        torch.manual_seed(0)
        keep(method, timed(request, device, settings["hf_repeats"], f"hf {method}"))


RUNNERS = {"flashspec": run_flashspec, "gpt-fast": run_gpt_fast, "hf": run_hf}


def run_system(system: str, shape: str, settings: dict[str, Any],
               save: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One system at one shape, in this process: its methods' records, with "error" (text) added when one
    failed; the methods measured before it stay. `save` gets the record after every method, so a process cut
    by its time limit leaves what it finished."""
    device = torch.device(settings["device"])
    out: dict[str, Any] = {}

    def keep(method: str, record: dict[str, Any]) -> None:
        out[method] = record
        if save is not None:
            save(out)
    try:
        RUNNERS[system](shape, device, settings, keep)
    except Exception as error:  # noqa: BLE001 - recorded, the other systems still run
        out["error"] = f"{type(error).__name__}: {error}"[:2000]
    return out


def hbm_floor_ms(shape: str, copy_bytes_per_s: float | None, filled: int) -> float | None:
    """A one-token forward's floor: its weights (all but the embedding table, unless tied) and `filled` K/V
    slots per layer, read once at the measured copy bandwidth (bytes read + written per second)."""
    if not copy_bytes_per_s:
        return None
    config = SHAPES[shape][0]()
    head_dim = config.hidden_size // config.num_attention_heads
    layer = (config.hidden_size * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
             + 3 * config.hidden_size * config.intermediate_size + 2 * config.hidden_size)
    weights = config.num_hidden_layers * layer + config.hidden_size * (config.vocab_size + 1)
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * filled
    return 2 * (weights + kv) / copy_bytes_per_s * 1e3  # bf16: 2 bytes a value

