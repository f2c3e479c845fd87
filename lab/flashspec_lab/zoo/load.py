"""Finding and loading a zoo: the manifest checks, the cache lookup that builds on a miss, and `load_zoo`."""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flashspec import models
from flashspec_lab import corpora
from flashspec_lab.zoo import cache, distill
from flashspec_lab.zoo.build import HELDOUT, MANIFEST, PROMPTS, build_zoo, file_sha256
from flashspec_lab.zoo.config import GENERALIST, ZOO_FORMAT, ZooConfig, get_config

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


def _required_files(domains: list[str], distilled: bool = False, features: bool = False) -> set[str]:
    """Files `load_zoo` opens, which a manifest must list (so that their hashes get checked); a distilled
    zoo's target is its teacher, loaded from elsewhere (`flashspec_lab.zoo.distill.load_teacher`); a feature
    draft adds its own two files."""
    from flashspec.features import FEATURES_FILE, WEIGHTS_FILE

    names = [*([] if distilled else ["target"]), *(f"draft-{name}" for name in [*domains, GENERALIST]),
             *([distill.FEATURE_DRAFT] if features else [])]
    return {PROMPTS, HELDOUT, "tokenizer/tokenizer.json",
            *(f"{model}/{file}" for model in names for file in ("config.json", "model.safetensors")),
            *((f"{distill.FEATURE_DRAFT}/{FEATURES_FILE}", f"{distill.FEATURE_DRAFT}/{WEIGHTS_FILE}") if features
              else ())}


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
    absent = sorted(_required_files(domains, config.get("teacher") is not None,
                                    bool(config.get("feature_steps"))) - set(files))
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
        if file_sha256(file_path) != expected:
            raise ValueError(f"file {relpath} does not match its SHA-256 (corrupt or edited)")
    return manifest


def zoo_dir(size: str | ZooConfig = "cpu", device: str | None = None, progress: bool = True,
            rebuild: bool = False) -> Path:
    """The cache folder of a zoo, building it first when it is missing, corrupt or `rebuild` is set.

    ZooCacheError when the cache folder cannot hold it (checked before the corpora are assembled when a
    file is in the way, before training when the folder cannot be written).
    """
    config = get_config(size)
    cache.check_cache_root()  # before the corpora: a wrong FLASHSPEC_CACHE fails at once
    domain_corpora = corpora.assemble(config.train_chars_per_domain, config.domains)
    path = cache.cache_path(config, domain_corpora)
    key = path.name
    if not rebuild:
        if not path.exists():
            cache.say(f"flashspec zoo [{config.size}]: no cached zoo at {path}; building it (one-off)", progress)
        else:
            try:
                if check_zoo_dir(path)["key"] != key:
                    raise ValueError(f"its {MANIFEST} names another key")
                return path
            except ValueError as error:
                message = f"flashspec zoo [{config.size}]: cached zoo at {path} is unusable ({error}); rebuilding it"
                warnings.warn(message, cache.ZooCacheWarning, stacklevel=2)
                cache.say(message, True)
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
    device_ = torch.device(device) if device is not None else models.default_device()
    if dtype is None:
        dtype = models.half_dtype(device_) if device_.type == "cuda" else torch.float32  # fp16 on a T4
    domains = tuple(manifest["config"]["domains"])

    def load(name: str) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(folder / name, dtype=dtype)
        return model.to(device_).eval()

    prompts = json.loads((folder / PROMPTS).read_text())
    teacher = manifest["config"].get("teacher")
    if teacher is None:
        target = load("target")
    else:
        target = distill.load_teacher(teacher, device_)[0].to(dtype)
    drafts = {name: load(f"draft-{name}") for name in [*domains, GENERALIST]}
    if manifest["config"].get("feature_steps"):
        from flashspec.features import FeatureDraft

        drafts[distill.FEATURE_DRAFT.removeprefix("draft-")] = FeatureDraft.from_pretrained(
            folder / distill.FEATURE_DRAFT, dtype=dtype).to(device_).eval()
    return Zoo(
        path=folder, manifest=manifest, tokenizer=AutoTokenizer.from_pretrained(folder / "tokenizer"),
        target=target, drafts=drafts,
        heldout=load_file(str(folder / HELDOUT)), prompts={d: prompts[d]["ids"] for d in domains},
        domains=domains,
    )

