"""The paper's T4 table, measured on whatever GPU runs it: `flashspec reproduce t4`.

The paper reports, for TinyLlama-1.1B-Chat in 4-bit NF4 with a small draft at γ = 4 on an NVIDIA T4, 44.2
tokens/s, a 22.1 ms step and an acceptance rate of 0.75, and a verify kernel 1.6× faster than a PyTorch reference
at B = 8 (slower at B = 1). `run` measures the same quantities here, on the fast path:

- decoding: the target (NF4 on a GPU) with one draft at γ = 4 on `FastSpeculativeDecoder`, a few chat prompts,
  tokens/s, both acceptance measures (accepted/drafted and the per-token α), the p50 step; and the same target
  decoding plainly on `FastPlainDecoder` for the speed-up;
- the verify step: `flashspec.verify` (Triton on a GPU) against the PyTorch a user would write
  (`flashspec_lab.baseline.verify_pytorch`) at B = 1 and 8, V = 32000, median and spread over repeats.

Where the models come from (`source`): "hub" (TinyLlama-1.1B-Chat and llama-68m from the Hugging Face hub, on
Colab), "random" (the same shapes with random weights: every cost real, the acceptance meaningless; for machines
without the hub), "smollm2" (the offline SmolLM2-135M-Instruct of `flashspec.real` with prompt lookup as its
draft), or "smoke" (tiny models on the CPU: that the command runs, in seconds). Every result names its GPU: a
number measured elsewhere than on a T4 is not a T4 number.
"""
from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

import flashspec as fs
from flashspec import models
from flashspec_lab.baseline import verify_pytorch

PAPER_T4 = {"gpu": "Tesla T4", "tokens_per_s": 44.2, "p50_step_ms": 22.1, "acceptance": 0.75, "gamma": 4,
            "verify_speedup_b8": 1.6}  # and at B = 1 the kernel was slower than the PyTorch reference
TARGET_ID = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
DRAFT_ID = "JackFram/llama-68m"  # the Llama-2 tokenizer, as TinyLlama's
SOURCES = ("hub", "random", "smollm2", "smoke")
PROMPTS = (
    "Explain in a paragraph why the sky is blue.",
    "Write a short story about a robot who learns to paint.",
    "What are the main differences between Python lists and tuples?",
    "Give three tips for writing clear technical documentation.",
)


def progress(message: str, since: float) -> None:
    """One line on stderr: what finished and how long it took (a first run on a T4 is minutes of compiling)."""
    print(f"flashspec reproduce: {message} ({time.perf_counter() - since:.1f} s)", file=sys.stderr, flush=True)


@dataclass
class Pool:
    """What one source loads: the target, its draft(s), a tokenizer and how they were loaded."""

    target: torch.nn.Module
    drafts: list[Any]
    tokenizer: Any
    description: str


def load_pool(source: str, device: torch.device) -> Pool:
    """The target and draft of `source` (module docstring), on `device` (NF4 on a CUDA device)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    cuda = device.type == "cuda"
    if source == "smoke":
        tokenizer = models.char_tokenizer()
        common = dict(vocab_size=len(tokenizer), max_positions=512, bos_token_id=1, eos_token_id=2, pad_token_id=2,
                      device=device)
        target = models.tiny_llama(hidden_size=64, num_layers=2, num_heads=4, seed=0, **common)
        draft = models.tiny_llama(hidden_size=32, num_layers=1, num_heads=2, seed=1, **common)
        return Pool(target, [draft], tokenizer, "tiny random Llama models, float32 (smoke)")
    if not cuda:
        raise ValueError(f"source {source!r} needs a CUDA GPU (NF4 runs there); use source='smoke' on a CPU")
    half = models.half_dtype(device)
    if source == "hub":
        tokenizer = models.load_tokenizer(TARGET_ID)
        target = models.load_model(TARGET_ID, quantization="nf4", device=device)
        draft = models.load_model(DRAFT_ID, dtype=half, device=device)
        for field in ("bos_token_id", "eos_token_id"):  # llama-68m's config disagrees with its own tokenizer
            for config in (draft.config, draft.generation_config):
                setattr(config, field, getattr(tokenizer, field))
        models.check_compatible(target, draft, tokenizer, models.load_tokenizer(DRAFT_ID), draft_name=DRAFT_ID)
        return Pool(target, [draft], tokenizer, f"{TARGET_ID} (NF4, {half} compute) + {DRAFT_ID} ({half})")
    if source == "random":
        tokenizer = models.char_tokenizer()
        target = models.quantize_nf4(models.model_from_config(models.tinyllama_1b_config(), dtype=half, seed=0),
                                     device=device)
        draft = models.model_from_config(models.llama_68m_config(), dtype=half, seed=1).to(device)
        return Pool(target, [draft], tokenizer, f"TinyLlama-1.1B- and llama-68m-shaped random weights (target "
                                                f"NF4, {half} compute; the acceptance is meaningless)")
    from flashspec import real

    target, tokenizer = real.load_real("smollm2", device=device, dtype=half)
    target = models.quantize_nf4(target, device=device)
    return Pool(target, [fs.PromptLookupDrafter()], tokenizer,
                "SmolLM2-135M-Instruct (offline GGUF, NF4) + prompt lookup")


def chat_prompts(tokenizer: Any, count: int, device: torch.device) -> list[torch.Tensor]:
    """`count` prompts [1, n] as one user turn of the chat template (plain text where the tokenizer has none)."""
    prompts = []
    for text in (PROMPTS * count)[:count]:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        else:
            ids = tokenizer(text, return_tensors="pt").input_ids
        prompts.append(ids.to(device))
    return prompts


def decode(pool: Pool, prompts: list[torch.Tensor], new_tokens: int, gamma: int, graphs: bool) -> dict[str, Any]:
    """Speculative (one draft at `gamma`) and plain decoding of each prompt on the fast path, T = 1, after one
    warm-up request (graph capture, kernel compilation) per decoder."""
    sampling = fs.SamplingParams(temperature=1.0)
    speculative = fs.FastSpeculativeDecoder(pool.target, pool.drafts, policy="fixed", gamma=gamma, graphs=graphs)
    plain = fs.FastPlainDecoder(pool.target, graphs=graphs)
    runs: dict[str, Any] = {}
    for name, decoder in (("speculative", speculative), ("plain", plain)):
        began = time.perf_counter()
        decoder.generate(prompts[0], max_new_tokens=new_tokens, sampling=sampling, seed=1000, ignore_eos=True)
        progress(f"{name} decoder warmed up", began)
        began = time.perf_counter()
        steps, tokens, seconds = [], 0, 0.0
        accepted = drafted = rejections = 0
        for index, prompt in enumerate(prompts):
            result = decoder.generate(prompt, max_new_tokens=new_tokens, sampling=sampling, seed=index,
                                      ignore_eos=True)
            tokens += result.stats.generated_tokens
            seconds += result.stats.total_s
            steps += [step.latency_s for step in result.stats.steps]
            for step in result.stats.steps:
                accepted += sum(step.num_accepted)
                drafted += step.gamma * len(step.num_accepted)
                rejections += sum(n < step.gamma for n in step.num_accepted)
        progress(f"{name}: {len(prompts)} prompts decoded", began)
        runs[name] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                      "p50_step_ms": 1e3 * statistics.median(steps), "steps": len(steps)}
        if name == "speculative":
            runs[name]["acceptance_rate"] = accepted / drafted if drafted else float("nan")
            runs[name]["token_acceptance"] = (fs.stats.token_acceptance_from_counts(accepted, rejections)
                                              if accepted + rejections else float("nan"))
    runs["speedup_over_plain"] = runs["speculative"]["tokens_per_s"] / runs["plain"]["tokens_per_s"]
    return runs


def _median_ms(run: Callable[[], object], repeats: int, device: torch.device) -> tuple[float, list[float]]:
    """Median and (min, max) of `repeats` timed calls after warm-up: CUDA events on a GPU, the host clock on a CPU."""
    for _ in range(max(3, repeats // 10)):
        run()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            begin = time.perf_counter()
            run()
            times.append(1e3 * (time.perf_counter() - begin))
    return statistics.median(times), [min(times), max(times)]


def verify_step(batches: tuple[int, ...], vocab: int, gamma: int, repeats: int,
                device: torch.device) -> dict[str, Any]:
    """`flashspec.verify` (Triton on a GPU, PyTorch on a CPU) against `verify_pytorch` per batch size: the
    logits of a draft near the target, T = 1, each call timed whole (launch included), as an engine calls it."""
    dtype = models.half_dtype(device) if device.type == "cuda" else torch.float32
    params = fs.SamplingParams(temperature=1.0)
    backend = "triton" if device.type == "cuda" else "torch"
    rows = {}
    for batch in batches:
        generator = torch.Generator(device=device).manual_seed(batch)
        target = 3.0 * torch.randn(batch, gamma + 1, vocab, device=device, generator=generator)
        draft = target[:, :gamma] + 1.5 * torch.randn(batch, gamma, vocab, device=device, generator=generator)
        target, draft = target.to(dtype), draft.to(dtype)
        probs = fs.warp_logits(draft, params).exp().reshape(-1, vocab)
        tokens = torch.multinomial(probs, 1, generator=generator).view(batch, gamma)
        ours, ours_range = _median_ms(lambda: fs.verify(target, draft, tokens, params, generator=1,
                                                        backend=backend), repeats, device)
        theirs, theirs_range = _median_ms(lambda: verify_pytorch(target, draft, tokens, params), repeats, device)
        rows[str(batch)] = {"flashspec_ms": ours, "flashspec_range_ms": ours_range, "pytorch_ms": theirs,
                            "pytorch_range_ms": theirs_range, "speedup": theirs / ours}
    return {"dtype": str(dtype).replace("torch.", ""), "backend": backend, "batches": rows}


def run(source: str = "hub", new_tokens: int = 128, prompts: int = 4, gamma: int = 4, repeats: int = 100,
        device: str | None = None) -> dict[str, Any]:
    """The whole table: decoding and the verify step (module docstring); settings and results for a record."""
    where = torch.device(device) if device is not None else models.default_device()
    smoke = source == "smoke"
    began = time.perf_counter()
    pool = load_pool(source, where)
    progress(f"models loaded: {pool.description}", began)
    chats = chat_prompts(pool.tokenizer, prompts, where)
    decoded = decode(pool, chats, new_tokens, gamma, graphs=where.type == "cuda")
    began = time.perf_counter()
    verified = verify_step((1, 8), 512 if smoke else 32000, gamma, repeats, where)
    progress("verify step timed", began)
    results = {"gpu": torch.cuda.get_device_name(where) if where.type == "cuda" else None,
               "models": pool.description, "decode": decoded, "verify": verified, "paper_t4": PAPER_T4}
    settings = {"source": source, "new_tokens": new_tokens, "prompts": prompts, "gamma": gamma, "repeats": repeats,
                "temperature": 1.0, "device": str(where)}
    return {"settings": settings, "results": results}


def table(results: dict[str, Any]) -> str:
    """The measured numbers beside the paper's, as plain text within 88 columns."""
    decoded, verified = results["decode"], results["verify"]["batches"]
    here = results["gpu"] or "this CPU"
    rows = [
        ("tokens/s (speculative, γ = 4)", f"{PAPER_T4['tokens_per_s']:.1f}",
         f"{decoded['speculative']['tokens_per_s']:.1f}"),
        ("tokens/s (plain, same target)", "-", f"{decoded['plain']['tokens_per_s']:.1f}"),
        ("p50 step (ms)", f"{PAPER_T4['p50_step_ms']:.1f}", f"{decoded['speculative']['p50_step_ms']:.2f}"),
        ("acceptance (accepted / drafted)", f"{PAPER_T4['acceptance']:.2f}",
         f"{decoded['speculative']['acceptance_rate']:.2f}"),
        ("token acceptance α", "-", f"{decoded['speculative']['token_acceptance']:.2f}"),
        ("verify vs PyTorch, B = 8", f"{PAPER_T4['verify_speedup_b8']:.1f}x", f"{verified['8']['speedup']:.2f}x"),
        ("verify vs PyTorch, B = 1", "< 1x", f"{verified['1']['speedup']:.2f}x"),
    ]
    width = max(len(row[0]) for row in rows)
    head = f"{'':{width}}  {'paper (T4)':>10}  {here[:24]:>24}"
    return "\n".join([head, *(f"{name:{width}}  {paper:>10}  {ours:>24}" for name, paper, ours in rows)])
