"""Exactness suite: the joint distribution of the first L = 3 emitted tokens against exact
enumeration, over a grid of configurations, for both backends; and the negative controls
(buggy verifiers, a cherry-picking selector) that must fail the very same test.

The Triton backend runs in its CPU interpreter here, where each call costs ~0.2 s of Python
whatever its size, so its grid uses one call of 10,000 rows per step; batch sizes B = 1, 3, 8
are covered for Triton by exact token equality with the PyTorch reference (tests/test_kernels.py)
and for PyTorch by the χ² configurations below that really call `verify` with B rows.

Every test in the family uses the Bonferroni-corrected level ALPHA_EACH = 0.01 / (number of
χ² tests in the family), so the whole suite has at most a 1% chance of a false alarm.
"""
from __future__ import annotations

import pytest
import torch

from experiments.exactness import (
    ALPHA_EACH,
    BLOCK_CONFIGS,
    CONFIGS,
    LOG_PROB_CONFIGS,
    NEGATIVE_CONFIGS,
    REJECTION_CONFIGS,
    TRITON_CONFIGS,
    ChiSquareCase,
    gate_target,
    run_config,
)
from flashspec_lab import exactness as ex

BACKENDS = ("torch", "triton")
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else None  # compiled on a GPU, else the interpreter


def test_grid_is_large_enough():
    assert len(CONFIGS) >= 30 and len(TRITON_CONFIGS) >= 30
    assert {c.rows_per_call for c in CONFIGS} >= {1, 3, 8}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_joint_distribution_torch(config: ChiSquareCase):
    result = run_config(config, ex.library_verifier("torch"))
    assert result.passes(ALPHA_EACH), f"{config.name}: {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize("config", TRITON_CONFIGS, ids=lambda c: c.name)
def test_joint_distribution_triton(config: ChiSquareCase):
    pytest.importorskip("triton")
    result = run_config(config, ex.library_verifier("triton", TRITON_DEVICE), seed=1)
    assert result.passes(ALPHA_EACH), f"{config.name}: {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", LOG_PROB_CONFIGS, ids=lambda c: c.name)
def test_joint_distribution_given_draft_log_probs(config: ChiSquareCase, backend: str):
    """The draft's warped log-probs in place of its logits (`draft_is_log_probs`): the same exactness."""
    if backend == "triton":
        pytest.importorskip("triton")
    verifier = ex.library_verifier(backend, TRITON_DEVICE if backend == "triton" else None, draft_log_probs=True)
    result = run_config(config, verifier, seed=2)
    assert result.passes(ALPHA_EACH), f"{config.name}: {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", REJECTION_CONFIGS, ids=lambda c: c.name)
def test_joint_distribution_residual_by_rejection(config: ChiSquareCase, backend: str):
    """The residual drawn by rejection from p (`residual="rejection"`, the one-launch kernel): the same exactness."""
    if backend == "triton":
        pytest.importorskip("triton")
    verifier = ex.library_verifier(backend, TRITON_DEVICE if backend == "triton" else None, residual="rejection")
    result = run_config(config, verifier, seed=3)
    assert result.passes(ALPHA_EACH), f"{config.name}: {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("config", BLOCK_CONFIGS, ids=lambda c: c.name)
def test_joint_distribution_block_verification(config: ChiSquareCase, backend: str):
    """Block verification (`method="block"`): the chain judged as a whole, the same exactness."""
    if backend == "triton":
        pytest.importorskip("triton")
    verifier = ex.library_verifier(backend, TRITON_DEVICE if backend == "triton" else None, method="block")
    result = run_config(config, verifier, seed=4)
    assert result.passes(ALPHA_EACH), f"{config.name}: {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize(
    "bug,config_name",
    [(bug, name) for bug, names in NEGATIVE_CONFIGS.items() for name in names],
)
def test_negative_control_fails(bug: str, config_name: str):
    config = next(c for c in CONFIGS if c.name == config_name)
    result = run_config(config, ex.NEGATIVE_CONTROLS[bug])
    assert not result.passes(ALPHA_EACH), f"the harness let the '{bug}' bug through on {config_name}: {result}"


def test_cherry_picking_selector_fails():
    config = next(c for c in CONFIGS if c.name == "two-g2-T1.0")
    result = run_config(config, ex.library_verifier("torch"), selector=ex.cherry_picking_selector)
    assert not result.passes(ALPHA_EACH), f"cherry-picking among drafts went unnoticed: {result}"


def test_every_bug_has_a_control():
    assert set(NEGATIVE_CONFIGS) == set(ex.NEGATIVE_CONTROLS)


# --- The paper's gate: γ = 1, draft = target, KS over 10,000 first tokens at α = 0.01 ---------

@pytest.mark.parametrize("backend", BACKENDS)
def test_paper_gate_passes(backend: str):
    result = ex.paper_gate(ex.library_verifier(backend, TRITON_DEVICE if backend == "triton" else None), gate_target())
    assert result.passes(0.01), result


@pytest.mark.parametrize("bug", sorted(ex.NEGATIVE_CONTROLS))
def test_paper_gate_is_blind_to_the_bugs(bug: str):
    """Documents why the paper's own test is not enough: every buggy verifier passes it."""
    assert ex.paper_gate(ex.NEGATIVE_CONTROLS[bug], gate_target()).passes(0.01)
