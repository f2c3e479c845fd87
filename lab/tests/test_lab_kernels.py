"""The lab's launch structures of the verify step -- the fused launch, the cooperative launch and the cluster launch
(`flashspec_lab.kernels`) -- through the library's token-for-token checks (`tests/kernel_cases.py`), their plans
and bindings, and the benchmark's dependency-chain probe (`flashspec_lab.kernels.chain_probe`).

On a machine without a GPU these run through the Triton interpreter (the root conftest sets TRITON_INTERPRET=1);
interpreted, the cooperative kernel runs as its two halves either side of the barrier and the cluster kernel's
program as one block.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashspec import rng
from flashspec.sampling import SAMPLE_BLOCK, SamplingParams

triton = pytest.importorskip("triton")

import flashspec_lab.kernels  # noqa: E402,F401  (registers fused, coop and cluster)
import kernel_cases as cases  # noqa: E402
from flashspec.kernels import make_plan, structures, verify_triton  # noqa: E402
from flashspec.kernels.shims import CLUSTERS_AVAILABLE  # noqa: E402
from kernel_cases import (DEVICE, ON_GPU, SPLIT_PARAMS, assert_backends_agree, gpu_only, gpu_planner,  # noqa: E402,F401
                          make_case)

# compiled, the cluster plan needs SM90+ and Triton >= 3.9; elsewhere its tests run the plan it falls back to
CLUSTERS_ON_DEVICE = ON_GPU and CLUSTERS_AVAILABLE and torch.cuda.get_device_capability()[0] >= 9
# the lab's structures (the cooperative and the cluster one at T > 0; greedy, their plan is the two launches)
PLANS = {"fused": {"fused": True}, "coop": {"tuning": (("coop", 1),)}, "cluster": {"tuning": (("cluster", 1),)}}
SHAPES = {"fused": dict(block_b=2, block_v=16, num_splits=3)}  # V = 100: two rows per program, three row blocks
# at T = 0 the cooperative and cluster plans are the two launches, which the library's tests run at these shapes:
# greedy cases take the fused launch alone
SAMPLED = {"coop", "cluster"}
SPLIT_CASES = [(plan, params) for plan in PLANS for params in SPLIT_PARAMS if plan not in SAMPLED or not params.greedy]
SPLIT_IDS = [f"{params}-{plan}" for plan, params in SPLIT_CASES]
TEMPERATURE_CASES = [(plan, t) for plan in PLANS for t in (0.0, 0.5, 1.0, 1.7) if plan not in SAMPLED or t > 0]
SHAPE = dict(block_b=8, block_v=16, num_splits=3)


def test_importing_the_lab_registers_its_structures() -> None:
    """`import flashspec_lab.kernels` registers the fused, cooperative and cluster launches beside the library's,
    each asked for by the plan key of its name (off by default) and adding its own keys."""
    assert {"fused", "coop", "cluster", "two_launch", "one_pass"} <= set(structures.names())
    keys = structures.plan_keys()
    assert {name: keys[name] for name in ("fused", "coop", "cluster")} == {"fused": 0, "coop": 0, "cluster": 0}
    assert {"coop_block_v", "coop_programs_per_sm", "cluster_ctas", "cluster_block_v", "cluster_warps",
            "cluster_stages"} <= set(keys)
    assert [structures.get(name).launches for name in ("fused", "coop", "cluster")] == [1, 1, 1]


@settings(max_examples=10 if ON_GPU else 20, deadline=None, derandomize=True)  # GPU: each new shape compiles
@given(
    batch=st.sampled_from([1, 3, 8]),
    gamma=st.sampled_from([1, 2, 4, 7]),
    vocab=st.sampled_from([7, 16, 50]),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    truncation=st.sampled_from([(0, 1.0), (3, 1.0), (0, 0.8), (4, 0.9)]),
    with_draft=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**40),
    plan=st.sampled_from(sorted(PLANS)),
)
def test_lab_structures_equal_the_torch_reference(batch, gamma, vocab, temperature, truncation, with_draft, dtype,
                                                  seed, plan):
    params = SamplingParams(temperature, *truncation)
    target, draft, tokens = make_case(batch, gamma, vocab, params, with_draft, dtype, seed % 10_000)
    assert_backends_agree(target, draft, tokens, params, seed, **PLANS[plan])


@pytest.mark.parametrize("plan, temperature", TEMPERATURE_CASES)
@pytest.mark.parametrize("with_draft", [True, False])
def test_every_temperature_and_proposal_kind(temperature: float, with_draft: bool, plan: str) -> None:
    cases.check_every_temperature(temperature, with_draft, PLANS[plan])


@pytest.mark.parametrize("plan", PLANS)
def test_draft_equal_to_target_accepts_everything(plan: str) -> None:
    cases.check_draft_equal_to_target(PLANS[plan])


@pytest.mark.parametrize("plan, params", SPLIT_CASES, ids=SPLIT_IDS)
@pytest.mark.parametrize("with_draft", [True, False])
def test_long_rows_split_into_several_chunks(params: SamplingParams, with_draft: bool, plan: str) -> None:
    """V = 100 in tiles of 16 and 3 splits: several tiles per program, several programs per row, partials or chunk
    winners meeting through the ticket counter (the cooperative launch: its barrier; the cluster launch: on chip);
    called twice to check the counters reset themselves. Two rows per program in the fused launch: three row
    blocks, each with its own ticket."""
    shape = SHAPES.get(plan, SHAPE)
    chosen = cases.plan_of(5, 3, 100, params.greedy, PLANS[plan], **shape)
    coop = plan == "coop" and not params.greedy
    cluster = plan == "cluster" and not params.greedy and (not ON_GPU or CLUSTERS_ON_DEVICE)
    expected = "fused" if plan == "fused" else "coop" if coop else "cluster" if cluster else "two_launch"
    assert chosen.structure == expected and chosen.launches == (2 if expected == "two_launch" else 1)
    assert not coop or (chosen.params.splits == 3 and chosen.params.chunk == 48)
    assert not cluster or chosen.params.block_v == 16  # a whole row per program, in seven tiles
    assert plan != "fused" or (chosen.params.splits == 3 and chosen.params.chunk == 48)
    assert chosen.stats_splits == 3 and chosen.stats_chunk == 48
    cases.check_long_rows(params, with_draft, PLANS[plan], shape)


@pytest.mark.parametrize("plan, params", SPLIT_CASES, ids=SPLIT_IDS)
def test_draft_log_probs_in_place_of_its_logits(params: SamplingParams, plan: str) -> None:
    """The draft's warped log-probs passed instead of its logits: the reference's tokens, in chunks and several
    tiles per program, twice in a row, and for rows shifted off one (read as given)."""
    cases.check_draft_log_probs(params, PLANS[plan], SHAPES.get(plan, SHAPE), whole_row=False)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_chunk_with_an_empty_residual(plan: str, temperature: float) -> None:
    """A first V-chunk with no residual mass: that chunk races p, the others the residual, and the reduction
    picks the residual's winner (as the reference does)."""
    cases.check_empty_residual_chunk(temperature, PLANS[plan])


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7), SamplingParams(0.8, 4, 0.9)], ids=str)
@pytest.mark.parametrize("with_draft", [True, False])
def test_rows_of_several_sampling_blocks(params: SamplingParams, with_draft: bool, plan: str) -> None:
    """V = 700: three blocks of `sampling.SAMPLE_BLOCK` tokens in tiles of 256 (the two-level race of
    `sampling.block_race`), rows rejecting with no residual mass in the first block and a row sampling the
    bonus."""
    cases.check_several_blocks(params, with_draft, PLANS[plan], dict(block_b=2, block_v=SAMPLE_BLOCK, num_splits=3))


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("with_draft", [True, False])
def test_device_key_gives_the_same_tokens_as_the_host_key(with_draft: bool, plan: str) -> None:
    cases.check_device_key(with_draft, PLANS[plan])


@pytest.mark.parametrize("one_launch, params", [case for case in SPLIT_CASES if case[0] != "cluster"],
                         ids=[name for case, name in zip(SPLIT_CASES, SPLIT_IDS) if case[0] != "cluster"])
@pytest.mark.parametrize("with_draft", [True, False])
def test_one_launch_gives_the_two_launches_tokens(params: SamplingParams, with_draft: bool, one_launch: str) -> None:
    """Same V-splits, same partials, same race: the fused launch and the cooperative one return the two
    launches' tokens bit for bit, on rows that reject at every position and rows that accept everything."""
    target, draft, tokens = make_case(4, 3, 100, params, with_draft, torch.float32, seed=5)
    if with_draft:  # rows 2-3 propose from the target itself: every draft accepted, the bonus sampled
        draft = draft.clone()
        draft[2:] = target[2:, :3]
    for seed in (3, 4):
        key = rng.key_from_generator(seed)
        two = verify_triton(target, draft, tokens, params, key, block_v=16, num_splits=4, fused=False)
        one = verify_triton(target, draft, tokens, params, key, block_v=16, num_splits=4, **PLANS[one_launch])
        assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1]), (one, two)


@gpu_only
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.6])
def test_warm_steps_launch_with_addresses_and_return_the_reference_tokens(plan: str, temperature: float,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    cases.check_warm_steps(PLANS[plan], temperature, monkeypatch)


@gpu_only
@pytest.mark.parametrize("plan", PLANS)
def test_warm_steps_still_call_tritons_launch_hooks(plan: str) -> None:
    cases.check_launch_hooks(PLANS[plan])


@gpu_only
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_captured_step_draws_new_uniforms_per_replay(plan: str, temperature: float) -> None:
    cases.check_captured_step(PLANS[plan], temperature)


@gpu_only
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.0), SamplingParams(0.7, top_p=0.9)], ids=str)
@pytest.mark.parametrize("log_probs", [False, True], ids=["draft logits", "draft log-probs"])
def test_the_fused_launch_makes_no_host_sync(params: SamplingParams, log_probs: bool) -> None:
    """Zero host syncs inside the fused launch's step (as tests/test_verify.py checks the library's), given the
    draft's logits or its log-probs; torch raises on any synchronising call."""
    target, draft, tokens = make_case(8, 4, 32000, SamplingParams(1.0), True, torch.float32, seed=1)
    if log_probs:
        draft = torch.log_softmax(draft, dim=-1)

    def call(seed: int) -> torch.Tensor:
        return verify_triton(target, draft, tokens, params, rng.Key.from_seed(seed), fused=True,
                             draft_is_log_probs=log_probs)[0]

    call(0)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = call(1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert out.is_cuda


# ----------------------------------------------------------------------------- plans
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("vocab", [32000, 128256])
def test_gpu_plans_of_every_benchmark_variant_are_valid(gpu_planner, batch: int, vocab: int) -> None:
    """Every launch-plan variant the benchmark times gives a plan within the kernels' limits, on every
    structure, and a SHAPE_PLANS entry naming a lab structure changes the default of its bucket only."""
    from flashspec_lab.bench import PLAN_VARIANTS, _variant_options, is_rejection

    device = torch.device("cuda", 0)
    for overrides in PLAN_VARIANTS.values():
        options = _variant_options(overrides)
        chosen = gpu_planner.make_plan(batch, 4, vocab, device, False, tuning=options["tuning"],
                                       residual=options["residual"])
        own = chosen.params
        assert (chosen.structure == "one_pass") == is_rejection(overrides)
        assert chosen.structure != "one_pass" or chosen.stats_block_v % SAMPLE_BLOCK == 0  # whole blocks per tile
        assert (chosen.structure == "fused") == bool(overrides.get("fused", 0))
        capacity = 132 * overrides.get("coop_programs_per_sm", 1)
        assert (chosen.structure == "coop") == (bool(overrides.get("coop", 0)) and batch <= capacity)
        chunks = [(chosen.stats_chunk, chosen.stats_splits, chosen.stats_block_v, 256),
                  (chosen.sample_chunk, chosen.sample_splits, chosen.sample_block_v, 1024)]
        if chosen.structure == "fused":
            chunks.append((own.chunk, own.splits, chosen.stats_block_v, 256))
            assert own.block_s >= own.splits
        if chosen.structure == "coop":  # its whole grid resident at once: at most the SMs' share it was given
            chunks.append((own.chunk, own.splits, own.block_v, 256))
            assert batch * own.splits <= capacity and own.block_s >= own.splits
        for chunk, splits, block_v, most in chunks:
            assert chunk % block_v == 0 and (splits - 1) * chunk < vocab <= splits * chunk and splits <= most
        assert chosen.block_s >= chosen.stats_splits
        assert (chosen.structure == "cluster") == bool(overrides.get("cluster", 0))
        if chosen.structure == "cluster":  # a program per row, its tile split evenly over its cluster's blocks
            assert own.ctas == overrides["cluster_ctas"]
            per_block = overrides.get("cluster_block_v", structures.get("cluster").keys["cluster_block_v"])
            assert own.block_v == per_block * own.ctas
        assert chosen.launches == (2 if chosen.structure == "two_launch" else 1)
        assert chosen.pdl == (bool(overrides.get("pdl", 0)) and chosen.launches == 2)
    default = gpu_planner.make_plan(batch, 4, vocab, device, False)
    assert default.structure == "two_launch"  # an empty SHAPE_PLANS runs GPU_PLAN: two launches
    bucket = gpu_planner.shape_bucket(batch, vocab)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(gpu_planner.SHAPE_PLANS, bucket, {"fused": 1})
        gpu_planner.make_plan.cache_clear()
        assert gpu_planner.make_plan(batch, 4, vocab, device, False).structure == "fused"
        assert gpu_planner.make_plan(batch, 4, vocab, device, False, fused=False).structure == "two_launch"
        other = gpu_planner.shape_bucket(batch * 8 + 1, vocab)
        assert other == bucket or gpu_planner.make_plan(batch * 8 + 1, 4, vocab, device, False).structure != "fused"
        patch.setitem(gpu_planner.SHAPE_PLANS, bucket, {"coop": 1})
        gpu_planner.make_plan.cache_clear()
        assert gpu_planner.make_plan(batch, 4, vocab, device, False).structure == "coop"
        assert gpu_planner.make_plan(batch, 4, vocab, device, False, fused=False).structure == "two_launch"
        assert gpu_planner.make_plan(batch, 4, vocab, device, True).structure == "two_launch"  # greedy samples nothing
    gpu_planner.make_plan.cache_clear()
    # 133 rows do not fit 132 SMs at one program each: two launches
    assert gpu_planner.make_plan(133, 4, vocab, device, False, tuning=(("coop", 1),)).structure == "two_launch"
    assert gpu_planner.make_plan(133, 4, vocab, device, False,
                                 tuning=(("coop", 1), ("coop_programs_per_sm", 2))).structure == "coop"
    with pytest.raises(ValueError, match="cluster_ctas=3"):
        gpu_planner.make_plan(batch, 4, vocab, device, False, tuning=(("cluster", 1), ("cluster_ctas", 3)))


def test_several_structures_asked_for_take_the_first_that_runs(gpu_planner) -> None:
    """Asked for together, the fused launch comes first, then the cluster launch, then the cooperative one; each
    that cannot run at the shape (greedy; a grid that does not fit; no clusters on the GPU) gives way to the next,
    and finally to the two launches."""
    device = torch.device("cuda", 0)
    every = (("cluster", 1), ("coop", 1), ("fused", 1))
    assert gpu_planner.make_plan(8, 4, 32000, device, False, tuning=every).structure == "fused"
    assert gpu_planner.make_plan(8, 4, 32000, device, False, tuning=every[:2]).structure == "cluster"
    assert gpu_planner.make_plan(8, 4, 32000, device, True, tuning=every[:2]).structure == "two_launch"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gpu_planner, "_has_clusters", lambda index: False)
        gpu_planner.make_plan.cache_clear()
        assert gpu_planner.make_plan(8, 4, 32000, device, False, tuning=every[:2]).structure == "coop"
        assert gpu_planner.make_plan(133, 4, 32000, device, False, tuning=every[:2]).structure == "two_launch"
    gpu_planner.make_plan.cache_clear()


def test_greedy_steps_of_the_sampled_structures_are_the_two_launches() -> None:
    """At T = 0 the cooperative and cluster plans are the two launches (the greedy sampler streams nothing), so
    the token checks above run them at T > 0 only; the fused launch has a greedy program of its own."""
    for name in ("coop", "cluster"):
        greedy = make_plan(5, 3, 100, DEVICE, True, **SHAPE, tuning=((name, 1),))
        assert greedy == make_plan(5, 3, 100, DEVICE, True, **SHAPE)
        assert make_plan(5, 3, 100, DEVICE, False, **SHAPE, tuning=((name, 1),)).structure == (
            name if name == "coop" or not ON_GPU or CLUSTERS_ON_DEVICE else "two_launch")
    assert make_plan(5, 3, 100, DEVICE, True, **SHAPE, fused=True).structure == "fused"


# ----------------------------------------------------------------------------- a step's binding
LAB_BINDINGS = {"fused": {"fused": True}, "coop": {"tuning": (("coop", 1),)}, "cluster": {"tuning": (("cluster", 1),)}}


def test_launch_key_determines_every_launch_specialisation() -> None:
    """Equal launch keys mean equal specialisations for the lab's structures too (`kernel_cases`)."""
    cases.check_launch_key_determines_specialisations(list(LAB_BINDINGS.values()), least=50)


def test_work_layout_addresses_match_its_views_aligned_and_disjoint() -> None:
    """The lab's structures' buffers in the step's one allocation: the fused launch's partials, the cooperative
    launch's partials and chunk winners, none for the cluster launch (its blocks meet on chip); greedy, the
    cooperative and cluster plans are the two launches'."""
    def used_by(plan, greedy: bool) -> set[str]:
        partials = {"part_max", "part_idx" if greedy else "part_sum"}
        race = {"race_val", "race_idx"}
        return {"fused": partials, "coop": partials | race, "cluster": set(),
                "two_launch": partials | (race if plan.sample_splits > 1 else set())}[plan.structure]

    assert cases.check_work_layout(list(LAB_BINDINGS.values()), used_by) == {"fused", "coop", "cluster", "two_launch"}


def test_warm_binding_fills_the_arguments_the_address_binding_gives() -> None:
    assert {"fused", "coop", "cluster"} <= cases.check_warm_binding(LAB_BINDINGS)


def test_warm_launch_fires_each_cached_binary_with_the_calls_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    cases.check_warm_launch([({"tuning": (("coop", 1),)}, False, False), ({"fused": True}, True, True),
                             ({"tuning": (("cluster", 1),)}, False, True)], monkeypatch)


# ----------------------------------------------------------------------------- the dependency-chain probe
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
    assert (plan.structure == "coop") == coop
    step = chain_step(logits, plan)
    if coop:
        starts, width = range(0, vocab, plan.params.chunk), plan.params.block_v
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
