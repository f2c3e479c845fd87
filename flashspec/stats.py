"""Per-step statistics of a speculative generation: what each step chose, accepted and cost.

`GenerationStats` records one `StepRecord` per step; `summary()` reduces them (tokens/s, mean
acceptance α, mean accepted length, p50/p99 step latency, per-arm selection trace), `to_json()`
exports everything, and `format_table()` prints a plain-text table (no pandas).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class StepRecord:
    """One step. `num_accepted` and `kept` have one entry per row that was still generating (active
    rows): accepted drafts, and tokens appended (accepted + 1, cut by the row's budget or EOS);
    `latency_s` is host wall time (device-synchronised when asked)."""

    step: int
    arm: int
    gamma: int
    num_accepted: list[int]
    kept: list[int]
    latency_s: float


@dataclass
class GenerationStats:
    arm_names: list[str]
    batch_size: int
    prompt_length: int
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    total_s: float = 0.0
    generated_tokens: int = 0
    synchronized_timing: bool = False
    cache_columns: int = 0
    cache_tokens: float = 0.0

    def record(self, step: StepRecord) -> None:
        self.steps.append(step)

    @property
    def arm_trace(self) -> list[int]:
        return [step.arm for step in self.steps]

    def acceptance_trace(self) -> list[float]:
        """Per step, the mean over active rows of num_accepted / γ."""
        return [_mean([n / step.gamma for n in step.num_accepted]) for step in self.steps]

    def summary(self) -> dict[str, Any]:
        """Reduced numbers; NaN where there is nothing to average (e.g. zero steps)."""
        accepted = [n for step in self.steps for n in step.num_accepted]
        drafted = sum(step.gamma * len(step.num_accepted) for step in self.steps)
        emitted = sum(n + 1 for n in accepted)
        kept = [count for step in self.steps for count in step.kept]
        latencies = sorted(step.latency_s for step in self.steps)
        per_arm: dict[str, dict[str, float]] = {}
        for arm, name in enumerate(self.arm_names):
            chosen = [step for step in self.steps if step.arm == arm]
            arm_accepted = [n for step in chosen for n in step.num_accepted]
            arm_drafted = sum(step.gamma * len(step.num_accepted) for step in chosen)
            per_arm[name] = {
                "selections": len(chosen),
                "mean_acceptance": sum(arm_accepted) / arm_drafted if arm_drafted else math.nan,
            }
        decode_s = sum(latencies)
        return {
            "batch_size": self.batch_size,
            "prompt_length": self.prompt_length,
            "steps": len(self.steps),
            "generated_tokens": self.generated_tokens,
            "total_s": self.total_s,
            "prefill_s": self.prefill_s,
            "tokens_per_s": self.generated_tokens / self.total_s if self.total_s > 0 else math.nan,
            "decode_tokens_per_s": self.generated_tokens / decode_s if decode_s > 0 else math.nan,
            "mean_acceptance": sum(accepted) / drafted if drafted else math.nan,
            "mean_accepted_length": _mean(accepted),
            "mean_tokens_per_step": _mean(kept),
            "kept_fraction": sum(kept) / emitted if emitted else math.nan,
            "kv_cache_fill": self.cache_tokens / self.cache_columns if self.cache_columns else math.nan,
            "p50_step_latency_s": percentile(latencies, 50),
            "p99_step_latency_s": percentile(latencies, 99),
            "synchronized_timing": self.synchronized_timing,
            "per_arm": per_arm,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm_names": list(self.arm_names),
            "summary": self.summary(),
            "arm_trace": self.arm_trace,
            "steps": [asdict(step) for step in self.steps],
        }

    def to_json(self, path: str | None = None, indent: int = 2) -> str:
        """JSON text of `to_dict()` (NaN written as null); also written to `path` when given."""
        text = json.dumps(_nan_to_none(self.to_dict()), indent=indent)
        if path is not None:
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
        return text

    def format_table(self) -> str:
        """A plain-text table of the summary and the per-arm selections."""
        summary = self.summary()
        rows = [
            ("steps", f"{summary['steps']}"),
            ("generated tokens", f"{summary['generated_tokens']}"),
            ("tokens/s", _fmt(summary["tokens_per_s"], ".1f")),
            ("mean acceptance α", _fmt(summary["mean_acceptance"], ".3f")),
            ("mean accepted length", _fmt(summary["mean_accepted_length"], ".2f")),
            ("tokens per step (per row)", _fmt(summary["mean_tokens_per_step"], ".2f")),
            ("kept / emitted (budget, EOS)", _fmt(summary["kept_fraction"], ".3f")),
            ("target KV-cache fill", _fmt(summary["kv_cache_fill"], ".3f")),
            ("p50 step latency (ms)", _fmt(summary["p50_step_latency_s"] * 1e3, ".2f")),
            ("p99 step latency (ms)", _fmt(summary["p99_step_latency_s"] * 1e3, ".2f")),
        ]
        for name, arm in summary["per_arm"].items():
            rows.append((f"arm {name}", f"{arm['selections']} steps, α {_fmt(arm['mean_acceptance'], '.3f')}"))
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted list (NaN when empty)."""
    if not sorted_values:
        return math.nan
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _fmt(value: float, spec: str) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {key: _nan_to_none(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nan_to_none(item) for item in value]
    return value
