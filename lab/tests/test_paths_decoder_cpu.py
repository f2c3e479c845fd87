"""The paths-decoder driver's pieces on tiny models: every decoder it names runs a prompt, and the summary's means,
spreads and ratios to the best one-chain decoder of the same drafts are those of its cells."""
from __future__ import annotations

import pytest
import torch

import flashspec as fs
from flashspec import models
from flashspec.features import FeatureDraft


def test_every_decoder_runs_a_prompt_and_the_summary_reads_the_cells():
    from experiments import paths_decoder_cpu as driver

    target = models.tiny_llama(vocab_size=32, hidden_size=16, num_layers=2, initializer_range=0.3, seed=1)
    torch.manual_seed(0)
    drafts = {"draft": models.tiny_llama(vocab_size=32, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2),
              "features": FeatureDraft.from_target(target, (1,), (0, 1, -1)).eval()}
    decoders = {name: driver.make(name, target, drafts, gamma=2) for name in driver.DECODERS}
    cells = [driver.measure_prompt(decoders, torch.tensor([[3, 5, 7, 3, 5]]), fs.SamplingParams(1.0), new_tokens=8,
                                   seed=seed) for seed in (0, 1)]
    for cell in cells:
        assert all(1.0 <= cell[f"{name}_tokens_per_step"] <= 3.0 for name in driver.DECODERS)
    summary = driver.summarise(cells)
    mean = (cells[0]["paths_draft_lookup_tokens_per_step"] + cells[1]["paths_draft_lookup_tokens_per_step"]) / 2
    assert summary["paths_draft_lookup"] == pytest.approx(mean)
    # the best one chain of the draft and prompt lookup, block-verified
    best = max(("chain_block", "chain_block_lookup"), key=lambda name: summary[name])
    assert summary["paths_draft_lookup_best_chain"] == best
    assert summary["paths_draft_lookup_over_best_chain"] == pytest.approx(summary["paths_draft_lookup"] / summary[best])
    assert summary["paths_draft_x2_best_chain"] == "chain_block"  # two samples of the draft: its own chain alone
    assert summary["paths_features_draft_lookup_best_chain"] in ("chain_block", "chain_block_features",
                                                                "chain_block_lookup")
    assert summary["chain_token_standard_error"] is not None and "chain_token_over_best_chain" not in summary
    assert len(decoders["paths_features_x2_lookup"].drafts) == 3 and cells[0]["seconds"] > 0
    # a run of some decoders summarises those alone
    some = driver.summarise([{key: value for key, value in cell.items() if "features" not in key} for cell in cells])
    assert "paths_features_lookup" not in some and "paths_draft_lookup_over_best_chain" in some
