"""The plain-step profiler: its variants compute the same forward, its kernel table adds up, and one process's
work runs end to end at smoke shapes on the CPU."""
from __future__ import annotations

import json

import pytest
import torch

from flashspec import models, runner
from flashspec_lab import peers, step_profile


def test_math_variant_computes_the_same_forward():
    config = peers.smoke_config(models.tinyllama_1b_config)
    model = models.model_from_config(config, seed=3)
    tokens = torch.randint(0, config.vocab_size, (1, 7))
    positions = torch.arange(7)[None]
    outputs = []
    for name in step_profile.VARIANTS:
        with step_profile.variant(name):
            outputs.append(runner.LlamaRunner(model, 1, 32)(tokens, positions, 16))
    assert runner.attend is not None and all(torch.allclose(outputs[0], out, atol=1e-5) for out in outputs[1:])
    with pytest.raises(ValueError, match="variant must be one of"):
        with step_profile.variant("nope"):
            pass


def test_compile_variants_change_inductor_only_inside():
    from torch._inductor import decomposition

    mm, options = torch.ops.aten.mm.default, dict(runner.FORWARD_OPTIONS)
    with step_profile.variant("cublas-mm"):
        assert mm not in decomposition.fast_random_decomps() and runner.FORWARD_OPTIONS == options
    with step_profile.variant("no-cdt"):
        assert "coordinate_descent_tuning" not in runner.FORWARD_OPTIONS
    assert mm in decomposition.fast_random_decomps() and runner.FORWARD_OPTIONS == options


def test_kernel_table_counts_per_step():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        torch.ones(3).add_(1)
    table = step_profile.kernel_table(profile, steps=2)
    assert table == {"kernels_per_step": 0.0, "kernel_us_per_step": 0.0, "top": []}  # no device kernels on a CPU


def test_one_process_profiles_at_smoke_shapes(tmp_path):
    settings = dict(device="cpu", smoke=True, compile=None, new_tokens=4, prompt_tokens=3, repeats=1)
    out = tmp_path / "cell.json"
    step_profile.run_child("flashspec", "smollm2-135m", "math", settings, tmp_path, 1, out)
    cell = json.loads(out.read_text())
    assert "error" not in cell, cell
    assert cell["tok_s_median"] > 0 and set(cell["profile"]) == {"kernels_per_step", "kernel_us_per_step", "top"}
    step_profile.run_child("gpt-fast", "smollm2-135m", "default", {**settings, "gpt_fast": str(tmp_path)}, None, 1, out)
    assert "a checkout of pytorch-labs/gpt-fast" in json.loads(out.read_text())["error"]


def test_profile_plain_groups_fit_one_card():
    """Small shapes start together; each system at a large shape runs alone (three 7B processes overflow 80 GB)."""
    from experiments.profile_plain import LARGE_SHAPES, job_groups

    jobs = [(system, shape, name) for shape in ("tinyllama-1.1b", "smollm2-135m", "llama-2-7b")
            for system, name in (("flashspec", "default"), ("flashspec", "math"), ("gpt-fast", "default"))]
    groups = job_groups(jobs)
    assert sorted(job for group in groups for job in group) == sorted(jobs)
    assert groups[0] == [job for job in jobs if job[1] not in LARGE_SHAPES]
    assert [{(shape, system) for system, shape, _ in group} for group in groups[1:]] == [
        {("llama-2-7b", "flashspec")}, {("llama-2-7b", "gpt-fast")}]
    assert job_groups([job for job in jobs if job[1] == "llama-2-7b"])[0][0][1] == "llama-2-7b"
