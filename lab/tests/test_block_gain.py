"""The block-gain measurement: its per-chain sums average to each method's expected drafts kept (exact enumeration
and `fs.verify` itself agree), the recorder sees every verified row of the eager engine without changing its
output, and the summary adds up."""
from __future__ import annotations

import itertools

import pytest
import torch

import flashspec as fs
from flashspec import models
from flashspec_lab import block_gain


def _chain_case(gamma: int = 3, vocab: int = 4, seed: int = 2):
    generator = torch.Generator().manual_seed(seed)
    target = 1.5 * torch.randn(gamma + 1, vocab, generator=generator)
    draft = torch.randn(gamma, vocab, generator=generator)
    return target, draft


def test_the_sums_average_to_the_exact_expectations_and_to_verify():
    target, draft = _chain_case()
    gamma, vocab = draft.shape
    log_p, log_q = torch.log_softmax(target.double(), -1), torch.log_softmax(draft.double(), -1)
    chains = torch.tensor(list(itertools.product(range(vocab), repeat=gamma)))
    positions = torch.arange(gamma)
    chain_p, chain_q = log_p[positions, chains], log_q[positions, chains]             # [V^γ, γ]
    token, block = block_gain.expected_accepted(chain_p, chain_q)
    weight = chain_q.sum(1).exp()
    exact = {"token": float((weight * token).sum()), "block": float((weight * block).sum())}
    assert exact["block"] > exact["token"] + 0.05                                     # block keeps more here
    rows = 40_000
    sampled = torch.stack([torch.multinomial(log_q[j].exp().float(), rows, True,
                                             generator=torch.Generator().manual_seed(j)) for j in range(gamma)], 1)
    for method in ("token", "block"):
        out = fs.verify(target.expand(rows, -1, -1).contiguous(), draft.expand(rows, -1, -1).contiguous(), sampled,
                        generator=3, method=method)
        kept = out.num_accepted.double()
        assert abs(float(kept.mean()) - exact[method]) < 4 * float(kept.std()) / rows ** 0.5, method
    sums = block_gain.expected_accepted(log_p[positions, sampled], log_q[positions, sampled])
    for method, values in zip(("token", "block"), sums):
        assert abs(float(values.mean()) - exact[method]) < 4 * float(values.std()) / rows ** 0.5, method


def test_recorder_sees_every_verified_row_and_changes_nothing():
    target = models.tiny_llama(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    draft = models.tiny_llama(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, seed=1)
    prompt = torch.tensor([[1, 5, 6, 7]])
    sampling = fs.SamplingParams(1.0)
    plain = fs.SpeculativeDecoder(target, [draft], policy="fixed", gamma=3, verify_method="block").generate(
        prompt, max_new_tokens=12, sampling=sampling, seed=4, ignore_eos=True)
    recorder = block_gain.Recorder()
    with block_gain.record(recorder):
        recorded = fs.SpeculativeDecoder(target, [draft], policy="fixed", gamma=3, verify_method="block").generate(
            prompt, max_new_tokens=12, sampling=sampling, seed=4, ignore_eos=True)
    assert torch.equal(plain.sequences, recorded.sequences)
    assert len(recorder.token) == len(recorder.block) == len(recorded.stats.steps)
    assert all(0 <= t <= 3 and 0 <= b <= 3 for t, b in zip(recorder.token, recorder.block))
    from flashspec import engine
    assert engine.verify_with_key.__module__ == "flashspec.verify"                   # put back


def test_summary_of_a_category():
    cells = [{"steps": 4, "token_expected_tokens_per_step": 1.5, "block_expected_tokens_per_step": 1.7,
              "realised_tokens_per_step": 1.6},
             {"steps": 6, "token_expected_tokens_per_step": 2.0, "block_expected_tokens_per_step": 2.1,
              "realised_tokens_per_step": 2.0}]
    row = block_gain.summarise(cells)
    assert row["prompts"] == 2 and row["steps"] == 10
    assert row["gain"] == pytest.approx(0.15) and row["gain_min"] == pytest.approx(0.1)
    assert row["ratio"] == pytest.approx(1.9 / 1.75) and row["gain_standard_error"] == pytest.approx(0.05)
