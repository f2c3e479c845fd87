"""The multi-path gain measurement (`flashspec_lab.paths_gain`) on tiny random models."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from flashspec.sampling import SamplingParams
from flashspec_lab import paths_gain


def tiny(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def test_a_draft_equal_to_the_target_keeps_every_chain_whole():
    model, ids = tiny(0), torch.randint(0, 48, (1, 7), generator=torch.Generator().manual_seed(1))
    cell = paths_gain.measure_prompt(model, model, ids, SamplingParams(1.0), chains=2, gamma=3, new_tokens=12,
                                     seed=0, draws=4)
    for method in ("token", "block", "paths1", "paths2"):
        assert abs(cell[f"{method}_expected_tokens_per_step"] - 4.0) < 1e-4, (method, cell)
    assert cell["generated"] >= 12 and cell["steps"] == -(-cell["generated"] // 4)


def test_the_cached_chains_are_the_uncached_ones():
    """The draft's KV cache repeated to K rows drafts what a full forward over each row would."""
    draft, ids = tiny(2), torch.randint(0, 48, (1, 9), generator=torch.Generator().manual_seed(3))
    context = paths_gain.Context(draft, ids)
    from flashspec import rng

    tokens, log_q = paths_gain.draft_chains(context, ids[:, -1:], 3, 4, SamplingParams(1.0), rng.Key.from_seed(5))
    for k in range(3):
        rows = torch.cat([ids, tokens[k:k + 1]], dim=1)
        full = torch.log_softmax(draft(rows).logits[0, ids.shape[1] - 1:-1].float(), dim=-1)
        assert torch.allclose(full, log_q[k], atol=1e-4)


def test_more_chains_and_block_keep_at_least_as_much_on_average():
    target, draft = tiny(4), tiny(5)
    ids = torch.randint(0, 48, (1, 6), generator=torch.Generator().manual_seed(6))
    cell = paths_gain.measure_prompt(target, draft, ids, SamplingParams(1.0), chains=3, gamma=3, new_tokens=40,
                                     seed=1, draws=64)
    assert cell["block_expected_tokens_per_step"] >= cell["token_expected_tokens_per_step"]
    assert cell["paths3_expected_tokens_per_step"] > cell["paths1_expected_tokens_per_step"] - 0.05
    summary = paths_gain.summarise([cell, cell], chains=3)
    assert summary["prompts"] == 2 and summary["paths_minus_block_standard_error"] == 0.0
    assert abs(summary["paths_over_block"] * summary["block"] - summary["paths3"]) < 1e-9
