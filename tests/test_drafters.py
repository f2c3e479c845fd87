"""The model-free drafter: n-gram lookup and prompt-lookup proposals (flashspec.drafters)."""
from __future__ import annotations

import torch

import flashspec as fs
from flashspec.drafters import DraftContext, PromptLookupDrafter, lookup_ngram


def test_lookup_ngram_finds_most_recent_earlier_occurrence():
    tokens = torch.tensor([[1, 2, 3, 9, 1, 2, 4, 1, 2]])
    valid = torch.ones_like(tokens, dtype=torch.bool)
    assert lookup_ngram(tokens, valid, 2).tolist() == [6]  # "1 2" last seen at 4..5, then 4
    assert lookup_ngram(tokens, valid, 3).tolist() == [-1]


def test_prompt_lookup_proposal_is_periodic_and_falls_back_to_last_token():
    drafter = PromptLookupDrafter(max_ngram=2)
    tokens = torch.tensor([[5, 6, 7, 5, 6], [1, 2, 3, 4, 8]])
    context = DraftContext(
        tokens=tokens, valid=torch.ones_like(tokens, dtype=torch.bool), position_ids=torch.arange(5).expand(2, -1),
        lengths=[5, 5], next_position=torch.tensor([5, 5]), gamma=4, sampling=fs.SamplingParams(), key=fs.rng.Key(1, 2),
    )
    proposal = drafter.propose(context)
    assert proposal.logits is None
    assert proposal.tokens.tolist() == [[7, 5, 6, 7], [8, 8, 8, 8]]


def test_prompt_lookup_on_right_aligned_rows_of_different_lengths():
    """Row 1 is two tokens shorter: its first two columns are outside the row and never match."""
    drafter = PromptLookupDrafter(max_ngram=1)
    tokens = torch.tensor([[4, 4, 9, 4], [9, 9, 2, 9]])
    valid = torch.tensor([[True, True, True, True], [False, False, True, True]])
    context = DraftContext(
        tokens=tokens, valid=valid, position_ids=torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1]]), lengths=[4, 2],
        next_position=torch.tensor([4, 2]), gamma=2, sampling=fs.SamplingParams(), key=fs.rng.Key(1, 2),
    )
    assert drafter.propose(context).tokens.tolist() == [[9, 4], [9, 9]]


def test_prompt_lookup_ignores_padding():
    tokens = torch.tensor([[0, 0, 3, 0]])
    valid = torch.tensor([[False, False, True, True]])
    assert lookup_ngram(tokens, valid, 1).tolist() == [-1]
