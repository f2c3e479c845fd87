"""Multi-path verification (`flashspec.paths`): the joint law of the first L = 3 tokens against exact enumeration
when every draft's chains are verified together, and the negative controls that must fail the same test.

The χ² family here has its own Bonferroni level: 0.01 over its tests."""
from __future__ import annotations

import pytest
import torch

import flashspec as fs
from flashspec.paths import verify_paths
from flashspec_lab import exactness as ex
from flashspec_lab import exactness_paths as xp

VOCAB, LENGTH, ROWS = 4, 3, 20_000
TARGET = ex.make_toy(VOCAB, seed=1)
SAMPLED = [ex.make_toy(VOCAB, seed=2), ex.make_toy(VOCAB, seed=3, scale=0.8)]
CERTAIN = [ex.make_toy(VOCAB, seed=2, deterministic=True), ex.make_toy(VOCAB, seed=3, scale=0.8, deterministic=True)]
# (name, drafts, chains per draft, gamma, sampling)
CASES = [
    ("two-drafts-g2-T1", SAMPLED, 1, 2, fs.SamplingParams(1.0)),
    ("one-draft-x3-g3-T1", SAMPLED[:1], 3, 3, fs.SamplingParams(1.0)),
    ("two-drafts-x2-g2-T0.7-topk3", SAMPLED, 2, 2, fs.SamplingParams(0.7, top_k=3)),
    ("two-drafts-g4-T1.3-topp0.9", SAMPLED, 1, 4, fs.SamplingParams(1.3, top_p=0.9)),
    ("deterministic-g3-T1", CERTAIN, 1, 3, fs.SamplingParams(1.0)),
]
SAMPLED_CASES = [case for case in CASES if case[1] is not CERTAIN]
CONTROL_CASES = ("two-drafts-g2-T1", "one-draft-x3-g3-T1")
NUM_TESTS = 2 * len(CASES) + len(xp.PATHS_NEGATIVE_CONTROLS) * len(CONTROL_CASES)
ALPHA_EACH = 0.01 / NUM_TESTS


def fit(case: tuple, verifier: xp.PathsVerifier, seed: int) -> ex.FitResult:
    name, drafts, samples, gamma, params = case
    sequences = xp.sample_sequences_paths(TARGET, drafts, params, gamma, ROWS, LENGTH, seed=seed, verifier=verifier,
                                          samples=samples)
    return ex.chi_square_test(sequences, ex.exact_sequence_probs(TARGET, params, LENGTH), VOCAB)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0])
def test_joint_law_is_the_targets(case):
    result = fit(case, xp.library_paths_verifier(), seed=11)
    assert result.passes(ALPHA_EACH), f"{case[0]}: {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize("case", CASES, ids=lambda case: case[0])
def test_sampled_paths_verified_as_certain_stay_exact(case):
    """q one-hot at sampled tokens: exact, only accepted less often (not a bug, so not a control)."""
    result = fit(case, xp.certain_siblings_verifier, seed=12)
    assert result.passes(ALPHA_EACH), f"{case[0]}: {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize("bug,case_name", [(bug, name) for bug in xp.PATHS_NEGATIVE_CONTROLS for name in CONTROL_CASES])
def test_negative_control_fails(bug, case_name):
    case = next(case for case in CASES if case[0] == case_name)
    result = fit(case, xp.PATHS_NEGATIVE_CONTROLS[bug], seed=13)
    assert not result.passes(ALPHA_EACH), f"the harness let '{bug}' through on {case_name}: {result}"


def test_more_paths_keep_more_tokens():
    """Three chains of one draft keep more drafted tokens per step than one chain of it."""
    case = next(case for case in CASES if case[0] == "one-draft-x3-g3-T1")
    _, drafts, _, gamma, params = case
    state = ex.LoopState(prev2=torch.full((ROWS,), VOCAB), prev1=torch.full((ROWS,), VOCAB),
                         count=torch.zeros(ROWS, dtype=torch.long), generated=torch.full((ROWS, 1), -1))
    kept = {}
    for samples in (1, 3):
        chains = [ex.propose(drafts[0], state, params, gamma, fs.rng.Key.from_seed(100 + s)) for s in range(samples)]
        tokens = torch.stack([chain.tokens for chain in chains], dim=1)
        logits = torch.stack([chain.logits for chain in chains], dim=1)
        target = torch.stack([ex.score_positions(TARGET, state, tokens[:, k]) for k in range(samples)], dim=1)
        kept[samples] = verify_paths(target, logits, tokens, params, generator=1).num_accepted.double().mean().item()
    assert kept[3] > kept[1] + 0.1, kept


def test_one_path_keeps_what_token_verification_keeps_on_average():
    """K = 1 is token verification: the same expected number of kept drafts (different random streams)."""
    params, gamma = fs.SamplingParams(1.0), 3
    state = ex.LoopState(prev2=torch.full((ROWS,), VOCAB), prev1=torch.full((ROWS,), VOCAB),
                         count=torch.zeros(ROWS, dtype=torch.long), generated=torch.full((ROWS, 1), -1))
    chain = ex.propose(SAMPLED[0], state, params, gamma, fs.rng.Key.from_seed(7))
    target = ex.score_positions(TARGET, state, chain.tokens)
    one = verify_paths(target[:, None], chain.logits[:, None], chain.tokens[:, None], params, generator=3)
    token = fs.verify(target, chain.logits, chain.tokens, params, generator=3)
    difference = (one.num_accepted.double().mean() - token.num_accepted.double().mean()).abs().item()
    assert difference < 4 * (token.num_accepted.double().var().item() * 2 / ROWS) ** 0.5
    assert bool((one.path == 0).all())


def test_output_shape_and_the_kept_path():
    torch.manual_seed(0)
    batch, paths, gamma, vocab = 5, 3, 4, 11
    tokens = torch.randint(0, vocab, (batch, paths, gamma))
    tokens[:, 1] = tokens[:, 0]  # path 1 repeats path 0: the same node all the way down
    out = verify_paths(torch.randn(batch, paths, gamma + 1, vocab), torch.randn(batch, paths, gamma, vocab), tokens,
                       fs.SamplingParams(1.0), generator=0)
    assert out.tokens.shape == (batch, gamma + 1) and out.num_emitted.tolist() == (out.num_accepted + 1).tolist()
    for row in range(batch):
        n = int(out.num_accepted[row])
        assert tokens[row, int(out.path[row]), :n].tolist() == out.tokens[row, :n].tolist()
        assert out.tokens[row, n + 1:].tolist() == [-1] * (gamma - n)


@pytest.mark.parametrize("bad,message", [
    ({"target_logits": torch.zeros(2, 3, 5)}, "target_logits must be a 4-d tensor"),
    ({"draft_tokens": torch.zeros(2, 3, dtype=torch.long)}, "draft_tokens must be a 3-d tensor"),
    ({"draft_tokens": torch.zeros(2, 1, 2, dtype=torch.long)}, "disagree on B or K"),
    ({"target_logits": torch.full((2, 2, 3, 5), float("nan"))}, "NaN"),
    ({"draft_tokens": torch.full((2, 2, 2), 9)}, "draft_tokens"),
])
def test_bad_input_names_the_argument(bad, message):
    arguments = {"target_logits": torch.zeros(2, 2, 3, 5), "draft_logits": torch.zeros(2, 2, 2, 5),
                 "draft_tokens": torch.zeros(2, 2, 2, dtype=torch.long)} | bad
    with pytest.raises(ValueError, match=message):
        verify_paths(arguments["target_logits"], arguments["draft_logits"], arguments["draft_tokens"])
