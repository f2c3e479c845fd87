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

from dataclasses import dataclass, replace

import pytest
import torch

from flashspec import exactness as ex
from flashspec.sampling import SamplingParams

VOCAB = 5
LENGTH = 3
NUM_SEQUENCES = 20_000


@dataclass(frozen=True)
class Config:
    name: str
    gamma: int
    params: SamplingParams
    drafts: str = "two"  # two | deterministic | same | disjoint
    rows_per_call: int | None = None  # B; None = every sequence in one call
    num_sequences: int = NUM_SEQUENCES


def _grid() -> list[Config]:
    configs = []
    for gamma in (1, 2, 4, 7):
        for temperature in (0.5, 1.0, 1.7):
            configs.append(Config(f"two-g{gamma}-T{temperature}", gamma, SamplingParams(temperature)))
    for gamma in (2, 4):
        configs.append(Config(f"topk3-g{gamma}", gamma, SamplingParams(1.0, top_k=3)))
        configs.append(Config(f"topp0.8-g{gamma}", gamma, SamplingParams(1.3, top_p=0.8)))
        configs.append(Config(f"topk4-topp0.9-g{gamma}", gamma, SamplingParams(0.7, top_k=4, top_p=0.9)))
    configs.append(Config("two-g3-T1.2", 3, SamplingParams(1.2)))
    configs += [
        Config("deterministic-g1-T1", 1, SamplingParams(1.0), drafts="deterministic"),
        Config("deterministic-g3-T0.5", 3, SamplingParams(0.5), drafts="deterministic"),
        Config("deterministic-g4-T1.7-topp", 4, SamplingParams(1.7, top_p=0.9), drafts="deterministic"),
        Config("deterministic-g2-T1-topk", 2, SamplingParams(1.0, top_k=3), drafts="deterministic"),
        Config("deterministic-g7-T0.7", 7, SamplingParams(0.7), drafts="deterministic"),
        Config("same-g1-T1", 1, SamplingParams(1.0), drafts="same"),
        Config("same-g4-T1.7", 4, SamplingParams(1.7), drafts="same"),
        Config("same-g2-T0.5-topk-topp", 2, SamplingParams(0.5, top_k=4, top_p=0.9), drafts="same"),
        Config("disjoint-g1-T1.7", 1, SamplingParams(1.7), drafts="disjoint"),
        Config("disjoint-g2-T1", 2, SamplingParams(1.0), drafts="disjoint"),
        Config("disjoint-g4-T0.5-topk", 4, SamplingParams(0.5, top_k=3), drafts="disjoint"),
        Config("B1-g2-T1", 2, SamplingParams(1.0), rows_per_call=1, num_sequences=2_000),
        Config("B3-g4-T0.7-topp", 4, SamplingParams(0.7, top_p=0.9), rows_per_call=3, num_sequences=4_500),
        Config("B8-g7-T1.7", 7, SamplingParams(1.7), rows_per_call=8, num_sequences=8_000),
    ]
    return configs


CONFIGS = _grid()
TRITON_CONFIGS = [replace(c, num_sequences=10_000) for c in CONFIGS if c.rows_per_call is None]
BACKENDS = ("torch", "triton")
TRITON_DEVICE = "cuda" if torch.cuda.is_available() else None  # compiled on a GPU, else the interpreter
NEGATIVE_CONFIGS = {
    # the bug, and the configurations on which it must be caught
    "post_rejection_leak": ("two-g2-T1.0", "two-g4-T0.5"),
    "bonus_from_residual": ("two-g1-T1.0", "two-g2-T1.7"),
    "accept_reuses_draft_noise": ("two-g1-T1.0", "two-g4-T1.7"),
    "residual_reuses_draft_noise": ("two-g2-T1.0", "two-g2-T0.5"),
    "temperature_after_log_softmax": ("two-g2-T0.5", "two-g2-T1.7"),
}
NUM_TESTS = len(CONFIGS) + len(TRITON_CONFIGS) + sum(len(v) for v in NEGATIVE_CONFIGS.values()) + 1
ALPHA_EACH = 0.01 / NUM_TESTS


def models(config: Config) -> tuple[ex.ToyModel, list[ex.ToyModel]]:
    if config.drafts == "disjoint":
        target = ex.make_toy(VOCAB, 11, support=[2, 3, 4])
        return target, [ex.make_toy(VOCAB, 12, support=[0, 1]), ex.make_toy(VOCAB, 13, support=[0, 1, 2])]
    target = ex.make_toy(VOCAB, 1)
    if config.drafts == "same":
        return target, [target]
    if config.drafts == "deterministic":
        return target, [ex.make_toy(VOCAB, 2, deterministic=True), ex.make_toy(VOCAB, 3, deterministic=True)]
    return target, [ex.make_toy(VOCAB, 2), ex.make_toy(VOCAB, 3, scale=0.8)]


def run_config(config: Config, verifier, seed: int = 0, selector=ex.round_robin_selector) -> ex.FitResult:
    target, drafts = models(config)
    exact = ex.exact_sequence_probs(target, config.params, LENGTH)
    sequences = ex.sample_sequences(
        target, drafts, config.params, config.gamma, config.num_sequences, LENGTH, seed,
        verifier=verifier, rows_per_call=config.rows_per_call, selector=selector,
    )
    return ex.chi_square_test(sequences, exact, VOCAB)


def test_grid_is_large_enough():
    assert len(CONFIGS) >= 30 and len(TRITON_CONFIGS) >= 30
    assert {c.rows_per_call for c in CONFIGS} >= {1, 3, 8}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.name)
def test_joint_distribution_torch(config: Config):
    result = run_config(config, ex.library_verifier("torch"))
    assert result.passes(ALPHA_EACH), f"{config.name}: {result} (alpha {ALPHA_EACH:.2e})"


@pytest.mark.parametrize("config", TRITON_CONFIGS, ids=lambda c: c.name)
def test_joint_distribution_triton(config: Config):
    pytest.importorskip("triton")
    result = run_config(config, ex.library_verifier("triton", TRITON_DEVICE), seed=1)
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

PAPER_PARAMS = SamplingParams(1.0)


def paper_gate(verifier) -> ex.FitResult:
    target = ex.make_toy(VOCAB, 1)
    first = ex.sample_sequences(target, [target], PAPER_PARAMS, 1, 10_000, 1, seed=3, verifier=verifier)[:, 0]
    return ex.ks_first_token_test(first, ex.marginal_first_token(target, PAPER_PARAMS))


@pytest.mark.parametrize("backend", BACKENDS)
def test_paper_gate_passes(backend: str):
    result = paper_gate(ex.library_verifier(backend, TRITON_DEVICE if backend == "triton" else None))
    assert result.passes(0.01), result


@pytest.mark.parametrize("bug", sorted(ex.NEGATIVE_CONTROLS))
def test_paper_gate_is_blind_to_the_bugs(bug: str):
    """Documents why the paper's own test is not enough: every buggy verifier passes it."""
    assert paper_gate(ex.NEGATIVE_CONTROLS[bug]).passes(0.01)
