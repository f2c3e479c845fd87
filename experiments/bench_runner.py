"""Per-forward time of the static-cache LlamaRunner against HF eager with a DynamicCache.

For TinyLlama-1.1B-, llama-68m- and SmolLM2-135M-shaped random-weight models, batch sizes B and query
lengths q (q=1: decode, q=5: a γ=4 verify, larger q: a tree of candidates), after a `--context`-token
prompt, it times:
  hf_eager        model(...) with a DynamicCache (cropped back after every call, as the engine does)
  runner_eager    LlamaRunner.forward
  runner_graph    the same forward replayed from one CUDA graph (input copies included); for GQA
                  models also with attention forced to "fold" and to "gqa" (runner_graph_fold/_gqa)
  runner_compile  torch.compile(max-autotune-no-cudagraphs) then graph (only with --compile)
Each is timed per call with CUDA events after warm-up (wall clock on CPU): median and spread over
`--repeats` calls. The floor is the bytes one forward must read (weights except the embedding
table, plus the filled KV) over the device-to-device copy bandwidth measured here.
Correctness: runner logits against HF's on the same step, in the bench dtype and on an fp32 copy
(also compiled, with --compile). Random weights give nearly flat logits, so bf16 rounding can flip
an argmax; the fp32 errors are the exactness check.

    python experiments/bench_runner.py --out results/bench_runner_h200.json [--compile]
    python experiments/bench_runner.py --smoke --out /tmp/smoke.json      # tiny, any device

flashspec must be importable without the checkout's root on sys.path (`pip install -e .`): from the
root, `import kernels` (which transformers tries) finds the repository's kernels/ folder.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from flashspec import models
from flashspec_lab import cli_checks, provenance
from flashspec.runner import HAS_ENABLE_GQA, LlamaRunner, attend, bucket_for, capture, fold_mask

CONFIGS: dict[str, Callable[[], Any]] = {
    "tinyllama-1b": models.tinyllama_1b_config,
    "llama-68m": models.llama_68m_config,
    "smollm2-135m": models.smollm2_135m_config,  # the real target's shape: its forward's cost per query length
    "smoke": lambda: models.llama_config(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                         intermediate_size=128, max_positions=512),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--models", nargs="+", default=["tinyllama-1b", "llama-68m"], choices=sorted(CONFIGS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--queries", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--context", type=int, default=256, help="prompt tokens already in the cache")
    parser.add_argument("--max-len", type=int, default=1024, help="runner cache positions")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dtype", default=None, help="bf16 on CUDA, fp32 on CPU unless given")
    parser.add_argument("--device", default=None)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile + graph (minutes per shape)")
    parser.add_argument("--smoke", action="store_true", help="tiny model, few repeats: checks the script runs")
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if args.smoke:
        args.models, args.batches, args.context, args.max_len, args.repeats, args.warmup = ["smoke"], [2], 20, 64, 3, 1
    return args


# ----------------------------------------------------------------------------------------- timing


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int, device: torch.device,
               after: Callable[[], Any] | None = None) -> dict[str, float]:
    """Milliseconds per call of `fn` (CUDA events around each call, wall clock off CUDA); `after`
    runs between calls, outside the timed span."""
    for _ in range(warmup):
        fn()
        if after:
            after()
    times: list[float] = []
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        torch.cuda.synchronize()
        for start, end in events:
            start.record()
            fn()
            end.record()
            if after:
                after()
        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in events]
    else:
        for _ in range(repeats):
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
            if after:
                after()
    ordered = sorted(times)
    return {"median_ms": statistics.median(times), "p10_ms": ordered[len(ordered) // 10],
            "p90_ms": ordered[(9 * len(ordered)) // 10], "min_ms": ordered[0], "max_ms": ordered[-1],
            "repeats": repeats}


def copy_bandwidth(device: torch.device) -> float | None:
    """Device-to-device copy bandwidth in bytes/s (read + written) on 2 GiB buffers; None off CUDA."""
    if device.type != "cuda":
        return None
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    stats = time_calls(lambda: dst.copy_(src), repeats=20, warmup=3, device=device)
    moved = 2 * src.numel() * src.element_size()
    del src, dst
    torch.cuda.empty_cache()
    return moved / (stats["median_ms"] * 1e-3)


# ------------------------------------------------------------------------------------------ cells


def floor_bytes(model: torch.nn.Module, batch: int, filled: int) -> int:
    """Bytes one forward must read: every weight but the embedding table (a few rows are read) and
    the filled K/V of every layer."""
    embedding = model.model.embed_tokens.weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding)
    if model.lm_head.weight is embedding:
        weights += embedding.numel() * embedding.element_size()
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * batch * config.num_key_value_heads * filled * head_dim * embedding.element_size()
    return weights + kv


def compare(ours: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    ours, reference = ours.float(), reference.float()
    error = (ours - reference).abs().max().item()
    return {"max_abs_error": error, "relative_error": error / max(reference.abs().max().item(), 1e-30),
            "argmax_agreement": (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()}


def measure_cell(model: torch.nn.Module, reference32: torch.nn.Module | None, batch: int, q: int,
                 args: argparse.Namespace, device: torch.device, bandwidth: float | None) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(batch * 100 + q)
    vocab = model.config.vocab_size
    prompt = torch.randint(3, vocab, (batch, args.context), generator=generator).to(device)
    step = torch.randint(3, vocab, (batch, q), generator=generator).to(device)
    positions = (args.context + torch.arange(q, device=device)).expand(batch, q).contiguous()
    bucket = bucket_for(args.context + q, args.max_len)
    cell: dict[str, Any] = {"batch": batch, "q": q, "context": args.context, "bucket": bucket}

    cache = models.new_cache(model)
    models.forward_logits(model, prompt, cache)
    position_ids = positions

    def hf_step() -> torch.Tensor:
        return models.forward_logits(model, step, cache, position_ids=position_ids)

    hf_logits = hf_step()
    models.crop_cache(cache, args.context)
    cell["hf_eager"] = time_calls(hf_step, args.repeats, args.warmup, device,
                                  after=lambda: models.crop_cache(cache, args.context))

    runner = LlamaRunner(model, max_batch=batch, max_len=args.max_len)
    runner.prefill(prompt)
    eager_logits = runner.forward(step, positions, bucket).clone()
    cell["check_eager_vs_hf"] = compare(eager_logits, hf_logits)
    cell["runner_eager"] = time_calls(lambda: runner.forward(step, positions, bucket), args.repeats, args.warmup, device)

    graphed = runner.graphed(batch, q, bucket)
    cell["check_graph_vs_eager"] = compare(graphed(step, positions), eager_logits)
    cell["runner_graph"] = time_calls(lambda: graphed(step, positions), args.repeats, args.warmup, device)

    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    for mode in ("fold", "gqa") if groups > 1 and HAS_ENABLE_GQA else ():
        variant = LlamaRunner(model, max_batch=batch, max_len=args.max_len, attention=mode)
        variant.prefill(prompt)
        step_graph = variant.graphed(batch, q, bucket)
        cell[f"check_graph_{mode}_vs_eager"] = compare(step_graph(step, positions), eager_logits)
        cell[f"runner_graph_{mode}"] = time_calls(lambda: step_graph(step, positions), args.repeats, args.warmup, device)
        del variant, step_graph

    if args.compile:
        begin = time.perf_counter()
        compiled = runner.graphed(batch, q, bucket, compile=True)
        cell["compile_s"] = time.perf_counter() - begin
        cell["check_compile_vs_hf"] = compare(compiled(step, positions), hf_logits)
        cell["runner_compile_graph"] = time_calls(lambda: compiled(step, positions), args.repeats, args.warmup, device)

    if reference32 is not None:
        cache32 = models.new_cache(reference32)
        models.forward_logits(reference32, prompt, cache32)
        hf32 = models.forward_logits(reference32, step, cache32, position_ids=position_ids)
        runner32 = LlamaRunner(reference32, max_batch=batch, max_len=args.max_len)
        runner32.prefill(prompt)
        cell["check_fp32_vs_hf"] = compare(runner32.forward(step, positions, bucket), hf32)
        if args.compile:
            cell["check_compile_fp32_vs_hf"] = compare(runner32.graphed(batch, q, bucket, compile=True)(step, positions), hf32)
        del cache32, runner32

    cell["floor_bytes"] = floor_bytes(model, batch, args.context + q)
    if bandwidth:
        cell["floor_ms"] = cell["floor_bytes"] / bandwidth * 1e3
    del runner, graphed, cache
    return cell


def attention_variants(config: Any, batch: int, q: int, filled: int, args: argparse.Namespace,
                       device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """All layers' attention for one step (q queries over a bucket of cached slots), three ways:
    the runner's folded GQA, SDPA with enable_gqa=True and SDPA over repeat_interleave'd K/V.
    On CUDA each is timed as one graph of `num_hidden_layers` calls (kernel time, no launch cost)."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    groups, bucket = heads // kv_heads, bucket_for(filled, args.max_len)
    generator = torch.Generator(device=device).manual_seed(0)
    query = torch.randn(batch, q, heads, head_dim, device=device, dtype=dtype, generator=generator)
    keys = torch.randn(batch, kv_heads, bucket, head_dim, device=device, dtype=dtype, generator=generator)
    values = torch.randn_like(keys)
    positions = (filled - q + torch.arange(q, device=device)).expand(batch, q)
    visible = torch.arange(bucket, device=device) <= positions[..., None]           # [B, q, S]
    folded_mask = fold_mask(visible[:, None], groups)
    heads_first = query.transpose(1, 2)                                               # [B, Hq, q, D]
    scale = head_dim ** -0.5
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def folded() -> torch.Tensor:
        return attend(query, keys, values, folded_mask, scale, fold=True)

    def gqa() -> torch.Tensor:
        out = sdpa(heads_first, keys, values, attn_mask=visible[:, None], scale=scale, enable_gqa=True)
        return out.transpose(1, 2).reshape(batch, q, heads * head_dim)

    def repeated() -> torch.Tensor:
        k, v = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
        out = sdpa(heads_first, k, v, attn_mask=visible[:, None], scale=scale)
        return out.transpose(1, 2).reshape(batch, q, heads * head_dim)

    reference = folded()
    found: dict[str, Any] = {"batch": batch, "q": q, "filled": filled, "bucket": bucket}
    layers = config.num_hidden_layers
    for name, fn in (("folded", folded), ("sdpa_enable_gqa", gqa), ("sdpa_repeat_kv", repeated)):
        try:
            found[f"{name}_max_diff"] = (fn() - reference).abs().max().item()
            if device.type == "cuda":
                graph, _ = capture(lambda fn=fn: [fn() for _ in range(layers)])
                found[f"{name}_all_layers"] = time_calls(graph.replay, args.repeats, args.warmup, device)
            else:
                found[f"{name}_all_layers"] = time_calls(lambda fn=fn: [fn() for _ in range(layers)],
                                                         args.repeats, args.warmup, device)
        except (RuntimeError, TypeError) as error:
            found[f"{name}_error"] = str(error)[:300]
    return found


def summary_line(name: str, cell: dict[str, Any]) -> str:
    parts = [f"{name:13s} B={cell['batch']:<2d} q={cell['q']}"]
    for key in ("hf_eager", "runner_eager", "runner_graph", "runner_graph_fold", "runner_graph_gqa",
                "runner_compile_graph"):
        if key in cell:
            parts.append(f"{key} {cell[key]['median_ms']:.3f}")
    if "floor_ms" in cell:
        parts.append(f"floor {cell['floor_ms']:.3f}")
    parts.append(f"rel.err {cell['check_eager_vs_hf']['relative_error']:.1e}")
    if "check_fp32_vs_hf" in cell:
        parts.append(f"fp32 err {cell['check_fp32_vs_hf']['max_abs_error']:.1e}")
    if "check_compile_fp32_vs_hf" in cell:
        parts.append(f"compiled fp32 err {cell['check_compile_fp32_vs_hf']['max_abs_error']:.1e}")
    return " | ".join(parts) + " (ms, median)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = models.resolve_dtype(args.dtype or ("bf16" if device.type == "cuda" else "fp32"))
    if args.compile:
        torch._dynamo.config.cache_size_limit = 64
    record = provenance.record(["python", "experiments/bench_runner.py", *argv], args.git_sha)
    result: dict[str, Any] = {"cells": {}}
    bandwidth = copy_bandwidth(device)
    result["copy_bandwidth_bytes_per_s"] = bandwidth
    start = time.perf_counter()
    for name in args.models:
        reference32 = models.model_from_config(CONFIGS[name](), seed=0, dtype=torch.float32, device=device)
        model = copy.deepcopy(reference32).to(dtype) if dtype != torch.float32 else reference32
        cells = []
        for batch in args.batches:
            for q in args.queries:
                cell = measure_cell(model, reference32 if dtype != torch.float32 else None, batch, q, args,
                                    device, bandwidth)
                print(summary_line(name, cell), flush=True)
                cells.append(cell)
        config = CONFIGS[name]()
        attention = [attention_variants(config, batch, q, args.context + q, args, device, dtype)
                     for batch in args.batches for q in args.queries]
        for row in attention:
            times = {key[: -len("_all_layers")]: row[key]["median_ms"] for key in row if key.endswith("_all_layers")}
            print(f"{name:13s} attention B={row['batch']:<2d} q={row['q']} bucket={row['bucket']}: "
                  + ", ".join(f"{key} {value:.3f}" for key, value in times.items()) + " (ms, all layers)", flush=True)
        result["cells"][name] = {"config": config.to_dict(), "results": cells, "attention_variants": attention}
        del model, reference32
        if device.type == "cuda":
            torch.cuda.empty_cache()
    record["wall_seconds"] = time.perf_counter() - start
    settings = {**vars(args), "device": str(device), "dtype": str(dtype)}
    provenance.write_result(args.out, record, settings, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
