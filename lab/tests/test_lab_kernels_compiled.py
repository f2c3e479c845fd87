"""The lab's verify launch structures and diagnostics through Triton's compiler, on any machine: every launch the
benchmark's plan variants make with the lab's structures (fused, cooperative, cluster) and its dependency-chain probes
through the compiler front end (as tests/test_kernels_compiled.py does for the library's), the cluster-reduction
probe, and the library's kernels compiled to SM90 SASS and counted (`flashspec_lab.kernels.sass`). No GPU is needed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from flashspec.sampling import SamplingParams
from kernel_cases import gpu_planner, lower, structure_of  # noqa: F401


@pytest.mark.skipif(sys.platform == "win32", reason="Triton's compiler front end needs Linux")
def test_every_gpu_launch_of_the_lab_passes_the_compiler_front_end(gpu_planner) -> None:
    """The launches of the benchmark's variants that take a lab structure, and the dependency-chain probes at every
    variant's grids, bound as an SM90 GPU would launch them and lowered to Triton IR (one per structure up to tile
    sizes)."""
    from flashspec_lab.bench import PLAN_VARIANTS, _variant_options
    from flashspec_lab.kernels import sass
    from flashspec_lab.kernels.chain_probe import chain_step

    gpu = torch.device("cuda", 0)
    gamma = 4
    launches: dict[str, dict] = {}
    for batch in (1, 8, 64):
        for vocab in (32000, 128256):
            for overrides in PLAN_VARIANTS.values():
                for params, with_draft in ((SamplingParams(1.0), True), (SamplingParams(0.7), False),
                                           (SamplingParams(0.0), False)):
                    options = _variant_options(overrides)
                    plan = gpu_planner.make_plan(batch, gamma, vocab, gpu, params.greedy, tuning=options["tuning"],
                                                 residual=options["residual"])
                    bound = []
                    for device_key in (False, True):
                        prepared, target = sass.bind_step(plan, batch, gamma, vocab, params, with_draft, device_key)
                        if plan.structure not in ("two_launch", "one_pass"):  # the library's test lowers those
                            bound += sass.kernel_launches(prepared)
                    # the benchmark's dependency-chain probe at the same grids (the cluster plan has none)
                    chains = [] if plan.structure == "cluster" else chain_step(target, plan).launches
                    if plan.structure not in ("cluster", "coop"):  # and the one-launch chain at its stats grid
                        chains += chain_step(target, plan, one_launch=True).launches
                    bound += [(kernel, args, meta) for kernel, _, args, meta in chains]
                    for kernel, args, meta in bound:
                        described = sass.describe(kernel, args, meta, plan.precise)
                        launches.setdefault(structure_of(described), described)
    assert {d["kernel"] for d in launches.values()} == {"_fused_kernel", "_coop_kernel", "_cluster_kernel",
                                                        "_chain_first", "_chain_second", "_chain_one", "_chain_coop"}
    modules = [f"flashspec_lab.kernels.{name}" for name in ("chain_probe", "cluster_pass", "coop_pass", "fused_pass")]
    failures = lower(list(launches.values()), modules)
    assert not failures, json.dumps(failures[:3], indent=1)


@pytest.mark.skipif(sys.platform == "win32", reason="Triton's compiler needs Linux")
def test_cluster_reduce_probe_writes_what_this_triton_does(tmp_path) -> None:
    """`experiments/cluster_reduce_probe.py` compiles a one-block reduction for sm_90 with the installed Triton
    (it must lower) and records, per block count, whether the cross-block one lowered and through which
    cluster instructions."""
    out = tmp_path / "probe.json"
    env = dict(os.environ, TRITON_INTERPRET="0")
    script = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "experiments", "cluster_reduce_probe.py")
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
