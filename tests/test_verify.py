"""Properties of `flashspec.verify` (Hypothesis) and its input validation."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flashspec as fs
from flashspec import rng
from flashspec.sampling import sample_from_logits, warp_logits

PARAMS = st.sampled_from(
    [
        fs.SamplingParams(1.0),
        fs.SamplingParams(0.6),
        fs.SamplingParams(1.7, top_k=3),
        fs.SamplingParams(0.9, top_p=0.7),
        fs.SamplingParams(1.2, top_k=4, top_p=0.85),
    ]
)


def make_inputs(batch: int, gamma: int, vocab: int, seed: int, params: fs.SamplingParams, deterministic: bool = False):
    generator = torch.Generator().manual_seed(seed)
    target = 2.0 * torch.randn(batch, gamma + 1, vocab, generator=generator)
    draft = 2.0 * torch.randn(batch, gamma, vocab, generator=generator)
    key = rng.Key.from_seed(seed + 1000)
    tokens = torch.stack(
        [sample_from_logits(draft[:, i], params, key, position=i)[0] for i in range(gamma)], dim=1
    )
    return target, (None if deterministic else draft), tokens


CASES = dict(
    batch=st.integers(1, 6),
    gamma=st.integers(1, 6),
    vocab=st.integers(2, 40),
    seed=st.integers(0, 10_000),
    params=PARAMS,
    deterministic=st.booleans(),
)


@settings(max_examples=60, deadline=None)
@given(**CASES)
def test_output_shape_and_layout(batch, gamma, vocab, seed, params, deterministic):
    target, draft, tokens = make_inputs(batch, gamma, vocab, seed, params, deterministic)
    out = fs.verify(target, draft, tokens, params, generator=seed)
    assert out.tokens.shape == (batch, gamma + 1) and out.tokens.dtype == torch.long
    assert out.num_accepted.shape == (batch,) and out.num_accepted.dtype == torch.long
    assert bool(((out.num_accepted >= 0) & (out.num_accepted <= gamma)).all())
    for row in range(batch):
        n = int(out.num_accepted[row])
        assert torch.equal(out.tokens[row, :n], tokens[row, :n].long()), "accepted prefix must be the drafts"
        assert 0 <= int(out.tokens[row, n]) < vocab, "the emitted token must be a real id"
        assert bool((out.tokens[row, n + 1 :] == -1).all()), "nothing after the emitted token"


@settings(max_examples=40, deadline=None)
@given(**CASES)
def test_same_seed_same_output(batch, gamma, vocab, seed, params, deterministic):
    target, draft, tokens = make_inputs(batch, gamma, vocab, seed, params, deterministic)
    first = fs.verify(target, draft, tokens, params, generator=seed)
    second = fs.verify(target, draft, tokens, params, generator=seed)
    assert torch.equal(first.tokens, second.tokens)
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    assert torch.equal(
        fs.verify(target, draft, tokens, params, generator=g1).tokens,
        fs.verify(target, draft, tokens, params, generator=g2).tokens,
    )


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 6), gamma=st.integers(1, 6), vocab=st.integers(2, 40), seed=st.integers(0, 10_000),
       params=PARAMS)
def test_draft_log_probs_give_the_same_tokens_as_its_logits(batch, gamma, vocab, seed, params):
    """The draft's warped log-probs in place of its logits (`draft_is_log_probs`) are the very q the logits
    give, so every token is the same, for every sampling parameter (top-k / top-p warped once, by the draft)."""
    target, draft, tokens = make_inputs(batch, gamma, vocab, seed, params)
    log_q = torch.stack([sample_from_logits(draft[:, i], params, rng.Key.from_seed(0))[1] for i in range(gamma)], 1)
    from_logits = fs.verify(target, draft, tokens, params, generator=seed)
    from_log_probs = fs.verify(target, log_q, tokens, params, generator=seed, draft_is_log_probs=True)
    assert torch.equal(from_logits.tokens, from_log_probs.tokens)
    assert torch.equal(from_logits.num_accepted, from_log_probs.num_accepted)


def test_draft_log_probs_must_be_given_and_normalised():
    target, draft, tokens = good()
    with pytest.raises(ValueError, match=r"draft_is_log_probs=True needs draft_logits"):
        fs.verify(target, None, tokens, draft_is_log_probs=True)
    with pytest.raises(ValueError, match=r"draft_logits row \(0, 0\) is not a row of log-probabilities.*"
                                         r"draft_is_log_probs=False"):
        fs.verify(target, draft, tokens, draft_is_log_probs=True)  # logits, not log-probs
    log_q = torch.log_softmax(draft, dim=-1)
    log_q[1, 1] -= 0.01
    with pytest.raises(ValueError, match=r"row \(1, 1\)"):
        fs.verify(target, log_q, tokens, draft_is_log_probs=True)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 6), gamma=st.integers(1, 6), vocab=st.integers(2, 40), seed=st.integers(0, 10_000))
def test_greedy_is_the_argmax_chain(batch, gamma, vocab, seed):
    params = fs.SamplingParams(0.0)
    generator = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, gamma + 1, vocab, generator=generator)
    argmax = target.argmax(-1)
    # draft agrees with the target's argmax for a random number of leading positions
    agree = torch.randint(0, gamma + 1, (batch,), generator=generator)
    tokens = argmax[:, :gamma].clone()
    for row in range(batch):
        if agree[row] < gamma:
            tokens[row, agree[row]] = (argmax[row, agree[row]] + 1) % vocab
    out = fs.verify(target, torch.randn(batch, gamma, vocab), tokens, params, generator=seed, validate=False)
    for row in range(batch):
        n = int(agree[row])
        assert int(out.num_accepted[row]) == n
        assert torch.equal(out.tokens[row, : n + 1], argmax[row, : n + 1])


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 6), gamma=st.integers(1, 6), vocab=st.integers(2, 40), seed=st.integers(0, 10_000), params=PARAMS)
def test_draft_equal_to_target_accepts_everything(batch, gamma, vocab, seed, params):
    generator = torch.Generator().manual_seed(seed)
    target = torch.randn(batch, gamma + 1, vocab, generator=generator)
    key = rng.Key.from_seed(seed)
    tokens = torch.stack([sample_from_logits(target[:, i], params, key, position=i)[0] for i in range(gamma)], 1)
    out = fs.verify(target, target[:, :gamma], tokens, params, generator=seed)
    assert bool((out.num_accepted == gamma).all())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_match_their_fp32_upcast(dtype):
    params = fs.SamplingParams(0.8)
    target, draft, tokens = make_inputs(4, 3, 50, 7, params)
    low_t, low_d = target.to(dtype), draft.to(dtype)
    out = fs.verify(low_t, low_d, tokens, params, generator=5)
    ref = fs.verify(low_t.float(), low_d.float(), tokens, params, generator=5)
    assert torch.equal(out.tokens, ref.tokens)


def test_rows_are_independent_of_batch_composition():
    """Row r's output depends on row r's inputs, the key and r only."""
    params = fs.SamplingParams(1.0)
    target, draft, tokens = make_inputs(6, 4, 30, 3, params)
    full = fs.verify(target, draft, tokens, params, generator=11)
    changed_target = target.clone()
    changed_target[3:] = torch.randn_like(changed_target[3:])
    partial = fs.verify(changed_target, draft, tokens, params, generator=11, validate=False)
    assert torch.equal(full.tokens[:3], partial.tokens[:3])


def test_uniforms_are_never_zero_or_one_and_look_uniform():
    u = rng.uniforms(rng.Key.from_seed(123), rng.STREAM_SAMPLE, 4, 3, 50_000)
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    other = rng.uniforms(rng.Key.from_seed(123), rng.STREAM_ACCEPT, 4, 3, 50_000)
    assert abs(float(torch.corrcoef(torch.stack([u.flatten(), other.flatten()]))[0, 1])) < 0.01


# --- bad input ---------------------------------------------------------------------------------


def good():
    target = torch.randn(2, 4, 10)
    draft = torch.randn(2, 3, 10)
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    return target, draft, tokens


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda t, d, x: (t[:, :3], d, x), "target_logits"),
        (lambda t, d, x: (t[0], d, x), "target_logits"),
        (lambda t, d, x: (t, d[:, :, :9], x), "vocabulary"),
        (lambda t, d, x: (t, d[:1], x), "draft_logits"),
        (lambda t, d, x: (t[:, :1], d[:, :0], x[:, :0]), "gamma >= 1"),
        (lambda t, d, x: (t, d, x.float()), "draft_tokens"),
        (lambda t, d, x: (t, d, x + 10), r"draft_tokens must lie in \[0, V\)"),
        (lambda t, d, x: (t, d, x - 2), r"draft_tokens must lie in \[0, V\)"),
        (lambda t, d, x: (t.long(), d, x), "target_logits must be a float"),
        (lambda t, d, x: (t.index_fill(2, torch.arange(10), float("nan")), d, x), "target_logits contains NaN"),
        (lambda t, d, x: (t.index_fill(2, torch.arange(10), float("-inf")), d, x), "-inf everywhere"),
        (lambda t, d, x: (t, d.index_fill(2, torch.arange(10), float("nan")), x), "draft_logits contains NaN"),
        (lambda t, d, x: (t, d.index_fill(2, torch.tensor([3]), float("inf")), x), r"\+inf"),
    ],
)
def test_bad_input_raises_value_error_naming_the_argument(mutate, match):
    target, draft, tokens = mutate(*good())
    with pytest.raises(ValueError, match=match):
        fs.verify(target, draft, tokens, fs.SamplingParams(1.0), generator=0)


def test_draft_token_outside_the_draft_support_is_rejected_with_a_fix():
    target, draft, tokens = good()
    draft[0, 0, tokens[0, 0]] = float("-inf")
    with pytest.raises(ValueError, match="zero probability under the warped draft_logits"):
        fs.verify(target, draft, tokens, fs.SamplingParams(1.0), generator=0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
    ],
)
def test_bad_sampling_params(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fs.SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(backend="cuda"), "backend"),
        (dict(generator=-1), "generator"),
        (dict(generator="seed"), "generator"),
        (dict(params=0.7), "params"),
        (dict(residual="resample"), "residual"),
        (dict(method="tree"), "method"),
        (dict(method="block", residual="rejection"), "residual='rejection' applies to method='token' only"),
    ],
)
def test_bad_call_arguments(kwargs, match):
    target, draft, tokens = good()
    with pytest.raises(ValueError, match=match):
        fs.verify(target, draft, tokens, **kwargs)


def test_bad_input_writes_nothing():
    target, draft, tokens = good()
    before = (target.clone(), draft.clone(), tokens.clone())
    with pytest.raises(ValueError):
        fs.verify(target, draft, tokens + 100, generator=0)
    assert all(torch.equal(a, b) for a, b in zip(before, (target, draft, tokens)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: host syncs only exist there")
@pytest.mark.parametrize("residual", ["race", "rejection", "block"], ids=["fs.verify", "residual=rejection",
                                                                          "method=block"])
@pytest.mark.parametrize("params", [fs.SamplingParams(1.0), fs.SamplingParams(0.0), fs.SamplingParams(0.7, top_p=0.9)])
@pytest.mark.parametrize("log_probs", [False, True], ids=["draft logits", "draft log-probs"])
def test_triton_verify_makes_no_host_sync(params, residual, log_probs):
    """Zero host syncs inside verify (its default plan and the one launch of the residual by rejection; the lab's
    structures: lab/tests/test_lab_kernels.py's captured steps), given the draft's logits or its log-probs; torch
    raises on any synchronising call."""
    target, draft, tokens = make_inputs(8, 4, 32000, 1, fs.SamplingParams(1.0))
    if log_probs:
        draft = torch.log_softmax(draft, dim=-1)
    target, draft, tokens = target.cuda(), draft.cuda(), tokens.cuda()

    def call(seed: int) -> torch.Tensor:
        method = "block" if residual == "block" else "token"
        return fs.verify(target, draft, tokens, params, generator=seed, backend="triton", validate=False,
                         draft_is_log_probs=log_probs, residual="race" if method == "block" else residual,
                         method=method).tokens

    call(0)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = call(1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.is_cuda


# --- the two-level race (`sampling.block_race`) ------------------------------------------------


def _three_block_weights(vocab: int = 700) -> torch.Tensor:
    """Unnormalised weights over three blocks of SAMPLE_BLOCK tokens: a few large weights in the first two, many
    small ones filling the third (a block whose sum, not its largest weight, makes it likely), zeros elsewhere."""
    weights = torch.zeros(vocab)
    weights[[3, 250, 255, 256, 300, 511]] = torch.tensor([0.20, 0.05, 0.10, 0.15, 0.02, 0.08])
    weights[512:vocab] = 0.40 / (vocab - 512)
    return 0.37 * weights


def _draw(race, weights: torch.Tensor, rows: int, seed: int) -> torch.Tensor:
    base = rng.base_hash(rng.Key.from_seed(seed), rng.STREAM_SAMPLE, torch.arange(rows).view(rows, 1),
                         torch.zeros(rows, 1, dtype=torch.long))
    many = weights.expand(rows, -1)
    return race(many, many.log(), base)


def _chi_square_p(tokens: torch.Tensor, weights: torch.Tensor) -> float:
    from scipy.stats import chisquare

    support = weights > 0
    assert bool(support[tokens].all()), "a token of zero weight was drawn"
    counts = torch.bincount(tokens, minlength=weights.numel())[support].double()
    expected = weights[support].double() / weights[support].double().sum() * tokens.numel()
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


def test_block_race_samples_the_normalised_weights():
    """30,000 independent rows (one base hash each) over 700 tokens in three blocks: the tokens' counts fit
    normalise(w) (χ² over the 194 tokens of the support, each expected 64 times or more)."""
    from flashspec.sampling import SAMPLE_BLOCK, block_race

    weights = _three_block_weights()
    assert weights.numel() > 2 * SAMPLE_BLOCK
    tokens, has_mass = _draw(block_race, weights, 30_000, seed=5)
    assert bool(has_mass.all())
    assert _chi_square_p(tokens, weights) > 1e-3


def test_block_race_control_weighing_blocks_by_their_largest_weight_fails():
    """The same χ² test must catch a block race that weighs each block by its largest weight instead of its sum
    (the third block, 188 small weights, then almost never wins)."""
    from flashspec import sampling

    def by_largest(weights, log_weights, base):
        """block_race on weights rescaled so that each block sums to its largest weight (each block's own
        proportions kept): the race between blocks then weighs their largest weights."""
        rows, vocab = weights.shape
        blocks = -(-vocab // sampling.SAMPLE_BLOCK)
        padded = torch.nn.functional.pad(weights, (0, blocks * sampling.SAMPLE_BLOCK - vocab))
        padded = padded.view(rows, blocks, sampling.SAMPLE_BLOCK)
        rescaled = padded / padded.sum(-1, keepdim=True).clamp(min=1e-30) * padded.amax(-1, keepdim=True)
        rescaled = rescaled.reshape(rows, -1)[:, :vocab]
        return sampling.block_race(rescaled, rescaled.log(), base)

    weights = _three_block_weights()
    tokens, _ = _draw(by_largest, weights, 30_000, seed=5)
    assert _chi_square_p(tokens, weights) < 1e-6


def test_block_race_of_one_block_is_the_gumbel_argmax():
    """A row of at most SAMPLE_BLOCK tokens is one block: the race is `gumbel_argmax` over the row itself."""
    from flashspec.sampling import SAMPLE_BLOCK, block_race, gumbel_argmax

    weights = torch.rand(64, SAMPLE_BLOCK, generator=torch.Generator().manual_seed(2))
    base = rng.base_hash(rng.Key.from_seed(9), rng.STREAM_SAMPLE, torch.arange(64).view(64, 1),
                         torch.zeros(64, 1, dtype=torch.long))
    noise = rng.uniform_from_base(base, torch.arange(SAMPLE_BLOCK).view(1, -1))
    tokens, has_mass = block_race(weights, weights.log(), base)
    assert torch.equal(tokens, gumbel_argmax(weights.log(), noise)) and bool(has_mass.all())
    zero = torch.zeros(2, 700)
    assert not bool(block_race(zero, zero.log(), base[:2])[1].any())


# --- the residual by rejection from p (`sampling.residual_by_rejection`) -----------------------------------


def _residual_pair(mass: float, vocab: int = 700) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, q) over three blocks of SAMPLE_BLOCK tokens whose residual max(0, p - q) has total mass `mass`, spread
    over eight tokens in all three blocks (and none elsewhere: q >= p on the rest), not in p's proportions: the
    tokens give up alternately a large and a small fraction of their p."""
    p = _three_block_weights(vocab)
    p = p / p.sum()
    lifted = torch.tensor([3, 250, 255, 256, 300, 511, 520, 699])
    fractions = torch.tensor([0.9, 0.2] * 4)
    share = fractions * p[lifted] * mass / float((fractions * p[lifted]).sum())
    assert bool((share < p[lifted]).all()), "mass too large for these fractions"
    q = p.clone()
    q[lifted] -= share
    rest = torch.ones(vocab, dtype=torch.bool)
    rest[lifted] = False
    q[rest] += share.sum() * p[rest] / p[rest].sum()  # the mass moved onto the other tokens, in p's proportions
    return p, q


def _draw_residual(sampler, p: torch.Tensor, q: torch.Tensor, rows: int, proposals: int, seed: int) -> torch.Tensor:
    """`rows` independent draws (one row of hashes each) of `sampler(log_p, log_q, bases, fallback_base)`."""
    row = torch.arange(rows).view(rows, 1)
    key = rng.Key.from_seed(seed)
    bases = rng.base_hash(key, rng.STREAM_SAMPLE, row, torch.arange(proposals).view(1, proposals))
    fallback = rng.base_hash(key, rng.STREAM_SAMPLE, row, torch.full((rows, 1), proposals))
    return sampler(p.log().expand(rows, -1), q.log().expand(rows, -1), bases, fallback)


@pytest.mark.parametrize("mass, proposals", [(0.3, 4), (0.06, 4), (0.2, 1)])
def test_residual_by_rejection_samples_the_residual(mass, proposals):
    """12,000 rows: the tokens fit normalise(max(0, p - q)) (χ² over its support), whether the proposals mostly
    succeed (residual mass 0.3 and four proposals: the fallback draws 24% of rows) or the fallback draws most
    rows (mass 0.06: (1 - 0.06)^4 = 78%; mass 0.2 and one proposal: 80%)."""
    from flashspec.sampling import residual_by_rejection

    p, q = _residual_pair(mass)
    residual = (p - q).clamp(min=0)
    assert abs(float(residual.sum()) - mass) < 1e-4
    tokens = _draw_residual(residual_by_rejection, p, q, 12_000, proposals, seed=7)
    assert _chi_square_p(tokens, residual) > 1e-3


def test_residual_by_rejection_controls_fail():
    """The same χ² test must catch a sampler that keeps its first proposal from p without the accept test (it
    draws tokens the residual never gives), and one that draws from p restricted to the residual's support (the
    right tokens in p's proportions instead of max(0, p - q)'s)."""
    from flashspec import sampling

    def untested(log_p, log_q, bases, fallback_base):
        return sampling.block_race(log_p.exp(), log_p, bases[:, :1])[0]

    def p_on_the_support(log_p, log_q, bases, fallback_base):
        restricted = torch.where(log_q < log_p, log_p.exp(), torch.zeros_like(log_p))
        return sampling.block_race(restricted, restricted.log(), fallback_base)[0]

    p, q = _residual_pair(0.3)
    residual = (p - q).clamp(min=0)
    tokens = _draw_residual(untested, p, q, 12_000, 4, seed=7)
    assert bool((residual[tokens] == 0).any())
    tokens = _draw_residual(p_on_the_support, p, q, 12_000, 4, seed=7)
    assert bool((residual[tokens] > 0).all()) and _chi_square_p(tokens, residual) < 1e-6


# --- verify with residual="rejection": the residual drawn by rejection from p ----------------------------------


@pytest.mark.parametrize("params", [fs.SamplingParams(1.0), fs.SamplingParams(0.7), fs.SamplingParams(0.0),
                                    fs.SamplingParams(0.9, top_k=40, top_p=0.9)], ids=str)
@pytest.mark.parametrize("deterministic", [False, True])
def test_rejection_changes_only_the_residual_draws(params, deterministic):
    """residual="rejection" and "race" run the same accept test and draw the same bonus token (the same hash):
    only rows that rejected may differ, and across 64 rows some do (another random stream, not the same sampler
    under another name). Greedy has no residual: identical."""
    target, draft, tokens = make_inputs(64, 4, 700, 3, params, deterministic=deterministic)
    race = fs.verify(target, draft, tokens, params, generator=9)
    rejection = fs.verify(target, draft, tokens, params, generator=9, residual="rejection")
    assert torch.equal(race.num_accepted, rejection.num_accepted)
    bonus = race.num_accepted == 4
    assert torch.equal(race.tokens[bonus], rejection.tokens[bonus])
    differs = (race.tokens != rejection.tokens).any(dim=1)
    assert bool(differs[~bonus].any()) != params.greedy
    assert not bool(differs[bonus].any())


def test_rejection_fallbacks_count_the_rows_that_race_the_residual():
    """`rejection_fallbacks`: a draft close to the target (small residuals) sends most rejected rows to the
    fallback race; a distant one almost none; greedy never; and a fallback row's token is the race's (the same
    hash at the same position: the fallback is the race)."""
    from flashspec.verify import rejection_fallbacks

    params = fs.SamplingParams(1.0)
    generator = torch.Generator().manual_seed(4)
    target = 2.0 * torch.randn(256, 4, 700, generator=generator)
    near = target[:, :3] + 0.05 * torch.randn(256, 3, 700, generator=generator)
    far = target[:, :3] + 2.0 * torch.randn(256, 3, 700, generator=generator)
    key = rng.Key.from_seed(2)
    counts = {}
    for name, draft in (("near", near), ("far", far)):
        tokens = torch.multinomial(warp_logits(draft, params).exp().reshape(-1, 700), 1,
                                   generator=generator).view(256, 3)
        counts[name] = rejection_fallbacks(target, draft, tokens, params, key)
        assert counts[name]["rows"] == 256 and 0 <= counts[name]["fallback"] <= counts[name]["rejected"]
    assert counts["near"]["fallback"] > counts["near"]["rejected"] / 2 > 0
    assert counts["far"]["fallback"] < counts["far"]["rejected"] / 10
    assert rejection_fallbacks(target, near, tokens, fs.SamplingParams(0.0), key)["fallback"] == 0


# --- block verification (`method="block"`) ----------------------------------------------------------------------


def _chain_expectations(p: torch.Tensor, q: torch.Tensor) -> tuple[float, float]:
    """Exact E[accepted drafts] of token and block verification for position-wise distributions p [γ+1, V] and
    q [γ, V] (drafts drawn independently from each q_j), by enumerating every chain: token verification keeps
    prefix x^i with probability prod_j min(p_j, q_j)(x_j), block verification with m_i = min(m_{i-1} p_i(x_i),
    q(x^i)) (the book's proof: P(τ >= i, X^i = x^i) = q(x^i) w_i)."""
    import itertools

    gamma, vocab = q.shape
    token = block = 0.0
    for length in range(1, gamma + 1):
        for chain in itertools.product(range(vocab), repeat=length):
            kept_token, kept_block, drafted = 1.0, 1.0, 1.0
            for j, x in enumerate(chain):
                drafted *= float(q[j, x])
                kept_token *= min(float(p[j, x]), float(q[j, x]))
                kept_block = min(kept_block * float(p[j, x]), drafted)
            token, block = token + kept_token, block + kept_block
    return token, block


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_block_verification_accepts_its_exact_expectation_and_never_fewer_than_token(backend):
    """60,000 rows of one (p, q) chain (γ = 3, V = 4): the mean τ of each method matches its exact expectation
    within 4 standard errors, and block's expectation is above token's (here by 0.12 tokens)."""
    if backend == "triton":
        pytest.importorskip("triton")
    generator = torch.Generator().manual_seed(4)
    gamma, vocab, rows = 3, 4, 60_000
    target, draft = 1.5 * torch.randn(gamma + 1, vocab, generator=generator), torch.randn(gamma, vocab,
                                                                                         generator=generator)
    p, q = torch.softmax(target.double(), -1), torch.softmax(draft.double(), -1)
    tokens = torch.stack([torch.multinomial(q[j].float(), rows, True, generator=generator) for j in range(gamma)], 1)
    exact = dict(zip(("token", "block"), _chain_expectations(p, q)))
    assert exact["block"] > exact["token"] + 0.1
    for method in ("token", "block"):
        out = fs.verify(target.expand(rows, -1, -1).contiguous(), draft.expand(rows, -1, -1).contiguous(), tokens,
                        generator=11, backend=backend, method=method)
        accepted = out.num_accepted.double()
        error = float(accepted.std()) / rows ** 0.5
        assert abs(float(accepted.mean()) - exact[method]) < 4 * error, (method, float(accepted.mean()), exact)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(batch=st.integers(1, 5), gamma=st.integers(1, 6), vocab=st.integers(2, 40), seed=st.integers(0, 10_000),
       temperature=st.sampled_from([0.0, 0.6, 1.0, 1.5]), deterministic=st.booleans())
def test_block_verification_keeps_the_layout_and_agrees_with_token_where_it_must(batch, gamma, vocab, seed,
                                                                                 temperature, deterministic):
    """Block verification's output has the verify layout; greedy, it is token verification's; a draft equal to the
    target keeps every draft under both."""
    params = fs.SamplingParams(temperature)
    target, draft, tokens = make_inputs(batch, gamma, vocab, seed, params)
    draft = None if deterministic else draft
    block = fs.verify(target, draft, tokens, params, generator=seed, method="block")
    positions = torch.arange(gamma + 1).view(1, -1)
    n = block.num_accepted.view(-1, 1)
    assert bool(((block.num_accepted >= 0) & (block.num_accepted <= gamma)).all())
    kept = positions[:, :gamma] < n
    assert torch.equal(block.tokens[:, :gamma][kept], tokens[kept])
    assert bool((block.tokens[positions > n] == -1).all()) and bool((block.tokens.gather(1, n) >= 0).all())
    if params.greedy:
        token = fs.verify(target, draft, tokens, params, generator=seed)
        assert torch.equal(block.tokens, token.tokens)
    same = fs.verify(target, target[:, :gamma], warp_logits(target[:, :gamma], params).argmax(-1) if params.greedy
                     else tokens_from(target[:, :gamma], params, seed), params, generator=seed, method="block")
    assert bool((same.num_accepted == gamma).all())


def tokens_from(logits: torch.Tensor, params: fs.SamplingParams, seed: int) -> torch.Tensor:
    """Tokens drawn from the warped `logits` [B, γ, V]."""
    generator = torch.Generator().manual_seed(seed)
    probs = warp_logits(logits, params).exp()
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).view(probs.shape[:2])
