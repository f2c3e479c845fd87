"""Engine benchmark: FlashSpec vs Hugging Face assisted generation vs plain autoregressive decoding,
same models, same sampling, side by side in one run.

Models are built from config with random weights (no download): a TinyLlama-1.1B-shaped target
(hidden 2048, 22 layers, 32 heads, 4 KV heads, V = 32000) and a llama-68m-shaped draft (hidden 768,
2 layers, 12 heads), bf16. For each batch size and method: `--warmup` untimed warm-up runs (their times
are recorded), then `repeats` timed runs, each instrumented; every number of a cell -- tokens/s, steps,
tokens per step, acceptance, step latencies -- comes from the timed run with the median wall time
(all runs are kept under "runs"), and each FlashSpec speed-up is judged by `stats.compare_runs`.

    flashspec bench engine                       # the H200 run: B in {1, 8}, γ = 4, 128 new tokens
    flashspec bench engine --tiny --device cpu   # smoke test in seconds (tiny models)

HF assisted generation only supports batch size 1 (transformers raises otherwise); at B > 1 the JSON
records that error and, as `hf_assisted_sequential`, the B prompts served one after another: its
tokens/s is all B rows' tokens over the whole loop's wall time, and its steps advance one row each.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from flashspec import models, provenance, stats
from flashspec.drafters import PromptLookupDrafter
from flashspec.engine import SpeculativeDecoder
from flashspec.sampling import SamplingParams

METHODS = ("plain", "hf_assisted", "flashspec", "flashspec_pool")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="flashspec bench engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--tiny", action="store_true", help="tiny models, few tokens: a smoke test in seconds")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default 1 8 (tiny: 1 2)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (tiny: 12)")
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per cell (default 3; tiny: 1)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs per cell before timing (default 1); on the H200 the first FlashSpec "
                             "cell of a batch size kept speeding up over about five runs")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--dtype", default=None, help="bf16 (default on CUDA) or fp32 (default on CPU)")
    parser.add_argument("--out", default=None, help="JSON path (default results/bench_engine_<device>.json)")
    parser.add_argument("--git-sha", default=None, help="record this SHA when the copy has no .git")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify-backend", default="auto", choices=["auto", "torch", "triton"],
                        help="FlashSpec's verify backend (auto: Triton on CUDA)")
    return parser.parse_args(argv)


def build_models(tiny: bool, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module, dict]:
    """Random-weight target and draft; EOS off so every method generates exactly max_new_tokens."""
    special = dict(bos_token_id=1, eos_token_id=None, pad_token_id=0)
    if tiny:
        target_config = models.llama_config(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, **special)
        draft_config = models.llama_config(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, **special)
    else:
        target_config = models.tinyllama_1b_config(**special)
        draft_config = models.llama_68m_config(**special)
    target = models.model_from_config(target_config, seed=0, dtype=dtype, device=device)
    draft = models.model_from_config(draft_config, seed=1, dtype=dtype, device=device)
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    shapes = {
        "target": _shape(target_config, target),
        "draft": _shape(draft_config, draft),
    }
    return target, draft, shapes


def _shape(config: Any, model: torch.nn.Module) -> dict[str, Any]:
    return {
        "hidden_size": config.hidden_size, "num_layers": config.num_hidden_layers,
        "num_heads": config.num_attention_heads, "num_kv_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size, "parameters": sum(p.numel() for p in model.parameters()),
    }


class ForwardClock:
    """Counts a model's forwards and stamps (device-synchronised) the start of each one."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.stamps: list[float] = []
        self.device = device
        self.handle = model.register_forward_pre_hook(self._hook)

    def _hook(self, module: torch.nn.Module, inputs: Any) -> None:
        synchronize(self.device)
        self.stamps.append(time.perf_counter())

    def close(self, end: float) -> list[float]:
        self.handle.remove()
        stamps = self.stamps + [end]
        return [b - a for a, b in zip(stamps, stamps[1:])]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Callable[[], Any], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    return time.perf_counter() - start


def hf_kwargs(params: SamplingParams, max_new_tokens: int) -> dict[str, Any]:
    """The same sampling as FlashSpec: temperature only, HF's default top_k=50 turned off."""
    if params.greedy:
        return dict(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)
    return dict(do_sample=True, temperature=params.temperature, top_k=0, top_p=1.0,
                max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens)


def measure_cell(
    method: str, batch: int, target: torch.nn.Module, draft: torch.nn.Module, prompts: torch.Tensor,
    params: SamplingParams, gamma: int, max_new_tokens: int, repeats: int, device: torch.device, seed: int,
    verify_backend: str = "auto", warmup: int = 1,
) -> dict[str, Any]:
    """`warmup` untimed runs, then `repeats` timed, instrumented runs; the cell reports its median run
    (`cell_from_runs`)."""
    input_ids = prompts[:batch]
    new_tokens = batch * max_new_tokens
    if method in ("flashspec", "flashspec_pool"):
        pool: list[Any] = [draft] if method == "flashspec" else [draft, PromptLookupDrafter()]
        decoder = SpeculativeDecoder(target, pool, policy="thompson", gamma=gamma, policy_kwargs={"seed": seed},
                                     backend=verify_backend)

        def run(call: int) -> Any:
            # timing=False: no extra syncs; each step already waits for the device once, so the host
            # clock between steps is close to the device's step time
            return decoder.generate(input_ids, max_new_tokens=max_new_tokens, sampling=params,
                                    seed=seed + call, ignore_eos=True, timing=False)

        warmup_s = [timed(lambda: run(10_000 + index), device) for index in range(warmup)]
        runs = []
        for call in range(repeats):
            done: list[Any] = []
            wall_s = timed(lambda: done.append(run(call)), device)
            runs.append(engine_run(done[0].stats.summary(), wall_s, new_tokens, gamma))
        return cell_from_runs(runs, warmup_s, rows_per_step=batch)

    kwargs = hf_kwargs(params, max_new_tokens)
    if method == "hf_assisted":
        configure_assistant(draft, gamma)
        kwargs.update(assistant_model=draft, num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant")
        if batch > 1:
            try:
                target.generate(input_ids, **kwargs)
                raise RuntimeError("HF assisted generation accepted B > 1; measure it directly")
            except ValueError as error:
                unsupported = str(error)
            cell = measure_sequential_assisted(target, input_ids, kwargs, repeats, device, gamma, max_new_tokens,
                                               warmup)
            return {"unsupported": unsupported, "hf_assisted_sequential": cell}

    def run_hf() -> Any:
        return target.generate(input_ids, **kwargs)

    warmup_s = [timed(run_hf, device) for _ in range(warmup)]
    runs = [hf_run(target, run_hf, device, new_tokens, max_new_tokens, gamma if method == "hf_assisted" else None)
            for _ in range(repeats)]
    return cell_from_runs(runs, warmup_s, rows_per_step=batch)


def engine_run(summary: dict[str, Any], wall_s: float, new_tokens: int, gamma: int) -> dict[str, Any]:
    """One timed FlashSpec run, every number from the engine's own step records of that run."""
    decode_s = summary["mean_step_latency_s"] * summary["steps"]
    return {
        "time_s": wall_s, "tokens_per_s": new_tokens / wall_s, "steps": summary["steps"],
        "tokens_per_step": summary["mean_tokens_per_step"],
        "acceptance_rate": summary["acceptance_rate"], "token_acceptance": summary["token_acceptance"],
        "p50_step_latency_ms": summary["p50_step_latency_s"] * 1e3,
        "p99_step_latency_ms": summary["p99_step_latency_s"] * 1e3,
        "mean_step_latency_ms": summary["mean_step_latency_s"] * 1e3, "decode_fraction": decode_s / wall_s,
        "kv_cache_fill": summary["kv_cache_fill"], "per_arm": summary["per_arm"],
    }


def hf_run(target: torch.nn.Module, run: Callable[[], Any], device: torch.device, new_tokens: int,
           tokens_per_row: int, gamma: int | None) -> dict[str, Any]:
    """One timed Hugging Face run; steps are the target's forwards (counted and stamped in the same run).

    `tokens_per_row` / steps is the tokens per step of one row; with `gamma` (assisted generation),
    acceptance_rate = (tokens per step - 1) / γ and token_acceptance solves the geometric model."""
    clock = ForwardClock(target, device)
    wall_s = timed(run, device)
    latencies = sorted(clock.close(time.perf_counter()))
    tokens_per_step = tokens_per_row / len(latencies)
    out = {
        "time_s": wall_s, "tokens_per_s": new_tokens / wall_s, "steps": len(latencies),
        "tokens_per_step": tokens_per_step,
        "p50_step_latency_ms": stats.percentile(latencies, 50) * 1e3,
        "p99_step_latency_ms": stats.percentile(latencies, 99) * 1e3,
        "mean_step_latency_ms": sum(latencies) / len(latencies) * 1e3, "decode_fraction": sum(latencies) / wall_s,
    }
    if gamma is not None:
        out["acceptance_rate"] = (tokens_per_step - 1) / gamma
        out["token_acceptance"] = stats.token_acceptance_from_tokens_per_step(tokens_per_step, gamma)
        out["acceptance_note"] = "from the target's forward count: tokens per step = 1 + γ · acceptance_rate"
    return out


def cell_from_runs(runs: list[dict[str, Any]], warmup_s: list[float], rows_per_step: int) -> dict[str, Any]:
    """A cell's numbers, all from its median-time run (the lower median for an even count), plus every run.

    `rows_per_step` is how many rows one step advances (B for batched decoding, 1 for rows served one at
    a time): tokens/s x mean step latency / rows_per_step = tokens per step x decode_fraction, less where
    rows of a batch finish early (tokens per step counts active rows only)."""
    order = sorted(range(len(runs)), key=lambda index: runs[index]["time_s"])
    median = order[(len(runs) - 1) // 2]
    cell = dict(runs[median])
    cell.pop("time_s")
    cell.update({
        "times_s": [run["time_s"] for run in runs], "warmup_times_s": warmup_s, "median_run": median,
        "rows_per_step": rows_per_step, "runs": runs,
        "reported_from": "every number is from the timed run with the median wall time (index median_run of runs)",
    })
    if "acceptance_rate" in cell:
        cell["alpha"] = cell["acceptance_rate"]  # the old name of acceptance_rate, for older readers
    return cell


def configure_assistant(draft: torch.nn.Module, gamma: int) -> dict[str, Any]:
    """HF's candidate generator reads these from the ASSISTANT's generation config (a `generate`
    kwarg does not reach it): γ constant tokens, and no confidence early stop (default 0.4), so
    HF drafts exactly γ tokens per step like FlashSpec."""
    settings = {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
    for name, value in settings.items():
        setattr(draft.generation_config, name, value)
    return settings


def measure_sequential_assisted(
    target: torch.nn.Module, input_ids: torch.Tensor, kwargs: dict[str, Any], repeats: int,
    device: torch.device, gamma: int, max_new_tokens: int, warmup: int = 1,
) -> dict[str, Any]:
    """HF assisted generation over B prompts one at a time (what it can do for a batch).

    tokens/s is all B rows' tokens over the loop's wall time; a step advances one row, so tokens per
    step is B x max_new_tokens over all the loop's target forwards."""
    rows = input_ids.shape[0]

    def run_all() -> None:
        for row in range(rows):
            target.generate(input_ids[row : row + 1], **kwargs)

    warmup_s = [timed(lambda: target.generate(input_ids[:1], **kwargs), device) for _ in range(warmup)]
    runs = [hf_run(target, run_all, device, rows * max_new_tokens, rows * max_new_tokens, gamma)
            for _ in range(repeats)]
    return cell_from_runs(runs, warmup_s, rows_per_step=1)


def metadata(argv: list[str], git_sha: str | None, device: torch.device) -> dict[str, Any]:
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    hardware: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "device": str(device)}
    if device.type == "cuda":
        hardware["gpu"] = torch.cuda.get_device_name(device)
        hardware["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        hardware["cuda"] = torch.version.cuda
    return {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "git_sha": provenance.git_sha(git_sha),
        "command": "flashspec bench engine " + " ".join(argv),
        "hardware": hardware,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "triton": triton_version, "transformers": transformers.__version__},
    }


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=cwd, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def ratios(cells: dict[str, Any]) -> dict[str, float]:
    """FlashSpec tokens/s over each baseline's (same batch size)."""
    def rate(name: str) -> float | None:
        cell = cells.get(name) or {}
        cell = cell.get("hf_assisted_sequential", cell)
        return cell.get("tokens_per_s")

    found = {}
    for ours in ("flashspec", "flashspec_pool"):
        for base in ("plain", "hf_assisted"):
            if rate(ours) and rate(base):
                found[f"{ours}/{base}"] = rate(ours) / rate(base)
    return found


CONTROL = "flashspec_pool/flashspec"


def cell_of(cells: dict[str, Any], name: str) -> dict[str, Any]:
    """A method's cell (for HF assisted at B > 1, its one-row-at-a-time measurement)."""
    cell = cells.get(name) or {}
    return cell.get("hf_assisted_sequential", cell)


def same_work(cells: dict[str, Any]) -> bool:
    """True when flashspec_pool never chose prompt lookup, in the runs that record their choices: then it
    ran flashspec's draft and target forwards again (with one idle drafter more), i.e. the same work."""
    pool = cell_of(cells, "flashspec_pool")
    records = [run["per_arm"] for run in pool.get("runs", [])] or [pool.get("per_arm")]
    return "flashspec" in cells and all(
        per_arm and per_arm.get("prompt-lookup", {}).get("selections", 1) == 0 for per_arm in records)


def comparisons(cells: dict[str, Any]) -> dict[str, stats.Comparison]:
    """Each FlashSpec speed-up over each baseline judged by `stats.compare_runs` on the cells' timed runs.

    When flashspec_pool did flashspec's work (`same_work`), that pair is measured as well (key CONTROL):
    it can only differ by run-to-run error, so it is the control of every other comparison of the batch."""
    times = {name: cell_of(cells, name).get("times_s") for name in cells}
    found: dict[str, stats.Comparison] = {}
    control = None
    if same_work(cells) and times.get("flashspec") and times.get("flashspec_pool"):
        control = found[CONTROL] = stats.compare_runs(times["flashspec"], times["flashspec_pool"])
    for ours in ("flashspec", "flashspec_pool"):
        for base in ("plain", "hf_assisted"):
            if times.get(ours) and times.get(base):
                found[f"{ours}/{base}"] = stats.compare_runs(times[base], times[ours], control=control)
    return found


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    device = torch.device(args.device) if args.device else models.default_device()
    dtype = models.resolve_dtype(args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    batch_sizes = args.batch_sizes or ([1, 2] if args.tiny else [1, 8])
    max_new_tokens = args.max_new_tokens or (12 if args.tiny else 128)
    repeats = args.repeats or (1 if args.tiny else 3)
    params = SamplingParams(temperature=args.temperature)
    target, draft, shapes = build_models(args.tiny, device, dtype)
    prompts = torch.randint(2, target.config.vocab_size, (max(batch_sizes), args.prompt_length),
                            generator=torch.Generator().manual_seed(args.seed)).to(device)
    record: dict[str, Any] = {
        **metadata(argv, args.git_sha, device),
        "settings": {"gamma": args.gamma, "max_new_tokens": max_new_tokens, "prompt_length": args.prompt_length,
                     "temperature": args.temperature, "top_k": 0, "top_p": 1.0, "dtype": str(dtype),
                     "repeats": repeats, "warmup": args.warmup, "batch_sizes": batch_sizes, "tiny": args.tiny,
                     "weights": "random, built from config", "models": shapes,
                     "hf_assistant_generation_config": configure_assistant(draft, args.gamma),
                     "flashspec_policy": "thompson", "verify_backend": args.verify_backend, "flashspec_pools": {"flashspec": ["draft"],
                                                                          "flashspec_pool": ["draft", "prompt-lookup"]}},
        "results": {},
    }
    for batch in batch_sizes:
        cells: dict[str, Any] = {}
        for method in args.methods:
            cells[method] = measure_cell(method, batch, target, draft, prompts, params, args.gamma,
                                         max_new_tokens, repeats, device, args.seed, args.verify_backend,
                                         args.warmup)
            print(f"B={batch} {method}: {summarise(cells[method])}", file=sys.stderr)
        judged = {name: asdict(comparison) for name, comparison in comparisons(cells).items()}
        record["results"][f"B={batch}"] = {"cells": cells, "ratios": ratios(cells), "comparisons": judged}
        for name, comparison in judged.items():
            print(f"B={batch} {name}: {comparison['ratio']:.2f}x, {comparison['verdict']} ({comparison['reason']})",
                  file=sys.stderr)
    out = Path(args.out) if args.out else Path("results") / f"bench_engine_{slug(record['hardware'], args.tiny)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=float) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def summarise(cell: dict[str, Any]) -> str:
    cell = cell.get("hf_assisted_sequential", cell)
    parts = [f"{cell['tokens_per_s']:.1f} tok/s", f"{cell['tokens_per_step']:.2f} tokens/step",
             f"p50 step {cell['p50_step_latency_ms']:.2f} ms"]
    if cell.get("acceptance_rate") is not None:
        parts.append(f"acceptance rate {cell['acceptance_rate']:.3f}, token acceptance {cell['token_acceptance']:.3f}")
    return ", ".join(parts)


def slug(hardware: dict[str, Any], tiny: bool) -> str:
    name = hardware.get("gpu") or hardware.get("device", "cpu")
    text = re.sub(r"[^a-z0-9]+", "_", str(name).lower()).strip("_")
    return f"tiny_{text}" if tiny else text


if __name__ == "__main__":
    raise SystemExit(main())
