"""The library's verify kernels through Triton's compiler front end, on any machine.

Triton's CPU interpreter runs the kernels as Python, so it accepts code the compiler rejects -- a branch
that changes a value's type, say (a pointer argument reloaded as an int32 inside a runtime `if` passed
every interpreted test and failed to compile on the H200). This test binds every launch the GPU launch
plans of the library's structures make (the two launches with each of their options and every measured table's
entries, the one pass at a few stats grids; greedy, sampled, with and without draft logits, host and device keys),
then, in a subprocess with the interpreter off, lowers each distinct kernel specialisation to Triton IR for an sm_90
target. No GPU is needed: the front end stops before PTX. The lab's structures and probes have their own
(lab/tests/test_lab_kernels_compiled.py).
"""
from __future__ import annotations

import inspect
import json
import sys

import pytest
import torch

from flashspec.sampling import SamplingParams
from kernel_cases import LIBRARY_TUNINGS, REJECTION_TUNINGS, gpu_planner, lower, structure_of, t4_planner  # noqa: F401

COMPILER_OPTIONS = {"num_warps", "num_ctas", "enable_fp_fusion", "launch_cooperative_grid", "launch_pdl"}
TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.int64: "i64", torch.int32: "i32"}


def _type(value) -> str:
    """The Triton type of a launch argument (pointers by their tensor's dtype)."""
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    return "fp32"


def describe(launch, precise: bool) -> dict:
    """A bound launch as the compiler needs it: the kernel's name, each runtime argument's Triton type, the
    constexprs (PRECISE as the GPU runs it: the interpreter turns it off) and the warp count."""
    names = list(inspect.signature(launch.launcher.kernel.fn).parameters)
    constexprs = {name: value for name, value in launch.meta.items() if name not in COMPILER_OPTIONS}
    if "PRECISE" in constexprs:
        constexprs["PRECISE"] = precise
    return {"kernel": launch.launcher.kernel.fn.__name__,
            "signature": {name: _type(value) for name, value in zip(names, launch.args)},
            "constexprs": constexprs, "num_warps": launch.meta.get("num_warps", 4)}


def bind_for_gpu(plan, batch: int, gamma: int, vocab: int, params: SamplingParams, with_draft: bool,
                 device_key: bool, dtype: torch.dtype = torch.bfloat16) -> tuple:
    """The launches of one step under a GPU `plan`, bound to tiny CPU tensors of the GPU dtypes (a launch's types
    and constexprs do not depend on the sizes, which the plan and the shape carry). Nothing runs."""
    from flashspec import rng
    from flashspec.kernels import structures
    from flashspec.kernels.shims import SCALE_MULTIPLY, SCALE_NONE
    from flashspec.kernels.step import _work_layout
    from flashspec.kernels.verify import _prefixes, device_prefixes

    target = torch.zeros(1, gamma + 1, 8, dtype=dtype)
    draft = torch.zeros(1, gamma, 8, dtype=dtype) if with_draft else target
    tokens = torch.zeros(1, gamma, dtype=torch.int64)
    layout = _work_layout(batch, gamma, plan, params.greedy, vocab)
    memory = torch.empty(layout.words // 2, dtype=torch.int64)
    outputs = (memory[:batch * (gamma + 1)].view(batch, gamma + 1), memory[:batch])
    key = rng.Key.from_seed(1)
    if device_key:
        prefixes = device_prefixes(rng.key_tensor(key, "cpu"))
        prefix = (prefixes[0:1], prefixes[1:2], True)
    else:
        prefix = (*_prefixes(key), False)
    scale_mode = SCALE_NONE if params.temperature in (0.0, 1.0) else SCALE_MULTIPLY
    flags = dict(SCALE_MODE=scale_mode, HAS_DRAFT=with_draft and not params.greedy, GREEDY=params.greedy)
    scale = 1.0 if params.temperature in (0.0, 1.0) else 1.0 / params.temperature
    return structures.get(plan.structure).bind(plan, (target, draft, tokens), outputs, layout.views(memory),
                                               (batch, gamma, vocab), scale, flags, prefix, memory.device, False)


@pytest.mark.skipif(sys.platform == "win32", reason="Triton's compiler front end needs Linux")
def test_every_gpu_launch_passes_the_compiler_front_end(gpu_planner) -> None:
    gpu = torch.device("cuda", 0)
    gamma = 4
    launches: dict[str, dict] = {}
    tunings = [(tuple(sorted(t.items())), "race") for t in [{}, *LIBRARY_TUNINGS]]
    tunings += [(tuple(sorted(t.items())), "rejection") for t in REJECTION_TUNINGS]
    tunings += [(tuple(sorted(t.items())), "block") for t in [{}, *LIBRARY_TUNINGS[:3]]]
    for batch in (1, 8, 64):
        for vocab in (32000, 128256):
            for tuning, residual in tunings:
                for params, with_draft in ((SamplingParams(1.0), True), (SamplingParams(0.7), False),
                                           (SamplingParams(0.0), False)):
                    if residual == "block" and params.greedy:  # greedy block verification is the two launches'
                        continue
                    plan = gpu_planner.make_plan(batch, gamma, vocab, gpu, params.greedy, tuning=tuning,
                                                 residual=residual)
                    for device_key in (False, True):
                        for launch in bind_for_gpu(plan, batch, gamma, vocab, params, with_draft, device_key):
                            described = describe(launch, plan.precise)
                            launches.setdefault(structure_of(described), described)
    assert {d["kernel"] for d in launches.values()} == {"_stats_kernel", "_stats_accept_kernel", "_sample_kernel",
                                                        "_one_pass_kernel", "_block_mass_kernel"}
    failures = lower(list(launches.values()), ["flashspec.kernels.one_pass", "flashspec.kernels.sample_pass",
                                               "flashspec.kernels.stats_pass", "flashspec.kernels.block_pass"])
    assert not failures, json.dumps(failures[:3], indent=1)


def test_a_t4_gets_the_default_launches_without_hopper_features(t4_planner) -> None:
    """A Colab T4 (sm_75, 40 SMs): the default structures (none of the lab's), no programmatic dependent launch
    and no clusters; and every launch it makes, with the fp16 logits a T4 runs (no bf16 units), passes the
    compiler's front end for sm_75."""
    import flashspec_lab.kernels  # noqa: F401  (the lab's structures registered: none may be chosen on a T4)

    gpu = torch.device("cuda", 0)
    launches: dict[str, dict] = {}
    for batch in (1, 8, 64):
        for residual, structure in (("race", "two_launch"), ("rejection", "one_pass"), ("block", "block_pass")):
            for params, with_draft in ((SamplingParams(1.0), True), (SamplingParams(0.7), False),
                                       (SamplingParams(0.0), False)):
                if residual == "block" and params.greedy:  # greedy block verification is the two launches'
                    continue
                plan = t4_planner.make_plan(batch, 4, 32000, gpu, params.greedy, residual=residual)
                assert plan.structure == structure and not plan.pdl, (batch, residual, plan)
                for launch in bind_for_gpu(plan, batch, 4, 32000, params, with_draft, True, torch.float16):
                    described = describe(launch, plan.precise)
                    launches.setdefault(structure_of(described), described)
    assert not t4_planner._has_pdl(0) and not t4_planner._has_clusters(0)  # both need compute capability 9
    failures = lower(list(launches.values()), ["flashspec.kernels.one_pass", "flashspec.kernels.sample_pass",
                                               "flashspec.kernels.stats_pass", "flashspec.kernels.block_pass"],
                     capability=75)
    assert not failures, json.dumps(failures[:3], indent=1)
