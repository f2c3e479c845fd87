"""Figures (flashspec.plots) drawn from a live generation and from results records."""
from __future__ import annotations

import torch

import flashspec as fs
from flashspec.drafters import PromptLookupDrafter
from flashspec.engine import SpeculativeDecoder


def test_plot_generation_trace(tmp_path, target, draft):
    from flashspec.plots import plot_generation_trace

    decoder = SpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="exp3", gamma=3, policy_kwargs={"seed": 0})
    result = decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=12, sampling=fs.SamplingParams(1.0), ignore_eos=True)
    path = tmp_path / "trace.png"
    figure = plot_generation_trace(result.stats, path)
    assert path.stat().st_size > 0
    arm_axis = figure.axes[0]
    assert [label.get_text() for label in arm_axis.get_yticklabels()] == result.stats.arm_names
    assert len(arm_axis.collections[0].get_offsets()) == len(result.stats.steps)
