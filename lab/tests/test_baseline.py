"""The plain-PyTorch verify (the kernels' speed baseline) is exact: it passes the joint χ² of the
exactness suite on the same configurations as `flashspec.verify`, and a negative control shows the
harness can see a bug in it."""
from __future__ import annotations

import pytest
import torch

import flashspec as fs
from experiments.exactness import ALPHA_EACH, CONFIGS, run_config
from flashspec_lab.baseline import verify_pytorch
from flashspec_lab.exactness import VerifyOutput


def harness_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise, sampler="multinomial"):
    """`verify_pytorch` in the exactness harness's signature (an int seed per call)."""
    return verify_pytorch(target_logits, draft_logits, draft_tokens, params,
                          torch.Generator().manual_seed(generator), sampler=sampler)


def race_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
    """The same, drawing the residual / bonus by an exponential race (the graph-capturable form)."""
    return harness_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise, "race")


def bonus_from_wrong_position(target_logits, draft_logits, draft_tokens, params, generator, draft_noise):
    """The same verify with a bug: a fully accepted step draws its bonus token from the target's
    distribution at the last draft position instead of the bonus position."""
    gamma = draft_tokens.shape[1]
    out = harness_verifier(target_logits, draft_logits, draft_tokens, params, generator, draft_noise)
    if draft_logits is None:
        return out
    shifted = torch.cat([target_logits[:, :gamma], target_logits[:, gamma - 1: gamma]], dim=1)
    buggy = harness_verifier(shifted, draft_logits, draft_tokens, params, generator, draft_noise)
    full = out.num_accepted == gamma
    return VerifyOutput(tokens=torch.where(full.unsqueeze(1), buggy.tokens, out.tokens), num_accepted=out.num_accepted)


SAMPLE = [config for config in CONFIGS if config.name in {c.name for c in CONFIGS[::6]}]


@pytest.mark.parametrize("verifier", [harness_verifier, race_verifier], ids=["multinomial", "race"])
@pytest.mark.parametrize("config", SAMPLE, ids=lambda c: c.name)
def test_plain_pytorch_verify_matches_the_exact_law(config, verifier):
    result = run_config(config, verifier)
    assert result.passes(ALPHA_EACH), f"{config.name}: {result}"


def test_harness_sees_a_bug_in_it():
    config = next(c for c in CONFIGS if c.name == "two-g1-T1.0")
    result = run_config(config, bonus_from_wrong_position)
    assert not result.passes(ALPHA_EACH), result


def test_greedy_equals_the_library_and_shapes():
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(5, 4, 11, generator=generator)
    draft = torch.randn(5, 3, 11, generator=generator)
    tokens = torch.randint(0, 11, (5, 3), generator=generator)
    tokens[0] = target[0, :3].argmax(-1)  # a fully accepted row: the bonus comes from the target
    greedy = fs.SamplingParams(0.0)
    ours = verify_pytorch(target, draft, tokens, greedy, torch.Generator().manual_seed(1))
    library = fs.verify(target, draft, tokens, greedy, generator=1, backend="torch")
    assert torch.equal(ours.tokens, library.tokens) and torch.equal(ours.num_accepted, library.num_accepted)
    for sampler in ("multinomial", "race"):
        sampled = verify_pytorch(target, None, tokens, fs.SamplingParams(0.8), torch.Generator().manual_seed(2),
                                 sampler=sampler)
        assert sampled.tokens.shape == (5, 4) and bool(((sampled.num_accepted >= 0) & (sampled.num_accepted <= 3)).all())
    with pytest.raises(ValueError, match="sampler"):
        verify_pytorch(target, draft, tokens, greedy, sampler="gumbel")
