"""Building a zoo: corpora, tokenizer, every model of the training plan, held-out text, prompts, manifest.

Deterministic given the config's seed on one platform.  The manifest, written last, lists every file with its
SHA-256, so a load can tell a complete zoo from a damaged one (`flashspec_lab.zoo.load.check_zoo_dir`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from flashspec import models
from flashspec_lab import corpora, provenance
from flashspec_lab.zoo import cache, distill, training
from flashspec_lab.zoo.config import ZOO_FORMAT, ZooConfig, get_config

MANIFEST = "manifest.json"
PROMPTS = "prompts.json"
HELDOUT = "heldout.safetensors"


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prompt_windows(heldout_ids: torch.Tensor, num_prompts: int, prompt_tokens: int) -> list[list[int]]:
    """`num_prompts` held-out windows of `prompt_tokens` ids at evenly spaced offsets."""
    span = heldout_ids.numel() - prompt_tokens - 1
    if span <= 0:
        raise ValueError(f"held-out text too short for prompts of {prompt_tokens} tokens")
    offsets = [int(i * span / num_prompts) for i in range(num_prompts)]
    return [heldout_ids[o:o + prompt_tokens].tolist() for o in offsets]


def check_build_device(config: ZooConfig, device: str | None) -> None:
    """ValueError before any work when a zoo that needs a GPU would build on a CPU by default; an explicit
    `device` (e.g. "cpu") is obeyed."""
    if device is None and config.teacher in distill.GPU_TEACHERS and not torch.cuda.is_available():
        raise ValueError(f"building zoo size {config.size!r} distils {config.teacher} and needs a CUDA GPU (minutes on "
                         "an H200, hours on a CPU); build it where one is available, or pass device='cpu' "
                         f"(flashspec zoo build --size {config.size} --device cpu) to build here anyway")


def build_zoo(size: str | ZooConfig = "cpu", out_dir: str | Path | None = None, device: str | None = None,
              progress: bool = True, domain_corpora: dict[str, corpora.DomainCorpus] | None = None) -> Path:
    """Train the whole zoo from the offline corpora and save it to `out_dir` (default: the cache folder).

    Deterministic given `config.seed` on one platform.  Returns the folder.  The folder is written under
    a temporary name and renamed at the end, so an interrupted build never looks complete.
    """
    config = get_config(size)
    check_build_device(config, device)
    device_ = torch.device(device) if device is not None else models.default_device()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _build(config, out_dir, device_, progress, domain_corpora)
    finally:  # the engine measured afterwards should run with the caller's settings
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])


def _build(config: ZooConfig, out_dir: str | Path | None, device_: torch.device, progress: bool,
           domain_corpora: dict[str, corpora.DomainCorpus] | None) -> Path:
    if device_.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    timings: dict[str, float] = {}
    started = time.perf_counter()
    cpu_started = time.process_time()

    cache.say(f"flashspec zoo [{config.size}]: assembling corpora {config.domains}", progress)
    if domain_corpora is None:
        domain_corpora = corpora.assemble(config.train_chars_per_domain, config.domains)
    corpus_sha = corpora.corpora_sha256(domain_corpora)
    key = config.key(corpus_sha)
    final_dir = Path(out_dir) if out_dir is not None else cache.check_cache_root() / key
    timings["corpora_s"] = time.perf_counter() - started
    with cache.building_dir(final_dir, cache.is_in_cache(final_dir), progress) as work_dir:
        _train_into(work_dir, config, domain_corpora, key, corpus_sha, device_, progress, timings,
                    (started, cpu_started))
        cache.install(work_dir, final_dir)
    cache.say(f"flashspec zoo [{config.size}]: built in {timings['total_s']:.1f} s -> {final_dir}", progress)
    return final_dir


def _save_model(work_dir: Path, name: str, model: torch.nn.Module, tokenizer: Any, losses: list[float],
                started: float, identity: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Save a trained model and the tokenizer under `work_dir / name`; return its manifest entry: `identity`,
    its sizes, weight hash, final loss (mean of the last 20 steps) and seconds since `started`, then `extra`."""
    model.save_pretrained(work_dir / name)
    tokenizer.save_pretrained(work_dir / name)
    return {**identity, "parameters": training.count_parameters(model),
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "weights_sha256": training.weights_sha256(model),
            "final_loss": sum(losses[-20:]) / len(losses[-20:]), "train_seconds": time.perf_counter() - started,
            **extra}


def _train_into(work_dir: Path, config: ZooConfig, domain_corpora: dict[str, corpora.DomainCorpus], key: str,
                corpus_sha: str, device_: torch.device, progress: bool, timings: dict[str, float],
                clocks: tuple[float, float]) -> None:
    """Train the tokenizer and every model into `work_dir` and write the manifest last.

    `clocks` holds the build's start on `time.perf_counter` and `time.process_time`, for the timings.
    """
    from safetensors.torch import save_file

    started, cpu_started = clocks

    mark = time.perf_counter()
    if config.distilled:
        cache.say(f"flashspec zoo [{config.size}]: loading the teacher {config.teacher} and its tokenizer", progress)
        teacher, tokenizer = distill.load_teacher(config.teacher, device_)
        timings["teacher_load_s"] = time.perf_counter() - mark
        mark = time.perf_counter()
    else:
        cache.say(f"flashspec zoo [{config.size}]: training tokenizer (byte-level BPE, V={config.vocab_size})",
                  progress)
        tokenizer_texts = [domain_corpora[d].train_text[:config.tokenizer_chars_per_domain] for d in config.domains]
        tokenizer = training.train_tokenizer(tokenizer_texts, config.vocab_size)
    train_ids = {d: training.encode_text(tokenizer, domain_corpora[d].train_text) for d in config.domains}
    heldout_ids = {d: training.encode_text(tokenizer, domain_corpora[d].heldout_text) for d in config.domains}
    timings["tokenizer_s"] = time.perf_counter() - mark
    for domain in config.domains:
        if train_ids[domain].numel() <= config.context + 1:
            raise ValueError(f"domain {domain!r} has too little text for context {config.context}")

    tokenizer.save_pretrained(work_dir / "tokenizer")

    models_info: dict[str, Any] = {}
    mark = time.perf_counter()
    if config.distilled:
        layers = distill.init_layers(config, teacher.config.num_hidden_layers)
        fresh = f"{config.teacher} layers {list(layers)}"
        models_info["target"] = {**distill.teacher_record(config.teacher),
                                 "parameters": training.count_parameters(teacher)}
        trained = distill.distill_pool(config, teacher, train_ids, device_, progress)
    else:
        fresh = "random"
        trained = training.train_plan(training.training_plan(config), config, tokenizer, train_ids, device_, progress)
    for step, model, losses in trained:
        calibration = None
        if config.distilled and config.calibration_tokens:
            model, calibration = distill.calibrate(model, teacher, [train_ids[d] for d in step.domains], config,
                                                   device_, step.name)
        models_info[step.name] = _save_model(
            work_dir, step.name, model, tokenizer, losses, mark,
            {"domains": list(step.domains), "steps": step.steps, "initialised_from": step.start_from or fresh},
            {} if calibration is None else {"calibration": calibration})
        timings[f"train_{step.name}_s"] = time.perf_counter() - mark
        del model
        mark = time.perf_counter()

    if config.distilled and config.feature_steps:
        draft, losses = distill.distill_features(config, teacher, train_ids, device_, progress)
        calibration = None
        if config.calibration_tokens and distill.foldable(draft):
            draft, calibration = distill.calibrate(draft, teacher, [train_ids[d] for d in config.domains], config,
                                                   device_, distill.FEATURE_DRAFT)
        models_info[distill.FEATURE_DRAFT] = _save_model(
            work_dir, distill.FEATURE_DRAFT, draft, tokenizer, losses, mark,
            {"domains": list(config.domains), "steps": config.feature_steps,
             "initialised_from": f"{config.teacher} layer {teacher.config.num_hidden_layers - 1}"},
            {"feature_layers": list(config.feature_layers), "training_depths": config.feature_depths,
             **({} if calibration is None else {"calibration": calibration})})
        timings[f"train_{distill.FEATURE_DRAFT}_s"] = time.perf_counter() - mark
        del draft
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
        "models": models_info, "device": str(device_), "timings": timings,
        "environment": {"hardware": provenance.hardware(), "versions": provenance.versions()},
        "files": {str(p.relative_to(work_dir)): file_sha256(p) for p in files},
    }
    (work_dir / MANIFEST).write_text(json.dumps(manifest, indent=1))
