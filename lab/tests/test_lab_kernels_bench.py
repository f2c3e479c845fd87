"""The verify benchmark (`flashspec_lab.bench`, `python -m experiments.bench_verify`): its driver end to end on tiny
shapes in Triton's interpreter, its variants option, and how it reads its records -- the plan choice, the standings
of the launch structures, the verdicts of its bars and the paired timings."""
from __future__ import annotations

import pytest
import torch

from flashspec.kernels.shims import CLUSTERS_AVAILABLE
from kernel_cases import ON_GPU

# compiled, the cluster plan needs SM90+ and Triton >= 3.9: elsewhere its variants record that they did not run
CLUSTERS_ON_DEVICE = ON_GPU and CLUSTERS_AVAILABLE and torch.cuda.get_device_capability()[0] >= 9
SMOKE = dict(batch=3, gamma=2, vocab=40)  # the smoke run's point (`bench_verify --smoke`: gamma 2, vocab 40)


def distinct_variants() -> list[str]:
    """The benchmark's variants, one per distinct plan they run here: all on a GPU; interpreted, where the plan
    leaves out the tile and grid keys (one tile, whole rows), the first variant of each plan (the others launch the
    very same kernels with the very same arguments)."""
    from flashspec_lab.bench import PLAN_VARIANTS, _variant_options

    if ON_GPU:
        return list(PLAN_VARIANTS)
    from flashspec.kernels import make_plan

    first: dict = {}
    for name, overrides in PLAN_VARIANTS.items():
        options = _variant_options(overrides)
        plan = make_plan(SMOKE["batch"], SMOKE["gamma"], SMOKE["vocab"], torch.device("cpu"), False,
                         fused=options["fused"], tuning=options["tuning"], residual=options["residual"])
        first.setdefault(plan, name)
    return list(first.values())


def test_verify_benchmark_variants_option(tmp_path, capsys) -> None:
    """`--variants` times only the named plan variants (and records only them) at every point asked for (each
    point in its own entry); an unknown name is refused with the known names, before anything runs."""
    import json

    from experiments import bench_verify

    with pytest.raises(SystemExit) as refused:
        bench_verify.main(["--smoke", "--variants", "two_launch", "no_such_plan"])
    assert refused.value.code == 2 and "no_such_plan" in capsys.readouterr().err
    out = tmp_path / "verify.json"
    assert bench_verify.main(["--smoke", "--batch", "1", "3", "--variants", "two_launch", "cluster_c8",
                              "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record["settings"]["plan_variants"]) == {"two_launch", "cluster_c8"}
    assert [p["batch"] for p in record["results"]["points"]] == [1, 3]
    assert all(set(point["variants"]) == {"two_launch", "cluster_c8"} for point in record["results"]["points"])


def test_verify_benchmark_smoke_runs_on_tiny_shapes(tmp_path) -> None:
    """`flashspec bench verify --smoke`: the GPU benchmark's driver end to end on tiny shapes (host clock, no
    graphs) at one point -- every plan variant (interpreted: every distinct plan among them) returns the reference's
    tokens, verdicts and the plan table are written."""
    import json

    from experiments import bench_verify
    from flashspec_lab.bench import PLAN_VARIANTS, TARGETS, is_diagnostic, is_rejection

    variants = distinct_variants()
    assert any(is_rejection(PLAN_VARIANTS[name]) for name in variants) and "fused" in variants and "coop" in variants
    out = tmp_path / "verify.json"
    assert bench_verify.main(["--smoke", "--batch", str(SMOKE["batch"]), "--gamma", str(SMOKE["gamma"]), "--vocab",
                              str(SMOKE["vocab"]), "--variants", *variants, "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    results = record["results"]
    assert [p["batch"] for p in results["points"]] == [SMOKE["batch"]]
    for point in results["points"]:
        assert set(point["variants"]) == set(variants)
        # (a one-pass kernel stopped early, a diagnostic, samples nothing)
        assert all(row["tokens_equal_reference"] for row in point["variants"].values()
                   if "error" not in row and not row["overrides"].get("one_pass_stop")), \
            point["variants"]
        assert point["honest_torch_us"] > 0 and point["honest_over_triton"] is not None
        assert point["honest_torch_latency_us"] > 0 and point["honest_over_triton_latency"] is not None
        assert point["honest_over_triton_paired"] > 0 and len(point["honest_over_best_paired_range"]) == 2
        sides = point["honest_over_triton_paired_sides_us"]  # what each call took while paired
        assert sides["honest"][0] > 0 and sides["step"][0] > 0 and len(sides["step"][1]) == 2
        assert set(point["honest_over_triton_paired_by_order"]) == {"honest_first", "step_first"}
        for host in ("warm", "cold"):  # the same pairs with both calls finding the host alike
            assert point[f"honest_over_triton_paired_{host}"] > 0
            assert point[f"honest_over_triton_paired_{host}_sides_us"]["step"][0] > 0
        # empty launches timed like the step: the ceiling of the eager ratio with this many launches
        assert set(point["latency_floor_by_launches_us"]) == {"1", "2"}
        assert point["honest_over_launch_floor_latency"] == point["honest_torch_latency_us"] / \
            point["latency_floor_by_launches_us"][str(point["launches_per_step"])]
        assert point["paired_best_variant"] == point["best_variant"]
        assert point["best_variant"] in PLAN_VARIANTS and not is_diagnostic(PLAN_VARIANTS[point["best_variant"]])
        assert "honest_torch_graph_error" in point or "honest_torch_graph_warm_us" in point
        # the dependency-chain floor, for every two-launch plan: a CUDA graph replay on a GPU, an error on a CPU
        assert (point["chain_floor_us"] > 0) if ON_GPU else ("chain_floor_error" in point)
        assert all("chain_floor_us" in row and "one_launch_chain_floor_us" in row
                   and ("stats_kernel_warm_us" in row) and ("sample_kernel_warm_us" in row)
                   and ((row["stats_kernel_warm_us"] or 0) > 0 if ON_GPU else "stats_kernel_warm_error" in row)
                   for row in point["variants"].values() if row["launches"] == 2)
        assert (point["one_launch_chain_floor_us"] > 0) if ON_GPU else ("one_launch_chain_floor_error" in point)
        assert (point["target_only_stats_kernel_warm_us"] > 0) if ON_GPU else (
            "target_only_stats_kernel_warm_error" in point)
        assert 0 < point["target_logit_bytes"] < point["logit_bytes"]
        assert point["log_probs_tokens_equal_reference"] is True
        assert (point["log_probs_graph_warm_us"] > 0) if ON_GPU else ("log_probs_graph_warm_error" in point)
        for name, row in point["variants"].items():  # each variant runs the plan it names
            overrides = PLAN_VARIANTS[name]
            if "error" in row:  # compiled, the cluster plan needs SM90+ and Triton >= 3.9: it says so
                assert overrides.get("cluster") and ON_GPU and not CLUSTERS_ON_DEVICE, (name, row)
                assert row["error"].startswith("unavailable"), row
                continue
            assert row["plan"].get("coop", False) == bool(overrides.get("coop", 0)), (name, row["plan"])
            assert row["plan"].get("cluster", False) == bool(overrides.get("cluster", 0)), (name, row["plan"])
            assert row["plan"]["fused"] == bool(overrides.get("fused", 0)), (name, row["plan"])
            assert row["plan"].get("one_pass", False) == is_rejection(overrides), (name, row["plan"])
            one_launch = (overrides.get("coop") or overrides.get("fused") or overrides.get("cluster")
                          or is_rejection(overrides))
            assert row["launches"] == (1 if one_launch else 2), name
        # the step with residual="rejection": its reference's tokens given logits or log-probs, timed, its rows
        # counted, and never the launch-plan table's choice (another sampler)
        assert point["rejection_tokens_equal_reference"] and point["rejection_log_probs_tokens_equal_reference"]
        assert point["rejection_eager_us"] > 0 and point["honest_over_rejection_paired"] > 0
        assert set(point["rejection_rows"]) == {"rows", "rejected", "fallback"}
        assert is_rejection(PLAN_VARIANTS[point["best_rejection_variant"]])
        assert not is_rejection(PLAN_VARIANTS[point["best_variant"]])
    assert set(results["verdicts"]) == set(TARGETS)
    assert set(results["rejection_verdicts"]) == set(TARGETS) | {"graph_over_floor_max_given_log_probs"}
    assert "SHAPE_PLANS" in results["plan_choice"]["paste"] and "residual" not in results["plan_choice"]["paste"]
    assert results["verdicts"]["honest_over_eager_at_batch_64"]["as_run"]["verdict"] == "NOT MEASURED"
    assert results["verdicts"]["honest_over_eager_min_for_batch_le_8"]["timing"].startswith(
        "one call from an idle GPU, launch included, the honest baseline's and the step's calls alternating")
    assert results["plan_choice"]["paste"].startswith("SHAPE_PLANS_BY_TRITON[(")
    assert record["settings"]["targets"] == TARGETS
    floors = results["floors"]
    assert 0 < floors["one_empty_launch_latency_us"] and 0 < floors["two_empty_launches_latency_us"]
    assert len(floors["two_empty_launches_latency_us_spread"]) == 2


def test_plan_choice_skips_diagnostic_and_wrong_variants() -> None:
    """The fastest variant becomes a default only if it returned the reference's tokens and rounds as the
    reference does."""
    from flashspec_lab.bench import plan_choice, point_ratios

    point = {"batch": 8, "vocab": 32000, "floor_us": 4.0, "triton_us": 40.0, "honest_torch_us": 400.0,
             "torch_us": 4000.0, "floor_bytes_us": 4.0, "triton_graph_warm_us": 12.0,
             "variants": {
                 "two_launch": {"overrides": {}, "eager_us": 40.0, "graph_warm_us": 12.0,
                                "tokens_equal_reference": True},
                 "fused": {"overrides": {"fused": 1}, "eager_us": 30.0, "graph_warm_us": 9.0,
                           "tokens_equal_reference": False},
                 "diagnostic_fast_math": {"overrides": {"precise": 0}, "eager_us": 20.0, "graph_warm_us": 6.0,
                                          "tokens_equal_reference": True},
                 "two_launch_sample_bv256": {"overrides": {"sample_block_v": 256}, "eager_us": 45.0,
                                             "graph_warm_us": 10.0, "tokens_equal_reference": True}}}
    point.update(point_ratios(point))
    assert point["best_variant"] == "two_launch_sample_bv256" and point["best_variant_eager"] == "two_launch"
    assert point["best_graph_warm_over_floor"] == 2.5 and point["honest_over_best_eager"] == 400.0 / 45.0
    assert "(8, 32768): {'sample_block_v': 256}" in plan_choice([point])["paste"]


PLAN_RECORDS = {(3, 6): "verify_h200_70751e3", (3, 9): "verify_h200_blocks_all_decba52"}  # where each plan table came from


def test_shape_plans_follow_the_installed_triton() -> None:
    """One launch-plan table per Triton version measured, each the plan choice of a committed H200 record made
    under that version; a Triton reads the newest table not newer than it (older than all: the oldest)."""
    import triton

    from flashspec_lab import provenance
    from flashspec_lab.bench import PLAN_VARIANTS, plan_choice
    from flashspec.kernels import plan

    assert plan.triton_version("3.9.0") == (3, 9) and plan.triton_version("3.6.0+git1a2b3c") == (3, 6)
    with pytest.raises(ValueError, match="cannot read a Triton version from 'nightly'"):
        plan.triton_version("nightly")
    tables = plan.SHAPE_PLANS_BY_TRITON
    assert plan.shape_plans_for("3.9.0") is tables[(3, 9)] and plan.shape_plans_for("3.10.1") is tables[(3, 9)]
    assert plan.shape_plans_for("3.8.0") is tables[(3, 6)] and plan.shape_plans_for("3.0.0") is tables[(3, 6)]
    assert plan.SHAPE_PLANS is plan.shape_plans_for(triton.__version__)
    buckets = {(b, v) for b in plan.BATCH_BUCKETS for v in plan.VOCAB_BUCKETS}
    assert set(tables) == set(PLAN_RECORDS)
    for version, table in tables.items():
        assert set(table) == buckets and all(entry in PLAN_VARIANTS.values() for entry in table.values()), version
        record = provenance.load_result(PLAN_RECORDS[version])
        assert plan.triton_version(record["provenance"]["versions"]["triton"]) == version
        choice = plan_choice(record["results"]["points"])["paste"]
        assert all(f"{bucket}: {entry}," in choice for bucket, entry in table.items()), (version, choice)


def test_cluster_over_others_compares_the_fastest_correct_plans() -> None:
    """The book's cluster ratio: the fastest cluster variant's replay over the fastest other variant's, each among
    variants that returned the reference's tokens and are not diagnostics; None when one side was not timed."""
    from flashspec_lab.bench import best_replay, cluster_over_others

    def row(overrides: dict, replay: float | None, correct: bool = True) -> dict:
        return {"overrides": overrides, "graph_warm_us": replay, "tokens_equal_reference": correct}

    point = {"variants": {
        "two_launch": row({}, 10.0),
        "fast_but_wrong": row({"lanes": 1}, 5.0, correct=False),
        "diagnostic_fast_math": row({"precise": 0}, 4.0),
        "cluster_c8": row({"cluster": 1, "cluster_ctas": 8}, 30.0),
        "cluster_c4": row({"cluster": 1, "cluster_ctas": 4}, 25.0),
        "cluster_wrong": row({"cluster": 1, "cluster_ctas": 2}, 1.0, correct=False),
    }}
    assert best_replay(point, lambda o: bool(o.get("cluster"))) == ("cluster_c4", 25.0)
    assert best_replay(point, lambda o: not o.get("cluster")) == ("two_launch", 10.0)
    assert cluster_over_others(point) == 2.5
    point["variants"]["cluster_c4"]["graph_warm_us"] = point["variants"]["cluster_c8"]["graph_warm_us"] = None
    assert cluster_over_others(point) is None


def test_newest_points_read_each_point_from_the_latest_run_that_timed_it() -> None:
    from flashspec_lab.bench import newest_points

    def record(date: str | None, *shapes: tuple[int, int]) -> dict:
        return {"provenance": {"date_utc": date},
                "results": {"points": [{"batch": b, "vocab": v, "run": date} for b, v in shapes]}}

    late, early, undated = (record("2026-12-03T10:00:00+00:00", (1, 32000), (8, 32000)),
                            record("2026-12-02T10:00:00+00:00", (1, 32000), (64, 128256)), record(None, (8, 32000)))
    points = newest_points([late, undated, early])
    assert points[(1, 32000)] == (late["results"]["points"][0], late)
    assert points[(8, 32000)][1] is late and points[(64, 128256)][1] is early
    assert newest_points([]) == {}


def test_standings_take_each_structures_fastest_exact_replay_and_judge_the_bar_across_runs() -> None:
    """Every structure's fastest variant that returned the reference's tokens (diagnostics and wrong tokens left out;
    the one pass judged among rejection variants), the log-probs steps apart, and the bar per point across runs:
    met in every run, within spread when the runs disagree, missed in all."""
    from flashspec_lab.bench import STRUCTURES, bar_reached, standings

    def row(overrides: dict, replay: float | None, correct: bool = True) -> dict:
        return {"overrides": overrides, "graph_warm_us": replay, "tokens_equal_reference": correct}

    def point(batch: int, two: float, one_pass: float, log_probs: float | None = None) -> dict:
        return {"batch": batch, "vocab": 32000, "floor_us": 4.0, "log_probs_graph_warm_us": log_probs,
                "log_probs_tokens_equal_reference": True, "variants": {
                    "two_launch": row({}, two),
                    "lanes_tiles8": row({"lanes": 1, "sample_max_tiles": 8}, two + 1.0),
                    "wrong": row({"lanes": 1}, 1.0, correct=False),
                    "diagnostic_fast_math": row({"precise": 0}, 1.0),
                    "pdl": row({"pdl": 1}, two + 2.0),
                    "coop": row({"coop": 1}, None),
                    "one_pass": row({"residual_rejection": 1}, one_pass),
                    "diagnostic_one_pass_stream": row({"residual_rejection": 1, "one_pass_stop": 1}, 0.5),
                }}

    rows = standings(point(1, 9.0, 12.0, log_probs=6.0))
    assert {name: (r["variant"], r["us"]) for name, r in rows.items()} == {
        "two launches": ("two_launch", 9.0), "two launches, dependent launch": ("pdl", 11.0),
        "one launch, rejection": ("one_pass", 12.0), "two launches given log-probs": ("default", 6.0)}
    assert rows["two launches"]["over_floor"] == 9.0 / 4.0
    assert set(rows) - {"two launches given log-probs"} <= set(STRUCTURES)
    runs = [point(1, 7.0, 12.0, 6.0), point(1, 9.0, 12.0, 6.0),  # B=1: the runs disagree
            point(8, 7.5, 9.0), point(8, 8.0, 7.0),  # B=8: within in both, once by the one pass
            point(64, 9.0, 10.0), point(64, 10.0, 11.0)]  # B=64: missed in both
    for p in runs[4:]:
        p["batch"] = 64
    judged = bar_reached(runs)
    assert {key: value["verdict"] for key, value in judged.items()} == {
        (1, 32000): "within spread", (8, 32000): "met", (64, 32000): "missed"}
    assert judged[(8, 32000)]["best"] == [("two launches", 7.5 / 4.0), ("one launch, rejection", 7.0 / 4.0)]
    assert bar_reached(runs, given_log_probs=True)[(1, 32000)]["verdict"] == "met"  # 6.0 / 4.0 in both


def test_verdicts_judge_the_eager_bars_at_both_ends_of_the_spread() -> None:
    """A bar met by the medians but not by the pessimistic end of the timings' spreads is 'WITHIN SPREAD',
    one met at both ends 'PASS', one missed at both 'MISS'; records without spreads keep the median verdict."""
    from flashspec_lab import bench

    def point(batch: int, honest: list[float], eager: list[float]) -> dict:
        row = {"batch": batch, "vocab": 32000, "floor_us": 3.0, "triton_us": sum(eager) / 2,
               "honest_torch_us": sum(honest) / 2, "torch_us": 1.0, "floor_bytes_us": 1.0,
               "honest_torch_us_spread": honest, "triton_us_spread": eager}
        row.update(bench.point_ratios(row))
        return row

    bars = bench.verdicts([point(1, [900, 1100], [80, 95]),     # 9.5-13.8x: straddles 10x
                           point(64, [900, 1100], [100, 120])])  # 7.5-11x: above 3x at both ends
    assert bars["honest_over_eager_min_for_batch_le_8"]["as_run"]["verdict"] == "WITHIN SPREAD"
    assert bars["honest_over_eager_at_batch_64"]["as_run"]["verdict"] == "PASS"
    missed = bench.verdicts([point(8, [500, 600], [90, 100])])  # 5-6.7x: below 10x at both ends
    assert missed["honest_over_eager_min_for_batch_le_8"]["as_run"]["verdict"] == "MISS"
    assert missed["honest_over_eager_min_for_batch_le_8"]["as_run"]["range"] == pytest.approx([5.0, 600 / 90])
    old = point(1, [900, 1100], [80, 95])
    del old["honest_torch_us_spread"]
    old.update(bench.point_ratios(old))
    assert bench.verdicts([old])["honest_over_eager_min_for_batch_le_8"]["as_run"]["verdict"] == "PASS"  # 1000/87.5
    assert bars["honest_over_eager_at_batch_64"]["timing"].startswith("do_bench")


def test_eager_bars_use_the_launch_included_latency_where_recorded() -> None:
    """A record with each call's latency from an idle GPU judges the eager bars on it (do_bench's times overlap
    the host's launch with its L2 flush); one without it keeps do_bench's times."""
    from flashspec_lab import bench

    row = {"batch": 8, "vocab": 32000, "floor_us": 3.0, "triton_us": 20.0, "honest_torch_us": 500.0,
           "torch_us": 1.0, "floor_bytes_us": 1.0, "honest_torch_us_spread": [480.0, 520.0],
           "triton_us_spread": [18.0, 22.0],  # 25x by do_bench
           "honest_torch_latency_us": 600.0, "honest_torch_latency_us_spread": [580.0, 620.0],
           "triton_latency_us": 80.0, "triton_latency_us_spread": [75.0, 85.0],  # 7.5x from an idle GPU
           "variants": {"two_launch": {"overrides": {}, "eager_us": 20.0, "eager_us_spread": [18.0, 22.0],
                                       "latency_us": 50.0, "latency_us_spread": [45.0, 55.0], "graph_warm_us": 9.0,
                                       "tokens_equal_reference": True}}}
    row.update(bench.point_ratios(row))
    bar = bench.verdicts([row])["honest_over_eager_min_for_batch_le_8"]
    assert bar["timing"] == "one call from an idle GPU, launch included"
    assert bar["as_run"]["measured"] == pytest.approx(7.5) and bar["as_run"]["verdict"] == "MISS"
    assert bar["with_plan_choice"]["measured"] == pytest.approx(12.0) and bar["with_plan_choice"]["verdict"] == "PASS"
    assert bar["as_run"]["range"] == pytest.approx([580 / 85, 620 / 75])
    # paired calls, where recorded, decide over both medians: the pairs' ratios met the host at the same moment
    paired = {**row, "honest_over_triton_paired": 10.5, "honest_over_triton_paired_range": [9.8, 11.0],
              "honest_over_best_paired": 12.5, "honest_over_best_paired_range": [11.5, 13.0]}
    bar = bench.verdicts([paired])["honest_over_eager_min_for_batch_le_8"]
    assert bar["timing"].startswith("one call from an idle GPU, launch included, the honest baseline's and")
    assert bar["as_run"]["measured"] == 10.5 and bar["as_run"]["verdict"] == "WITHIN SPREAD"
    assert bar["with_plan_choice"]["measured"] == 12.5 and bar["with_plan_choice"]["verdict"] == "PASS"
    for key in ("honest_torch_latency_us", "triton_latency_us"):
        del row[key]
    row.update(bench.point_ratios(row))
    assert bench.verdicts([row])["honest_over_eager_min_for_batch_le_8"]["as_run"]["measured"] == pytest.approx(25.0)


def test_paired_ratio_alternates_and_cancels_a_drifting_host(monkeypatch) -> None:
    """`_paired_ratio` times the two calls alternately, each pair at one moment of the host: a host whose speed
    drifts during the measurement (here 1x to 3x, on both calls alike) leaves the pairs' ratio where it is, while
    two medians taken one after the other would move with the drift."""
    from flashspec_lab import bench

    clock = {"t": 0.0, "calls": 0}
    order = []

    def timer(fn):  # a host that gets slower call by call
        clock["calls"] += 1
        return fn() * (1.0 + 2.0 * clock["calls"] / 100)

    monkeypatch.setattr(bench, "_idle_call_timer", lambda: timer)
    honest = lambda: order.append("h") or 10.0  # noqa: E731
    step = lambda: order.append("s") or 1.0  # noqa: E731
    monkeypatch.setattr(bench, "_on_gpu", lambda: True)  # the GPU count of pairs, with the timer above
    median, spread, sides = bench._paired_ratio(honest, step, reps=40)
    assert abs(median - 10.0) < 0.5 and spread[0] <= median <= spread[1] and spread[1] - spread[0] < 1.0
    # each side's own times while paired carry the drift the ratio cancels: 10 and 1 scaled by 1x to 3x
    (honest_us, honest_spread), (step_us, _) = sides["numerator"], sides["denominator"]
    assert 15.0 < honest_us < 25.0 and 1.5 < step_us < 2.5 and honest_spread[1] - honest_spread[0] > 5.0
    assert honest_us / step_us == pytest.approx(median, rel=0.1)
    assert all(value == pytest.approx(10.0, rel=0.05) for value in sides["by_order"].values())
    timed = order[2:]  # after one warm-up call of each
    assert timed[:4] == ["h", "s", "s", "h"] and timed.count("h") == timed.count("s") == 40


def test_paired_ratio_gives_both_calls_the_same_host_state(monkeypatch) -> None:
    """With host="warm" each timed call comes right after an untimed call of itself, with "cold" right after a
    sweep of the host's caches; left as None, a call finds whatever the other left. A timer that makes the small
    call slow right after the large one (the asymmetry measured on the H200) biases None, not "warm"."""
    from flashspec_lab import bench

    last = {"fn": None}

    def timer(fn):
        slow = 2.0 if fn is step and last["fn"] is honest else 1.0
        last["fn"] = fn
        return fn() * slow

    def honest():
        last["fn"] = honest
        return 10.0

    def step():
        last["fn"] = step
        return 1.0

    sweeps = []
    monkeypatch.setattr(bench, "_idle_call_timer", lambda: timer)
    monkeypatch.setattr(bench, "_on_gpu", lambda: True)
    monkeypatch.setattr(bench, "_sweep_host_caches", lambda: sweeps.append(1) or last.update(fn=None))
    as_found = bench._paired_ratio(honest, step, reps=20)
    assert as_found[2]["by_order"]["numerator_first"] == pytest.approx(5.0)  # the step after the honest call
    assert as_found[2]["by_order"]["denominator_first"] == pytest.approx(10.0)
    warm = bench._paired_ratio(honest, step, reps=20, host="warm")
    cold = bench._paired_ratio(honest, step, reps=20, host="cold")
    assert warm[0] == pytest.approx(10.0) and cold[0] == pytest.approx(10.0) and len(sweeps) == 40
    with pytest.raises(ValueError, match="host must be"):
        bench._paired_ratio(honest, step, host="hot")


def test_issue_bound_step_overlaps_the_stats_pass_with_its_bytes_only() -> None:
    """`bench.issue_bound_step_us`: the stats pass costs the larger of its issue floor and the bytes floor, the
    sampling pass its issue floor after it; a record without issue floors gives None."""
    from flashspec_lab.bench import issue_bound_step_us

    def record(stats: float | None, sample: float | None) -> dict:
        return {"results": [{"batch": 64, "vocab": 128256, "variant": "default", "launched": [
            {"name": "_stats_accept_kernel", "issue_floor_us": stats},
            {"name": "_sample_kernel", "issue_floor_us": sample}]}]}

    assert issue_bound_step_us(record(29.0, 36.4), 64, 128256, 34.6) == pytest.approx(34.6 + 36.4)
    assert issue_bound_step_us(record(40.0, 36.4), 64, 128256, 34.6) == pytest.approx(40.0 + 36.4)
    assert issue_bound_step_us(record(None, 36.4), 64, 128256, 34.6) is None
    assert issue_bound_step_us(record(29.0, 36.4), 8, 128256, 34.6) is None  # no such point
