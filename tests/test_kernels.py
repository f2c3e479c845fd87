"""The Triton backend: its hash is flashspec.rng's bit for bit, and `verify(backend="triton")`
returns exactly what the PyTorch reference returns for the same seed, under the library's launch structures (the
two launches with each of their options, and the one pass of residual="rejection"); the lab's structures run the
same checks (`tests/kernel_cases.py`) in lab/tests/test_lab_kernels.py.

On a machine without a GPU these run through the Triton interpreter (conftest sets
TRITON_INTERPRET=1); the same file runs compiled on a GPU.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import flashspec as fs
from flashspec import rng
from flashspec.sampling import SAMPLE_BLOCK, SamplingParams, warp_logits

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

import kernel_cases as cases  # noqa: E402
from flashspec.kernels import make_plan, structures  # noqa: E402
from flashspec.kernels import rng as krng  # noqa: E402
from kernel_cases import (DEVICE, LIBRARY_TUNINGS, ON_GPU, REJECTION_TUNINGS, SPLIT_PARAMS,  # noqa: E402,F401
                          assert_backends_agree, gpu_only, gpu_planner, make_case)

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
    sampler=st.sampled_from(["race", "rejection", "block"]),
)
def test_triton_equals_torch_reference(batch, gamma, vocab, temperature, truncation, with_draft, dtype, seed, sampler):
    params = SamplingParams(temperature, *truncation)
    target, draft, tokens = make_case(batch, gamma, vocab, params, with_draft, dtype, seed % 10_000)
    options = {"race": {}, "rejection": {"residual": "rejection"}, "block": {"method": "block"}}[sampler]
    assert_backends_agree(target, draft, tokens, params, seed, **options)


# the launch plans every kernel test runs: the default (two launches, and fs.verify's own call), the one launch
# that draws the residual by rejection from p (its own reference: residual="rejection") and block verification's
# three launches (method="block")
PLANS = {"default": {}, "one_pass": {"residual": "rejection"}, "block": {"method": "block"}}
# and, where programs loop over several tiles or the accept test's place matters, the race that keeps per-lane
# winners (GPU_PLAN["lanes"]) and the accept test run once per row block by the stats launch ("accept_once")
TILED_PLANS = {**PLANS, "lanes": {"tuning": (("lanes", 1),)},
               "accept_once": {"tuning": (("accept_once", 1), ("lanes", 1))},
               # the stats pass reducing each tile across the program instead of per-lane partials (GPU_PLAN's
               # stats_lane_elems, which every other plan here runs)
               "stats_lanes_off": {"tuning": (("stats_lane_elems", 0),)}}
if ON_GPU:  # the sampling launch as a programmatic dependent launch: GPU-only (the interpreter has no grid control)
    TILED_PLANS["accept_once_pdl"] = {"tuning": (("accept_once", 1), ("lanes", 1), ("pdl", 1))}
# where every program covers one tile (and where the key's handling is what is tested), the lanes' options only
# change how that one tile is reduced -- the race's per-lane winners not at all in the block race, which `LANES`
# leaves alone; the stats pass's per-lane partials meet once, which the tests of several tiles per program cover --
# so the plans that change the step there are the default, the one pass and the accept test's place
ACCEPT_PLANS = {name: TILED_PLANS[name] for name in ("default", "one_pass", "accept_once")}
# and where the residual's race is what is tested: the options that change the race's code (the stats pass's lanes and
# the accept test's place leave it as it is)
RACE_PLANS = {name: TILED_PLANS[name] for name in ("default", "one_pass", "lanes")}
# at T = 0 the sampler streams nothing and runs the accept test itself, and the stats pass keeps argmax partials: the
# two launches' options run the default's code there, so greedy cases take `PLANS` alone
SPLIT_CASES = [(plan, params) for plan in TILED_PLANS for params in SPLIT_PARAMS if plan in PLANS or not params.greedy]
SPLIT_IDS = [f"{params}-{plan}" for plan, params in SPLIT_CASES]
SHAPE = dict(block_b=8, block_v=16, num_splits=3)  # V = 100: several tiles per program, several programs per row


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0, 1.7])
@pytest.mark.parametrize("with_draft", [True, False])
def test_every_temperature_and_proposal_kind(temperature: float, with_draft: bool, plan: str) -> None:
    cases.check_every_temperature(temperature, with_draft, PLANS[plan])


@pytest.mark.parametrize("plan", ACCEPT_PLANS)
def test_draft_equal_to_target_accepts_everything(plan: str) -> None:
    cases.check_draft_equal_to_target(ACCEPT_PLANS[plan])


@pytest.mark.parametrize("plan, params", SPLIT_CASES, ids=SPLIT_IDS)
@pytest.mark.parametrize("with_draft", [True, False])
def test_long_rows_split_into_several_chunks(params: SamplingParams, with_draft: bool, plan: str) -> None:
    """V = 100 in tiles of 16 and 3 splits: several tiles per program, several programs per
    row (in both passes, or in the one pass), partials or chunk winners meeting through the
    ticket counter; called twice to check the counter resets itself."""
    chosen = cases.plan_of(5, 3, 100, params.greedy, TILED_PLANS[plan], **SHAPE)
    one_pass = plan == "one_pass"
    block = plan == "block" and not params.greedy  # greedy block verification is the two launches'
    assert chosen.structure == ("one_pass" if one_pass else "block_pass" if block else "two_launch")
    assert chosen.launches == (1 if one_pass else 3 if block else 2)
    if plan in ("lanes", "accept_once"):  # elsewhere the shape's SHAPE_PLANS entry decides (on a GPU)
        assert chosen.lanes
        assert chosen.accept_once == (plan == "accept_once" and not params.greedy)
    assert chosen.stats_splits == 3 and chosen.stats_chunk == 48
    assert params.greedy or one_pass or chosen.sample_splits == 3
    cases.check_long_rows(params, with_draft, TILED_PLANS[plan], SHAPE)


@pytest.mark.parametrize("plan, params", SPLIT_CASES, ids=SPLIT_IDS)
def test_draft_log_probs_in_place_of_its_logits(params: SamplingParams, plan: str) -> None:
    """The draft's warped log-probs passed instead of its logits (`draft_is_log_probs`: the stats pass streams
    the target's logits only, the accept test and the residual read the log-probs as given): every plan returns
    the reference's tokens, in chunks and several tiles per program, twice in a row, and the default plan at the
    whole-row shape too."""
    cases.check_draft_log_probs(params, TILED_PLANS[plan], SHAPE, whole_row=plan == "default")


@pytest.mark.parametrize("plan", RACE_PLANS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_chunk_with_an_empty_residual(plan: str, temperature: float) -> None:
    """The draft puts more mass than the target on every token of the first V-chunk, so a rejected row's
    residual max(0, p - q) is zero there: that chunk runs the fallback race over p, the others the residual
    race, and the reduction must still pick the residual's winner (as the reference does)."""
    cases.check_empty_residual_chunk(temperature, RACE_PLANS[plan])


@pytest.mark.parametrize("plan", ACCEPT_PLANS)
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7), SamplingParams(0.8, 4, 0.9)], ids=str)
@pytest.mark.parametrize("with_draft", [True, False])
def test_rows_of_several_sampling_blocks(params: SamplingParams, with_draft: bool, plan: str) -> None:
    """V = 700: three blocks of `sampling.SAMPLE_BLOCK` tokens in tiles of 256, one chunk each: every chunk races
    its blocks and then the tokens of its winning block, and the chunks' winners meet through the ticket counter
    (the reference: `sampling.block_race`). Rows 0-1 reject with no residual mass in the first chunk (the draft
    outweighs the target on all of it: that chunk runs the fallback race over p too); row 3 proposes from the
    target itself and samples the bonus."""
    shape = dict(block_b=2, block_v=SAMPLE_BLOCK, num_splits=3)
    chosen = cases.plan_of(4, 3, 700, params.greedy, ACCEPT_PLANS[plan], **shape)
    assert (chosen.stats_splits if plan == "one_pass" else chosen.sample_splits) == 3
    assert (chosen.stats_chunk if plan == "one_pass" else chosen.sample_chunk) == SAMPLE_BLOCK
    cases.check_several_blocks(params, with_draft, ACCEPT_PLANS[plan], shape)


@pytest.mark.parametrize("reshape", [True, False], ids=["reshaped", "block-by-block"])
@pytest.mark.parametrize("plan", ["default", "block"])
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7)], ids=str)
def test_tiles_of_several_blocks_sum_them_either_way(params: SamplingParams, plan: str, reshape: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampling tile of four blocks (V = 700: three of them in use, one chunk): `_block_race` sums the blocks
    from the tile reshaped (Triton >= 3.9) or block by block (older Tritons, `shims.RESHAPED_BLOCK_SUMS`); either
    way the tokens are the reference's. Compiled, only the installed Triton's way runs (a jit global is fixed)."""
    from flashspec.kernels import sample_pass

    if ON_GPU and reshape != bool(sample_pass.RESHAPE_BLOCKS):
        pytest.skip("compiled Triton runs the installed version's way only")
    monkeypatch.setattr(sample_pass, "RESHAPE_BLOCKS", tl.constexpr(reshape))
    shape = dict(block_b=2, block_v=4 * SAMPLE_BLOCK, num_splits=1)
    chosen = cases.plan_of(4, 3, 700, params.greedy, PLANS[plan], **shape)
    assert chosen.sample_block_v == 4 * SAMPLE_BLOCK and chosen.sample_splits == 1
    cases.check_several_blocks(params, True, PLANS[plan], shape)


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


def test_plan_spreads_one_long_row_over_the_gpu() -> None:
    if not ON_GPU:
        pytest.skip("the split count follows the GPU's SM count; interpreted plans use whole rows")
    plan = make_plan(1, 4, 128256, DEVICE, greedy=False)
    assert plan.block_b == 1 and plan.sample_splits >= 64 and plan.stats_splits * 5 >= 64


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("with_draft", [True, False])
def test_nan_and_inf_logits_never_give_ids_out_of_range(greedy: bool, with_draft: bool, method: str) -> None:
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
    out = fs.verify(target, draft, tokens, params, generator=0, backend="triton", validate=False, method=method)
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


@pytest.mark.parametrize("plan", ACCEPT_PLANS)
@pytest.mark.parametrize("with_draft", [True, False])
def test_device_key_gives_the_same_tokens_as_the_host_key(with_draft, plan):
    """A key held in a device tensor (what a captured CUDA graph advances between replays) draws the
    same uniforms as the host Key, on both backends (each kernel that reads the key's prefixes: the sampling
    launch, the stats launch that runs the accept test, the one pass)."""
    cases.check_device_key(with_draft, ACCEPT_PLANS[plan])


@gpu_only
@pytest.mark.parametrize("plan", TILED_PLANS)
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.6])
def test_warm_steps_launch_with_addresses_and_return_the_reference_tokens(plan: str, temperature: float,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """After a step's first launch its later steps bind raw addresses (no tensor views) to the cached binaries:
    they must say so and still return the reference's tokens, for host keys, device keys and an input whose
    data pointer is not 16-byte aligned (another launch key, so cold once more). `verify_triton` launches a warm
    step straight from its binding (`_WarmStep.launch`), with the same tokens."""
    cases.check_warm_steps(TILED_PLANS[plan], temperature, monkeypatch)


@gpu_only
@pytest.mark.parametrize("plan", PLANS)
def test_warm_steps_still_call_tritons_launch_hooks(plan: str) -> None:
    """A warm step launches its binaries without Triton's per-call path only while no launch hook is set: with
    one set (a profiler's), every launch must reach it, and the tokens stay the reference's."""
    cases.check_launch_hooks(PLANS[plan])


@gpu_only
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_captured_step_draws_new_uniforms_per_replay(plan: str, temperature: float) -> None:
    """verify_triton with a device key captured in a CUDA graph: every replay, with the key buffer advanced,
    returns the reference's tokens for that key (the prefixes are read from memory, the tickets reset
    themselves between replays), and the step makes no host sync."""
    cases.check_captured_step(PLANS[plan], temperature)




# ----------------------------------------------------------------------------- launch plans
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("vocab", [32000, 128256])
def test_gpu_plans_of_the_library_options_are_valid(gpu_planner, batch: int, vocab: int) -> None:
    """Every option the library's launch structures take gives a GPU plan within the kernels' limits, and a
    SHAPE_PLANS entry changes the default of its bucket only."""
    device = torch.device("cuda", 0)
    for residual, tunings in (("race", LIBRARY_TUNINGS), ("rejection", REJECTION_TUNINGS)):
        for overrides in tunings:
            chosen = gpu_planner.make_plan(batch, 4, vocab, device, False, tuning=tuple(sorted(overrides.items())),
                                           residual=residual)
            assert chosen.structure == ("one_pass" if residual == "rejection" else "two_launch")
            assert chosen.launches == (1 if residual == "rejection" else 2)
            assert residual == "race" or (chosen.stats_block_v % SAMPLE_BLOCK == 0  # its tiles hold whole blocks
                                          and chosen.params.stop == overrides.get("one_pass_stop", 0))
            for chunk, splits, block_v, most in [(chosen.stats_chunk, chosen.stats_splits, chosen.stats_block_v, 256),
                                                 (chosen.sample_chunk, chosen.sample_splits, chosen.sample_block_v,
                                                  1024)]:
                assert chunk % block_v == 0 and (splits - 1) * chunk < vocab <= splits * chunk and splits <= most
            assert chosen.block_s >= chosen.stats_splits and chosen.block_s2 >= chosen.sample_splits
            assert chosen.pdl == (bool(overrides.get("pdl", 0)) and residual == "race")
            assert chosen.accept_once == (bool(overrides.get("accept_once", 0)) and residual == "race")
            assert chosen.precise == bool(overrides.get("precise", 1))
    bucket, other = gpu_planner.shape_bucket(batch, vocab), gpu_planner.shape_bucket(batch * 8 + 1, vocab)
    default, other_default = (gpu_planner.make_plan(b, 4, vocab, device, False) for b in (batch, batch * 8 + 1))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(gpu_planner.SHAPE_PLANS, bucket, {"accept_once": 1, "lanes": 1})
        gpu_planner.make_plan.cache_clear()
        assert gpu_planner.make_plan(batch, 4, vocab, device, False).accept_once
        assert not gpu_planner.make_plan(batch, 4, vocab, device, True).accept_once  # greedy accepts in the sampler
        assert other == bucket or gpu_planner.make_plan(batch * 8 + 1, 4, vocab, device, False) == other_default
    gpu_planner.make_plan.cache_clear()
    assert gpu_planner.make_plan(batch, 4, vocab, device, False) == default
    with pytest.raises(ValueError, match="unknown launch-plan keys"):
        gpu_planner.make_plan(batch, 4, vocab, device, False, tuning=(("sample_tile", 1),))


def test_shape_buckets() -> None:
    from flashspec.kernels.plan import shape_bucket

    assert shape_bucket(1, 32000) == (1, 32768)
    assert shape_bucket(2, 32768) == (8, 32768)
    assert shape_bucket(9, 50000) == (64, 131072)
    assert shape_bucket(500, 256000) == (64, 131072)


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


def test_the_sampling_tile_rule_leaves_rows_per_program_alone(gpu_planner) -> None:
    """The GPU plan's rows per program follow row_tile / stats_block_v whatever the sampling tiles are (the
    check that sampling tiles hold whole blocks once reused a name and set them from another structure's tile), and
    a table's tile below one block is raised to one block; planned for an SM90 GPU on any machine."""
    device = torch.device("cuda", 0)
    wide = gpu_planner.make_plan(8, 4, 128256, device, False,
                                 tuning=(("stats_block_v", 2048), ("stats_max_tiles", 2)))
    narrow = gpu_planner.make_plan(1, 4, 32000, device, False,
                                   tuning=(("sample_block_v", 128), ("sample_max_tiles", 8)))
    assert wide.block_b == max(1, gpu_planner.GPU_PLAN["row_tile"] // 2048)
    assert narrow.sample_block_v == SAMPLE_BLOCK


# ----------------------------------------------------------------------------- the registry of launch structures
@pytest.fixture
def library_structures(monkeypatch):
    """The registry as the library alone leaves it (the lab's structures unregistered, whatever this process
    imported), restored afterwards."""
    from flashspec.kernels import one_pass, two_launch

    monkeypatch.setattr(structures, "_REGISTRY", {s.name: s for s in (two_launch.STRUCTURE, one_pass.STRUCTURE)})
    make_plan.cache_clear()
    yield structures
    make_plan.cache_clear()


def test_a_structure_that_is_not_registered_is_refused_naming_the_fix(library_structures) -> None:
    """The library registers the two launches and the one pass; a plan that names the lab's structures without the
    lab imported (`fused=True`, their keys in `tuning`) is refused with the structure's name and the import that
    registers it, in prepare_verify too, before anything launches."""
    from flashspec.kernels import prepare_verify

    assert structures.names() == ("one_pass", "two_launch")
    with pytest.raises(ValueError, match=r"'fused' is not registered.*import flashspec_lab\.kernels"):
        make_plan(2, 3, 40, DEVICE, False, fused=True)
    for key in ("fused", "coop", "cluster", "cluster_ctas"):
        with pytest.raises(ValueError, match=rf"unknown launch-plan keys \['{key}'\].*import flashspec_lab\.kernels"):
            make_plan(2, 3, 40, DEVICE, False, tuning=((key, 1),))
    params = SamplingParams(1.0)
    target, draft, tokens = make_case(2, 3, 40, params, True, torch.float32, seed=1)
    with pytest.raises(ValueError, match="'fused' is not registered"):
        prepare_verify(target, draft, tokens, params, rng.Key.from_seed(1), fused=True)
    with pytest.raises(ValueError, match="'nope' is not registered"):
        structures.get("nope")
    assert make_plan(2, 3, 40, DEVICE, False, fused=False).structure == "two_launch"


def test_a_registered_structure_is_asked_for_by_its_key_and_planned_by_its_own_function(library_structures) -> None:
    """The registry is the only place `make_plan` learns of a structure: one registered here (the two launches'
    kernels under another name, with a key of its own) is taken when its key asks for it, with the parameters its
    `plan` gives, and its launches return the reference's tokens; where its `plan` says it cannot run (greedy
    here), the default is taken. A structure must be asked for by its own key, claim new keys, and each residual
    has one default."""
    from dataclasses import replace

    from flashspec.kernels import two_launch

    def plan(context):
        return None if context.greedy else (("width", int(context.config["toy_width"])),)

    toy = replace(two_launch.STRUCTURE, name="toy", plan=plan, keys={"toy": 0, "toy_width": 4}, default=False,
                  fixes={"pdl": False})
    structures.register(toy)
    chosen = make_plan(5, 3, 100, DEVICE, False, tuning=(("toy", 1), ("toy_width", 8)))
    assert chosen.structure == "toy" and chosen.params == (("width", 8),) and chosen.launches == 2
    assert make_plan(5, 3, 100, DEVICE, True, tuning=(("toy", 1),)).structure == "two_launch"
    assert make_plan(5, 3, 100, DEVICE, False).structure == "two_launch"  # not asked for
    params = SamplingParams(0.7)
    target, draft, tokens = make_case(5, 3, 100, params, True, torch.float32, seed=4)
    assert_backends_agree(target, draft, tokens, params, 2, tuning=(("toy", 1),), **SHAPE)
    with pytest.raises(ValueError, match="asked for by the plan key of its name"):
        structures.register(replace(toy, name="toy2"))
    with pytest.raises(ValueError, match=r"plan keys \['toy_width'\] belong to another structure"):
        structures.register(replace(toy, name="toy2", keys={"toy2": 0, "toy_width": 1}))
    with pytest.raises(ValueError, match="residual 'race' has a default structure"):
        structures.register(replace(two_launch.STRUCTURE, name="other_default"))


# ----------------------------------------------------------------------------- a step's binding
LIBRARY_BINDINGS = {"default": {}, "lanes": {"tuning": (("lanes", 1),)},
                    "accept_once": {"tuning": (("accept_once", 1), ("lanes", 1))},
                    "one_pass": {"residual": "rejection"}}


def test_launch_key_determines_every_launch_specialisation() -> None:
    """The compiled launch path caches binaries under `launch_key` instead of one spec per argument; that is
    sound only if equal launch keys always mean equal specialisations (every argument's spec and every
    constexpr), arguments Triton does not specialise (`do_not_specialize`) aside. Checked over shapes, dtypes,
    misaligned inputs, temperatures, truncation, draft or none, host or device keys and the library's plans."""
    cases.check_launch_key_determines_specialisations(list(LIBRARY_BINDINGS.values()), least=50)


def test_work_layout_addresses_match_its_views_aligned_and_disjoint() -> None:
    """Once a step's binaries are cached its launches take raw addresses from `_WorkLayout.addresses` instead of
    tensor views: each address must be the data pointer of the view it replaces, every buffer 64-byte aligned
    (`launch_key` assumes it) and inside the allocation, and the buffers a plan uses must not overlap the
    outputs or each other: the two launches' partials, chunk winners where the sampling pass splits V and the
    accept outcomes of `accept_once`; the one pass's partials and block pairs."""
    def used_by(plan, greedy: bool) -> set[str]:
        used = {"part_max", "part_idx" if greedy else "part_sum"}
        if plan.structure == "one_pass":
            return used | ({"block_max", "block_sum"} if not greedy else set())  # V = 4096 spans blocks
        return used | ({"race_val", "race_idx"} if plan.sample_splits > 1 else set()) | (
            {"info"} if plan.accept_once else set())

    assert cases.check_work_layout(list(LIBRARY_BINDINGS.values()), used_by) == {"two_launch", "one_pass"}


def test_warm_binding_fills_the_arguments_the_address_binding_gives() -> None:
    """A warm step's binding (`_WarmStep`, built once from a structure's `bind` given `_Slot`s) must give every
    launch the arguments the `bind` gives with this call's raw addresses: the same grids, meta and constants,
    each input, output, work buffer and prefix at its address (or the host prefix's value)."""
    assert cases.check_warm_binding(LIBRARY_BINDINGS) == {"two_launch", "one_pass"}


def test_warm_launch_fires_each_cached_binary_with_the_calls_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_WarmStep.launch` (the warm path of `verify_triton`) must fire every launch of the step once, in order, on
    the current stream, with the grid, the constexprs and the arguments the structure's `bind` gives for this
    call's addresses (its own fresh allocation included), and return tokens and num_accepted as views of that
    allocation where the kernels write them. Cached binaries stand in as recorders here (the GPU tests run the
    real ones)."""
    cases.check_warm_launch([({}, False, False), ({"tuning": (("accept_once", 1),)}, False, True), ({}, True, False),
                             ({"residual": "rejection"}, False, False)], monkeypatch)


def test_a_prepared_step_fires_its_launches_by_name() -> None:
    """`PreparedVerify.launch(name)` fires one launch alone (the benchmark times the two launches apart): the
    stats launch and then the sample launch give `run()`'s tokens; a name the step lacks is refused with its
    launches."""
    from flashspec.kernels import prepare_verify

    params = SamplingParams(1.0)
    target, draft, tokens = make_case(3, 2, 40, params, True, torch.float32, seed=6)
    whole = prepare_verify(target, draft, tokens, params, rng.Key.from_seed(2))
    apart = prepare_verify(target, draft, tokens, params, rng.Key.from_seed(2))
    assert whole.launch_names == ("stats", "sample")
    whole.run()
    apart.launch("stats")
    apart.launch("sample")
    assert torch.equal(whole.tokens, apart.tokens) and torch.equal(whole.num_accepted, apart.num_accepted)
    assert set(whole.registers()) == {"stats", "sample"}
    with pytest.raises(ValueError, match=r"no launch 'fused' in this two_launch step; its launches: \['stats'"):
        whole.launch("fused")


def test_raw_launch_fires_what_tritons_launcher_passes_its_c_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Triton's launcher is the one `_raw_launch_call` recognises (3.9's `CudaLauncher`), a warm launch
    calls its C entry directly: with exactly the arguments the launcher's own Python wrapper passes it. A
    launcher with scratch memory, or whose wrapper calls its C entry any other way, keeps the wrapper."""
    driver_module = pytest.importorskip("triton.backends.nvidia.driver")
    from flashspec.kernels import launcher as kernels

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
