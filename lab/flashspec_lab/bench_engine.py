"""The engine benchmark's measurements: FlashSpec vs Hugging Face assisted generation vs plain autoregressive
decoding, same models, same sampling.

Models are built from config with random weights (no download): a TinyLlama-1.1B-shaped target
(hidden 2048, 22 layers, 32 heads, 4 KV heads, V = 32000) and a llama-68m-shaped draft (hidden 768,
2 layers, 12 heads), bf16. For each batch size and method: `warmup` untimed warm-up runs (their times
are recorded), then `repeats` timed runs, each instrumented; every number of a cell -- tokens/s, steps,
tokens per step, acceptance, step latencies -- comes from the timed run with the median wall time
(all runs are kept under "runs"), and each FlashSpec speed-up is judged by `stats.compare_runs`.
Times are host wall clock around device-synchronised runs: the end-to-end rate a server sees.

HF assisted generation only supports batch size 1 (transformers raises otherwise); at B > 1 a cell
records that error and, as `hf_assisted_sequential`, the B prompts served one after another: its
tokens/s is all B rows' tokens over the whole loop's wall time, and its steps advance one row each.
``flashspec bench engine`` (`experiments/bench_engine.py`) runs the grid and writes the results file.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from flashspec import models, stats
from flashspec.drafters import PromptLookupDrafter
from flashspec.engine import SpeculativeDecoder
from flashspec.sampling import SamplingParams

METHODS = ("plain", "hf_assisted", "flashspec", "flashspec_pool")


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
