"""Per-step statistics of a speculative generation, the two acceptance measures, and the rules this
project uses to call a measured difference.

`GenerationStats` records one `StepRecord` per step; `summary()` reduces them (tokens/s, acceptance,
mean accepted length, p50/p99 step latency, per-arm selection trace), `to_json()` exports everything,
and `format_table()` prints a plain-text table (no pandas).

Acceptance has two names, each defined here once (`ACCEPTANCE` holds the same text for printing):

- ``acceptance_rate``: accepted draft tokens / drafted tokens. A step that drafts γ tokens and
  accepts n emits n + 1, so mean tokens per step = 1 + γ · acceptance_rate exactly (before a
  token budget or EOS trims the last step).
- ``token_acceptance``: the per-token acceptance probability α of the truncated-geometric model
  Pr(n ≥ j) = α^j, under which mean tokens per step = (1 − α^(γ+1)) / (1 − α). From step outcomes
  its maximum-likelihood estimate is accepted / (accepted + rejections)
  (`token_acceptance_from_counts`); from a mean tokens per step alone, the α that solves the
  formula (`token_acceptance_from_tokens_per_step`).

At γ = 4, acceptance_rate 0.30 and token_acceptance ≈ 0.58 describe the same 2.2 tokens per step.

Measured differences are called by `compare_runs` (repeated wall times of the same work) and
`paired_difference` (per-request values of two contestants on the same requests).
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

ACCEPTANCE = {
    "acceptance_rate": "accepted draft tokens / drafted tokens; tokens per step = 1 + γ · acceptance_rate",
    "token_acceptance": "per-token α of the truncated-geometric model Pr(n ≥ j) = α^j; "
                        "tokens per step = (1 − α^(γ+1)) / (1 − α)",
}


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
    arm_gammas: list[int] | None = None  # each arm's γ when arms are (draft, γ) pairs; per_arm reports it

    def record(self, step: StepRecord) -> None:
        self.steps.append(step)

    @property
    def arm_trace(self) -> list[int]:
        return [step.arm for step in self.steps]

    @property
    def gamma_trace(self) -> list[int]:
        """Per step, the drafted tokens per row (the arm's γ, cut by the token budget on the eager engine)."""
        return [step.gamma for step in self.steps]

    def acceptance_trace(self) -> list[float]:
        """Per step, the mean over active rows of num_accepted / γ (NaN for a plain step: nothing drafted)."""
        return [_mean([n / step.gamma for n in step.num_accepted]) if step.gamma else math.nan for step in self.steps]

    def summary(self) -> dict[str, Any]:
        """Reduced numbers; NaN where there is nothing to average (e.g. zero steps).

        `acceptance_rate` and `token_acceptance` are defined in the module docstring;
        `mean_acceptance` is the old name of `acceptance_rate`, kept for existing readers.
        """
        accepted = [n for step in self.steps for n in step.num_accepted]
        emitted = sum(n + 1 for n in accepted)
        kept = [count for step in self.steps for count in step.kept]
        latencies = sorted(step.latency_s for step in self.steps)
        per_arm: dict[str, dict[str, float]] = {}
        for arm, name in enumerate(self.arm_names):
            chosen = [step for step in self.steps if step.arm == arm]
            per_arm[name] = {"selections": len(chosen), **_acceptance(chosen)}
            if self.arm_gammas is not None:
                per_arm[name]["gamma"] = self.arm_gammas[arm]
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
            **_acceptance(self.steps),
            "mean_accepted_length": _mean(accepted),
            "mean_tokens_per_step": _mean(kept),
            "kept_fraction": sum(kept) / emitted if emitted else math.nan,
            "kv_cache_fill": self.cache_tokens / self.cache_columns if self.cache_columns else math.nan,
            "p50_step_latency_s": percentile(latencies, 50),
            "p99_step_latency_s": percentile(latencies, 99),
            "mean_step_latency_s": _mean(latencies),
            "synchronized_timing": self.synchronized_timing,
            "per_arm": per_arm,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm_names": list(self.arm_names),
            **({"arm_gammas": list(self.arm_gammas)} if self.arm_gammas is not None else {}),
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
            ("acceptance rate (accepted/drafted)", _fmt(summary["acceptance_rate"], ".3f")),
            ("token acceptance α (per token)", _fmt(summary["token_acceptance"], ".3f")),
            ("mean accepted length", _fmt(summary["mean_accepted_length"], ".2f")),
            ("tokens per step (per row)", _fmt(summary["mean_tokens_per_step"], ".2f")),
            ("kept / emitted (budget, EOS)", _fmt(summary["kept_fraction"], ".3f")),
            ("target KV-cache fill", _fmt(summary["kv_cache_fill"], ".3f")),
            ("p50 step latency (ms)", _fmt(summary["p50_step_latency_s"] * 1e3, ".2f")),
            ("p99 step latency (ms)", _fmt(summary["p99_step_latency_s"] * 1e3, ".2f")),
        ]
        for name, arm in summary["per_arm"].items():
            rows.append((f"arm {name}", f"{arm['selections']} steps, acceptance rate "
                                        f"{_fmt(arm['acceptance_rate'], '.3f')}, α {_fmt(arm['token_acceptance'], '.3f')}"))
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def _acceptance(steps: Sequence[StepRecord]) -> dict[str, float]:
    """Both acceptance measures of some steps, and the old name of the first."""
    accepted = sum(n for step in steps for n in step.num_accepted)
    drafted = sum(step.gamma * len(step.num_accepted) for step in steps)
    rejections = sum(1 for step in steps for n in step.num_accepted if n < step.gamma)
    rate = acceptance_rate(accepted, drafted)
    return {"acceptance_rate": rate, "token_acceptance": token_acceptance_from_counts(accepted, rejections),
            "mean_acceptance": rate}


def acceptance_rate(accepted: int, drafted: int) -> float:
    """Accepted draft tokens over drafted tokens (NaN when nothing was drafted)."""
    return accepted / drafted if drafted else math.nan


def token_acceptance_from_counts(accepted: int, rejections: int) -> float:
    """Maximum-likelihood per-token α from step outcomes: accepted / (accepted + rejections).

    A row-step that accepts n < γ is n successes and one failure; n = γ is γ successes and no
    failure (the truncated geometric the bandits' conjugate update uses)."""
    return accepted / (accepted + rejections) if accepted + rejections else math.nan


def tokens_per_step_from_token_acceptance(alpha: float, gamma: int) -> float:
    """Expected tokens per step of the geometric model: 1 + α + ... + α^γ."""
    return sum(alpha**k for k in range(gamma + 1))


def token_acceptance_from_tokens_per_step(tokens_per_step: float, gamma: int) -> float:
    """The per-token α whose geometric model emits `tokens_per_step` on average (bisection).

    NaN when no α in [0, 1] fits: fewer than 1 or more than γ + 1 tokens per step."""
    if not 1.0 <= tokens_per_step <= gamma + 1:
        return math.nan
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if tokens_per_step_from_token_acceptance(middle, gamma) < tokens_per_step:
            low = middle
        else:
            high = middle
    return (low + high) / 2


# Calling a difference ------------------------------------------------------------------------------

MIN_RUNS = 2
MAX_SEPARATION_CHANCE = 0.1
Z_DECIDED = 2.0


@dataclass(frozen=True)
class Comparison:
    """The claim "the candidate is faster than the baseline", judged from repeated wall times.

    `ratio` is median(baseline) / median(candidate) (> 1: candidate faster); `low` and `high` pair
    the repeats least and most favourably for the candidate; `chance` is the probability that the
    two sets of runs separate completely when every run is equally likely to be the fastest."""

    ratio: float
    low: float
    high: float
    runs: tuple[int, int]
    chance: float
    verdict: str
    reason: str


def compare_runs(baseline_times: Sequence[float], candidate_times: Sequence[float],
                 control: Comparison | None = None) -> Comparison:
    """Judge a speed-up from wall times of runs that do the same work.

    The rule: "reproduced" when even the least favourable pairing is faster (low > 1), "not
    reproduced" when even the most favourable one is slower (high < 1), and "inconclusive"
    otherwise. It is also inconclusive when either side has fewer than `MIN_RUNS` runs, when
    complete separation could arise by chance with probability above `MAX_SEPARATION_CHANCE`
    (three runs a side give 2 / C(6, 3) = 0.1), or when `control` -- the same comparison between
    two measurements of identical work -- itself came out decided: then the repeats understate the
    run-to-run error (warm-up, run order), and no difference measured next to it can be trusted.
    """
    base, cand = list(baseline_times), list(candidate_times)
    if not base or not cand or min(base + cand) <= 0:
        raise ValueError(f"need positive wall times on both sides, got {base} and {cand}")
    ratio = statistics.median(base) / statistics.median(cand)
    low, high = min(base) / max(cand), max(base) / min(cand)
    chance = 2.0 / math.comb(len(base) + len(cand), len(base))
    if min(len(base), len(cand)) < MIN_RUNS:
        verdict, reason = "inconclusive", f"{min(len(base), len(cand))} run on one side: no spread to judge by"
    elif low <= 1.0 <= high:
        verdict, reason = "inconclusive", f"the repeats overlap ({low:.2f}–{high:.2f}×)"
    elif chance > MAX_SEPARATION_CHANCE:
        verdict, reason = "inconclusive", (f"{len(base)} and {len(cand)} runs separate by chance with "
                                           f"probability {chance:.2f}")
    elif control is not None and control.verdict != "inconclusive":
        verdict, reason = "inconclusive", (f"identical work measured twice differed by {control.ratio:.2f}× "
                                           f"({control.low:.2f}–{control.high:.2f}×), beyond its repeats' spread")
    elif low > 1.0:
        verdict, reason = "reproduced", f"every pairing of runs is faster ({low:.2f}–{high:.2f}×)"
    else:
        verdict, reason = "not reproduced", f"every pairing of runs is slower ({low:.2f}–{high:.2f}×)"
    return Comparison(ratio, low, high, (len(base), len(cand)), chance, verdict, reason)


def overall_verdict(verdicts: Sequence[str]) -> str:
    """One verdict for a claim judged several times (batch sizes, streams): the common verdict when all
    agree, "mixed" when decided ones disagree, "inconclusive" when none is decided or there are none."""
    decided = set(verdicts) - {"inconclusive"}
    if not decided:
        return "inconclusive"
    if len(decided) > 1:
        return "mixed"
    return decided.pop() if "inconclusive" not in verdicts else f"{next(iter(decided))} in part, inconclusive in part"


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """Sample mean and its standard error (sample standard deviation / √n; NaN for n < 2)."""
    values = list(values)
    if not values:
        return math.nan, math.nan
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, statistics.stdev(values) / math.sqrt(len(values))


@dataclass(frozen=True)
class Difference:
    """The claim "the candidate is higher than the baseline", judged from paired values."""

    mean: float
    standard_error: float
    n: int
    verdict: str


def paired_difference(candidate: Sequence[float], baseline: Sequence[float], z: float = Z_DECIDED) -> Difference:
    """Mean of candidate − baseline over paired units (e.g. the same requests) and its standard error.

    "reproduced" when the mean exceeds `z` standard errors above 0, "not reproduced" when it is `z`
    below, "inconclusive" inside (or with fewer than two pairs)."""
    if len(candidate) != len(baseline):
        raise ValueError(f"paired values need equal lengths, got {len(candidate)} and {len(baseline)}")
    mean, error = mean_and_standard_error([a - b for a, b in zip(candidate, baseline)])
    if math.isnan(error) or abs(mean) <= z * error:
        verdict = "inconclusive"
    else:
        verdict = "reproduced" if mean > 0 else "not reproduced"
    return Difference(mean, error, len(candidate), verdict)


def per_request_tokens_per_step(request_of_step: Sequence[int], tokens_per_request: int,
                                num_requests: int) -> list[float]:
    """Tokens per step of each request of a served stream whose requests all generate the same
    number of tokens (the switching workload ignores EOS): tokens_per_request / its step count."""
    counts = [0] * num_requests
    for request in request_of_step:
        counts[request] += 1
    if min(counts) == 0:
        raise ValueError("every request must have at least one step")
    return [tokens_per_request / count for count in counts]


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
