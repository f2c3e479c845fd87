"""The paths-decoder driver's pieces on tiny models: every decoder it names runs a prompt, and the summary's means,
spreads and ratios are those of its cells."""
from __future__ import annotations

import pytest
import torch

import flashspec as fs
from flashspec import models


def test_every_decoder_runs_a_prompt_and_the_summary_reads_the_cells():
    from experiments import paths_decoder_cpu as driver

    target = models.tiny_llama(vocab_size=32, hidden_size=16, num_layers=1, initializer_range=0.3, seed=1)
    draft = models.tiny_llama(vocab_size=32, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    decoders = {name: driver.make(name, target, draft, gamma=2) for name in driver.DECODERS}
    cells = [driver.measure_prompt(decoders, torch.tensor([[3, 5, 7, 3, 5]]), fs.SamplingParams(1.0), new_tokens=8,
                                   seed=seed) for seed in (0, 1)]
    for cell in cells:
        assert all(1.0 <= cell[f"{name}_tokens_per_step"] <= 3.0 for name in driver.DECODERS)
    summary = driver.summarise(cells)
    mean = (cells[0]["paths_draft_lookup_tokens_per_step"] + cells[1]["paths_draft_lookup_tokens_per_step"]) / 2
    assert summary["paths_draft_lookup"] == pytest.approx(mean)
    assert summary["paths_draft_x2_over_chain_block"] == pytest.approx(summary["paths_draft_x2"]
                                                                        / summary["chain_block"])
    assert summary["chain_token_standard_error"] is not None and "chain_token_over_chain_block" not in summary
    assert len(decoders["paths_draft_x2_lookup"].drafts) == 3 and cells[0]["seconds"] > 0
