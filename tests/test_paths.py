"""Multi-path verification (`flashspec.paths`): the joint law of the first L = 3 tokens against exact enumeration
when every draft's chains are verified together, and the negative controls that must fail the same test.

The χ² family here has its own Bonferroni level: 0.01 over its tests."""
from __future__ import annotations

import functools

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
NUM_TESTS = (3 * len(CASES) + len(xp.PATHS_NEGATIVE_CONTROLS) * len(CONTROL_CASES)
             + len(xp.BACKEND_CONTROLS) * len(CONTROL_CASES))
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
def test_joint_law_is_the_targets_triton(case):
    pytest.importorskip("triton")
    result = fit(case, xp.library_paths_verifier("triton"), seed=11)
    assert result.passes(ALPHA_EACH), f"{case[0]} (triton): {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize("bug,case_name", [(bug, name) for bug in xp.BACKEND_CONTROLS for name in CONTROL_CASES])
def test_negative_control_fails_triton(bug, case_name):
    pytest.importorskip("triton")
    case = next(case for case in CASES if case[0] == case_name)
    control = xp.on_triton_device(functools.partial(xp.PATHS_NEGATIVE_CONTROLS[bug], backend="triton"))
    result = fit(case, control, seed=13)
    assert not result.passes(ALPHA_EACH), f"the harness let '{bug}' (triton) through on {case_name}: {result}"


# (batch, paths, gamma, vocab, sampling, deterministic): one-block and two-level races, greedy, truncation
SHAPES = [(512, 3, 3, 16, fs.SamplingParams(1.0), False), (96, 2, 4, 700, fs.SamplingParams(0.8, top_k=50), False),
          (128, 3, 2, 16, fs.SamplingParams(0.0), False), (128, 3, 3, 300, fs.SamplingParams(1.0, top_p=0.9), True)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda shape: f"B{shape[0]}-K{shape[1]}-g{shape[2]}-V{shape[3]}")
def test_triton_backend_draws_what_the_reference_draws(shape):
    """One key, both backends: the same tokens, counts and kept paths, row for row (shared prefixes included)."""
    pytest.importorskip("triton")
    batch, paths, gamma, vocab, params, deterministic = shape
    generator = torch.Generator().manual_seed(5)
    target = 2 * torch.randn(batch, paths, gamma + 1, vocab, generator=generator)
    draft = None if deterministic else 2 * torch.randn(batch, paths, gamma, vocab, generator=generator)
    if draft is None:
        tokens = torch.randint(0, vocab, (batch, paths, gamma), generator=generator)
    else:  # drafted from the warped drafts, as a truncating sampler needs
        weights = fs.sampling.warp_logits(draft, params).exp().view(-1, vocab)
        tokens = torch.multinomial(weights, 1, generator=generator).view(batch, paths, gamma)
    half = batch // 2  # the first half's paths 0 and 1 share two tokens, so their target rows agree there too
    tokens[:half, 1, :2] = tokens[:half, 0, :2]
    target[:half, 1, :3] = target[:half, 0, :3]
    if draft is not None:
        draft[:half, 1, :2] = draft[:half, 0, :2]
    torch_out = verify_paths(target, draft, tokens, params, generator=9, backend="torch")
    triton_out = xp.library_paths_verifier("triton")(target, draft, tokens, params, 9)  # on the GPU where there is one
    assert torch.equal(torch_out.tokens, triton_out.tokens)
    assert torch.equal(torch_out.num_accepted, triton_out.num_accepted)
    assert torch.equal(torch_out.path, triton_out.path)


def test_a_device_key_draws_what_its_host_key_draws():
    """`verify_paths_triton` with the key in device memory (lo, hi; the kernel reads its stream prefixes at
    launch, as the fast path's captured step does) returns what the same key passed as host ints returns."""
    pytest.importorskip("triton")
    from flashspec import rng
    from flashspec.kernels.paths import verify_paths_triton
    from flashspec.paths import paths_inputs

    generator = torch.Generator().manual_seed(8)
    batch, paths, gamma, vocab = 64, 3, 3, 40
    target = 2 * torch.randn(batch, paths, gamma + 1, vocab, generator=generator)
    draft = 2 * torch.randn(batch, paths, gamma, vocab, generator=generator)
    params = fs.SamplingParams(1.0)
    weights = fs.sampling.warp_logits(draft, params).exp().view(-1, vocab)
    tokens = torch.multinomial(weights, 1, generator=generator).view(batch, paths, gamma)
    log_p, q = paths_inputs(target, draft, tokens, params)
    key = rng.Key.from_seed(0x1234_5678_9ABC)
    on_host = verify_paths_triton(log_p, q, tokens, key)
    on_device = verify_paths_triton(log_p, q, tokens, torch.tensor([key.lo, key.hi]))
    other = verify_paths_triton(log_p, q, tokens, torch.tensor([key.lo + 1, key.hi]))
    assert all(torch.equal(a, b) for a, b in zip(on_host, on_device))
    assert not torch.equal(on_host[0], other[0])  # the key is read: another key draws other tokens


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
