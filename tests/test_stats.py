"""Per-step statistics, the acceptance measures and the rules that call a measured difference (flashspec.stats)."""
from __future__ import annotations

import json
import math

import pytest
import torch

import flashspec as fs
from flashspec import rewards
from flashspec.drafters import PromptLookupDrafter
from flashspec.engine import SpeculativeDecoder
from flashspec.stats import (
    ACCEPTANCE,
    GenerationStats,
    StepRecord,
    acceptance_rate,
    compare_runs,
    overall_verdict,
    mean_and_standard_error,
    paired_difference,
    per_request_tokens_per_step,
    percentile,
    token_acceptance_from_counts,
    token_acceptance_from_tokens_per_step,
    tokens_per_step_from_token_acceptance,
)


def test_both_acceptance_measures_are_defined_once_and_reported() -> None:
    assert set(ACCEPTANCE) == {"acceptance_rate", "token_acceptance"}
    stats = GenerationStats(arm_names=["a"], batch_size=2, prompt_length=3)
    stats.record(StepRecord(step=0, arm=0, gamma=4, num_accepted=[4, 2], kept=[5, 3], latency_s=0.01))
    stats.record(StepRecord(step=1, arm=0, gamma=4, num_accepted=[0, 1], kept=[1, 2], latency_s=0.03))
    summary = stats.summary()
    assert summary["acceptance_rate"] == pytest.approx(7 / 16)
    assert summary["mean_acceptance"] == summary["acceptance_rate"]  # the old name still reads
    assert summary["token_acceptance"] == pytest.approx(7 / (7 + 3))  # three row-steps ended in a rejection
    assert summary["per_arm"]["a"]["token_acceptance"] == summary["token_acceptance"]
    assert summary["mean_step_latency_s"] == pytest.approx(0.02)
    table = stats.format_table()
    assert "acceptance rate (accepted/drafted)" in table and "token acceptance α (per token)" in table


def test_tokens_per_step_identities() -> None:
    # accepted / drafted gives tokens per step linearly; the per-token α through the geometric sum
    assert 1 + 4 * acceptance_rate(3, 4) == 4.0
    for alpha in (0.0, 0.3, 0.58, 0.75, 0.99):
        assert tokens_per_step_from_token_acceptance(alpha, 4) == pytest.approx(rewards.expected_tokens_per_step(alpha, 4))
        assert token_acceptance_from_tokens_per_step(tokens_per_step_from_token_acceptance(alpha, 4), 4) == \
            pytest.approx(alpha, abs=1e-9)
    assert 0.57 < token_acceptance_from_tokens_per_step(1 + 4 * 0.303, 4) < 0.59
    assert math.isnan(token_acceptance_from_tokens_per_step(0.977, 4))  # fewer than one token a step fits no α
    assert math.isnan(token_acceptance_from_tokens_per_step(5.5, 4))
    assert math.isnan(acceptance_rate(0, 0)) and math.isnan(token_acceptance_from_counts(0, 0))


def test_compare_runs_decides_only_outside_the_spread() -> None:
    faster = compare_runs([2.0, 2.1, 2.2], [1.0, 1.1, 1.2])
    assert faster.verdict == "reproduced" and faster.low == pytest.approx(2.0 / 1.2)
    assert faster.chance == pytest.approx(0.1)
    slower = compare_runs([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])
    assert slower.verdict == "not reproduced" and slower.high < 1
    overlap = compare_runs([1.9, 2.8, 2.0], [2.1, 2.3, 2.4])
    assert overlap.verdict == "inconclusive" and overlap.low < 1 < overlap.high


def test_compare_runs_needs_repeats_on_both_sides() -> None:
    assert compare_runs([15.8], [2.1, 2.2, 2.4]).verdict == "inconclusive"  # one run: no spread
    two_each = compare_runs([2.0, 2.1], [1.0, 1.1])  # separated, but 2 / C(4, 2) = 1/3 by chance
    assert two_each.verdict == "inconclusive" and two_each.chance == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        compare_runs([], [1.0])
    with pytest.raises(ValueError):
        compare_runs([0.0, 1.0], [1.0, 1.0])


def test_a_decided_control_makes_every_comparison_inconclusive() -> None:
    """The committed H200 bench at B = 8: two cells did identical work, yet their repeats separate."""
    plain = [1.93, 2.77, 2.05]
    single_draft = [9.69, 5.56, 4.38]
    same_work = [2.10, 2.26, 2.36]
    control = compare_runs(single_draft, same_work)
    assert control.verdict != "inconclusive"
    alone = compare_runs(plain, single_draft)
    assert alone.verdict == "not reproduced"
    judged = compare_runs(plain, single_draft, control=control)
    assert judged.verdict == "inconclusive" and "identical work" in judged.reason
    assert (judged.ratio, judged.low, judged.high) == (alone.ratio, alone.low, alone.high)
    quiet = compare_runs([2.0, 2.1, 2.2], [2.05, 2.15, 2.12])
    assert compare_runs([2.0, 2.1, 2.2], [1.0, 1.1, 1.2], control=quiet).verdict == "reproduced"


def test_paired_difference_and_standard_error() -> None:
    mean, error = mean_and_standard_error([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and error == pytest.approx(math.sqrt(5 / 3) / 2)
    assert math.isnan(mean_and_standard_error([1.0])[1])
    clear = paired_difference([2.0, 2.1, 2.2, 2.3], [1.0, 1.0, 1.1, 1.2])
    assert clear.verdict == "reproduced" and clear.n == 4
    assert paired_difference([1.0, 1.0, 1.1, 1.2], [2.0, 2.1, 2.2, 2.3]).verdict == "not reproduced"
    noisy = paired_difference([1.0, 2.0, 1.0, 2.2], [1.5, 1.4, 1.6, 1.5])
    assert noisy.verdict == "inconclusive" and abs(noisy.mean) <= 2 * noisy.standard_error
    assert paired_difference([1.0], [0.0]).verdict == "inconclusive"
    with pytest.raises(ValueError):
        paired_difference([1.0, 2.0], [1.0])


def test_per_request_tokens_per_step() -> None:
    assert per_request_tokens_per_step([0, 0, 1, 1, 1, 1, 2], 8, 3) == [4.0, 2.0, 8.0]
    with pytest.raises(ValueError):
        per_request_tokens_per_step([0, 0], 8, 2)


def test_bench_cell_reports_every_number_from_its_median_run() -> None:
    from flashspec_lab.bench_engine import cell_from_runs

    runs = [{"time_s": t, "tokens_per_s": 128 / t, "steps": s, "tokens_per_step": 128 / s, "acceptance_rate": r,
             "token_acceptance": 0.5, "p50_step_latency_ms": 1000 * t / s}
            for t, s, r in ((3.0, 60, 0.28), (2.0, 58, 0.30), (2.5, 59, 0.29))]
    cell = cell_from_runs(runs, warmup_s=[9.0], rows_per_step=1)
    assert cell["median_run"] == 2 and cell["times_s"] == [3.0, 2.0, 2.5] and cell["warmup_times_s"] == [9.0]
    assert (cell["tokens_per_s"], cell["steps"], cell["acceptance_rate"]) == (128 / 2.5, 59, 0.29)
    assert cell["alpha"] == cell["acceptance_rate"] and "time_s" not in cell
    # the paper's identity holds inside one run: tokens/s x step time = tokens per step
    assert cell["tokens_per_s"] * cell["p50_step_latency_ms"] / 1e3 == pytest.approx(cell["tokens_per_step"])


def test_bench_comparisons_use_the_identical_work_control() -> None:
    """The committed H200 file's B = 8 block, reduced to what `comparisons` reads."""
    from flashspec_lab.bench_engine import CONTROL, comparisons, same_work

    idle = {"draft0": {"selections": 62}, "prompt-lookup": {"selections": 0}}
    cells = {
        "plain": {"times_s": [1.93, 2.77, 2.05]},
        "hf_assisted": {"unsupported": "B > 1", "hf_assisted_sequential": {"times_s": [15.8]}},
        "flashspec": {"times_s": [9.69, 5.56, 4.38], "per_arm": {"draft0": {"selections": 62}}},
        "flashspec_pool": {"times_s": [2.10, 2.26, 2.36], "per_arm": idle},
    }
    assert same_work(cells)
    judged = comparisons(cells)
    assert judged[CONTROL].verdict != "inconclusive"
    assert {judged[name].verdict for name in judged if name != CONTROL} == {"inconclusive"}
    cells["flashspec_pool"]["per_arm"] = {**idle, "prompt-lookup": {"selections": 3}}
    assert not same_work(cells) and CONTROL not in comparisons(cells)
    assert comparisons(cells)["flashspec/plain"].verdict == "not reproduced"


def test_overall_verdict() -> None:
    assert overall_verdict([]) == "inconclusive"
    assert overall_verdict(["inconclusive", "inconclusive"]) == "inconclusive"
    assert overall_verdict(["reproduced", "reproduced"]) == "reproduced"
    assert overall_verdict(["reproduced", "not reproduced"]) == "mixed"
    assert overall_verdict(["not reproduced", "inconclusive"]) == "not reproduced in part, inconclusive in part"


def test_stats_summary_json_and_table(tmp_path, target, draft):
    decoder = SpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="thompson", gamma=3, policy_kwargs={"seed": 1})
    result = decoder.generate(torch.tensor([[1, 2, 3]] * 3), max_new_tokens=10, sampling=fs.SamplingParams(1.0), ignore_eos=True)
    stats = result.stats
    summary = stats.summary()
    assert summary["generated_tokens"] == 30
    assert summary["steps"] == len(stats.steps) == len(stats.arm_trace)
    assert 0.0 <= summary["mean_acceptance"] <= 1.0
    assert summary["p50_step_latency_s"] <= summary["p99_step_latency_s"]
    assert 0.0 < summary["kept_fraction"] <= 1.0
    assert 0.0 < summary["kv_cache_fill"] <= 1.0
    assert sum(arm["selections"] for arm in summary["per_arm"].values()) == summary["steps"]
    path = tmp_path / "stats.json"
    text = stats.to_json(str(path))
    loaded = json.loads(path.read_text())
    assert loaded == json.loads(text)
    assert loaded["arm_trace"] == stats.arm_trace
    table = stats.format_table()
    assert "tokens/s" in table and "prompt-lookup" in table


def test_stats_reduction_by_hand():
    stats = GenerationStats(arm_names=["a", "b"], batch_size=2, prompt_length=3)
    stats.record(StepRecord(step=0, arm=0, gamma=4, num_accepted=[4, 2], kept=[5, 2], latency_s=0.01))
    stats.record(StepRecord(step=1, arm=1, gamma=4, num_accepted=[0, 1], kept=[1, 1], latency_s=0.03))
    stats.generated_tokens, stats.total_s = 9, 0.04
    stats.cache_columns, stats.cache_tokens = 20, 15.0
    summary = stats.summary()
    assert summary["mean_acceptance"] == pytest.approx(7 / 16)
    assert summary["mean_accepted_length"] == pytest.approx(7 / 4)
    assert summary["kept_fraction"] == pytest.approx(9 / 11)
    assert summary["mean_tokens_per_step"] == pytest.approx(9 / 4)
    assert summary["kv_cache_fill"] == pytest.approx(0.75)
    assert summary["tokens_per_s"] == pytest.approx(225.0)
    assert summary["per_arm"]["a"]["mean_acceptance"] == pytest.approx(6 / 8)
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert math.isnan(percentile([], 50))
    empty = GenerationStats(arm_names=["a"], batch_size=1, prompt_length=1)
    assert "null" in empty.to_json()
