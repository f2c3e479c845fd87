"""Offline model zoo: a byte-level BPE tokenizer, a Llama target and domain-specialised drafts, trained here.

No machine the project runs on can download weights, and random-init models give meaningless acceptance
rates, so the zoo trains its own family from the offline corpora of `flashspec.corpora`:

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

Command line (``flashspec zoo ...`` dispatches to `main`)::

    python -m flashspec.zoo build --size cpu          # or gpu
    python -m flashspec.zoo info --size cpu
    python -m flashspec.zoo perplexity --size cpu     # held-out perplexity, models x domains
    python -m flashspec.zoo acceptance --size cpu     # acceptance matrix (engine + exact teacher-forced)
    python -m flashspec.zoo switching --size cpu      # domain-switching experiment
    python -m flashspec.zoo gpu-report --out DIR      # H200: build from scratch + all of the above
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import errno
import glob
import hashlib
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from flashspec import corpora, provenance

ZOO_FORMAT = 2  # 2: specialists fine-tuned from the generalist
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
GENERALIST = "general"
MANIFEST = "manifest.json"
PROMPTS = "prompts.json"
HELDOUT = "heldout.safetensors"
CACHE_ENV = "FLASHSPEC_CACHE"
BUILDING = ".building-"  # a build writes into <key>.building-<host>-<pid> and renames it to <key> when done
BUILD_NAME = re.compile(re.escape(BUILDING) + r"(.+-)?\d+$")  # a name without a host is taken as this host's
# A live build writes a model folder every few minutes (the gpu target, the longest silence, trains in ~2
# minutes on an H200), so a build folder untouched for a day belongs to a dead build even if its pid is reused.
STALE_BUILD_SECONDS = 24 * 3600
# OSError numbers that mean "this folder cannot take the zoo": answered with a ZooCacheError, not a traceback.
STORAGE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT})


class ZooCacheWarning(UserWarning):
    """A cached zoo was missing or corrupt and is being rebuilt."""


class ZooCacheError(ValueError):
    """The zoo cache folder cannot be used (a file in the way, not writable, full); the message says the fix.

    A ValueError, so callers that report bad arguments (`flashspec generate --zoo`) report this one too.
    """


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

    def key(self, corpus_sha256: str) -> str:
        """Cache key: SHA-256 of the zoo format, this config and the corpus hash (16 hex digits)."""
        blob = json.dumps({"format": ZOO_FORMAT, "config": dataclasses.asdict(self), "corpus": corpus_sha256},
                          sort_keys=True)
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


def get_config(size: str | ZooConfig) -> ZooConfig:
    """The ZooConfig for a size name ("cpu", "gpu", "micro") or the config itself."""
    if isinstance(size, ZooConfig):
        return size
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return SIZES[size]


def cache_root() -> Path:
    """$FLASHSPEC_CACHE/zoo (``~`` and ``$VARS`` expanded, made absolute), or ~/.cache/flashspec/zoo.

    Reads nothing on disk; `check_cache_root` says whether the folder can be used.
    """
    base = os.environ.get(CACHE_ENV)
    if not base:
        return Path.home() / ".cache" / "flashspec" / "zoo"
    expanded = os.path.expanduser(os.path.expandvars(base))
    unset = re.search(r"\$(\w+|\{[^}]*\})", expanded)  # expandvars leaves unset variables as they are
    if unset:
        raise ZooCacheError(f"{CACHE_ENV}={base!r} names the environment variable {unset.group(0)}, which is "
                            f"not set; set it, or set {CACHE_ENV} to a folder path")
    return Path(expanded).absolute() / "zoo"


def _cache_fix() -> str:
    """What to do about an unusable cache folder, with the current FLASHSPEC_CACHE value."""
    value = os.environ.get(CACHE_ENV)
    now = f"now {CACHE_ENV}={value!r}" if value else f"{CACHE_ENV} is unset, so ~/.cache/flashspec is used"
    return (f"set {CACHE_ENV} to a writable folder (created if missing), e.g. "
            f"{CACHE_ENV}=/tmp/flashspec ({now})")


def check_cache_root(root: Path | None = None) -> Path:
    """The zoo cache root (default `cache_root()`) after checking that no file stands on its path.

    Only reads, so a read-only cache holding a built zoo still loads; the build checks writability when it
    creates its work folder.  Called before the corpora are assembled, so a wrong FLASHSPEC_CACHE fails at once.
    """
    root = cache_root() if root is None else root
    try:
        for folder in (root, *root.parents):
            if folder.is_dir():
                break
            if folder.exists() or folder.is_symlink():
                raise ZooCacheError(f"the zoo cache folder {root} cannot be created: {folder} exists and is not "
                                    f"a folder; {_cache_fix()}, or move {folder} away")
    except OSError as error:
        raise ZooCacheError(f"the zoo cache folder {root} cannot be read ({error}); {_cache_fix()}") from error
    return root


def draft_names(config: ZooConfig) -> list[str]:
    """Specialists in domain order, then the generalist."""
    return [*config.domains, GENERALIST]


def derive_seed(seed: int, label: str) -> int:
    """A 31-bit seed for one component (model init, batch order), stable across platforms."""
    return int(hashlib.sha256(f"{seed}:{label}".encode()).hexdigest()[:8], 16) & 0x7FFFFFFF


# ----------------------------------------------------------------------------------------------- tokenizer

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


# ----------------------------------------------------------------------------------------------- models

def make_model(spec: ModelSpec, config: ZooConfig, tokenizer: Any, seed: int) -> torch.nn.Module:
    """A freshly initialised LlamaForCausalLM of shape `spec` (weights fixed by `seed`)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    llama_config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads, max_position_embeddings=max(2048, 4 * config.context),
        tie_word_embeddings=spec.tie_embeddings, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config)


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


def train_model(model: torch.nn.Module, streams: list[torch.Tensor], steps: int, config: ZooConfig,
                peak_lr: float, seed: int, device: torch.device, desc: str, progress: bool = True,
                batch_size: int | None = None) -> list[float]:
    """Next-token training with AdamW; returns the loss every step.  bf16 autocast on CUDA."""
    from tqdm.auto import tqdm

    model.to(device).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=peak_lr, betas=(0.9, 0.95), eps=1e-8, fused=True,
    )
    generator = torch.Generator().manual_seed(seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else _null_context()
    losses = []
    bar = tqdm(range(steps), desc=desc, disable=not progress, mininterval=1.0, leave=False)
    for step in bar:
        batch = sample_batch(streams, batch_size or config.batch_size, config.context, generator).to(device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak_lr, config.warmup_fraction)
        with autocast:
            logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % 20 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    model.eval()
    return losses


class _null_context:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ----------------------------------------------------------------------------------------------- build

def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _say(message: str, progress: bool) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def pick_device(device: str | torch.device | None) -> torch.device:
    """CUDA when available unless a device is given."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def prompt_windows(heldout_ids: torch.Tensor, num_prompts: int, prompt_tokens: int) -> list[list[int]]:
    """`num_prompts` held-out windows of `prompt_tokens` ids at evenly spaced offsets."""
    span = heldout_ids.numel() - prompt_tokens - 1
    if span <= 0:
        raise ValueError(f"held-out text too short for prompts of {prompt_tokens} tokens")
    offsets = [int(i * span / num_prompts) for i in range(num_prompts)]
    return [heldout_ids[o:o + prompt_tokens].tolist() for o in offsets]


def build_zoo(size: str | ZooConfig = "cpu", out_dir: str | Path | None = None, device: str | None = None,
              progress: bool = True, domain_corpora: dict[str, corpora.DomainCorpus] | None = None) -> Path:
    """Train the whole zoo from the offline corpora and save it to `out_dir` (default: the cache folder).

    Deterministic given `config.seed` on one platform.  Returns the folder.  The folder is written under
    a temporary name and renamed at the end, so an interrupted build never looks complete.
    """
    config = get_config(size)
    device_ = pick_device(device)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _build(config, out_dir, device_, progress, domain_corpora)
    finally:  # the engine measured afterwards should run with the caller's settings
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])


def _host() -> str:
    """This machine's name, recorded in build folder names: a pid is only meaningful on its own host."""
    return socket.gethostname() or "localhost"


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (True when that cannot be told, to keep its folder)."""
    if pid <= 0:
        return False
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT there; the age rule decides instead
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists but belongs to someone else
        return True
    return True


def _newest_change(folder: Path) -> float:
    """The latest modification time of `folder` or anything in it."""
    return max(item.lstat().st_mtime for item in [folder, *folder.rglob("*")])


def _build_is_stale(folder: Path) -> bool:
    """Whether a ``<key>.building-[<host>-]<pid>`` folder was left by a build that is no longer running.

    Stale: untouched for STALE_BUILD_SECONDS, or its pid is gone on this host.  A folder from another host
    (a shared cache) is judged by age alone, and one that changes while we look is taken as alive.
    """
    host, _, pid_text = folder.name.rpartition(BUILDING)[2].rpartition("-")
    try:
        if time.time() - _newest_change(folder) > STALE_BUILD_SECONDS:
            return True
    except OSError:
        return False
    if host and host != _host():
        return False
    return pid_text.isdigit() and not _pid_alive(int(pid_text))


def _remove(path: Path) -> None:
    """Delete whatever is at `path`: a folder with its contents, a file or a link (nothing if absent)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _remove_stale_builds(final_dir: Path, in_cache: bool, progress: bool) -> None:
    """Delete build folders left by interrupted builds next to `final_dir`; a live concurrent build's is kept.

    In the cache every zoo's build folders are candidates; elsewhere only those of `final_dir` itself, so
    that nothing of the user's next to an explicit out_dir is touched.
    """
    pattern = f"*{BUILDING}*" if in_cache else f"{glob.escape(final_dir.name)}{BUILDING}*"
    for folder in sorted(final_dir.parent.glob(pattern)):
        is_build = folder.is_dir() and not folder.is_symlink() and BUILD_NAME.search(folder.name)
        if is_build and _build_is_stale(folder):
            _say(f"flashspec zoo: removing {folder} (left by an interrupted build)", progress)
            shutil.rmtree(folder, ignore_errors=True)  # junk that cannot be removed must not stop the build


def _write_error(error: OSError, folder: Path, in_cache: bool) -> ZooCacheError:
    """The ZooCacheError for a failed write into `folder`: what went wrong and what to do."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        problem = "is full"
    elif error.errno in (errno.ENOTDIR, errno.EEXIST):
        problem = "cannot be created: a file stands on its path"
    elif error.errno in STORAGE_ERRNOS:
        problem = "is not writable"
    else:
        problem = "cannot be written"
    fix = _cache_fix() if in_cache else "pass a writable out_dir"
    return ZooCacheError(f"the zoo folder {folder} {problem} ({error.strerror or error}); {fix}")


def _in_cache(folder: Path) -> bool:
    """Whether `folder` lies in the zoo cache (its errors then point at FLASHSPEC_CACHE)."""
    try:
        return folder.absolute().is_relative_to(cache_root())
    except ZooCacheError:
        return False


def _start_work_dir(final_dir: Path, in_cache: bool, progress: bool) -> Path:
    """Create the folder a build writes into, next to `final_dir`, after removing stale ones.

    Called before any training, so that a folder that cannot be written fails in seconds.
    """
    parent = final_dir.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_builds(final_dir, in_cache, progress)
        work_dir = final_dir.with_name(f"{final_dir.name}{BUILDING}{_host()}-{os.getpid()}")
        _remove(work_dir)
        work_dir.mkdir()
    except OSError as error:
        raise _write_error(error, parent, in_cache) from error
    return work_dir


@contextlib.contextmanager
def _work_dir(final_dir: Path, in_cache: bool, progress: bool) -> Iterator[Path]:
    """A fresh build folder for `final_dir`, deleted if the build fails (storage errors become ZooCacheError)."""
    work_dir = _start_work_dir(final_dir, in_cache, progress)
    try:
        yield work_dir
    except BaseException as error:
        shutil.rmtree(work_dir, ignore_errors=True)
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            raise _write_error(error, final_dir.parent, in_cache) from error
        raise


def _install(work_dir: Path, final_dir: Path) -> None:
    """Move a finished build to `final_dir`, replacing what is there (an old zoo, a file, a link)."""
    _remove(final_dir)
    os.replace(work_dir, final_dir)


def _build(config: ZooConfig, out_dir: str | Path | None, device_: torch.device, progress: bool,
           domain_corpora: dict[str, corpora.DomainCorpus] | None) -> Path:
    if device_.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    timings: dict[str, float] = {}
    started = time.perf_counter()
    cpu_started = time.process_time()

    _say(f"flashspec zoo [{config.size}]: assembling corpora {config.domains}", progress)
    if domain_corpora is None:
        domain_corpora = corpora.assemble(config.train_chars_per_domain, config.domains)
    corpus_sha = corpora.corpora_sha256(domain_corpora)
    key = config.key(corpus_sha)
    final_dir = Path(out_dir) if out_dir is not None else check_cache_root() / key
    timings["corpora_s"] = time.perf_counter() - started
    with _work_dir(final_dir, _in_cache(final_dir), progress) as work_dir:
        _train_into(work_dir, config, domain_corpora, key, corpus_sha, device_, progress, timings,
                    (started, cpu_started))
        _install(work_dir, final_dir)
    _say(f"flashspec zoo [{config.size}]: built in {timings['total_s']:.1f} s -> {final_dir}", progress)
    return final_dir


def _train_into(work_dir: Path, config: ZooConfig, domain_corpora: dict[str, corpora.DomainCorpus], key: str,
                corpus_sha: str, device_: torch.device, progress: bool, timings: dict[str, float],
                clocks: tuple[float, float]) -> None:
    """Train the tokenizer and every model into `work_dir` and write the manifest last.

    `clocks` holds the build's start on `time.perf_counter` and `time.process_time`, for the timings.
    """
    from safetensors.torch import save_file

    started, cpu_started = clocks

    _say(f"flashspec zoo [{config.size}]: training tokenizer (byte-level BPE, V={config.vocab_size})", progress)
    mark = time.perf_counter()
    tokenizer_texts = [domain_corpora[d].train_text[:config.tokenizer_chars_per_domain] for d in config.domains]
    tokenizer = train_tokenizer(tokenizer_texts, config.vocab_size)
    train_ids = {d: encode_text(tokenizer, domain_corpora[d].train_text) for d in config.domains}
    heldout_ids = {d: encode_text(tokenizer, domain_corpora[d].heldout_text) for d in config.domains}
    timings["tokenizer_s"] = time.perf_counter() - mark
    for domain in config.domains:
        if train_ids[domain].numel() <= config.context + 1:
            raise ValueError(f"domain {domain!r} has too little text for context {config.context}")

    tokenizer.save_pretrained(work_dir / "tokenizer")

    generalist = f"draft-{GENERALIST}"
    # (name, shape, domains, steps, lr, batch, start from): the specialists start from the trained generalist
    plan = [("target", config.target, list(config.domains), config.target_steps, config.target_lr,
             config.batch_size, None),
            (generalist, config.draft, list(config.domains), config.draft_steps, config.draft_lr,
             config.draft_batch_size, None)]
    for domain in config.domains:
        plan.append((f"draft-{domain}", config.draft, [domain], config.specialist_steps, config.specialist_lr,
                     config.draft_batch_size, generalist))

    models_info: dict[str, Any] = {}
    trained: dict[str, torch.nn.Module] = {}
    for name, spec, domains, steps, lr, batch_size, start in plan:
        mark = time.perf_counter()
        origin = f"fine-tuning {start}" if start else "training"
        _say(f"flashspec zoo [{config.size}]: {origin} {name} on {'+'.join(domains)} ({steps} steps)", progress)
        if start is None:
            model = make_model(spec, config, tokenizer, derive_seed(config.seed, "init:" + name))
        else:
            model = copy.deepcopy(trained[start])
        losses = train_model(model, [train_ids[d] for d in domains], steps, config, lr,
                             derive_seed(config.seed, "batches:" + name), device_, name, progress, batch_size)
        model.to("cpu")
        model.save_pretrained(work_dir / name)
        tokenizer.save_pretrained(work_dir / name)
        models_info[name] = {
            "domains": domains, "steps": steps, "initialised_from": start or "random",
            "parameters": count_parameters(model), "weights_sha256": weights_sha256(model),
            "final_loss": sum(losses[-20:]) / len(losses[-20:]), "train_seconds": time.perf_counter() - mark,
        }
        timings[f"train_{name}_s"] = time.perf_counter() - mark
        if name == generalist:
            trained[name] = model
        else:
            del model
    trained.clear()

    save_file({d: heldout_ids[d] for d in config.domains}, str(work_dir / HELDOUT))
    prompts = {d: prompt_windows(heldout_ids[d], config.num_prompts, config.prompt_tokens) for d in config.domains}
    (work_dir / PROMPTS).write_text(json.dumps(
        {d: {"ids": prompts[d], "texts": [tokenizer.decode(p) for p in prompts[d]]} for d in config.domains}))
    timings["total_s"] = time.perf_counter() - started
    timings["process_cpu_s"] = time.process_time() - cpu_started  # wall vs CPU time shows machine contention
    files = sorted(p for p in work_dir.rglob("*") if p.is_file())
    manifest = {
        "format": ZOO_FORMAT, "key": key, "config": dataclasses.asdict(config),
        "corpus_sha256": corpus_sha, "corpora": {d: domain_corpora[d].manifest() for d in config.domains},
        "tokens": {d: {"train": int(train_ids[d].numel()), "heldout": int(heldout_ids[d].numel())}
                   for d in config.domains},
        "models": models_info, "device": str(device_), "timings": timings, "environment": environment(),
        "files": {str(p.relative_to(work_dir)): _file_sha256(p) for p in files},
    }
    (work_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))


MANIFEST_KEYS = ("format", "key", "config", "corpus_sha256", "corpora", "tokens", "models", "device", "timings",
                 "environment", "files")


def _read_manifest(path: Path) -> dict[str, Any]:
    """The parsed manifest of the zoo folder `path`; ValueError if it is absent, unreadable or not an object."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is not a folder")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ValueError(f"no {MANIFEST} in {path}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"unreadable {MANIFEST}: {error}") from error
    if not isinstance(manifest, dict):
        kind = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}.get(
            type(manifest), "null")
        raise ValueError(f"{MANIFEST} holds a JSON {kind}, not a JSON object")
    return manifest


def _required_files(domains: list[str]) -> set[str]:
    """Files `load_zoo` opens, which a manifest must list (so that their hashes get checked)."""
    models = ["target", *(f"draft-{name}" for name in [*domains, GENERALIST])]
    return {PROMPTS, HELDOUT, "tokenizer/tokenizer.json",
            *(f"{model}/{file}" for model in models for file in ("config.json", "model.safetensors"))}


def _check_manifest_shape(manifest: dict[str, Any]) -> None:
    """ValueError unless the manifest has this format's keys, types and file list (contents not read)."""
    if manifest.get("format") != ZOO_FORMAT:
        raise ValueError(f"{MANIFEST} has format {manifest.get('format')!r}, expected {ZOO_FORMAT}")
    missing = [key for key in MANIFEST_KEYS if key not in manifest]
    if missing:
        raise ValueError(f"{MANIFEST} lacks {', '.join(missing)}")
    files, config = manifest["files"], manifest["config"]
    if not isinstance(files, dict) or not isinstance(config, dict) or not isinstance(manifest["models"], dict):
        raise ValueError(f"{MANIFEST} has files, config or models that are not JSON objects")
    domains = config.get("domains")
    if not isinstance(domains, list) or not all(isinstance(d, str) for d in domains):
        raise ValueError(f"{MANIFEST} has no list of domains in its config")
    for relpath, expected in files.items():
        parts = Path(relpath).parts
        if not isinstance(expected, str) or not parts or Path(relpath).is_absolute() or ".." in parts:
            raise ValueError(f"{MANIFEST} lists a malformed file entry {relpath!r}")
    absent = sorted(_required_files(domains) - set(files))
    if absent:
        raise ValueError(f"{MANIFEST} does not list {', '.join(absent)}")


def check_zoo_dir(path: str | Path) -> dict[str, Any]:
    """The manifest of a complete, intact zoo folder; ValueError saying what is wrong otherwise."""
    path = Path(path)
    manifest = _read_manifest(path)
    _check_manifest_shape(manifest)
    for relpath, expected in manifest["files"].items():
        file_path = path / relpath
        if not file_path.is_file():
            raise ValueError(f"missing file {relpath}")
        if _file_sha256(file_path) != expected:
            raise ValueError(f"file {relpath} does not match its SHA-256 (corrupt or edited)")
    return manifest


def zoo_dir(size: str | ZooConfig = "cpu", device: str | None = None, progress: bool = True,
            rebuild: bool = False) -> Path:
    """The cache folder of a zoo, building it first when it is missing, corrupt or `rebuild` is set.

    ZooCacheError when the cache folder cannot hold it (checked before the corpora are assembled when a
    file is in the way, before training when the folder cannot be written).
    """
    config = get_config(size)
    root = check_cache_root()
    domain_corpora = corpora.assemble(config.train_chars_per_domain, config.domains)
    key = config.key(corpora.corpora_sha256(domain_corpora))
    path = root / key
    if not rebuild:
        if not path.exists():
            _say(f"flashspec zoo [{config.size}]: no cached zoo at {path}; building it (one-off)", progress)
        else:
            try:
                if check_zoo_dir(path)["key"] != key:
                    raise ValueError(f"its {MANIFEST} names another key")
                return path
            except ValueError as error:
                message = f"flashspec zoo [{config.size}]: cached zoo at {path} is unusable ({error}); rebuilding it"
                warnings.warn(message, ZooCacheWarning, stacklevel=2)
                _say(message, True)
    return build_zoo(config, path, device=device, progress=progress, domain_corpora=domain_corpora)


@dataclass
class Zoo:
    """A loaded zoo: tokenizer, target, drafts (name -> model), held-out ids and prompts per domain."""

    path: Path
    manifest: dict[str, Any]
    tokenizer: Any
    target: torch.nn.Module
    drafts: dict[str, torch.nn.Module]
    heldout: dict[str, torch.Tensor]
    prompts: dict[str, list[list[int]]]
    domains: tuple[str, ...] = field(default_factory=tuple)

    @property
    def size(self) -> str:
        return self.manifest["config"]["size"]


def load_zoo(size: str | ZooConfig = "cpu", device: str | None = None, dtype: torch.dtype | None = None,
             path: str | Path | None = None, progress: bool = True) -> Zoo:
    """Load (building if needed) a zoo onto `device` (default CUDA if present) in `dtype`.

    `path` loads a specific folder (no build); otherwise the cache folder for `size` is used.
    """
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not progress:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    folder = Path(path) if path is not None else zoo_dir(size, device=device, progress=progress)
    manifest = check_zoo_dir(folder)
    device_ = pick_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device_.type == "cuda" else torch.float32
    domains = tuple(manifest["config"]["domains"])

    def load(name: str) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(folder / name, dtype=dtype)
        return model.to(device_).eval()

    prompts = json.loads((folder / PROMPTS).read_text())
    return Zoo(
        path=folder, manifest=manifest, tokenizer=AutoTokenizer.from_pretrained(folder / "tokenizer"),
        target=load("target"), drafts={name: load(f"draft-{name}") for name in [*domains, GENERALIST]},
        heldout=load_file(str(folder / HELDOUT)), prompts={d: prompts[d]["ids"] for d in domains},
        domains=domains,
    )


# ----------------------------------------------------------------------------------------------- metadata

def environment() -> dict[str, Any]:
    """Hardware and versions for a results file."""
    import tokenizers
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__, "platform": platform.platform(), "processor": platform.processor(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    return info


def run_metadata(command: list[str] | None = None) -> dict[str, Any]:
    """Date, git SHA, command and environment, stored beside every measurement."""
    return {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_sha": provenance.git_sha(),
        "command": " ".join(command if command is not None else sys.argv),
        "environment": environment(),
    }


# ----------------------------------------------------------------------------------------------- measurements

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
def _window_logits(model: torch.nn.Module, windows: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    device = next(model.parameters()).device
    return [model(input_ids=windows[i:i + batch_size, :-1].to(device)).logits.float()
            for i in range(0, windows.shape[0], batch_size)]


@torch.no_grad()
def perplexity(model: torch.nn.Module, ids: torch.Tensor, context: int, max_tokens: int,
               batch_size: int = 16) -> float:
    """exp(mean next-token negative log-likelihood) on held-out windows."""
    windows = heldout_windows(ids, context, max_tokens)
    total, count = 0.0, 0
    for start, logits in zip(range(0, windows.shape[0], batch_size), _window_logits(model, windows, batch_size)):
        labels = windows[start:start + batch_size, 1:].to(logits.device)
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                         reduction="sum"))
        count += labels.numel()
    return math.exp(total / count)


def perplexity_table(zoo: Zoo, max_tokens: int | None = None) -> dict[str, dict[str, float]]:
    """Held-out perplexity, model name -> domain -> perplexity."""
    config = zoo.manifest["config"]
    budget = config["eval_tokens"] if max_tokens is None else max_tokens
    return {name: {d: perplexity(get_model(zoo, name), zoo.heldout[d], config["context"], budget)
                   for d in zoo.domains} for name in model_names(zoo)}


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
                                           _window_logits(draft, windows, batch_size)):
        p = warp_logits(target_logits, params).exp()
        q = warp_logits(draft_logits.to(p.device), params).exp()
        overlap = torch.minimum(p, q).sum(dim=-1)
        total += float(overlap.sum())
        count += overlap.numel()
    return total / count


def expected_acceptance_matrix(zoo: Zoo, max_tokens: int | None = None) -> dict[str, dict[str, float]]:
    """Draft name -> domain -> mean Σ min(p, q) at T = 1 on held-out text."""
    config = zoo.manifest["config"]
    budget = config["eval_tokens"] if max_tokens is None else max_tokens
    return {name: {d: expected_acceptance(zoo.target, draft, zoo.heldout[d], config["context"], budget)
                   for d in zoo.domains} for name, draft in zoo.drafts.items()}


def prompt_batch(zoo: Zoo, domain: str, num_prompts: int | None = None) -> torch.Tensor:
    """The held-out prompts of one domain as a LongTensor [P, prompt_tokens] (equal lengths, no padding)."""
    prompts = zoo.prompts[domain][:num_prompts] if num_prompts else zoo.prompts[domain]
    return torch.tensor(prompts, dtype=torch.long)


def engine_acceptance(zoo: Zoo, draft_name: str, domain: str, gamma: int = 4, max_new_tokens: int = 48,
                      num_prompts: int | None = None, seed: int = 0, temperature: float = 1.0,
                      backend: str = "auto") -> dict[str, Any]:
    """Speculative generation with one fixed draft on a domain's prompts (batched), via the engine.

    Returns the engine's summary: mean_acceptance (accepted / drafted), mean_accepted_length, tokens/s...
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
    cell = {key: summary.get(key) for key in ("mean_acceptance", "mean_accepted_length", "mean_tokens_per_step",
                                          "tokens_per_s", "generated_tokens", "steps", "batch_size")}
    cell["token_acceptance"] = token_acceptance(result.stats.steps)
    return cell


def token_acceptance(steps: list[Any]) -> float:
    """Per-token acceptance rate α from engine steps: accepted / (accepted + rejections).

    Each row-step with n accepted of γ is n accepted draft tokens followed by one rejection unless n = γ
    (the truncated geometric the bandits' conjugate update uses); this is the maximum-likelihood α, the same
    quantity as the exact Σ min(p, q).  `mean_acceptance` (accepted / drafted) is E[n]/γ, which is smaller
    (≈ (α + α² + ... + α^γ)/γ).
    """
    accepted = sum(n for step in steps for n in step.num_accepted)
    rejected = sum(1 for step in steps for n in step.num_accepted if n < step.gamma)
    return accepted / (accepted + rejected) if accepted + rejected else math.nan


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


# ----------------------------------------------------------------------------------------------- report + CLI

@dataclass(frozen=True)
class ExperimentSettings:
    """How much to measure per size: acceptance-matrix and switching-workload budgets."""

    matrix_prompts: int
    matrix_new_tokens: int
    switching_requests: int
    switching_block: int
    switching_new_tokens: int
    bandits: tuple[str, ...]
    gamma: int = 4


EXPERIMENTS: dict[str, ExperimentSettings] = {
    # Sized for a shared 2-core CPU (the engine runs ~3-10 steps/s there).
    "cpu": ExperimentSettings(matrix_prompts=24, matrix_new_tokens=64, switching_requests=12, switching_block=2,
                              switching_new_tokens=20, bandits=("thompson", "d-ts")),
    # Sized for ~5 minutes of measurement on one H200 after a ~2-minute build (one 10-minute device call).
    "gpu": ExperimentSettings(matrix_prompts=32, matrix_new_tokens=64, switching_requests=12, switching_block=3,
                              switching_new_tokens=40, bandits=("thompson", "d-ts")),
    "micro": ExperimentSettings(matrix_prompts=2, matrix_new_tokens=6, switching_requests=4, switching_block=2,
                                switching_new_tokens=6, bandits=("thompson",)),
}


def hardware_line(env: dict[str, Any]) -> str:
    """One line naming the hardware, for figure footers."""
    if env.get("gpu"):
        return f"{env['gpu']}, torch {env['torch']}"
    return f"CPU {env.get('processor') or env.get('platform')} x{env.get('cpu_count')}, torch {env['torch']}"


def _record(settings: dict[str, Any], results: dict[str, Any], command: list[str] | None) -> dict[str, Any]:
    meta = run_metadata(command)
    return {"settings": settings, "results": results, "git_sha": meta["git_sha"],
            "hardware": hardware_line(meta["environment"]), **meta}


def build_summary(zoo: Zoo) -> dict[str, Any]:
    """What was built: config, corpora (licences, SHA-256), token counts, model sizes, timings."""
    manifest = zoo.manifest
    models = manifest["models"]
    target_params = models["target"]["parameters"]
    return {
        "key": manifest["key"], "config": manifest["config"], "corpus_sha256": manifest["corpus_sha256"],
        "corpora": manifest["corpora"], "tokens": manifest["tokens"], "models": models,
        "target_to_draft_parameter_ratio": {name: target_params / info["parameters"]
                                            for name, info in models.items() if name != "target"},
        "build_device": manifest["device"], "build_timings": manifest["timings"],
        "build_environment": manifest["environment"],
    }


def measure_acceptance(zoo: Zoo, settings: ExperimentSettings, progress: bool = True,
                       backend: str = "auto") -> dict[str, Any]:
    """Engine-measured acceptance matrix (γ, T = 1) + exact teacher-forced Σ min(p, q), with the margins."""
    engine = engine_acceptance_matrix(zoo, settings.gamma, settings.matrix_new_tokens, settings.matrix_prompts,
                                      progress=progress, backend=backend)
    engine_alpha = {name: {d: cell["token_acceptance"] for d, cell in row.items()} for name, row in engine.items()}
    engine_fraction = {name: {d: cell["mean_acceptance"] for d, cell in row.items()} for name, row in engine.items()}
    _say("flashspec zoo: exact teacher-forced acceptance (sum of min(p, q))", progress)
    exact = expected_acceptance_matrix(zoo)
    return {
        "gamma": settings.gamma, "temperature": 1.0, "domains": list(zoo.domains), "drafts": list(zoo.drafts),
        "definitions": {
            "engine_token_acceptance": "per-token α = accepted / (accepted + rejections), engine steps",
            "engine_accepted_fraction": "accepted / drafted = E[n]/γ, engine steps (stats.summary mean_acceptance)",
            "teacher_forced_expected_acceptance": "mean Σ_v min(p_v, q_v) on held-out text, T = 1 (exact α)",
        },
        "engine": engine, "engine_token_acceptance": engine_alpha,
        "engine_margins": specialisation_margins(engine_alpha, zoo.domains),
        "engine_accepted_fraction": engine_fraction,
        "engine_fraction_margins": specialisation_margins(engine_fraction, zoo.domains),
        "teacher_forced_expected_acceptance": exact,
        "teacher_forced_margins": specialisation_margins(exact, zoo.domains),
    }


def measure_switching(zoo: Zoo, settings: ExperimentSettings, best_arm: dict[str, int],
                      progress: bool = True, backend: str = "auto") -> dict[str, Any]:
    from flashspec import switching

    return switching.run_switching_experiment(
        zoo.target, zoo.drafts, zoo.prompts, best_arm, settings.switching_requests, settings.switching_block,
        settings.switching_new_tokens, settings.gamma, settings.bandits, progress=progress, backend=backend)


def report(size: str, out_dir: str | Path, fresh: bool = False, device: str | None = None,
           settings: ExperimentSettings | None = None, command: list[str] | None = None,
           progress: bool = True, backend: str = "auto") -> list[Path]:
    """Build (from scratch when `fresh`) and measure a zoo; write JSON + PNG files into `out_dir`.

    Files: zoo_<size>_build.json, zoo_<size>_perplexity.json, zoo_<size>_acceptance.json/.png,
    zoo_<size>_switching.json, zoo_<size>_switching_trace.png (6 files).
    """
    from flashspec import plots

    config = get_config(size)
    settings = settings or EXPERIMENTS[config.size]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    stage: dict[str, float] = {}
    path = zoo_dir(config, device=device, progress=progress, rebuild=fresh)
    stage["build_or_load_s"] = time.perf_counter() - started
    zoo = load_zoo(config, device=device, path=path, progress=progress)
    prefix = f"zoo_{config.size}"
    written = []

    def save(name: str, settings_: dict[str, Any], results: dict[str, Any],
             extra: dict[str, Any] | None = None) -> dict[str, Any]:
        record = {**_record({"size": config.size, **settings_}, results, command), **(extra or {})}
        file = out / f"{prefix}_{name}.json"
        file.write_text(json.dumps(record, indent=1))
        written.append(file)
        _say(f"flashspec zoo: wrote {file}", progress)
        return record

    save("build", {"fresh": fresh}, build_summary(zoo))
    mark = time.perf_counter()
    _say("flashspec zoo: held-out perplexity", progress)
    save("perplexity", {"eval_tokens_per_domain": config.eval_tokens}, perplexity_table(zoo))
    stage["perplexity_s"] = time.perf_counter() - mark

    mark = time.perf_counter()
    acceptance = measure_acceptance(zoo, settings, progress, backend)
    stage["acceptance_s"] = time.perf_counter() - mark
    record = save("acceptance", {"gamma": settings.gamma, "temperature": 1.0, "prompts": settings.matrix_prompts,
                                 "new_tokens": settings.matrix_new_tokens, "verify_backend": backend}, acceptance)
    figure = out / f"{prefix}_acceptance.png"
    plots.plot_acceptance_matrix(record, figure)
    written.append(figure)

    names = list(zoo.drafts)
    best_arm = {d: max(range(len(names)), key=lambda a: acceptance["engine_token_acceptance"][names[a]][d])
                for d in zoo.domains}
    mark = time.perf_counter()
    switching_results = measure_switching(zoo, settings, best_arm, progress, backend)
    stage["switching_s"] = time.perf_counter() - mark
    stage["total_s"] = time.perf_counter() - started
    record = save("switching", {key: value for key, value in dataclasses.asdict(settings).items()
                                if key.startswith("switching") or key == "gamma"}, switching_results,
                  {"bandits": list(settings.bandits), "oracle_arms": {d: names[a] for d, a in best_arm.items()},
                   "stage_seconds": stage})
    figure = out / f"{prefix}_switching_trace.png"
    plots.plot_arm_trace(record, figure)
    written.append(figure)
    _say(format_report(out, config.size), progress)
    return written


def format_report(out_dir: str | Path, size: str) -> str:
    """A plain-text digest of the report files in `out_dir`."""
    out = Path(out_dir)
    lines = []
    ppl = json.loads((out / f"zoo_{size}_perplexity.json").read_text())["results"]
    domains = list(next(iter(ppl.values())))
    lines.append("held-out perplexity   " + "  ".join(f"{d:>8}" for d in domains))
    for name, row in ppl.items():
        lines.append(f"  {name:<20}" + "  ".join(f"{row[d]:8.2f}" for d in domains))
    acc = json.loads((out / f"zoo_{size}_acceptance.json").read_text())["results"]
    for label, key, margins in (("engine per-token α (γ=4, T=1)", "engine_token_acceptance", "engine_margins"),
                                ("engine accepted/drafted (γ=4, T=1)", "engine_accepted_fraction",
                                 "engine_fraction_margins"),
                                ("teacher-forced Σmin(p,q)", "teacher_forced_expected_acceptance",
                                 "teacher_forced_margins")):
        lines.append(f"{label}   " + "  ".join(f"{d:>8}" for d in domains))
        for name, row in acc[key].items():
            lines.append(f"  {name:<20}" + "  ".join(f"{row[d]:8.3f}" for d in domains))
        margin = acc[margins]
        lines.append("  specialist margin: " + ", ".join(f"{d} {m:+.3f}" for d, m in margin["margins"].items())
                     + f"  (>= {margin['required']}: {'PASS' if margin['passed'] else 'FAIL'})")
    path = out / f"zoo_{size}_switching.json"
    if path.exists():
        switching_results = json.loads(path.read_text())["results"]
        for kind, block in switching_results.items():
            lines.append(f"switching [{kind}]: tokens/s  tokens/step  acceptance")
            for label, run in block["runs"].items():
                lines.append(f"  {label:<20}{run['tokens_per_s']:9.1f}  {run['tokens_per_step']:9.3f}"
                             f"  {run['mean_acceptance']:9.3f}")
            summary = block["summary"]
            ratios = summary["tokens_per_s"]
            lines.append(f"  best bandit {summary['best_bandit']}: {ratios['best_bandit_vs_oracle']:.3f}"
                         f" x oracle, {ratios['best_bandit_vs_best_fixed']:.3f} x best fixed "
                         f"({summary['best_fixed']}) in tokens/s; targets >= 0.95 and >= 1.15")
    return "\n".join(lines)


def info(size: str) -> str:
    """Where a size's zoo lives, whether it is built, and what it holds (does not build)."""
    config = get_config(size)
    root = check_cache_root()
    domain_corpora = corpora.assemble(config.train_chars_per_domain, config.domains)
    path = root / config.key(corpora.corpora_sha256(domain_corpora))
    lines = [f"zoo size {config.size}: {path}"]
    try:
        manifest = check_zoo_dir(path)
    except ValueError as error:
        lines.append(f"  not built ({error}); run: flashspec zoo build --size {config.size}")
        manifest = None
    if manifest is not None:
        lines.append(f"  built on {manifest['device']} in {manifest['timings']['total_s']:.1f} s")
        for name, model in manifest["models"].items():
            lines.append(f"  {name:<14} {model['parameters']:>11,} parameters  trained on {'+'.join(model['domains'])}"
                         f" ({model['steps']} steps, final loss {model['final_loss']:.3f})")
    for domain, corpus in domain_corpora.items():
        lines.append(f"  corpus {domain:<7} {len(corpus.train_text):>10,} train chars  sha256 {corpus.sha256[:16]}…"
                     f"  licence: {corpus.licence}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`flashspec zoo build|info|perplexity|acceptance|switching|report|gpu-report ...`."""
    parser = argparse.ArgumentParser(prog="flashspec zoo", description="Offline model zoo: build, inspect, measure.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("build", "build (or load from cache) the zoo"), ("info", "show cache folder and contents"),
                       ("perplexity", "held-out perplexity, models x domains"),
                       ("acceptance", "acceptance matrix, drafts x domains (engine + teacher-forced)"),
                       ("switching", "domain-switching experiment"),
                       ("report", "build + perplexity + acceptance + switching; JSON + PNG into --out"),
                       ("gpu-report", "the H200 run: build the gpu zoo from scratch, then everything, into --out")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--size", choices=sorted(SIZES), default="gpu" if name == "gpu-report" else "cpu")
        sub.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
        sub.add_argument("--verify-backend", default="auto", choices=("auto", "torch", "triton"),
                         help="flashspec.verify backend inside the engine (auto: Triton on CUDA)")
        if name in ("build",):
            sub.add_argument("--rebuild", action="store_true", help="ignore the cache and build again")
        if name in ("perplexity", "acceptance", "switching", "report", "gpu-report"):
            sub.add_argument("--out", default="results", help="folder for the JSON / PNG files")
        if name == "report":
            sub.add_argument("--fresh", action="store_true", help="rebuild from scratch first")
    args = parser.parse_args(argv)
    command = ["flashspec", "zoo", *(sys.argv[1:] if argv is None else argv)]
    try:
        return _run(args, command)
    except ZooCacheError as error:  # a cache the user must fix: say how, without a traceback
        print(f"flashspec zoo: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, command: list[str]) -> int:
    """Carry out one parsed `flashspec zoo` command; `command` is recorded in the results files."""
    if args.command == "build":
        path = zoo_dir(args.size, device=args.device, rebuild=args.rebuild)
        print(info(args.size))
        print(path)
        return 0
    if args.command == "info":
        print(info(args.size))
        return 0
    if args.command in ("report", "gpu-report"):
        fresh = args.command == "gpu-report" or args.fresh
        files = report(args.size, args.out, fresh=fresh, device=args.device, command=command,
                       backend=args.verify_backend)
        print("\n".join(str(f) for f in files))
        return 0
    settings = EXPERIMENTS[args.size]
    zoo = load_zoo(args.size, device=args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.command == "perplexity":
        results: dict[str, Any] = perplexity_table(zoo)
    elif args.command == "acceptance":
        results = measure_acceptance(zoo, settings, backend=args.verify_backend)
    else:
        names = list(zoo.drafts)
        exact = expected_acceptance_matrix(zoo)
        best_arm = {d: max(range(len(names)), key=lambda a: exact[names[a]][d]) for d in zoo.domains}
        results = measure_switching(zoo, settings, best_arm, backend=args.verify_backend)
    file = out / f"zoo_{args.size}_{args.command}.json"
    file.write_text(json.dumps(_record({"size": args.size, **dataclasses.asdict(settings)}, results, command),
                               indent=1))
    print(json.dumps(results if args.command != "switching" else
                     {k: v["summary"] for k, v in results.items()}, indent=1)[:4000])
    print(file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
