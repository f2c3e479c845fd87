"""The checks every launch structure of the verify kernels passes, shared by the library's kernel tests
(`tests/test_kernels.py`: the two launches and the one pass) and the lab's (`lab/tests/test_lab_kernels.py`: the
fused, cooperative and cluster launches). Each `check_*` runs one test's body under the plan options it is given
(`verify_triton`'s `fused` / `tuning` / `residual` keywords); the test modules parametrise them over their plans.

"Exactly" holds up to ties in floating-point rounding: the kernels compute log-sum-exp in a different order than
torch, so a decision that sits within ~1e-7 of its threshold could in principle flip -- with random inputs that has
probability ~1e-6 per decision, and none of the fixed seeds here hits one.
"""
from __future__ import annotations

import inspect
import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

import flashspec as fs
from flashspec import rng
from flashspec.sampling import SAMPLE_BLOCK, SamplingParams, warp_logits

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
gpu_only = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU (compiled Triton)")
SPLIT_PARAMS = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7), SamplingParams(0.8, 4, 0.9)]


def _measured_entries() -> list[dict]:
    from flashspec.kernels.plan import SHAPE_PLANS_BY_TRITON

    return [dict(entry) for table in SHAPE_PLANS_BY_TRITON.values() for entry in table.values()]


# the options the library's structures take on a GPU: every measured table's entries, the two launches' options
# one at a time, and the one pass of residual="rejection" at a few stats grids (its diagnostic stops included)
LIBRARY_TUNINGS = [
    *_measured_entries(),
    {"lanes": 1}, {"accept_once": 1, "lanes": 1}, {"pdl": 1}, {"accept_once": 1, "lanes": 1, "pdl": 1},
    {"stats_lane_elems": 0}, {"precise": 0}, {"stats_max_tiles": 1}, {"stats_block_v": 8192},
    {"programs_per_sm": 8}, {"sample_block_v": 128, "sample_max_tiles": 8},
]
REJECTION_TUNINGS = [{}, {"stats_max_tiles": 1}, {"stats_block_v": 2048, "stats_max_tiles": 2}, {"one_pass_stop": 1},
                     {"one_pass_stop": 2}]


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


def reference_options(options: dict) -> dict:
    """The reference's keywords for a plan's options: its residual sampler and its verification method."""
    return {"residual": options.get("residual", "race"), "method": options.get("method", "token")}


def sampler_of(options: dict, greedy: bool) -> str:
    """The structures' sampler key `make_plan` takes for a plan's options (`flashspec.kernels.verify`'s mapping)."""
    return "block" if options.get("method") == "block" and not greedy else options.get("residual", "race")


def warm_options_of(options: dict, greedy: bool) -> tuple:
    """`kstep.warm_options` for a plan's options, as `verify_triton` keys its bindings (method folded into the
    sampler key)."""
    from flashspec.kernels import step as kstep

    plan = {name: value for name, value in options.items() if name not in ("method", "residual")}
    return kstep.warm_options(**plan, residual=sampler_of(options, greedy))


def assert_backends_agree(target, draft, tokens, params, seed, draft_is_log_probs=False, validate=None,
                          **plan) -> fs.VerifyOutput:
    """The Triton backend's tokens and counts equal the reference's (`fs.verify`'s default plan, or
    `verify_triton` under `plan`'s options), for the generator `seed`; returns the reference's output."""
    from flashspec.kernels import verify_triton

    expected = fs.verify(target, draft, tokens, params, generator=seed, backend="torch",
                         draft_is_log_probs=draft_is_log_probs, validate=validate,
                         **reference_options(plan))
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


def plan_of(batch: int, gamma: int, vocab: int, greedy: bool, options: dict, **shape):
    """`make_plan` on the test device under a test's plan options and forced shape."""
    from flashspec.kernels import make_plan

    return make_plan(batch, gamma, vocab, DEVICE, greedy, shape.get("block_b"), shape.get("block_v"),
                     shape.get("num_splits"), options.get("fused"), options.get("tuning"),
                     sampler_of(options, greedy))


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


@pytest.fixture
def t4_planner(monkeypatch):
    """`make_plan`'s GPU branch for a Colab T4: 40 SMs, compute capability 7.5 (so no programmatic dependent
    launch and no thread-block clusters, decided by the planner's own capability checks)."""
    from flashspec.kernels import plan as plan_module

    monkeypatch.setattr(plan_module, "interpreting", lambda: False)
    monkeypatch.setattr(plan_module, "_num_sms", lambda index: 40)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (7, 5))
    plan_module.make_plan.cache_clear()
    yield plan_module
    plan_module.make_plan.cache_clear()


# ----------------------------------------------------------------------------- token-for-token checks
def check_every_temperature(temperature: float, with_draft: bool, options: dict) -> None:
    params = SamplingParams(temperature)
    target, draft, tokens = make_case(8, 4, 33, params, with_draft, torch.float32, seed=int(temperature * 10) + with_draft)
    assert_backends_agree(target, draft, tokens, params, seed=11, **options)


def check_draft_equal_to_target(options: dict) -> None:
    params = SamplingParams(1.0)
    target, _, tokens = make_case(8, 4, 33, params, False, torch.float32, seed=3)
    tokens = torch.multinomial(warp_logits(target[:, :4].cpu(), params).exp().reshape(-1, 33), 1).view(8, 4).to(DEVICE)
    out = assert_backends_agree(target, target[:, :4].clone(), tokens, params, seed=5, **options)
    assert bool((out.num_accepted == 4).all())


def check_long_rows(params: SamplingParams, with_draft: bool, options: dict, shape: dict) -> None:
    """V = 100 in tiles of 16 and 3 splits, called twice (the tickets reset themselves)."""
    target, draft, tokens = make_case(5, 3, 100, params, with_draft, torch.float32, seed=21)
    for seed in (1, 2):
        assert_backends_agree(target, draft, tokens, params, seed, **shape, **options)


def check_draft_log_probs(params: SamplingParams, options: dict, shape: dict, whole_row: bool) -> None:
    """The draft's warped log-probs in place of its logits, in chunks, twice; rows shifted off one read as given;
    `whole_row`: the default plan at the whole-row shape too."""
    target, draft, tokens = make_case(5, 3, 100, params, True, torch.float32, seed=23)
    log_q = warp_logits(draft, params)  # what the draft sampled from
    rejected = False
    for seed in (1, 2):
        out = assert_backends_agree(target, log_q, tokens, params, seed, draft_is_log_probs=True, **shape, **options)
        rejected |= bool((out.num_accepted < 3).any())
    assert rejected or params.greedy  # a residual was drawn from the given log-probs
    # read as given, never normalised again: rows shifted off one (what no caller should pass, so the API's
    # value check is off here) give the reference's tokens for those very rows
    assert_backends_agree(target, log_q - 2.0, tokens, params, 4, draft_is_log_probs=True, validate=False, **shape,
                          **options)
    if whole_row:
        assert_backends_agree(target, log_q, tokens, params, 3, draft_is_log_probs=True)


def check_empty_residual_chunk(temperature: float, options: dict) -> None:
    """Chunk 0 of 3 has no residual mass (q > p on all of it): it races p, the others the residual."""
    params = SamplingParams(temperature)
    target, draft, _ = make_case(6, 3, 100, params, True, torch.float32, seed=13)
    draft = target[:, :3].clone()
    draft[:, :, :48] += 4.0  # chunk 0 of 3 (48 columns): q > p on all of it
    tokens = torch.multinomial(warp_logits(draft.cpu(), params).exp().reshape(-1, 100), 1,
                               generator=torch.Generator().manual_seed(1)).view(6, 3).to(DEVICE)
    for seed in (1, 2, 3):
        out = assert_backends_agree(target, draft, tokens, params, seed, block_b=8, block_v=16, num_splits=3,
                                    **options)
    assert bool((out.num_accepted < 3).any())  # some row rejected: the residual races ran


def several_blocks_case(params: SamplingParams, with_draft: bool):
    """V = 700 (three sampling blocks): rows 0-1 reject with no residual mass in the first block, row 3 proposes
    from the target itself."""
    target, draft, tokens = make_case(4, 3, 700, params, with_draft, torch.float32, seed=17)
    if with_draft:
        draft = draft.clone()
        draft[:2, :, :SAMPLE_BLOCK] += 4.0
        draft[3] = target[3, :3]
        tokens = torch.multinomial(warp_logits(draft.cpu(), params).exp().reshape(-1, 700), 1,
                                   generator=torch.Generator().manual_seed(2)).view(4, 3).to(DEVICE)
    return target, draft, tokens


def check_several_blocks(params: SamplingParams, with_draft: bool, options: dict, shape: dict) -> None:
    """Two seeds (the tickets reset between them), some row rejecting."""
    target, draft, tokens = several_blocks_case(params, with_draft)
    rejected = False
    for seed in (1, 2):
        out = assert_backends_agree(target, draft, tokens, params, seed, **shape, **options)
        rejected |= bool((out.num_accepted < 3).any())
    assert rejected


def check_device_key(with_draft: bool, options: dict) -> None:
    """A device key draws the host key's uniforms on both backends, with or without precomputed prefixes."""
    from flashspec.kernels import rng as krng
    from flashspec.kernels import verify_triton
    from flashspec.kernels.verify import device_prefixes
    from flashspec.verify import verify_reference

    generator = torch.Generator().manual_seed(3)
    batch, gamma, vocab = 6, 3, 11
    target = (torch.randn(batch, gamma + 1, vocab, generator=generator) * 2).to(DEVICE)
    draft = (torch.randn(batch, gamma, vocab, generator=generator) * 2).to(DEVICE) if with_draft else None
    tokens = torch.randint(0, vocab, (batch, gamma), generator=generator).to(DEVICE)
    params = fs.SamplingParams(temperature=0.8)
    for step in range(3):
        key = rng.step_key_host(rng.Key.from_seed(99), step)
        device_key = rng.step_key(rng.key_tensor(rng.Key.from_seed(99), DEVICE), torch.tensor([step], device=DEVICE))
        expected = verify_reference(target, draft, tokens, params, key, **reference_options(options))
        by_device = verify_reference(target, draft, tokens, params, device_key, **reference_options(options))
        tokens_t, accepted_t = verify_triton(target, draft, tokens, params, device_key, **options)
        assert torch.equal(expected.tokens, by_device.tokens)
        assert torch.equal(expected.tokens, tokens_t) and torch.equal(expected.num_accepted, accepted_t)
        # the fast path computes the stream prefixes in its own (compiled) step prologue
        prefixes = device_prefixes(device_key)
        assert prefixes.tolist() == [krng.as_int32(krng.stream_prefix(key, stream))
                                     for stream in (rng.STREAM_ACCEPT, rng.STREAM_SAMPLE)]
        tokens_p, accepted_p = verify_triton(target, draft, tokens, params, device_key, prefixes=prefixes, **options)
        assert torch.equal(tokens_p, tokens_t) and torch.equal(accepted_p, accepted_t)


# ----------------------------------------------------------------------------- compiled (GPU) launch path
def check_warm_steps(options: dict, temperature: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Later steps bind raw addresses to the cached binaries and still return the reference's tokens, for host and
    device keys and a misaligned input; `verify_triton` launches them straight from the binding."""
    from flashspec.kernels import prepare_verify, verify_triton
    from flashspec.kernels import step as kstep
    from flashspec.kernels.verify import device_prefixes
    from flashspec.verify import verify_reference

    params = SamplingParams(temperature)
    target, draft, tokens = make_case(8, 4, 32000, params, True, torch.bfloat16, seed=11)
    shifted = torch.cat([target.reshape(-1), target.reshape(-1)[:1]])[1:].view(target.shape)
    launched = []
    straight = kstep._WarmStep.launch
    monkeypatch.setattr(kstep._WarmStep, "launch", lambda *call: launched.append(1) or straight(*call))
    for logits in (target, shifted):
        for device_key in (False, True):
            # cold; then by address, keeping the binding; then that binding, with other keys
            for call, seed in enumerate((5, 5, 6, 7)):
                key = rng.key_tensor(rng.Key.from_seed(seed), DEVICE) if device_key else rng.Key.from_seed(seed)
                expected = verify_reference(logits, draft, tokens, params, rng.Key.from_seed(seed), **reference_options(options))
                prepared = prepare_verify(logits, draft, tokens, params, key, **options)
                out_tokens, out_accepted = prepared.run()
                assert torch.equal(out_tokens, expected.tokens) and torch.equal(out_accepted, expected.num_accepted)
                launched.clear()
                out_tokens, out_accepted = verify_triton(logits, draft, tokens, params, key, **options)
                assert torch.equal(out_tokens, expected.tokens) and torch.equal(out_accepted, expected.num_accepted)
                # the first call compiled (cold), the first verify_triton bound the step; the later ones reuse it
                assert launched or call == 0, "a warm verify_triton call should launch straight from its binding"
            assert all(isinstance(arg, int) for arg in prepared.launches[-1].args[:3]), \
                "a warm step should bind addresses"
            warm_key = kstep._warm_key(logits, draft, tokens, params, device_prefixes(key) if device_key else None,
                                       warm_options_of(options, params.greedy))
            assert warm_key in kstep._WARM_STEPS, "the later steps should reuse one binding"
            assert prepared.direct, "a warm step should launch its cached binaries directly"
    # a strided input is copied inside prepare_verify and bound by address: the step must keep the copy alive
    expected = verify_reference(target, draft, tokens, params, rng.Key.from_seed(5), **reference_options(options))
    strided = torch.stack([target, torch.zeros_like(target)], dim=-1)[..., 0]
    prepared = prepare_verify(strided, draft, tokens, params, rng.Key.from_seed(5), **options)
    del strided
    junk = [torch.full_like(target, 7.0) for _ in range(4)]  # reuses any block the step let go
    out_tokens, out_accepted = prepared.run()
    assert torch.equal(out_tokens, expected.tokens) and torch.equal(out_accepted, expected.num_accepted)
    del junk


def check_launch_hooks(options: dict) -> None:
    """With a launch hook set, every launch of a warm step reaches it; the tokens stay the reference's."""
    import triton

    from flashspec.kernels import prepare_verify, verify_triton
    from flashspec.verify import verify_reference

    params = SamplingParams(1.0)
    target, draft, tokens = make_case(8, 4, 32000, params, True, torch.bfloat16, seed=3)
    for _ in range(3):
        prepare_verify(target, draft, tokens, params, rng.Key.from_seed(1), **options).run()
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
        prepared = prepare_verify(target, draft, tokens, params, rng.Key.from_seed(1), **options)
        assert prepared.direct
        out_tokens, _ = prepared.run()
        straight_tokens, _ = verify_triton(target, draft, tokens, params, rng.Key.from_seed(1), **options)
        torch.cuda.synchronize()
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            runtime.launch_enter_hook = chain
    assert len(seen) == 2 * prepared.plan.launches, "both the prepared step and verify_triton must feed the hook"
    expected = verify_reference(target, draft, tokens, params, rng.Key.from_seed(1),
                                **reference_options(options)).tokens
    assert torch.equal(out_tokens, expected) and torch.equal(straight_tokens, expected)


def check_captured_step(options: dict, temperature: float) -> None:
    """A step captured in a CUDA graph with a device key: each replay, the key advanced, gives the reference's
    tokens for that key, and the step makes no host sync."""
    from flashspec.kernels import verify_triton
    from flashspec.verify import verify_reference

    params = SamplingParams(temperature)
    target, draft, tokens = make_case(4, 4, 32000, params, True, torch.float32, seed=8)
    base = rng.key_tensor(rng.Key.from_seed(7), DEVICE)
    step = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    key = rng.step_key(base, step)

    def verify_step():
        return verify_triton(target, draft, tokens, params, key, **options)

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
                                    **reference_options(options))
        assert torch.equal(out_tokens, expected.tokens) and torch.equal(out_accepted, expected.num_accepted)


# ----------------------------------------------------------------------------- a step's binding (nothing runs)
def check_launch_key_determines_specialisations(plans: list[dict], least: int) -> None:
    """Equal launch keys always mean equal specialisations (every argument's spec and every constexpr), arguments
    Triton does not specialise aside, over shapes, dtypes, misaligned inputs, temperatures, truncation, draft or
    none, host or device keys and `plans`; at least `least` distinct (kernel, key) entries seen."""
    from flashspec.kernels import prepare_verify
    from flashspec.kernels.launcher import _Launcher

    free = {"accept_prefix", "sample_prefix"}  # the kernels' do_not_specialize arguments (ints, int32 always)

    def specialisation(launch):
        names = list(inspect.signature(launch.launcher.kernel.fn).parameters)
        kept = tuple(a for name, a in zip(names, launch.args) if name not in free or isinstance(a, torch.Tensor))
        return launch.launcher.kernel.fn.__name__, _Launcher.spec_key(kept, launch.meta)

    seen: dict = {}
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
            for launch in prepared.launches:
                spec = specialisation(launch)
                entry = (launch.launcher.kernel.fn.__name__, prepared.key)
                assert seen.setdefault(entry, spec) == spec, (entry, spec, seen[entry])
    assert len(seen) > least, len(seen)


def check_work_layout(plans: list[dict], used_by) -> set[str]:
    """Each address of `_WorkLayout.addresses` is its view's data pointer, 64-byte aligned, inside the allocation;
    the buffers a plan uses (`used_by(plan, greedy)`) overlap neither the outputs nor each other. Returns the
    structures seen."""
    from flashspec.kernels import make_plan
    from flashspec.kernels.step import _work_layout

    structures = set()
    for batch, gamma, splits, greedy, options in itertools.product([1, 5, 64], [1, 4], [1, 3], [False, True], plans):
        # the layout is a pure function of the plan: planned for the CPU's interpreter
        plan = make_plan(batch, gamma, 4096, torch.device("cpu"), greedy, None, None, splits, options.get("fused"),
                         options.get("tuning"), sampler_of(options, greedy))
        structures.add(plan.structure)
        layout = _work_layout(batch, gamma, plan, greedy, 4096)
        memory = torch.empty(layout.words // 2, dtype=torch.int64)
        base, end = memory.data_ptr(), memory.data_ptr() + memory.numel() * 8
        views, addresses = layout.views(memory), layout.addresses(base)
        assert views.keys() == addresses.keys()
        used = used_by(plan, greedy)
        spans = [(0, (batch * (gamma + 1)) * 8), (layout.accepted * 4, layout.accepted * 4 + batch * 8)]
        for name, view in views.items():
            assert view.data_ptr() == addresses[name] and (addresses[name] - base) % 64 == 0, name
            assert base <= view.data_ptr() and view.data_ptr() + view.numel() * 4 <= end, name
            if name in used:
                spans.append((view.data_ptr() - base, view.data_ptr() - base + view.numel() * 4))
        spans.sort()
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans
    return structures


def _slot_binding(plan, layout, shape, flags, in_memory: bool, device: torch.device) -> tuple:
    """A structure's launches bound to `_Slot`s (what `prepare_verify` caches as a warm step)."""
    from flashspec.kernels import step as kstep
    from flashspec.kernels import structures

    slot = kstep._Slot
    return structures.get(plan.structure).bind(
        plan, (slot(kstep._TARGET), slot(kstep._DRAFT), slot(kstep._TOKENS)),
        (slot(kstep._BASE), slot(kstep._BASE, 4 * layout.accepted)),
        {field: slot(kstep._BASE, 4 * offset) for field, offset, _, _ in layout.fields},
        shape, 0.5, flags, (slot(kstep._ACCEPT), slot(kstep._SAMPLE), in_memory), device, True)


def check_warm_binding(plans: dict[str, dict]) -> set[str]:
    """A warm step's binding (`_WarmStep`) gives every launch the arguments its structure's `bind` gives with this
    call's raw addresses: the same names, grids, meta and constants, each input, output, work buffer and prefix at
    its address (or the host prefix's value). Returns the structures seen (planned for the CPU's interpreter)."""
    from flashspec.kernels import make_plan, structures
    from flashspec.kernels import step as kstep
    from flashspec.kernels.shims import SCALE_MULTIPLY

    device = torch.device("cpu")
    seen = set()
    for name, batch, splits, greedy, in_memory in itertools.product(plans, [1, 5], [1, 3], [False, True],
                                                                    [False, True]):
        gamma, vocab = 4, 4096
        options = plans[name]
        plan = make_plan(batch, gamma, vocab, device, greedy, None, None, splits, options.get("fused"),
                         options.get("tuning"), sampler_of(options, greedy))
        seen.add(plan.structure)
        layout = kstep._work_layout(batch, gamma, plan, greedy, vocab)
        shape, flags = (batch, gamma, vocab), dict(SCALE_MODE=SCALE_MULTIPLY, HAS_DRAFT=not greedy, GREEDY=greedy)
        target, draft = torch.zeros(batch, gamma + 1, vocab), torch.zeros(batch, gamma + 1, vocab)
        tokens = torch.zeros(batch, gamma, dtype=torch.int64)
        memory = torch.empty(layout.words // 2, dtype=torch.int64)
        prefixes = torch.zeros(2, dtype=torch.int32)
        accept, sample = (prefixes.data_ptr(), prefixes.data_ptr() + 4) if in_memory else (-123457, 98765)
        outputs = (memory[:batch * (gamma + 1)].view(batch, gamma + 1),
                   memory[layout.accepted // 2:layout.accepted // 2 + batch])
        bound = structures.get(plan.structure).bind(
            plan, (target.data_ptr(), draft.data_ptr(), tokens.data_ptr()), outputs,
            layout.addresses(memory.data_ptr()), shape, 0.5, flags, (accept, sample, in_memory), device, True)
        template = _slot_binding(plan, layout, shape, flags, in_memory, device)
        warm = kstep._WarmStep.from_launches(plan, 7, template, not greedy, layout.words, layout.accepted, batch,
                                             gamma)
        filled = warm.filled((target.data_ptr(), draft.data_ptr(), tokens.data_ptr(), memory.data_ptr(), accept,
                              sample))
        assert filled and len(filled) == len(bound) == plan.launches
        for got, want in zip(filled, bound):
            expected = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in want.args)
            assert got.args == expected, (name, want.name)
            assert (got.name, got.launcher, got.grid, got.meta) == (want.name, want.launcher, want.grid, want.meta)
            assert not any(isinstance(a, kstep._Slot) for a in got.args)
    return seen


def check_warm_launch(cases: list[tuple], monkeypatch: pytest.MonkeyPatch) -> None:
    """`_WarmStep.launch` fires every launch of the step once, in order, on the current stream, with the grid, the
    constexprs and the arguments its structure's `bind` gives for this call's addresses (its own fresh allocation
    included), and returns tokens and num_accepted as views of that allocation where the kernels write them.
    `cases`: (plan options, greedy, device key). Cached binaries stand in as recorders (the GPU tests run the real
    ones)."""
    from flashspec.kernels import make_plan, structures
    from flashspec.kernels import step as kstep
    from flashspec.kernels.shims import SCALE_MULTIPLY

    fired: list = []

    class Binary:  # what `_Launcher.binaries` caches, its launcher recording each call
        function, packed_metadata = 1234, (4, 1, 0)

        def __init__(self, name: str) -> None:
            self.name = name

        def run(self, *call) -> None:
            fired.append((self.name, call))

    monkeypatch.setattr(kstep, "_current_stream", lambda device_index: 99)
    device = torch.device("cpu")
    for options, greedy, in_memory in cases:
        batch, gamma, vocab = 3, 4, 4096
        plan = make_plan(batch, gamma, vocab, device, greedy, None, None, 3, options.get("fused"),
                         options.get("tuning"), sampler_of(options, greedy))
        layout = kstep._work_layout(batch, gamma, plan, greedy, vocab)
        shape, flags = (batch, gamma, vocab), dict(SCALE_MODE=SCALE_MULTIPLY, HAS_DRAFT=not greedy, GREEDY=greedy)
        template = _slot_binding(plan, layout, shape, flags, in_memory, device)
        for index, launch in enumerate(template):
            monkeypatch.setitem(launch.launcher.binaries, 7, (Binary(f"launch{index}"), (16 + index, 1), None))
        warm = kstep._WarmStep.from_launches(plan, 7, template, not greedy, layout.words, layout.accepted, batch,
                                             gamma)
        assert len(warm.calls) == len(template) == plan.launches
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
        bound = structures.get(plan.structure).bind(
            plan, (target.data_ptr(), draft.data_ptr() if not greedy else target.data_ptr(), tokens.data_ptr()),
            (base, base + 4 * layout.accepted), layout.addresses(base), shape, 0.5, flags, prefix, device, True)
        assert [name for name, _ in fired] == [f"launch{index}" for index in range(len(bound))]
        for index, ((_, call), launch) in enumerate(zip(fired, bound)):
            grid = tuple(launch.grid)
            args = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in launch.args)
            assert call == (*grid, *(1,) * (3 - len(grid)), 99, 1234, (4, 1, 0), None, None, None, *args, 16 + index, 1)


# ----------------------------------------------------------------------------- Triton's compiler front end
FRONT_END = r"""
import importlib, inspect, json, os, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from triton._C.libtriton import ir

modules = [importlib.import_module(name) for name in sys.argv[1:]]
kernels = {name: getattr(module, name) for module in modules
           for name in dir(module) if name.endswith("_kernel") or name.startswith("_chain_")}
target = GPUTarget("cuda", int(os.environ.get("FRONT_END_CAPABILITY", "90")), 32)
backend = make_backend(target)
takes_target = "target" in inspect.signature(ASTSource.make_ir).parameters  # Triton versions differ here
failures = []
for launch in json.load(sys.stdin):
    kernel = kernels[launch["kernel"]]
    signature = dict(launch["signature"], **{name: "constexpr" for name in launch["constexprs"]})
    source = ASTSource(kernel, signature, launch["constexprs"])
    options = backend.parse_options({"num_warps": launch["num_warps"], **source.parse_options()})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    try:
        lowering = (options, backend.get_codegen_implementation(options), backend.get_module_map(), context)
        source.make_ir(*((target,) if takes_target else ()), *lowering)
    except Exception as error:  # noqa: BLE001 -- every failure is reported, not only the first
        failures.append({"launch": launch, "error": f"{type(error).__name__}: {error}"[-1500:]})
print(json.dumps(failures))
"""
SIZES = {"CHUNK", "ROW", "BLOCK_V", "STATS_BLOCK_V", "BLOCK_P", "BLOCK_S", "BLOCK_S2"}  # tile and loop sizes


def structure_of(launch: dict) -> str:
    """A launch up to its tile and loop sizes: the kernel, its argument types and every constexpr that picks
    code (flags, modes, rows per program). One launch per structure is lowered."""
    flags = {name: value for name, value in launch["constexprs"].items() if name not in SIZES}
    return json.dumps([launch["kernel"], launch["signature"], flags], sort_keys=True)


def lower(launches: list[dict], modules: list[str], capability: int = 90) -> list[dict]:
    """The launches that fail Triton's front end for sm_`capability` (a subprocess with the interpreter off)."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="0", FRONT_END_CAPABILITY=str(capability))
    done = subprocess.run([sys.executable, "-c", FRONT_END, *modules], input=json.dumps(launches), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
