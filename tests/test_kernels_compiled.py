"""The verify kernels through Triton's compiler front end, on any machine.

Triton's CPU interpreter runs the kernels as Python, so it accepts code the compiler rejects -- a branch
that changes a value's type, say (a pointer argument reloaded as an int32 inside a runtime `if` passed
every interpreted test and failed to compile on the H200). This test binds every launch the GPU launch
plans make (the benchmark's shapes and plan variants, greedy, sampled, with and without draft logits, host
and device keys), then, in a subprocess with the interpreter off, lowers each distinct kernel
specialisation to Triton IR for an sm_90 target. No GPU is needed: the front end stops before PTX.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from flashspec.sampling import SamplingParams

FRONT_END = r"""
import inspect, json, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend
from triton._C.libtriton import ir
from flashspec.kernels import one_pass, sample_pass, stats_pass
from flashspec_lab.kernels import chain_probe, cluster_pass, coop_pass, fused_pass

kernels = {name: getattr(module, name) for module in (chain_probe, cluster_pass, coop_pass, fused_pass, one_pass,
                                                     sample_pass, stats_pass)
           for name in dir(module) if name.endswith("_kernel") or name.startswith("_chain_")}
target = GPUTarget("cuda", 90, 32)
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


def _structure(launch: dict) -> str:
    """A launch up to its tile and loop sizes: the kernel, its argument types and every constexpr that picks
    code (flags, modes, rows per program). One launch per structure is lowered: 35 of the 263 distinct launches."""
    flags = {name: value for name, value in launch["constexprs"].items() if name not in SIZES}
    return json.dumps([launch["kernel"], launch["signature"], flags], sort_keys=True)


@pytest.mark.skipif(sys.platform == "win32", reason="Triton's compiler front end needs Linux")
def test_every_gpu_launch_passes_the_compiler_front_end(monkeypatch) -> None:
    from flashspec_lab.bench import PLAN_VARIANTS, _variant_options
    from flashspec.kernels import plan as plan_module
    from flashspec_lab.kernels.chain_probe import chain_step
    from flashspec_lab.kernels import sass

    # make_plan's GPU branch (132 SMs, compiled Triton), as tests/test_kernels.py's gpu_planner fixture does
    monkeypatch.setattr(plan_module, "interpreting", lambda: False)
    monkeypatch.setattr(plan_module, "_num_sms", lambda index: 132)
    monkeypatch.setattr(plan_module, "_has_pdl", lambda index: True)  # an H200
    monkeypatch.setattr(plan_module, "_has_clusters", lambda index: True)  # with Triton >= 3.9
    plan_module.make_plan.cache_clear()
    gpu = torch.device("cuda", 0)
    gamma = 4
    launches: dict[str, dict] = {}
    try:
        for batch in (1, 8, 64):
            for vocab in (32000, 128256):
                for name, overrides in PLAN_VARIANTS.items():
                    for params, with_draft in ((SamplingParams(1.0), True), (SamplingParams(0.7), False),
                                               (SamplingParams(0.0), False)):
                        options = _variant_options(overrides)
                        plan = plan_module.make_plan(batch, gamma, vocab, gpu, params.greedy,
                                                     tuning=options["tuning"], residual=options["residual"])
                        for device_key in (False, True):
                            prepared, target = sass.bind_step(plan, batch, gamma, vocab, params, with_draft,
                                                              device_key)
                            for kernel, args, meta in sass.kernel_launches(prepared):
                                described = sass.describe(kernel, args, meta, plan.precise)
                                launches.setdefault(_structure(described), described)
                            # the benchmark's dependency-chain probe at the same grids (the cluster plan has none)
                            chains = [] if plan.cluster else chain_step(target, plan).launches
                            if not (plan.cluster or plan.coop):  # and the one-launch chain at its stats grid
                                chains += chain_step(target, plan, one_launch=True).launches
                            for kernel, _, args, meta in chains:
                                described = sass.describe(kernel, args, meta, plan.precise)
                                launches.setdefault(_structure(described), described)
    finally:
        plan_module.make_plan.cache_clear()
    assert {d["kernel"] for d in launches.values()} == {"_stats_kernel", "_stats_accept_kernel", "_sample_kernel",
                                                        "_fused_kernel", "_coop_kernel", "_cluster_kernel", "_one_pass_kernel",
                                                        "_chain_first",
                                                        "_chain_second", "_chain_one", "_chain_coop"}
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="0")
    done = subprocess.run([sys.executable, "-c", FRONT_END], input=json.dumps(list(launches.values())), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    failures = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failures, json.dumps(failures[:3], indent=1)


@pytest.mark.skipif(sys.platform == "win32", reason="Triton's compiler needs Linux")
def test_cluster_reduce_probe_writes_what_this_triton_does(tmp_path) -> None:
    """`experiments/cluster_reduce_probe.py` compiles a one-block reduction for sm_90 with the installed Triton
    (it must lower) and records, per block count, whether the cross-block one lowered and through which
    cluster instructions."""
    out = tmp_path / "probe.json"
    env = dict(os.environ, TRITON_INTERPRET="0")
    script = os.path.join(os.path.dirname(__file__), os.pardir, "experiments", "cluster_reduce_probe.py")
    done = subprocess.run([sys.executable, script, "--out", str(out), "--ctas", "1", "2"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    import triton

    from flashspec_lab import provenance

    assert list(record) == list(provenance.RESULT_KEYS) and record["provenance"]["versions"]["triton"] == triton.__version__
    assert record["results"]["triton"] == triton.__version__
    assert [row["num_ctas"] for row in record["results"]["probes"]] == [1, 2]
    single, pair = record["results"]["probes"]
    assert single["lowered"] and not single["cross_cta"] and sum(single["cluster_instructions"].values()) == 0
    if pair["lowered"]:  # a cross-block reduction goes through the cluster's shared memory
        assert pair["cross_cta"]
    else:
        assert "error" in pair


SASS_STATS = r"""
import json
from flashspec_lab.kernels import sass
from flashspec.sampling import SamplingParams

rows = []
for lane_elems in (None, 0):  # the default plan, and its stats pass without per-lane partials
    tuning = None if lane_elems is None else (("stats_lane_elems", lane_elems),)
    plan, launches = sass.bound_launches(64, 4, 128256, SamplingParams(1.0), tuning=tuning)
    stats = next(launch for launch in launches if launch["kernel"].startswith("_stats"))
    rows.append({"lane_elems": plan.stats_lane_elems, "loops": sass.loops(sass.compile_sass(stats)),
                 "per_thread": plan.stats_block_v // (32 * plan.stats_warps)})
print(json.dumps(rows))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="Triton's compiler needs Linux")
def test_stats_pass_loop_stays_inside_threads() -> None:
    """The stats pass's loop compiled for SM90 (B = 64, V = 128256, the default plan): with per-lane partials it
    has no shuffle or barrier and costs at most 20 instructions per vocabulary position a thread covers (two
    logits: target and draft; 18.7 under Triton 3.9). Reducing every tile across the threads shuffles and costs
    more (22.4; 28.4 with `tl.exp`'s denormal fix-up as well)."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="0")
    done = subprocess.run([sys.executable, "-c", SASS_STATS], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lanes, tiles = json.loads(done.stdout.strip().splitlines()[-1])
    assert lanes["lane_elems"] == 8 and tiles["lane_elems"] == 0
    for row in (lanes, tiles):
        assert len(row["loops"]) == 1, row["loops"]  # one loop over the chunk's tiles
    lane_loop, tile_loop = lanes["loops"][0], tiles["loops"][0]
    assert "SHFL" not in lane_loop["opcodes"] and "BAR" not in lane_loop["opcodes"]
    assert lane_loop["instructions"] / lanes["per_thread"] <= 20
    assert "SHFL" in tile_loop["opcodes"] and tile_loop["instructions"] > lane_loop["instructions"]


SASS_SAMPLE = r"""
import json
from flashspec_lab.kernels import sass
from flashspec.sampling import SamplingParams

plan, launches = sass.bound_launches(64, 4, 128256, SamplingParams(1.0))
sample = next(launch for launch in launches if launch["kernel"] == "_sample_kernel")
print(json.dumps({"loops": sass.loops(sass.compile_sass(sample)), "per_thread": plan.sample_block_v // (32 * plan.sample_warps)}))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="Triton's compiler needs Linux")
def test_sampling_pass_streams_weights_not_noise() -> None:
    """The sampling pass compiled for SM90 (B = 64, V = 128256, the default plan) races blocks of tokens: its loops
    over a chunk's tiles (the residual's, and the fallback's and the bonus's over p) only sum weights per block, at
    most 55 instructions per vocabulary position a thread covers for the residual (two logits, two `exp`) and 40
    for p (49.2 and 34.0 under Triton 3.9); the token race, which hashed and took two logarithms per token, cost
    133 and 83 (results/verify_sass_sm90_7cdf841.json)."""
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="0")
    done = subprocess.run([sys.executable, "-c", SASS_SAMPLE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    per_position = sorted(loop["instructions"] / row["per_thread"] for loop in row["loops"])
    assert len(per_position) == 3, row["loops"]  # the residual's loop, p's as the fallback and as the bonus
    assert per_position[0] <= 40 and per_position[1] <= 40 and per_position[2] <= 55, per_position
