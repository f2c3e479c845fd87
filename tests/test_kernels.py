"""The Triton backend: its hash is flashspec.rng's bit for bit, and `verify(backend="triton")`
returns exactly what the PyTorch reference returns for the same seed.

On a machine without a GPU these run through the Triton interpreter (conftest sets
TRITON_INTERPRET=1); the same file runs compiled on a GPU. "Exactly" holds up to ties in
floating-point rounding: the kernels compute log-sum-exp in a different order than torch, so a
decision that sits within ~1e-7 of its threshold could in principle flip -- with random
inputs that has probability ~1e-6 per decision, and none of the fixed seeds below hits one.
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flashspec as fs
from flashspec import rng
from flashspec.sampling import SAMPLE_BLOCK, SamplingParams, warp_logits

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from flashspec.kernels import make_plan, verify_triton  # noqa: E402
from flashspec.kernels import rng as krng  # noqa: E402
from flashspec.kernels.shims import CLUSTERS_AVAILABLE  # noqa: E402

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
# compiled, the cluster plan needs SM90+ and Triton >= 3.9; elsewhere its tests run the plan it falls back to
CLUSTERS_ON_DEVICE = ON_GPU and CLUSTERS_AVAILABLE and torch.cuda.get_device_capability()[0] >= 9
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (compiled Triton)")
BF16_REASON = "the Triton interpreter computes bf16 wrong (it upcasts); bf16 is checked on a GPU only"


# ----------------------------------------------------------------------------- the hash
@triton.jit
def _uniforms_kernel(row_ptr, position_ptr, index_ptr, out_ptr, prefix, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    row = tl.load(row_ptr + offsets, mask=mask, other=0)
    position = tl.load(position_ptr + offsets, mask=mask, other=0)
    index = tl.load(index_ptr + offsets, mask=mask, other=0)
    base = krng.base_hash(prefix, row, position)
    tl.store(out_ptr + offsets, krng.uniform_from_base(base, index), mask=mask)


@pytest.mark.parametrize("seed", [0, 1, 2**31 - 1, 2**31, 2**32 + 7, 2**62 - 1, 0x0123456789ABCDEF])
@pytest.mark.parametrize("stream", [rng.STREAM_ACCEPT, rng.STREAM_SAMPLE, rng.STREAM_DRAFT])
def test_triton_hash_is_bit_identical_to_torch(seed: int, stream: int) -> None:
    key = rng.Key.from_seed(seed)
    generator = torch.Generator().manual_seed(seed % 1000 + stream)
    count = 3000
    row = torch.randint(0, 2**40, (count,), generator=generator)  # values past 2**32 are taken mod 2**32
    position = torch.randint(0, 2**32, (count,), generator=generator)
    index = torch.randint(0, 2**33, (count,), generator=generator)
    row[:64] = torch.arange(64)  # the small counters verify actually uses
    position[:64] = torch.arange(64) % 8
    index[:64] = torch.arange(64)
    index[-4:] = torch.tensor([2**31 - 1, 2**31, 2**32 - 1, 2**32])
    out = torch.empty(count, dtype=torch.float32, device=DEVICE)
    block = 1024
    _uniforms_kernel[(triton.cdiv(count, block),)](
        row.to(DEVICE), position.to(DEVICE), index.to(DEVICE), out,
        krng.as_int32(krng.stream_prefix(key, stream)), count, BLOCK=block,
    )
    expected = rng.uniform_from_base(rng.base_hash(key, stream, row, position), index)
    assert torch.equal(out.cpu().view(torch.int32), expected.view(torch.int32))
    assert bool(((out > 0) & (out < 1)).all())


# ----------------------------------------------------------------------------- verify vs reference
def make_case(batch: int, gamma: int, vocab: int, params: SamplingParams, with_draft: bool,
              dtype: torch.dtype, seed: int, device: torch.device = DEVICE):
    """Target logits, draft logits near the target (so acceptance varies), drafted tokens
    sampled from the draft's warped distribution, with some replaced by arbitrary ids
    where that keeps the input valid."""
    generator = torch.Generator().manual_seed(seed)
    target = 2.0 * torch.randn(batch, gamma + 1, vocab, generator=generator)
    draft = target[:, :gamma] + torch.randn(batch, gamma, vocab, generator=generator)
    target, draft = target.to(dtype), draft.to(dtype)
    source = draft if with_draft else target[:, :gamma]
    probs = warp_logits(source, params).exp().reshape(-1, vocab)
    tokens = torch.multinomial(probs, 1, generator=generator).view(batch, gamma)
    if params.greedy or not with_draft:  # any id is a valid proposal here
        arbitrary = torch.randint(0, vocab, (batch, gamma), generator=generator)
        swap = torch.rand(batch, gamma, generator=generator) < 0.3
        tokens = torch.where(swap, arbitrary, tokens)
    return target.to(device), (draft.to(device) if with_draft else None), tokens.to(device)


def assert_backends_agree(target, draft, tokens, params, seed, draft_is_log_probs=False, validate=None,
                          **plan) -> fs.VerifyOutput:
    expected = fs.verify(target, draft, tokens, params, generator=seed, backend="torch",
                         draft_is_log_probs=draft_is_log_probs, validate=validate,
                         residual=plan.get("residual", "race"))
    if plan:
        got_tokens, got_accepted = verify_triton(target, draft, tokens, params, rng.key_from_generator(seed),
                                                 draft_is_log_probs=draft_is_log_probs, **plan)
    else:
        got = fs.verify(target, draft, tokens, params, generator=seed, backend="triton",
                        draft_is_log_probs=draft_is_log_probs, validate=validate)
        got_tokens, got_accepted = got.tokens, got.num_accepted
    assert got_tokens.dtype == torch.int64 and got_accepted.dtype == torch.int64
    assert torch.equal(got_accepted.cpu(), expected.num_accepted.cpu()), (got_accepted, expected.num_accepted)
    assert torch.equal(got_tokens.cpu(), expected.tokens.cpu()), (got_tokens, expected.tokens)
    return expected


TRUNCATIONS = [(0, 1.0), (3, 1.0), (0, 0.8), (4, 0.9)]


@settings(max_examples=20 if ON_GPU else 40, deadline=None, derandomize=True)  # GPU: each new shape compiles
@given(
    batch=st.sampled_from([1, 3, 8]),
    gamma=st.sampled_from([1, 2, 4, 7]),
    vocab=st.sampled_from([7, 16, 50]),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    truncation=st.sampled_from(TRUNCATIONS),
    with_draft=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**40),
    fused=st.sampled_from([None, True]),
)
def test_triton_equals_torch_reference(batch, gamma, vocab, temperature, truncation, with_draft, dtype, seed, fused):
    params = SamplingParams(temperature, *truncation)
    target, draft, tokens = make_case(batch, gamma, vocab, params, with_draft, dtype, seed % 10_000)
    assert_backends_agree(target, draft, tokens, params, seed, **({"fused": True} if fused else {}))


# the launch plans every kernel test runs (the cooperative and the cluster one at T > 0; greedy, their plan is the
# two launches; interpreted, the cluster plan's program runs as one block)
PLANS = {"default": {}, "fused": {"fused": True}, "coop": {"tuning": (("coop", 1),)},
         "cluster": {"tuning": (("cluster", 1),)},
         # the one launch that draws the residual by rejection from p (its own reference: residual="rejection")
         "one_pass": {"residual": "rejection"}}
# and, where programs loop over several tiles or the accept test's place matters, the race that keeps per-lane
# winners (GPU_PLAN["lanes"]) and the accept test run once per row block by the stats launch ("accept_once")
TILED_PLANS = {**PLANS, "lanes": {"tuning": (("lanes", 1),)},
               "accept_once": {"tuning": (("accept_once", 1), ("lanes", 1))},
               # the stats pass reducing each tile across the program instead of per-lane partials (GPU_PLAN's
               # stats_lane_elems, which every other plan here runs)
               "stats_lanes_off": {"tuning": (("stats_lane_elems", 0),)}}
if ON_GPU:  # the sampling launch as a programmatic dependent launch: GPU-only (the interpreter has no grid control)
    TILED_PLANS["accept_once_pdl"] = {"tuning": (("accept_once", 1), ("lanes", 1), ("pdl", 1))}


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0, 1.7])
@pytest.mark.parametrize("with_draft", [True, False])
def test_every_temperature_and_proposal_kind(temperature: float, with_draft: bool, plan: str) -> None:
    params = SamplingParams(temperature)
    target, draft, tokens = make_case(8, 4, 33, params, with_draft, torch.float32, seed=int(temperature * 10) + with_draft)
    assert_backends_agree(target, draft, tokens, params, seed=11, **PLANS[plan])


@pytest.mark.parametrize("plan", TILED_PLANS)
def test_draft_equal_to_target_accepts_everything(plan: str) -> None:
    params = SamplingParams(1.0)
    target, _, tokens = make_case(8, 4, 33, params, False, torch.float32, seed=3)
    tokens = torch.multinomial(warp_logits(target[:, :4].cpu(), params).exp().reshape(-1, 33), 1).view(8, 4).to(DEVICE)
    out = assert_backends_agree(target, target[:, :4].clone(), tokens, params, seed=5, **TILED_PLANS[plan])
    assert bool((out.num_accepted == 4).all())


SPLIT_PARAMS = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7), SamplingParams(0.8, 4, 0.9)]


@pytest.mark.parametrize("plan", TILED_PLANS)
@pytest.mark.parametrize("params", SPLIT_PARAMS, ids=str)
@pytest.mark.parametrize("with_draft", [True, False])
def test_long_rows_split_into_several_chunks(params: SamplingParams, with_draft: bool, plan: str) -> None:
    """V = 100 in tiles of 16 and 3 splits: several tiles per program, several programs per
    row (in both passes, or in the fused launch), partials or chunk winners meeting through the
    ticket counter; called twice to check the counter resets itself. Two rows per program in
    the fused launch: three row blocks, each with its own ticket."""
    target, draft, tokens = make_case(5, 3, 100, params, with_draft, torch.float32, seed=21)
    shape = dict(block_b=2, block_v=16, num_splits=3) if plan == "fused" else dict(block_b=8, block_v=16, num_splits=3)
    chosen = make_plan(5, 3, 100, DEVICE, params.greedy, **shape, **TILED_PLANS[plan])
    coop = plan == "coop" and not params.greedy
    cluster = plan == "cluster" and not params.greedy and (not ON_GPU or CLUSTERS_ON_DEVICE)
    one_pass = plan == "one_pass"
    assert chosen.coop == coop and chosen.cluster == cluster and chosen.one_pass == one_pass
    assert chosen.launches == (1 if plan == "fused" or coop or cluster or one_pass else 2)
    assert not coop or (chosen.coop_splits == 3 and chosen.coop_chunk == 48)
    assert not cluster or chosen.cluster_block_v == 16  # a whole row per program, in seven tiles
    if plan in ("lanes", "accept_once"):  # elsewhere the shape's SHAPE_PLANS entry decides (on a GPU)
        assert chosen.lanes
        assert chosen.accept_once == (plan == "accept_once" and not params.greedy)
    assert chosen.stats_splits == chosen.fused_splits == 3 and chosen.stats_chunk == chosen.fused_chunk == 48
    assert params.greedy or one_pass or chosen.sample_splits == 3
    for seed in (1, 2):
        assert_backends_agree(target, draft, tokens, params, seed, **shape, **TILED_PLANS[plan])


@pytest.mark.parametrize("plan", TILED_PLANS)
@pytest.mark.parametrize("params", SPLIT_PARAMS, ids=str)
def test_draft_log_probs_in_place_of_its_logits(params: SamplingParams, plan: str) -> None:
    """The draft's warped log-probs passed instead of its logits (`draft_is_log_probs`: the stats pass streams
    the target's logits only, the accept test and the residual read the log-probs as given): every plan returns
    the reference's tokens, in chunks and several tiles per program, twice in a row, and the default plan at the
    whole-row shape too."""
    target, draft, tokens = make_case(5, 3, 100, params, True, torch.float32, seed=23)
    log_q = warp_logits(draft, params)  # what the draft sampled from
    shape = dict(block_b=2, block_v=16, num_splits=3) if plan == "fused" else dict(block_b=8, block_v=16, num_splits=3)
    rejected = False
    for seed in (1, 2):
        out = assert_backends_agree(target, log_q, tokens, params, seed, draft_is_log_probs=True, **shape,
                                    **TILED_PLANS[plan])
        rejected |= bool((out.num_accepted < 3).any())
    assert rejected or params.greedy  # a residual was drawn from the given log-probs
    # read as given, never normalised again: rows shifted off one (what no caller should pass, so the API's
    # value check is off here) give the reference's tokens for those very rows
    assert_backends_agree(target, log_q - 2.0, tokens, params, 4, draft_is_log_probs=True, validate=False, **shape,
                          **TILED_PLANS[plan])
    if plan == "default":
        assert_backends_agree(target, log_q, tokens, params, 3, draft_is_log_probs=True)


@pytest.mark.parametrize("plan", TILED_PLANS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_chunk_with_an_empty_residual(plan: str, temperature: float) -> None:
    """The draft puts more mass than the target on every token of the first V-chunk, so a rejected row's
    residual max(0, p - q) is zero there: that chunk runs the fallback race over p, the others the residual
    race, and the reduction must still pick the residual's winner (as the reference does)."""
    params = SamplingParams(temperature)
    target, draft, _ = make_case(6, 3, 100, params, True, torch.float32, seed=13)
    draft = target[:, :3].clone()
    draft[:, :, :48] += 4.0  # chunk 0 of 3 (48 columns): q > p on all of it
    tokens = torch.multinomial(warp_logits(draft.cpu(), params).exp().reshape(-1, 100), 1,
                               generator=torch.Generator().manual_seed(1)).view(6, 3).to(DEVICE)
    for seed in (1, 2, 3):
        out = assert_backends_agree(target, draft, tokens, params, seed, block_b=2, block_v=16, num_splits=3,
                                    **TILED_PLANS[plan])
    assert bool((out.num_accepted < 3).any())  # some row rejected: the residual races ran


@pytest.mark.parametrize("plan", TILED_PLANS)
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7), SamplingParams(0.8, 4, 0.9)], ids=str)
@pytest.mark.parametrize("with_draft", [True, False])
def test_rows_of_several_sampling_blocks(params: SamplingParams, with_draft: bool, plan: str) -> None:
    """V = 700: three blocks of `sampling.SAMPLE_BLOCK` tokens in tiles of 256, one chunk each: every chunk races
    its blocks and then the tokens of its winning block, and the chunks' winners meet through the ticket counter
    (the reference: `sampling.block_race`). Rows 0-1 reject with no residual mass in the first chunk (the draft
    outweighs the target on all of it: that chunk runs the fallback race over p too); row 3 proposes from the
    target itself and samples the bonus."""
    target, draft, tokens = make_case(4, 3, 700, params, with_draft, torch.float32, seed=17)
    if with_draft:
        draft = draft.clone()
        draft[:2, :, :SAMPLE_BLOCK] += 4.0
        draft[3] = target[3, :3]
        tokens = torch.multinomial(warp_logits(draft.cpu(), params).exp().reshape(-1, 700), 1,
                                   generator=torch.Generator().manual_seed(2)).view(4, 3).to(DEVICE)
    shape = dict(block_b=2, block_v=SAMPLE_BLOCK, num_splits=3)
    chosen = make_plan(4, 3, 700, DEVICE, params.greedy, **shape, **TILED_PLANS[plan])
    assert (chosen.stats_splits if chosen.one_pass else chosen.sample_splits) == 3
    assert (chosen.stats_chunk if chosen.one_pass else chosen.sample_chunk) == SAMPLE_BLOCK
    rejected = False
    for seed in (1, 2, 3):
        out = assert_backends_agree(target, draft, tokens, params, seed, **shape, **TILED_PLANS[plan])
        rejected |= bool((out.num_accepted < 3).any())
    assert rejected


@pytest.mark.parametrize("with_draft", ["logits", "log-probs", "none"])
def test_one_pass_proposals_and_fallback_at_several_blocks(with_draft: str) -> None:
    """The one-pass plan (residual="rejection") at V = 700 in three splits of one sampling block: a draft near the
    target leaves small residuals, so rejected rows fall back to the race over the whole row; a distant one is
    mostly settled by the proposals (`rejection_fallbacks` says which happened). Either way the reference's
    tokens, called twice (the tickets reset)."""
    from flashspec.verify import rejection_fallbacks

    params = SamplingParams(1.0)
    generator = torch.Generator().manual_seed(5)
    target = 2.0 * torch.randn(16, 4, 700, generator=generator)
    seen = {"fallback": 0, "settled": 0}
    for spread in (0.15, 2.0):
        draft = target[:, :3] + spread * torch.randn(16, 3, 700, generator=generator)
        tokens = torch.multinomial(warp_logits(draft, params).exp().reshape(-1, 700), 1,
                                   generator=generator).view(16, 3)
        given = {"logits": draft, "log-probs": warp_logits(draft, params), "none": None}[with_draft]
        log_probs = with_draft == "log-probs"
        for seed in (1, 2):
            counts = rejection_fallbacks(target, given, tokens, params, rng.key_from_generator(seed), log_probs)
            seen["fallback"] += counts["fallback"]
            seen["settled"] += counts["rejected"] - counts["fallback"]
            assert_backends_agree(target.to(DEVICE), None if given is None else given.to(DEVICE), tokens.to(DEVICE),
                                  params, seed, draft_is_log_probs=log_probs, block_v=SAMPLE_BLOCK, num_splits=3,
                                  residual="rejection")
    assert seen["settled"] > 0 and (seen["fallback"] > 0 or with_draft == "none")


def test_a_sampling_tile_smaller_than_a_block_is_refused() -> None:
    with pytest.raises(ValueError, match=r"sample_block_v=128: a sampling tile holds whole blocks of 256"):
        make_plan(2, 3, 700, DEVICE, False, block_v=128)
    assert make_plan(2, 3, 700, DEVICE, True, block_v=128).sample_block_v == 128  # greedy samples nothing
    assert make_plan(2, 3, 200, DEVICE, False, block_v=16).sample_block_v == 16  # a row of one block


@pytest.mark.parametrize("one_launch", [{"fused": True}, {"tuning": (("coop", 1),)}], ids=["fused", "coop"])
@pytest.mark.parametrize("params", SPLIT_PARAMS, ids=str)
@pytest.mark.parametrize("with_draft", [True, False])
def test_one_launch_gives_the_two_launches_tokens(params: SamplingParams, with_draft: bool, one_launch: dict) -> None:
    """Same V-splits, same partials, same race: the fused launch and the cooperative one return the two
    launches' tokens bit for bit, on rows that reject at every position and rows that accept everything."""
    target, draft, tokens = make_case(6, 3, 100, params, with_draft, torch.float32, seed=5)
    if with_draft:  # rows 4-5 propose from the target itself: every draft accepted, the bonus sampled
        draft = draft.clone()
        draft[4:] = target[4:, :3]
    for seed in (3, 4, 5):
        key = rng.key_from_generator(seed)
        two = verify_triton(target, draft, tokens, params, key, block_v=16, num_splits=4, fused=False)
        one = verify_triton(target, draft, tokens, params, key, block_v=16, num_splits=4, **one_launch)
        assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1]), (one, two)


def test_plan_spreads_one_long_row_over_the_gpu() -> None:
    if not ON_GPU:
        pytest.skip("the split count follows the GPU's SM count; interpreted plans use whole rows")
    plan = make_plan(1, 4, 128256, DEVICE, greedy=False)
    assert plan.block_b == 1 and plan.sample_splits >= 64 and plan.stats_splits * 5 >= 64


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("with_draft", [True, False])
def test_nan_and_inf_logits_never_give_ids_out_of_range(greedy: bool, with_draft: bool) -> None:
    batch, gamma, vocab = 6, 3, 20
    params = SamplingParams(0.0 if greedy else 1.0)
    target, draft, tokens = make_case(batch, gamma, vocab, params, with_draft, torch.float32, seed=9)
    target = target.clone()
    target[0] = float("nan")  # a whole row of NaN
    target[1, :, ::3] = float("nan")  # NaN entries
    target[2] = float("-inf")  # nothing to sample
    target[3, :, 5] = float("inf")
    if draft is not None:
        draft = draft.clone()
        draft[4] = float("nan")
    tokens = tokens.clone()
    tokens[5, 0] = vocab + 3  # out of range (validate=False lets it through)
    out = fs.verify(target, draft, tokens, params, generator=0, backend="triton", validate=False)
    emitted = out.tokens.gather(1, out.num_accepted.view(-1, 1)).squeeze(1)
    assert bool(((out.num_accepted >= 0) & (out.num_accepted <= gamma)).all())
    assert bool(((emitted >= 0) & (emitted < vocab)).all()), emitted
    positions = torch.arange(gamma + 1, device=out.tokens.device).view(1, -1)
    assert bool((out.tokens[positions > out.num_accepted.view(-1, 1)] == -1).all())


@pytest.mark.skipif(not ON_GPU, reason=BF16_REASON)
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.6])
def test_bf16_logits_on_gpu(temperature: float) -> None:
    params = SamplingParams(temperature)
    for batch, vocab in ((8, 1000), (64, 32000)):
        target, draft, tokens = make_case(batch, 4, vocab, params, True, torch.bfloat16, seed=batch)
        assert_backends_agree(target, draft, tokens, params, seed=4)


@gpu_only
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_past_two_to_the_31_elements(temperature: float) -> None:
    """B·(γ+1)·V > 2**31: planted maxima beyond int32 offsets must be found (6.4 GB bf16).

    The kernels have no int32 offset path to force on the CPU (rows are cast to int64 before
    they are multiplied by V), and the interpreter cannot allocate past 2**31 elements, so
    this check needs a GPU."""
    gamma, vocab = 2, 2**30 + 3
    target = torch.zeros(1, gamma + 1, vocab, dtype=torch.bfloat16, device=DEVICE)
    planted = [vocab - 7, 12345, vocab - 5]  # offsets ≈ 3.2e9 for the bonus position
    for position, token in enumerate(planted):
        target[0, position, token] = 100.0
    tokens = torch.tensor([planted[:gamma]], device=DEVICE)
    out = fs.verify(target, None, tokens, SamplingParams(temperature), generator=1, backend="triton")
    assert out.num_accepted.tolist() == [gamma]
    assert out.tokens.tolist() == [planted]
    del target
    torch.cuda.empty_cache()


@pytest.mark.parametrize("plan", TILED_PLANS)
@pytest.mark.parametrize("with_draft", [True, False])
def test_device_key_gives_the_same_tokens_as_the_host_key(with_draft, plan):
    """A key held in a device tensor (what a captured CUDA graph advances between replays) draws the
    same uniforms as the host Key, on both backends."""
    from flashspec import rng
    from flashspec.kernels import verify_triton
    from flashspec.verify import verify_reference

    device = "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") == "1" else "cpu"
    generator = torch.Generator().manual_seed(3)
    batch, gamma, vocab = 6, 3, 11
    target = (torch.randn(batch, gamma + 1, vocab, generator=generator) * 2).to(device)
    draft = (torch.randn(batch, gamma, vocab, generator=generator) * 2).to(device) if with_draft else None
    tokens = torch.randint(0, vocab, (batch, gamma), generator=generator).to(device)
    params = fs.SamplingParams(temperature=0.8)
    for step in range(3):
        key = rng.step_key_host(rng.Key.from_seed(99), step)
        device_key = rng.step_key(rng.key_tensor(rng.Key.from_seed(99), device), torch.tensor([step], device=device))
        residual = TILED_PLANS[plan].get("residual", "race")
        expected = verify_reference(target, draft, tokens, params, key, residual=residual)
        by_device = verify_reference(target, draft, tokens, params, device_key, residual=residual)
        tokens_t, accepted_t = verify_triton(target, draft, tokens, params, device_key, **TILED_PLANS[plan])
        assert torch.equal(expected.tokens, by_device.tokens)
        assert torch.equal(expected.tokens, tokens_t) and torch.equal(expected.num_accepted, accepted_t)
        # the fast path computes the stream prefixes in its own (compiled) step prologue
        from flashspec.kernels.verify import device_prefixes
        from flashspec.kernels import rng as krng

        prefixes = device_prefixes(device_key)
        assert prefixes.tolist() == [krng.as_int32(krng.stream_prefix(key, stream))
                                     for stream in (rng.STREAM_ACCEPT, rng.STREAM_SAMPLE)]
        tokens_p, accepted_p = verify_triton(target, draft, tokens, params, device_key, prefixes=prefixes,
                                             **TILED_PLANS[plan])
        assert torch.equal(tokens_p, tokens_t) and torch.equal(accepted_p, accepted_t)


@gpu_only
@pytest.mark.parametrize("plan", TILED_PLANS)
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.6])
def test_warm_steps_launch_with_addresses_and_return_the_reference_tokens(plan: str, temperature: float,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """After a step's first launch its later steps bind raw addresses (no tensor views) to the cached binaries:
    they must say so and still return the reference's tokens, for host keys, device keys and an input whose
    data pointer is not 16-byte aligned (another launch key, so cold once more). `verify_triton` launches a warm
    step straight from its binding (`_WarmStep.launch`), with the same tokens."""
    from flashspec.kernels import prepare_verify, verify_triton
    from flashspec.verify import verify_reference

    params = SamplingParams(temperature)
    target, draft, tokens = make_case(8, 4, 32000, params, True, torch.bfloat16, seed=11)
    shifted = torch.cat([target.reshape(-1), target.reshape(-1)[:1]])[1:].view(target.shape)
    from flashspec.kernels import verify as kernels

    launched = []
    straight = kernels._WarmStep.launch
    monkeypatch.setattr(kernels._WarmStep, "launch", lambda *call: launched.append(1) or straight(*call))
    for logits in (target, shifted):
        for device_key in (False, True):
            # cold; then by address, keeping the binding; then that binding, with other keys
            for call, seed in enumerate((5, 5, 6, 7)):
                key = rng.key_tensor(rng.Key.from_seed(seed), DEVICE) if device_key else rng.Key.from_seed(seed)
                expected = verify_reference(logits, draft, tokens, params, rng.Key.from_seed(seed),
                                            residual=TILED_PLANS[plan].get("residual", "race"))
                prepared = prepare_verify(logits, draft, tokens, params, key, **TILED_PLANS[plan])
                out_tokens, out_accepted = prepared.run()
                assert torch.equal(out_tokens, expected.tokens) and torch.equal(out_accepted, expected.num_accepted)
                launched.clear()
                out_tokens, out_accepted = verify_triton(logits, draft, tokens, params, key, **TILED_PLANS[plan])
                assert torch.equal(out_tokens, expected.tokens) and torch.equal(out_accepted, expected.num_accepted)
                # the first call compiled (cold), the first verify_triton bound the step; the later ones reuse it
                assert launched or call == 0, "a warm verify_triton call should launch straight from its binding"
            args = (prepared.fused_args if prepared.plan.fused else prepared.coop_args if prepared.plan.coop
                    else prepared.cluster_args if prepared.plan.cluster
                    else prepared.one_pass_args if prepared.plan.one_pass else prepared.sample_args)
            assert all(isinstance(arg, int) for arg in args[:3]), "a warm step should bind addresses"
            options = kernels.warm_options(**TILED_PLANS[plan])
            prefixes = kernels.device_prefixes(key) if device_key else None
            warm_key = kernels._warm_key(logits, draft, tokens, params, prefixes, options)
            assert warm_key in kernels._WARM_STEPS, "the later steps should reuse one binding"
            assert prepared.direct, "a warm step should launch its cached binaries directly"
    # a strided input is copied inside prepare_verify and bound by address: the step must keep the copy alive
    expected = verify_reference(target, draft, tokens, params, rng.Key.from_seed(5),
                                residual=TILED_PLANS[plan].get("residual", "race"))
    strided = torch.stack([target, torch.zeros_like(target)], dim=-1)[..., 0]
    prepared = prepare_verify(strided, draft, tokens, params, rng.Key.from_seed(5), **TILED_PLANS[plan])
    del strided
    junk = [torch.full_like(target, 7.0) for _ in range(4)]  # reuses any block the step let go
    out_tokens, out_accepted = prepared.run()
    assert torch.equal(out_tokens, expected.tokens) and torch.equal(out_accepted, expected.num_accepted)
    del junk


@gpu_only
@pytest.mark.parametrize("plan", PLANS)
def test_warm_steps_still_call_tritons_launch_hooks(plan: str) -> None:
    """A warm step launches its binaries without Triton's per-call path only while no launch hook is set: with
    one set (a profiler's), every launch must reach it, and the tokens stay the reference's."""
    from flashspec.kernels import prepare_verify, verify_triton
    from flashspec.verify import verify_reference

    params = SamplingParams(1.0)
    target, draft, tokens = make_case(8, 4, 32000, params, True, torch.bfloat16, seed=3)
    for _ in range(3):
        prepare_verify(target, draft, tokens, params, rng.Key.from_seed(1), **PLANS[plan]).run()
    seen: list = []

    def hook(*metadata) -> None:
        seen.append(metadata)

    runtime = triton.knobs.runtime
    chain = runtime.launch_enter_hook
    if hasattr(chain, "add"):  # Triton >= 3.9: a chain of hooks
        chain.add(hook)
    else:
        runtime.launch_enter_hook = hook
    try:
        prepared = prepare_verify(target, draft, tokens, params, rng.Key.from_seed(1), **PLANS[plan])
        assert prepared.direct
        out_tokens, _ = prepared.run()
        straight_tokens, _ = verify_triton(target, draft, tokens, params, rng.Key.from_seed(1), **PLANS[plan])
        torch.cuda.synchronize()
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            runtime.launch_enter_hook = chain
    assert len(seen) == 2 * prepared.plan.launches, "both the prepared step and verify_triton must feed the hook"
    expected = verify_reference(target, draft, tokens, params, rng.Key.from_seed(1),
                                residual=PLANS[plan].get("residual", "race")).tokens
    assert torch.equal(out_tokens, expected) and torch.equal(straight_tokens, expected)


@gpu_only
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_captured_step_draws_new_uniforms_per_replay(plan: str, temperature: float) -> None:
    """verify_triton with a device key captured in a CUDA graph: every replay, with the key buffer advanced,
    returns the reference's tokens for that key (the prefixes are read from memory, the tickets reset
    themselves between replays), and the step makes no host sync."""
    from flashspec.verify import verify_reference

    params = SamplingParams(temperature)
    target, draft, tokens = make_case(4, 4, 32000, params, True, torch.float32, seed=8)
    base = rng.key_tensor(rng.Key.from_seed(7), DEVICE)
    step = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    key = rng.step_key(base, step)

    def verify_step():
        return verify_triton(target, draft, tokens, params, key, **PLANS[plan])

    verify_step()  # compile outside the capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        verify_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_tokens, out_accepted = verify_step()
    for value in range(3):
        key.copy_(rng.step_key(base, torch.tensor([value], device=DEVICE)))
        graph.replay()
        expected = verify_reference(target, draft, tokens, params, rng.step_key_host(rng.Key.from_seed(7), value),
                                    residual=PLANS[plan].get("residual", "race"))
        assert torch.equal(out_tokens, expected.tokens) and torch.equal(out_accepted, expected.num_accepted)


@pytest.fixture
def gpu_planner(monkeypatch):
    """`make_plan`'s GPU branch on any machine: a 132-SM SM90 device, compiled Triton (plans only; nothing runs)."""
    from flashspec.kernels import plan as plan_module

    monkeypatch.setattr(plan_module, "interpreting", lambda: False)
    monkeypatch.setattr(plan_module, "_num_sms", lambda index: 132)
    monkeypatch.setattr(plan_module, "_has_pdl", lambda index: True)
    monkeypatch.setattr(plan_module, "_has_clusters", lambda index: True)
    plan_module.make_plan.cache_clear()
    yield plan_module
    plan_module.make_plan.cache_clear()


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("vocab", [32000, 128256])
def test_gpu_plans_of_every_benchmark_variant_are_valid(gpu_planner, batch: int, vocab: int) -> None:
    """Every launch-plan variant the benchmark times gives a plan within the kernels' limits, on both
    plans, and a SHAPE_PLANS entry changes the default of its bucket only."""
    from flashspec_lab.bench import PLAN_VARIANTS, _variant_options, is_rejection

    device = torch.device("cuda", 0)
    for overrides in PLAN_VARIANTS.values():
        options = _variant_options(overrides)
        chosen = gpu_planner.make_plan(batch, 4, vocab, device, False, tuning=options["tuning"],
                                       residual=options["residual"])
        assert chosen.one_pass == is_rejection(overrides)
        assert not chosen.one_pass or chosen.stats_block_v % SAMPLE_BLOCK == 0  # its tiles hold whole blocks
        assert chosen.fused == bool(overrides.get("fused", 0))
        capacity = 132 * overrides.get("coop_programs_per_sm", 1)
        assert chosen.coop == (bool(overrides.get("coop", 0)) and batch <= capacity)
        chunks = [(chosen.stats_chunk, chosen.stats_splits, chosen.stats_block_v, 256),
                  (chosen.sample_chunk, chosen.sample_splits, chosen.sample_block_v, 1024),
                  (chosen.fused_chunk, chosen.fused_splits, chosen.stats_block_v, 256)]
        if chosen.coop:  # its whole grid resident at once: at most the SMs' share it was given
            chunks.append((chosen.coop_chunk, chosen.coop_splits, chosen.coop_block_v, 256))
            assert batch * chosen.coop_splits <= capacity
            assert chosen.block_s4 >= chosen.coop_splits
        for chunk, splits, block_v, most in chunks:
            assert chunk % block_v == 0 and (splits - 1) * chunk < vocab <= splits * chunk and splits <= most
        assert chosen.block_s3 >= chosen.fused_splits and chosen.block_s >= chosen.stats_splits
        assert chosen.cluster == bool(overrides.get("cluster", 0))
        if chosen.cluster:  # a program per row, its tile split evenly over its cluster's blocks
            assert chosen.cluster_ctas == overrides["cluster_ctas"]
            per_block = overrides.get("cluster_block_v", gpu_planner.GPU_PLAN["cluster_block_v"])
            assert chosen.cluster_block_v == per_block * chosen.cluster_ctas
        assert chosen.launches == (1 if chosen.fused or chosen.coop or chosen.cluster or chosen.one_pass else 2)
        assert chosen.pdl == (bool(overrides.get("pdl", 0)) and chosen.launches == 2)
    default = gpu_planner.make_plan(batch, 4, vocab, device, False)
    assert not default.fused  # an empty SHAPE_PLANS runs GPU_PLAN: two launches
    bucket = gpu_planner.shape_bucket(batch, vocab)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(gpu_planner.SHAPE_PLANS, bucket, {"fused": 1})
        gpu_planner.make_plan.cache_clear()
        assert gpu_planner.make_plan(batch, 4, vocab, device, False).fused
        assert not gpu_planner.make_plan(batch, 4, vocab, device, False, fused=False).fused
        other = gpu_planner.shape_bucket(batch * 8 + 1, vocab)
        assert other == bucket or not gpu_planner.make_plan(batch * 8 + 1, 4, vocab, device, False).fused
        patch.setitem(gpu_planner.SHAPE_PLANS, bucket, {"coop": 1})
        gpu_planner.make_plan.cache_clear()
        assert gpu_planner.make_plan(batch, 4, vocab, device, False).coop
        assert not gpu_planner.make_plan(batch, 4, vocab, device, False, fused=False).coop  # two launches asked
        assert not gpu_planner.make_plan(batch, 4, vocab, device, True).coop  # greedy samples nothing
    gpu_planner.make_plan.cache_clear()
    # 133 rows do not fit 132 SMs at one program each: two launches
    assert not gpu_planner.make_plan(133, 4, vocab, device, False, tuning=(("coop", 1),)).coop
    assert gpu_planner.make_plan(133, 4, vocab, device, False, tuning=(("coop", 1), ("coop_programs_per_sm", 2))).coop
    with pytest.raises(ValueError, match="unknown launch-plan keys"):
        gpu_planner.make_plan(batch, 4, vocab, device, False, tuning=(("sample_tile", 1),))


def test_shape_buckets() -> None:
    from flashspec.kernels.plan import shape_bucket

    assert shape_bucket(1, 32000) == (1, 32768)
    assert shape_bucket(2, 32768) == (8, 32768)
    assert shape_bucket(9, 50000) == (64, 131072)
    assert shape_bucket(500, 256000) == (64, 131072)


def test_verify_benchmark_variants_option(tmp_path, capsys) -> None:
    """`--variants` times only the named plan variants (and records only them); an unknown name is refused with
    the known names, before anything runs."""
    import json

    from experiments import bench_verify

    with pytest.raises(SystemExit) as refused:
        bench_verify.main(["--smoke", "--variants", "two_launch", "no_such_plan"])
    assert refused.value.code == 2 and "no_such_plan" in capsys.readouterr().err
    out = tmp_path / "verify.json"
    assert bench_verify.main(["--smoke", "--batch", "2", "--variants", "two_launch", "cluster_c8",
                              "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert set(record["settings"]["plan_variants"]) == {"two_launch", "cluster_c8"}
    assert set(record["results"]["points"][0]["variants"]) == {"two_launch", "cluster_c8"}


def test_verify_benchmark_smoke_runs_on_tiny_shapes(tmp_path) -> None:
    """`flashspec bench verify --smoke`: the GPU benchmark's driver end to end on tiny shapes (host clock, no
    graphs) -- every plan variant returns the reference's tokens, verdicts and the plan table are written."""
    import json

    from experiments import bench_verify
    from flashspec_lab.bench import PLAN_VARIANTS, TARGETS, is_diagnostic, is_rejection

    out = tmp_path / "verify.json"
    assert bench_verify.main(["--smoke", "--batch", "1", "3", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    results = record["results"]
    assert [p["batch"] for p in results["points"]] == [1, 3]
    for point in results["points"]:
        assert set(point["variants"]) == set(PLAN_VARIANTS)
        # (a one-pass kernel stopped early, a diagnostic, samples nothing)
        assert all(row["tokens_equal_reference"] for row in point["variants"].values()
                   if "error" not in row and not row["overrides"].get("one_pass_stop")), \
            point["variants"]
        assert point["honest_torch_us"] > 0 and point["honest_over_triton"] is not None
        assert point["honest_torch_latency_us"] > 0 and point["honest_over_triton_latency"] is not None
        assert point["honest_over_triton_paired"] > 0 and len(point["honest_over_best_paired_range"]) == 2
        sides = point["honest_over_triton_paired_sides_us"]  # what each call took while paired
        assert sides["honest"][0] > 0 and sides["step"][0] > 0 and len(sides["step"][1]) == 2
        assert set(point["honest_over_triton_paired_by_order"]) == {"honest_first", "step_first"}
        for host in ("warm", "cold"):  # the same pairs with both calls finding the host alike
            assert point[f"honest_over_triton_paired_{host}"] > 0
            assert point[f"honest_over_triton_paired_{host}_sides_us"]["step"][0] > 0
        # empty launches timed like the step: the ceiling of the eager ratio with this many launches
        assert set(point["latency_floor_by_launches_us"]) == {"1", "2"}
        assert point["honest_over_launch_floor_latency"] == point["honest_torch_latency_us"] / \
            point["latency_floor_by_launches_us"][str(point["launches_per_step"])]
        assert point["paired_best_variant"] == point["best_variant"]
        assert point["best_variant"] in PLAN_VARIANTS and not is_diagnostic(PLAN_VARIANTS[point["best_variant"]])
        assert "honest_torch_graph_error" in point or "honest_torch_graph_warm_us" in point
        # the dependency-chain floor, for every two-launch plan: a CUDA graph replay on a GPU, an error on a CPU
        assert (point["chain_floor_us"] > 0) if ON_GPU else ("chain_floor_error" in point)
        assert all("chain_floor_us" in row and "one_launch_chain_floor_us" in row
                   and ("stats_kernel_warm_us" in row) and ("sample_kernel_warm_us" in row)
                   and ((row["stats_kernel_warm_us"] or 0) > 0 if ON_GPU else "stats_kernel_warm_error" in row)
                   for row in point["variants"].values() if row["launches"] == 2)
        assert (point["one_launch_chain_floor_us"] > 0) if ON_GPU else ("one_launch_chain_floor_error" in point)
        assert (point["target_only_stats_kernel_warm_us"] > 0) if ON_GPU else (
            "target_only_stats_kernel_warm_error" in point)
        assert 0 < point["target_logit_bytes"] < point["logit_bytes"]
        assert point["log_probs_tokens_equal_reference"] is True
        assert (point["log_probs_graph_warm_us"] > 0) if ON_GPU else ("log_probs_graph_warm_error" in point)
        for name, row in point["variants"].items():  # each variant runs the plan it names
            overrides = PLAN_VARIANTS[name]
            if "error" in row:  # compiled, the cluster plan needs SM90+ and Triton >= 3.9: it says so
                assert overrides.get("cluster") and ON_GPU and not CLUSTERS_ON_DEVICE, (name, row)
                assert row["error"].startswith("unavailable"), row
                continue
            assert row["plan"].get("coop", False) == bool(overrides.get("coop", 0)), (name, row["plan"])
            assert row["plan"].get("cluster", False) == bool(overrides.get("cluster", 0)), (name, row["plan"])
            assert row["plan"]["fused"] == bool(overrides.get("fused", 0)), (name, row["plan"])
            assert row["plan"].get("one_pass", False) == is_rejection(overrides), (name, row["plan"])
            one_launch = (overrides.get("coop") or overrides.get("fused") or overrides.get("cluster")
                          or is_rejection(overrides))
            assert row["launches"] == (1 if one_launch else 2), name
        # the step with residual="rejection": its reference's tokens given logits or log-probs, timed, its rows
        # counted, and never the launch-plan table's choice (another sampler)
        assert point["rejection_tokens_equal_reference"] and point["rejection_log_probs_tokens_equal_reference"]
        assert point["rejection_eager_us"] > 0 and point["honest_over_rejection_paired"] > 0
        assert set(point["rejection_rows"]) == {"rows", "rejected", "fallback"}
        assert is_rejection(PLAN_VARIANTS[point["best_rejection_variant"]])
        assert not is_rejection(PLAN_VARIANTS[point["best_variant"]])
    assert set(results["verdicts"]) == set(TARGETS)
    assert set(results["rejection_verdicts"]) == set(TARGETS) | {"graph_over_floor_max_given_log_probs"}
    assert "SHAPE_PLANS" in results["plan_choice"]["paste"] and "residual" not in results["plan_choice"]["paste"]
    assert results["verdicts"]["honest_over_eager_at_batch_64"]["as_run"]["verdict"] == "NOT MEASURED"
    assert results["verdicts"]["honest_over_eager_min_for_batch_le_8"]["timing"].startswith(
        "one call from an idle GPU, launch included, the honest baseline's and the step's calls alternating")
    assert results["plan_choice"]["paste"].startswith("SHAPE_PLANS_BY_TRITON[(")
    assert record["settings"]["targets"] == TARGETS
    floors = results["floors"]
    assert 0 < floors["one_empty_launch_latency_us"] and 0 < floors["two_empty_launches_latency_us"]
    assert len(floors["two_empty_launches_latency_us_spread"]) == 2


def test_plan_choice_skips_diagnostic_and_wrong_variants() -> None:
    """The fastest variant becomes a default only if it returned the reference's tokens and rounds as the
    reference does."""
    from flashspec_lab.bench import plan_choice, point_ratios

    point = {"batch": 8, "vocab": 32000, "floor_us": 4.0, "triton_us": 40.0, "honest_torch_us": 400.0,
             "torch_us": 4000.0, "floor_bytes_us": 4.0, "triton_graph_warm_us": 12.0,
             "variants": {
                 "two_launch": {"overrides": {}, "eager_us": 40.0, "graph_warm_us": 12.0,
                                "tokens_equal_reference": True},
                 "fused": {"overrides": {"fused": 1}, "eager_us": 30.0, "graph_warm_us": 9.0,
                           "tokens_equal_reference": False},
                 "diagnostic_fast_math": {"overrides": {"precise": 0}, "eager_us": 20.0, "graph_warm_us": 6.0,
                                          "tokens_equal_reference": True},
                 "two_launch_sample_bv256": {"overrides": {"sample_block_v": 256}, "eager_us": 45.0,
                                             "graph_warm_us": 10.0, "tokens_equal_reference": True}}}
    point.update(point_ratios(point))
    assert point["best_variant"] == "two_launch_sample_bv256" and point["best_variant_eager"] == "two_launch"
    assert point["best_graph_warm_over_floor"] == 2.5 and point["honest_over_best_eager"] == 400.0 / 45.0
    assert "(8, 32768): {'sample_block_v': 256}" in plan_choice([point])["paste"]


PLAN_RECORDS = {(3, 6): "verify_h200_70751e3", (3, 9): "verify_h200_blocks_all_decba52"}  # where each plan table came from


def test_shape_plans_follow_the_installed_triton() -> None:
    """One launch-plan table per Triton version measured, each the plan choice of a committed H200 record made
    under that version; a Triton reads the newest table not newer than it (older than all: the oldest)."""
    import triton

    from flashspec_lab import provenance
    from flashspec_lab.bench import PLAN_VARIANTS, plan_choice
    from flashspec.kernels import plan

    assert plan.triton_version("3.9.0") == (3, 9) and plan.triton_version("3.6.0+git1a2b3c") == (3, 6)
    with pytest.raises(ValueError, match="cannot read a Triton version from 'nightly'"):
        plan.triton_version("nightly")
    tables = plan.SHAPE_PLANS_BY_TRITON
    assert plan.shape_plans_for("3.9.0") is tables[(3, 9)] and plan.shape_plans_for("3.10.1") is tables[(3, 9)]
    assert plan.shape_plans_for("3.8.0") is tables[(3, 6)] and plan.shape_plans_for("3.0.0") is tables[(3, 6)]
    assert plan.SHAPE_PLANS is plan.shape_plans_for(triton.__version__)
    buckets = {(b, v) for b in plan.BATCH_BUCKETS for v in plan.VOCAB_BUCKETS}
    assert set(tables) == set(PLAN_RECORDS)
    for version, table in tables.items():
        assert set(table) == buckets and all(entry in PLAN_VARIANTS.values() for entry in table.values()), version
        record = provenance.load_result(PLAN_RECORDS[version])
        assert plan.triton_version(record["provenance"]["versions"]["triton"]) == version
        choice = plan_choice(record["results"]["points"])["paste"]
        assert all(f"{bucket}: {entry}," in choice for bucket, entry in table.items()), (version, choice)


def test_cluster_over_others_compares_the_fastest_correct_plans() -> None:
    """The book's cluster ratio: the fastest cluster variant's replay over the fastest other variant's, each among
    variants that returned the reference's tokens and are not diagnostics; None when one side was not timed."""
    from flashspec_lab.bench import best_replay, cluster_over_others

    def row(overrides: dict, replay: float | None, correct: bool = True) -> dict:
        return {"overrides": overrides, "graph_warm_us": replay, "tokens_equal_reference": correct}

    point = {"variants": {
        "two_launch": row({}, 10.0),
        "fast_but_wrong": row({"lanes": 1}, 5.0, correct=False),
        "diagnostic_fast_math": row({"precise": 0}, 4.0),
        "cluster_c8": row({"cluster": 1, "cluster_ctas": 8}, 30.0),
        "cluster_c4": row({"cluster": 1, "cluster_ctas": 4}, 25.0),
        "cluster_wrong": row({"cluster": 1, "cluster_ctas": 2}, 1.0, correct=False),
    }}
    assert best_replay(point, lambda o: bool(o.get("cluster"))) == ("cluster_c4", 25.0)
    assert best_replay(point, lambda o: not o.get("cluster")) == ("two_launch", 10.0)
    assert cluster_over_others(point) == 2.5
    point["variants"]["cluster_c4"]["graph_warm_us"] = point["variants"]["cluster_c8"]["graph_warm_us"] = None
    assert cluster_over_others(point) is None


def test_launch_key_determines_every_launch_specialisation() -> None:
    """The compiled launch path caches binaries under `launch_key` instead of one spec per argument; that is
    sound only if equal launch keys always mean equal specialisations (every argument's spec and every
    constexpr), arguments Triton does not specialise (`do_not_specialize`) aside. Checked over shapes, dtypes,
    misaligned inputs, temperatures, truncation, draft or none, host or device keys and every plan option."""
    import inspect
    import itertools

    from flashspec.kernels import prepare_verify
    from flashspec.kernels import verify as kernels

    def launches(prepared):
        if prepared.plan.fused:
            yield kernels._FUSED_LAUNCHER, prepared.fused_args, prepared.fused_meta
        elif prepared.plan.coop:
            yield kernels._COOP_LAUNCHER, prepared.coop_args, prepared.coop_meta
        elif prepared.plan.cluster:
            yield kernels._CLUSTER_LAUNCHER, prepared.cluster_args, prepared.cluster_meta
        else:
            stats = kernels._STATS_ACCEPT_LAUNCHER if prepared.plan.accept_once else kernels._STATS_LAUNCHER
            yield stats, prepared.stats_args, prepared.stats_meta
            yield kernels._SAMPLE_LAUNCHER, prepared.sample_args, prepared.sample_meta

    free = {"accept_prefix", "sample_prefix"}  # the kernels' do_not_specialize arguments (ints, int32 always)

    def specialisation(launcher, args, meta):
        names = list(inspect.signature(launcher.kernel.fn).parameters)
        kept = tuple(a for name, a in zip(names, args) if name not in free or isinstance(a, torch.Tensor))
        return launcher.kernel.fn.__name__, kernels._Launcher.spec_key(kept, meta)

    seen: dict = {}
    plans = [{}, {"fused": True}, {"tuning": (("lanes", 1),)}, {"tuning": (("accept_once", 1), ("lanes", 1))},
             {"tuning": (("coop", 1),)}, {"tuning": (("cluster", 1),)}]
    cases = itertools.product([1, 3, 16], [1, 4], [16, 33], [torch.float32, torch.float16],
                              [0.0, 0.7, 1.0, "top_k"], [True, False], [False, True], [False, True], plans)
    for index, (batch, gamma, vocab, dtype, temperature, with_draft, misaligned, device_key, plan) in enumerate(cases):
        if index % 3:  # a deterministic third of the grid keeps the test quick; every value still occurs
            continue
        params = SamplingParams(0.8, 3, 1.0) if temperature == "top_k" else SamplingParams(temperature)
        target, draft, tokens = make_case(batch, gamma, vocab, params, with_draft, dtype, seed=index)
        if misaligned:  # one element in: the data pointer is no longer 16-byte aligned
            target = torch.cat([target.reshape(-1), target.reshape(-1)[:1]])[1:].view(target.shape)
        for seed in (1, 2, 3):  # host keys whose prefixes differ in their divisibility by 16
            key = (rng.key_tensor(rng.Key.from_seed(seed), DEVICE) if device_key else rng.Key.from_seed(seed))
            prepared = prepare_verify(target, draft, tokens, params, key, **plan)
            for launcher, args, meta in launches(prepared):
                spec = specialisation(launcher, args, meta)
                entry = (launcher.kernel.fn.__name__, prepared.key)
                assert seen.setdefault(entry, spec) == spec, (entry, spec, seen[entry])
    assert len(seen) > 50


def test_work_layout_addresses_match_its_views_aligned_and_disjoint() -> None:
    """Once a step's binaries are cached its launches take raw addresses from `_WorkLayout.addresses` instead of
    tensor views: each address must be the data pointer of the view it replaces, every buffer 64-byte aligned
    (`launch_key` assumes it) and inside the allocation, and the buffers a plan uses must not overlap the
    outputs or each other."""
    import itertools

    from flashspec.kernels import verify as kernels

    plans = [{}, {"fused": True}, {"tuning": (("accept_once", 1), ("lanes", 1))}, {"tuning": (("coop", 1),)},
             {"tuning": (("cluster", 1),)}]
    for batch, gamma, splits, greedy, options in itertools.product([1, 5, 64], [1, 4], [1, 3], [False, True], plans):
        plan = make_plan(batch, gamma, 4096, torch.device("cpu"), greedy, num_splits=splits,
                         fused=options.get("fused"), tuning=options.get("tuning"))
        layout = kernels._work_layout(batch, gamma, plan, greedy)
        memory = torch.empty(layout.words // 2, dtype=torch.int64)
        base, end = memory.data_ptr(), memory.data_ptr() + memory.numel() * 8
        views, addresses = layout.views(memory), layout.addresses(base)
        assert views.keys() == addresses.keys()
        used = {"part_max", "part_idx" if greedy else "part_sum"}  # "ints" stands in for an unused ticket
        used |= {"race_val", "race_idx"} if (plan.sample_splits > 1 and not plan.fused) or plan.coop else set()
        used |= {"info"} if plan.accept_once else set()
        spans = [(0, (batch * (gamma + 1)) * 8), (layout.accepted * 4, layout.accepted * 4 + batch * 8)]
        for name, view in views.items():
            assert view.data_ptr() == addresses[name] and (addresses[name] - base) % 64 == 0, name
            assert base <= view.data_ptr() and view.data_ptr() + view.numel() * 4 <= end, name
            if name in used:
                spans.append((view.data_ptr() - base, view.data_ptr() - base + view.numel() * 4))
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans


def test_warm_binding_fills_the_arguments_the_address_binding_gives() -> None:
    """A warm step's binding (`_WarmStep`, built once from the bind functions given `_Slot`s) must give every
    launch the arguments the bind functions give with this call's raw addresses: the same grids, meta and
    constants, each input, output, work buffer and prefix at its address (or the host prefix's value)."""
    import itertools

    from flashspec.kernels import verify as kernels
    from flashspec.kernels.shims import SCALE_MULTIPLY

    options = {"default": {}, "fused": {"fused": True}, "coop": {"tuning": (("coop", 1),)},
               "cluster": {"tuning": (("cluster", 1),)}, "accept_once": {"tuning": (("accept_once", 1),)}}
    device = torch.device("cpu")
    kinds = set()
    for name, batch, splits, greedy, in_memory in itertools.product(options, [1, 5], [1, 3], [False, True],
                                                                    [False, True]):
        gamma, vocab = 4, 4096
        plan = make_plan(batch, gamma, vocab, device, greedy, num_splits=splits, fused=options[name].get("fused"),
                         tuning=options[name].get("tuning"))
        layout, bind = kernels._work_layout(batch, gamma, plan, greedy), kernels._binder(plan)
        kinds.add(bind.__name__)
        shape, flags = (batch, gamma, vocab), dict(SCALE_MODE=SCALE_MULTIPLY, HAS_DRAFT=not greedy, GREEDY=greedy)
        target, draft = torch.zeros(batch, gamma + 1, vocab), torch.zeros(batch, gamma + 1, vocab)
        tokens, memory = torch.zeros(batch, gamma, dtype=torch.int64), torch.empty(layout.words // 2,
                                                                                   dtype=torch.int64)
        prefixes = torch.zeros(2, dtype=torch.int32)
        accept, sample = (prefixes.data_ptr(), prefixes.data_ptr() + 4) if in_memory else (-123457, 98765)
        outputs = (memory[:batch * (gamma + 1)].view(batch, gamma + 1),
                   memory[layout.accepted // 2:layout.accepted // 2 + batch])
        bound = bind(plan, (target.data_ptr(), draft.data_ptr(), tokens.data_ptr()), outputs,
                            layout.addresses(memory.data_ptr()), shape, 0.5, flags, (accept, sample, in_memory), 7,
                            device, True)
        slots = kernels._Slot
        template = bind(plan, (slots(kernels._TARGET), slots(kernels._DRAFT), slots(kernels._TOKENS)),
                               (slots(kernels._BASE), slots(kernels._BASE, 4 * layout.accepted)),
                               {field: slots(kernels._BASE, 4 * offset) for field, offset, _, _ in layout.fields},
                               shape, 0.5, flags, (slots(kernels._ACCEPT), slots(kernels._SAMPLE), in_memory), 7,
                               device, True)
        warm = kernels._WarmStep.from_template(template, not greedy, layout.words, layout.accepted, batch, gamma)
        fields = warm.fields((target.data_ptr(), draft.data_ptr(), tokens.data_ptr(), memory.data_ptr(), accept,
                              sample))
        launched = [field for field in kernels._LAUNCH_FIELDS if getattr(bound, field + "_args") is not None]
        assert launched and set(fields) == {f"{field}_{part}" for field in launched for part in ("grid", "args", "meta")}
        for field in launched:
            expected = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in getattr(bound, field + "_args"))
            assert fields[field + "_args"] == expected, (name, field)
            assert fields[field + "_grid"] == getattr(bound, field + "_grid")
            assert fields[field + "_meta"] == getattr(bound, field + "_meta")
            assert not any(isinstance(a, kernels._Slot) for a in fields[field + "_args"])
    assert {"_bind_two_launches", "_bind_fused", "_bind_coop"} <= kinds  # the cluster plan needs a GPU


def test_warm_launch_fires_each_cached_binary_with_the_calls_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_WarmStep.launch` (the warm path of `verify_triton`) must fire every launch of the step once, in order, on
    the current stream, with the grid, the constexprs and the arguments the bind functions give for this call's
    addresses (its own fresh allocation included), and return tokens and num_accepted as views of that allocation
    where the kernels write them. Cached binaries stand in as recorders here (the GPU tests run the real ones)."""
    from flashspec.kernels import verify as kernels
    from flashspec.kernels.shims import SCALE_MULTIPLY

    fired: list = []

    class Binary:  # what `_Launcher.binaries` caches, its launcher recording each call
        function, packed_metadata = 1234, (4, 1, 0)

        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, *call) -> None:
            fired.append((self.name, call))

    monkeypatch.setattr(kernels, "_current_stream", lambda device_index: 99)
    device = torch.device("cpu")
    for tuning, greedy, in_memory in [((), False, False), ((("accept_once", 1),), False, True), ((), True, False),
                                      ((("coop", 1),), False, False)]:
        batch, gamma, vocab = 3, 4, 4096
        plan = make_plan(batch, gamma, vocab, device, greedy, num_splits=3, tuning=tuning)
        layout, bind = kernels._work_layout(batch, gamma, plan, greedy), kernels._binder(plan)
        shape, flags = (batch, gamma, vocab), dict(SCALE_MODE=SCALE_MULTIPLY, HAS_DRAFT=not greedy, GREEDY=greedy)
        slots = kernels._Slot
        template = bind(plan, (slots(kernels._TARGET), slots(kernels._DRAFT), slots(kernels._TOKENS)),
                        (slots(kernels._BASE), slots(kernels._BASE, 4 * layout.accepted)),
                        {field: slots(kernels._BASE, 4 * offset) for field, offset, _, _ in layout.fields},
                        shape, 0.5, flags, (slots(kernels._ACCEPT), slots(kernels._SAMPLE), in_memory), 7, device, True)
        launchers = kernels._launchers(plan)
        for index, launcher in enumerate(launchers):
            monkeypatch.setitem(launcher.binaries, 7, (Binary(f"launch{index}"), (16 + index, 1), None))
        warm = kernels._WarmStep.from_template(template, not greedy, layout.words, layout.accepted, batch, gamma)
        assert len(warm.calls) == len(launchers) == plan.launches
        target, draft = torch.zeros(batch, gamma + 1, vocab), torch.zeros(batch, gamma + 1, vocab)
        tokens, prefixes = torch.zeros(batch, gamma, dtype=torch.int64), torch.zeros(2, dtype=torch.int32)
        accept, sample = (prefixes[0:1], prefixes[1:2]) if in_memory else (-123457, 98765)
        fired.clear()
        out_tokens, out_accepted = warm.launch(target, draft, tokens, *((accept.data_ptr(), sample.data_ptr())
                                                                        if in_memory else (accept, sample)))
        base = out_tokens.data_ptr()
        assert out_tokens.shape == (batch, gamma + 1) and out_tokens.is_contiguous()
        assert out_accepted.shape == (batch,) and out_accepted.data_ptr() == base + 4 * layout.accepted
        assert out_tokens.untyped_storage().data_ptr() == out_accepted.untyped_storage().data_ptr()
        assert out_tokens.untyped_storage().nbytes() == 4 * layout.words
        prefix = (accept.data_ptr(), sample.data_ptr(), True) if in_memory else (accept, sample, False)
        bound = bind(plan, (target.data_ptr(), draft.data_ptr() if not greedy else target.data_ptr(), tokens.data_ptr()),
                     (base, base + 4 * layout.accepted), layout.addresses(base), shape, 0.5, flags, prefix, 7, device,
                     True)
        fields = [field for field in kernels._LAUNCH_FIELDS if getattr(bound, field + "_args") is not None]
        assert [name for name, _ in fired] == [f"launch{index}" for index in range(len(fields))]
        for index, ((_, call), field) in enumerate(zip(fired, fields)):
            grid = tuple(getattr(bound, field + "_grid"))
            args = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in getattr(bound, field + "_args"))
            assert call == (*grid, *(1,) * (3 - len(grid)), 99, 1234, (4, 1, 0), None, None, None, *args, 16 + index, 1)


def test_raw_launch_fires_what_tritons_launcher_passes_its_c_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Triton's launcher is the one `_raw_launch_call` recognises (3.9's `CudaLauncher`), a warm launch
    calls its C entry directly: with exactly the arguments the launcher's own Python wrapper passes it. A
    launcher with scratch memory, or whose wrapper calls its C entry any other way, keeps the wrapper."""
    driver_module = pytest.importorskip("triton.backends.nvidia.driver")
    from flashspec.kernels import verify as kernels

    if not kernels._wrapper_calls_launch_as_39(driver_module.CudaLauncher):
        pytest.skip(f"Triton {triton.__version__}'s launcher is not 3.9's: warm launches go through its wrapper")
    entry: list = []
    launcher = driver_module.CudaLauncher.__new__(driver_module.CudaLauncher)
    for name, value in dict(launch=lambda *call: entry.append(call), num_ctas=1, global_scratch_size=0,
                            global_scratch_align=1, profile_scratch_size=0, profile_scratch_align=1,
                            launch_cooperative_grid=False, launch_pdl=True, gsan_enabled=False,
                            arg_annotations=("a", "b"), kernel_signature=b"sig").items():
        setattr(launcher, name, value)

    class Binary:
        run, function, packed_metadata = launcher, 1234, (4, 1, 0)

    monkeypatch.setattr(triton.runtime.driver, "_active", object())  # the wrapper reads it; no GPU here
    args = [11, 22, -3, 0.5, 16]
    launcher(8, 5, 1, 99, 1234, (4, 1, 0), None, None, None, *args)  # Triton's own path
    kernels._firing(Binary, (8, 5))(99, args)
    assert len(entry) == 2 and entry[0][:-1] == entry[1][:-1] and list(entry[0][-1]) == list(entry[1][-1])
    assert kernels._raw_launch_call(launcher) is not None
    launcher.global_scratch_size = 64
    assert kernels._raw_launch_call(launcher) is None

    class Reordered(driver_module.CudaLauncher):
        def __call__(self, gridX, gridY, gridZ, stream, function, *rest):  # noqa: N803  (Triton's names)
            self.launch(gridY, gridX, gridZ, stream, function, *rest)

    other = Reordered.__new__(Reordered)
    other.__dict__.update(launcher.__dict__, global_scratch_size=0)
    assert kernels._raw_launch_call(other) is None


@pytest.mark.parametrize("batch, vocab, splits, greedy, coop", [(3, 40, 2, False, False), (2, 100, 3, False, False),
                                                              (1, 70, 1, True, False), (3, 100, 3, False, True)])
def test_chain_probe_finds_the_largest_logit_it_loaded(batch: int, vocab: int, splits: int, greedy: bool,
                                                       coop: bool) -> None:
    """The benchmark's dependency-chain probe (`flashspec_lab.kernels.chain_probe`) must run its whole chain: each
    row's token is the first column of the largest last-position logit among the tiles launch 2 (or the
    cooperative launch, past its barrier) loaded (one tile at the start of each chunk), twice in a row (the
    tickets and barriers reset themselves)."""
    from flashspec_lab.kernels.chain_probe import chain_step

    gamma = 4
    logits = torch.randn(batch, gamma + 1, vocab, generator=torch.Generator().manual_seed(vocab)).to(DEVICE)
    plan = make_plan(batch, gamma, vocab, logits.device, greedy, block_v=16, num_splits=splits,
                     tuning=(("coop", 1),) if coop else None)
    assert plan.coop == coop
    step = chain_step(logits, plan)
    if plan.coop:
        starts, width = range(0, vocab, plan.coop_chunk), plan.coop_block_v
    elif plan.sample_splits > 1:
        starts, width = range(0, vocab, plan.sample_chunk), min(plan.sample_block_v, plan.sample_chunk)
    else:
        starts, width = [0], min(plan.sample_block_v, triton.next_power_of_2(vocab))
    cols = torch.cat([torch.arange(s, min(s + width, vocab)) for s in starts]).to(DEVICE)
    expected = cols[logits[:, gamma, cols].argmax(1)]
    for _ in range(2):
        step.run()
        assert torch.equal(step.token.long(), expected)


@pytest.mark.parametrize("batch, vocab, splits, block_v", [(2, 100, 3, 16), (1, 40, 1, 16), (3, 9000, 2, 256)])
def test_one_launch_chain_probe_finds_the_largest_logit_of_its_tiles(batch: int, vocab: int, splits: int,
                                                                     block_v: int) -> None:
    """The one-launch chain probe (`chain_step(..., one_launch=True)`) must run its whole chain in one launch: each
    row's token is the first column of the largest last-position logit among the ONE_LAUNCH_TILES sampling-block
    tiles spread over V that the row's last program loaded, twice in a row (its ticket resets itself); it refuses a
    cooperative plan, whose chain is one launch already."""
    from flashspec_lab.kernels.chain_probe import ONE_LAUNCH_TILES, chain_step

    gamma = 4
    logits = torch.randn(batch, gamma + 1, vocab, generator=torch.Generator().manual_seed(vocab)).to(DEVICE)
    plan = make_plan(batch, gamma, vocab, logits.device, False, block_v=block_v, num_splits=splits)
    step = chain_step(logits, plan, one_launch=True)
    assert len(step.launches) == 1
    tile = SAMPLE_BLOCK
    stride = max(-(-vocab // tile) // ONE_LAUNCH_TILES, 1)
    cols = torch.tensor(sorted({c for k in range(ONE_LAUNCH_TILES) for c in range(k * stride * tile,
                                                                               (k * stride + 1) * tile) if c < vocab}))
    expected = cols.to(DEVICE)[logits[:, gamma, cols.to(DEVICE)].argmax(1)]
    for _ in range(2):
        step.run()
        assert torch.equal(step.token.long(), expected)
    coop = make_plan(batch, gamma, vocab, logits.device, False, block_v=block_v, num_splits=splits,
                     tuning=(("coop", 1),))
    with pytest.raises(ValueError, match="one_launch"):
        chain_step(logits, coop, one_launch=True)


def test_newest_points_read_each_point_from_the_latest_run_that_timed_it() -> None:
    from flashspec_lab.bench import newest_points

    def record(date: str | None, *shapes: tuple[int, int]) -> dict:
        return {"provenance": {"date_utc": date},
                "results": {"points": [{"batch": b, "vocab": v, "run": date} for b, v in shapes]}}

    late, early, undated = (record("2026-12-03T10:00:00+00:00", (1, 32000), (8, 32000)),
                            record("2026-12-02T10:00:00+00:00", (1, 32000), (64, 128256)), record(None, (8, 32000)))
    points = newest_points([late, undated, early])
    assert points[(1, 32000)] == (late["results"]["points"][0], late)
    assert points[(8, 32000)][1] is late and points[(64, 128256)][1] is early
    assert newest_points([]) == {}


def test_standings_take_each_structures_fastest_exact_replay_and_judge_the_bar_across_runs() -> None:
    """Every structure's fastest variant that returned the reference's tokens (diagnostics and wrong tokens left out;
    the one pass judged among rejection variants), the log-probs steps apart, and the bar per point across runs:
    met in every run, within spread when the runs disagree, missed in all."""
    from flashspec_lab.bench import STRUCTURES, bar_reached, standings

    def row(overrides: dict, replay: float | None, correct: bool = True) -> dict:
        return {"overrides": overrides, "graph_warm_us": replay, "tokens_equal_reference": correct}

    def point(batch: int, two: float, one_pass: float, log_probs: float | None = None) -> dict:
        return {"batch": batch, "vocab": 32000, "floor_us": 4.0, "log_probs_graph_warm_us": log_probs,
                "log_probs_tokens_equal_reference": True, "variants": {
                    "two_launch": row({}, two),
                    "lanes_tiles8": row({"lanes": 1, "sample_max_tiles": 8}, two + 1.0),
                    "wrong": row({"lanes": 1}, 1.0, correct=False),
                    "diagnostic_fast_math": row({"precise": 0}, 1.0),
                    "pdl": row({"pdl": 1}, two + 2.0),
                    "coop": row({"coop": 1}, None),
                    "one_pass": row({"residual_rejection": 1}, one_pass),
                    "diagnostic_one_pass_stream": row({"residual_rejection": 1, "one_pass_stop": 1}, 0.5),
                }}

    rows = standings(point(1, 9.0, 12.0, log_probs=6.0))
    assert {name: (r["variant"], r["us"]) for name, r in rows.items()} == {
        "two launches": ("two_launch", 9.0), "two launches, dependent launch": ("pdl", 11.0),
        "one launch, rejection": ("one_pass", 12.0), "two launches given log-probs": ("default", 6.0)}
    assert rows["two launches"]["over_floor"] == 9.0 / 4.0
    assert set(rows) - {"two launches given log-probs"} <= set(STRUCTURES)
    runs = [point(1, 7.0, 12.0, 6.0), point(1, 9.0, 12.0, 6.0),  # B=1: the runs disagree
            point(8, 7.5, 9.0), point(8, 8.0, 7.0),  # B=8: within in both, once by the one pass
            point(64, 9.0, 10.0), point(64, 10.0, 11.0)]  # B=64: missed in both
    for p in runs[4:]:
        p["batch"] = 64
    judged = bar_reached(runs)
    assert {key: value["verdict"] for key, value in judged.items()} == {
        (1, 32000): "within spread", (8, 32000): "met", (64, 32000): "missed"}
    assert judged[(8, 32000)]["best"] == [("two launches", 7.5 / 4.0), ("one launch, rejection", 7.0 / 4.0)]
    assert bar_reached(runs, given_log_probs=True)[(1, 32000)]["verdict"] == "met"  # 6.0 / 4.0 in both


def test_verdicts_judge_the_eager_bars_at_both_ends_of_the_spread() -> None:
    """A bar met by the medians but not by the pessimistic end of the timings' spreads is 'WITHIN SPREAD',
    one met at both ends 'PASS', one missed at both 'MISS'; records without spreads keep the median verdict."""
    from flashspec_lab import bench

    def point(batch: int, honest: list[float], eager: list[float]) -> dict:
        row = {"batch": batch, "vocab": 32000, "floor_us": 3.0, "triton_us": sum(eager) / 2,
               "honest_torch_us": sum(honest) / 2, "torch_us": 1.0, "floor_bytes_us": 1.0,
               "honest_torch_us_spread": honest, "triton_us_spread": eager}
        row.update(bench.point_ratios(row))
        return row

    bars = bench.verdicts([point(1, [900, 1100], [80, 95]),     # 9.5-13.8x: straddles 10x
                           point(64, [900, 1100], [100, 120])])  # 7.5-11x: above 3x at both ends
    assert bars["honest_over_eager_min_for_batch_le_8"]["as_run"]["verdict"] == "WITHIN SPREAD"
    assert bars["honest_over_eager_at_batch_64"]["as_run"]["verdict"] == "PASS"
    missed = bench.verdicts([point(8, [500, 600], [90, 100])])  # 5-6.7x: below 10x at both ends
    assert missed["honest_over_eager_min_for_batch_le_8"]["as_run"]["verdict"] == "MISS"
    assert missed["honest_over_eager_min_for_batch_le_8"]["as_run"]["range"] == pytest.approx([5.0, 600 / 90])
    old = point(1, [900, 1100], [80, 95])
    del old["honest_torch_us_spread"]
    old.update(bench.point_ratios(old))
    assert bench.verdicts([old])["honest_over_eager_min_for_batch_le_8"]["as_run"]["verdict"] == "PASS"  # 1000/87.5
    assert bars["honest_over_eager_at_batch_64"]["timing"].startswith("do_bench")


def test_eager_bars_use_the_launch_included_latency_where_recorded() -> None:
    """A record with each call's latency from an idle GPU judges the eager bars on it (do_bench's times overlap
    the host's launch with its L2 flush); one without it keeps do_bench's times."""
    from flashspec_lab import bench

    row = {"batch": 8, "vocab": 32000, "floor_us": 3.0, "triton_us": 20.0, "honest_torch_us": 500.0,
           "torch_us": 1.0, "floor_bytes_us": 1.0, "honest_torch_us_spread": [480.0, 520.0],
           "triton_us_spread": [18.0, 22.0],  # 25x by do_bench
           "honest_torch_latency_us": 600.0, "honest_torch_latency_us_spread": [580.0, 620.0],
           "triton_latency_us": 80.0, "triton_latency_us_spread": [75.0, 85.0],  # 7.5x from an idle GPU
           "variants": {"two_launch": {"overrides": {}, "eager_us": 20.0, "eager_us_spread": [18.0, 22.0],
                                       "latency_us": 50.0, "latency_us_spread": [45.0, 55.0], "graph_warm_us": 9.0,
                                       "tokens_equal_reference": True}}}
    row.update(bench.point_ratios(row))
    bar = bench.verdicts([row])["honest_over_eager_min_for_batch_le_8"]
    assert bar["timing"] == "one call from an idle GPU, launch included"
    assert bar["as_run"]["measured"] == pytest.approx(7.5) and bar["as_run"]["verdict"] == "MISS"
    assert bar["with_plan_choice"]["measured"] == pytest.approx(12.0) and bar["with_plan_choice"]["verdict"] == "PASS"
    assert bar["as_run"]["range"] == pytest.approx([580 / 85, 620 / 75])
    # paired calls, where recorded, decide over both medians: the pairs' ratios met the host at the same moment
    paired = {**row, "honest_over_triton_paired": 10.5, "honest_over_triton_paired_range": [9.8, 11.0],
              "honest_over_best_paired": 12.5, "honest_over_best_paired_range": [11.5, 13.0]}
    bar = bench.verdicts([paired])["honest_over_eager_min_for_batch_le_8"]
    assert bar["timing"].startswith("one call from an idle GPU, launch included, the honest baseline's and")
    assert bar["as_run"]["measured"] == 10.5 and bar["as_run"]["verdict"] == "WITHIN SPREAD"
    assert bar["with_plan_choice"]["measured"] == 12.5 and bar["with_plan_choice"]["verdict"] == "PASS"
    for key in ("honest_torch_latency_us", "triton_latency_us"):
        del row[key]
    row.update(bench.point_ratios(row))
    assert bench.verdicts([row])["honest_over_eager_min_for_batch_le_8"]["as_run"]["measured"] == pytest.approx(25.0)


def test_paired_ratio_alternates_and_cancels_a_drifting_host(monkeypatch) -> None:
    """`_paired_ratio` times the two calls alternately, each pair at one moment of the host: a host whose speed
    drifts during the measurement (here 1x to 3x, on both calls alike) leaves the pairs' ratio where it is, while
    two medians taken one after the other would move with the drift."""
    from flashspec_lab import bench

    clock = {"t": 0.0, "calls": 0}
    order = []

    def timer(fn):  # a host that gets slower call by call
        clock["calls"] += 1
        return fn() * (1.0 + 2.0 * clock["calls"] / 100)

    monkeypatch.setattr(bench, "_idle_call_timer", lambda: timer)
    honest = lambda: order.append("h") or 10.0  # noqa: E731
    step = lambda: order.append("s") or 1.0  # noqa: E731
    monkeypatch.setattr(bench, "_on_gpu", lambda: True)  # the GPU count of pairs, with the timer above
    median, spread, sides = bench._paired_ratio(honest, step, reps=40)
    assert abs(median - 10.0) < 0.5 and spread[0] <= median <= spread[1] and spread[1] - spread[0] < 1.0
    # each side's own times while paired carry the drift the ratio cancels: 10 and 1 scaled by 1x to 3x
    (honest_us, honest_spread), (step_us, _) = sides["numerator"], sides["denominator"]
    assert 15.0 < honest_us < 25.0 and 1.5 < step_us < 2.5 and honest_spread[1] - honest_spread[0] > 5.0
    assert honest_us / step_us == pytest.approx(median, rel=0.1)
    assert all(value == pytest.approx(10.0, rel=0.05) for value in sides["by_order"].values())
    timed = order[2:]  # after one warm-up call of each
    assert timed[:4] == ["h", "s", "s", "h"] and timed.count("h") == timed.count("s") == 40


def test_paired_ratio_gives_both_calls_the_same_host_state(monkeypatch) -> None:
    """With host="warm" each timed call comes right after an untimed call of itself, with "cold" right after a
    sweep of the host's caches; left as None, a call finds whatever the other left. A timer that makes the small
    call slow right after the large one (the asymmetry measured on the H200) biases None, not "warm"."""
    from flashspec_lab import bench

    last = {"fn": None}

    def timer(fn):
        slow = 2.0 if fn is step and last["fn"] is honest else 1.0
        last["fn"] = fn
        return fn() * slow

    def honest():
        last["fn"] = honest
        return 10.0

    def step():
        last["fn"] = step
        return 1.0

    sweeps = []
    monkeypatch.setattr(bench, "_idle_call_timer", lambda: timer)
    monkeypatch.setattr(bench, "_on_gpu", lambda: True)
    monkeypatch.setattr(bench, "_sweep_host_caches", lambda: sweeps.append(1) or last.update(fn=None))
    as_found = bench._paired_ratio(honest, step, reps=20)
    assert as_found[2]["by_order"]["numerator_first"] == pytest.approx(5.0)  # the step after the honest call
    assert as_found[2]["by_order"]["denominator_first"] == pytest.approx(10.0)
    warm = bench._paired_ratio(honest, step, reps=20, host="warm")
    cold = bench._paired_ratio(honest, step, reps=20, host="cold")
    assert warm[0] == pytest.approx(10.0) and cold[0] == pytest.approx(10.0) and len(sweeps) == 40
    with pytest.raises(ValueError, match="host must be"):
        bench._paired_ratio(honest, step, host="hot")


def test_issue_bound_step_overlaps_the_stats_pass_with_its_bytes_only() -> None:
    """`bench.issue_bound_step_us`: the stats pass costs the larger of its issue floor and the bytes floor, the
    sampling pass its issue floor after it; a record without issue floors gives None."""
    from flashspec_lab.bench import issue_bound_step_us

    def record(stats: float | None, sample: float | None) -> dict:
        return {"results": [{"batch": 64, "vocab": 128256, "variant": "default", "launched": [
            {"name": "_stats_accept_kernel", "issue_floor_us": stats},
            {"name": "_sample_kernel", "issue_floor_us": sample}]}]}

    assert issue_bound_step_us(record(29.0, 36.4), 64, 128256, 34.6) == pytest.approx(34.6 + 36.4)
    assert issue_bound_step_us(record(40.0, 36.4), 64, 128256, 34.6) == pytest.approx(40.0 + 36.4)
    assert issue_bound_step_us(record(None, 36.4), 64, 128256, 34.6) is None
    assert issue_bound_step_us(record(29.0, 36.4), 8, 128256, 34.6) is None  # no such point


@pytest.mark.parametrize("batch, vocab, lanes", [(64, 128256, 8), (8, 128256, 8), (64, 32000, 8), (1, 32000, 0),
                                                 (8, 32000, 0), (1, 128256, 0)])
def test_stats_lanes_only_where_programs_loop(gpu_planner, batch: int, vocab: int, lanes: int) -> None:
    """The GPU plan keeps per-lane stats partials where a stats program loops over tiles, not where it covers one
    (there the lanes would meet once anyway, after extra bookkeeping); a variant turns them off everywhere."""
    device = torch.device("cuda", 0)
    plan = gpu_planner.make_plan(batch, 4, vocab, device, False)
    assert plan.stats_lane_elems == lanes
    assert (plan.stats_chunk > plan.stats_block_v) == bool(lanes)
    off = gpu_planner.make_plan(batch, 4, vocab, device, False, tuning=(("stats_lane_elems", 0),))
    assert off.stats_lane_elems == 0
    with pytest.raises(ValueError, match="stats_lane_elems"):
        gpu_planner.make_plan(batch, 4, vocab, device, False, tuning=(("stats_lane_elems", 3),))


def test_the_sampling_tile_rule_leaves_rows_per_program_alone() -> None:
    """The GPU plan's rows per program follow row_tile / stats_block_v whatever the sampling tiles are (the
    check that sampling tiles hold whole blocks once reused a name and set them from the cluster tile), and a
    table's tile below one block is raised to one block; planned for an SM90 GPU on any machine."""
    import torch as _torch

    from flashspec.kernels import plan as plan_module
    from flashspec_lab.kernels import sass

    with sass.sm90_planner():
        wide = plan_module.make_plan(8, 4, 128256, _torch.device("cuda", 0), False,
                                     tuning=(("stats_block_v", 2048), ("stats_max_tiles", 2)))
        narrow = plan_module.make_plan(1, 4, 32000, _torch.device("cuda", 0), False,
                                       tuning=(("sample_block_v", 128), ("sample_max_tiles", 8)))
    assert wide.block_b == max(1, plan_module.GPU_PLAN["row_tile"] // 2048)
    assert narrow.sample_block_v == SAMPLE_BLOCK
