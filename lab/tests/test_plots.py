"""Figures (flashspec_lab.plots) drawn from a live generation and from results records."""
from __future__ import annotations

import torch

import flashspec as fs
from flashspec.drafters import PromptLookupDrafter
from flashspec.engine import SpeculativeDecoder


def test_plot_generation_trace(tmp_path, target, draft):
    from flashspec_lab.plots import plot_generation_trace

    decoder = SpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="exp3", gamma=3, policy_kwargs={"seed": 0})
    result = decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=12, sampling=fs.SamplingParams(1.0), ignore_eos=True)
    path = tmp_path / "trace.png"
    figure = plot_generation_trace(result.stats, path)
    assert path.stat().st_size > 0
    arm_axis = figure.axes[0]
    assert [label.get_text() for label in arm_axis.get_yticklabels()] == result.stats.arm_names
    assert len(arm_axis.collections[0].get_offsets()) == len(result.stats.steps)


def test_plot_preceding_call(tmp_path):
    """A bar per preceding call and point in each panel, the host time hatched inside it, from a record shaped as
    experiments/verify_interference.py writes it."""
    from flashspec_lab.plots import PRECEDING_CALLS, plot_preceding_call

    def rows(scale: float) -> dict:
        return {key: {"event_us": scale * (index + 1), "host_us": 0.5 * scale * (index + 1)}
                for index, key in enumerate(PRECEDING_CALLS)}

    points = [{"batch": b, "vocab": 32000, "step": rows(10.0), "honest": rows(100.0)} for b in (1, 8)]
    path = tmp_path / "preceding.png"
    figure = plot_preceding_call({"settings": {}, "results": {"points": points}}, path)
    assert path.stat().st_size > 0 and len(figure.axes) == 2
    step_axis = figure.axes[0]
    heights = sorted(patch.get_height() for patch in step_axis.patches)
    # per point: five event bars and five hatched host bars at half their height
    assert len(heights) == 2 * 2 * len(PRECEDING_CALLS) and max(heights) == 50.0 and min(heights) == 5.0
    assert len(step_axis.get_legend().get_texts()) == len(PRECEDING_CALLS)


def test_plot_kernel_floors(tmp_path):
    """Two bars per point (stats and sampling pass), each kernel's issue floor hatched inside its bar, from a record
    shaped as experiments/verify_ncu.py writes it; other plans' rows are left out."""
    from flashspec_lab.plots import plot_kernel_floors

    def entry(batch: int, variant: str) -> dict:
        return {"batch": batch, "vocab": 32000, "variant": variant, "launched": [
            {"name": "_stats_kernel", "duration_us": 10.0 * batch, "issue_floor_us": 4.0 * batch},
            {"name": "_sample_kernel", "duration_us": 12.0 * batch, "issue_floor_us": 9.0 * batch}]}

    data = [entry(1, "default"), entry(8, "default"), entry(8, "stats_lanes_off")]
    path = tmp_path / "floors.png"
    figure = plot_kernel_floors({"settings": {}, "results": data}, path)
    assert path.stat().st_size > 0 and len(figure.axes) == 1
    heights = sorted(patch.get_height() for patch in figure.axes[0].patches)
    assert heights == sorted([10.0, 80.0, 4.0, 32.0, 12.0, 96.0, 9.0, 72.0])
    assert [t.get_text() for t in figure.axes[0].get_legend().get_texts()] == ["stats pass", "sampling pass"]


def test_plot_one_pass_split(tmp_path):
    """Per point a stack of three (streaming part, accept test, proposals) and the two-launch bar, only for points
    that timed the one-pass diagnostics, with a dashed bar at twice the floor."""
    from flashspec_lab.plots import plot_one_pass_split

    def point(batch: int, diagnostics: bool) -> dict:
        variants = ({"diagnostic_one_pass_stream": {"graph_warm_us": 3.0 * batch},
                     "diagnostic_one_pass_accept": {"graph_warm_us": 5.0 * batch}} if diagnostics else {})
        return {"batch": batch, "vocab": 32000, "floor_us": 3.5, "rejection_graph_warm_us": 8.0 * batch,
                "triton_graph_warm_us": 7.0 * batch, "variants": variants}

    path = tmp_path / "split.png"
    figure = plot_one_pass_split({"settings": {}, "results": {"points": [point(1, True), point(8, True),
                                                                         point(64, False)]}}, path)
    assert path.stat().st_size > 0
    heights = sorted(round(patch.get_height(), 6) for patch in figure.axes[0].patches)
    assert heights == sorted([3.0, 24.0, 2.0, 16.0, 3.0, 24.0, 7.0, 56.0])
    labels = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert sorted(labels) == sorted(["streaming part", "+ ticket and accept test", "+ proposals (and fallback)",
                                     "two launches (race)", "bar: 2x the floor"])


def test_plot_standings(tmp_path):
    """One marker per (point, structure timed there), at the runs' median, a line across the runs' range, and the
    bar at twice the floor; the log-probs steps hollow."""
    from flashspec_lab.plots import plot_standings

    def record(two: float) -> dict:
        points = [{"batch": batch, "vocab": 32000, "floor_us": 4.0, "log_probs_graph_warm_us": 6.0,
                   "variants": {"two_launch": {"overrides": {}, "graph_warm_us": two * batch}}}
                  for batch in (1, 8)]
        return {"settings": {}, "results": {"points": points}}

    path = tmp_path / "standings.png"
    figure = plot_standings([record(8.0), record(10.0), record(9.0)], path)
    assert path.stat().st_size > 0
    ax = figure.axes[0]
    markers = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert [list(line.get_ydata()) for line in markers] == [[9.0 / 4.0, 72.0 / 4.0], [1.5, 1.5]]
    assert markers[1].get_markerfacecolor() == "none"
    ranges = ax.collections[0].get_segments()
    assert [(seg[0][1], seg[1][1]) for seg in ranges] == [(2.0, 2.5), (16.0, 20.0)]
    labels = [t.get_text() for t in figure.legends[0].get_texts()]
    assert labels[0] == "two launches" and labels[-1] == "bar: 2x the floor"


def test_plot_temperature_fit(tmp_path):
    """A line per calibrated draft over its τ grid and a circle at its fitted τ, from a real_pool-shaped record."""
    from flashspec_lab.plots import plot_temperature_fit

    def fit(best: float) -> dict:
        grid = [0.8, 0.9, 1.0, 1.1]
        return {"temperature": best, "sum_min_t1_by_temperature": {str(t): 1.0 - abs(t - best) for t in grid}}

    models = {"target": {}, "draft-general": {"calibration": fit(0.9)}, "draft-cpp": {"calibration": fit(1.1)}}
    path = tmp_path / "temperature.png"
    figure = plot_temperature_fit({"provenance": {}, "results": {"build": {"models": models}}}, path)
    assert path.stat().st_size > 0
    lines = figure.axes[0].get_lines()
    curves = [line for line in lines if len(line.get_xdata()) == 4]
    circles = [line for line in lines if len(line.get_xdata()) == 1 and line.get_marker() == "o"]
    assert len(curves) == 2 and [(c.get_xdata()[0], c.get_ydata()[0]) for c in circles] == [(0.9, 1.0), (1.1, 1.0)]
    assert [t.get_text() for t in figure.axes[0].get_legend().get_texts()] == ["draft-general", "draft-cpp"]
