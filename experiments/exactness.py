"""The exactness suite's grid of χ² configurations, its negative controls, and ``python -m experiments.exactness``,
which writes the suite's statistics to results/exactness_cpu.json.

Each configuration samples the first L = 3 emitted tokens of speculative decoding on the toy models of
`flashspec_lab.exactness` and tests their joint law against exact enumeration; tests/test_exactness.py runs the same
grid.  Every test of the family uses the Bonferroni-corrected level ALPHA_EACH.

    python -m experiments.exactness --out results/exactness_cpu.json --backends torch triton
"""
from __future__ import annotations

import argparse
import sys
import zlib
from dataclasses import dataclass, replace

from flashspec import rng
from flashspec_lab import cli_checks, provenance
from flashspec_lab.exactness import (
    NEGATIVE_CONTROLS,
    FitResult,
    Selector,
    ToyModel,
    Verifier,
    cherry_picking_selector,
    chi_square_test,
    exact_sequence_probs,
    library_verifier,
    make_toy,
    paper_gate,
    round_robin_selector,
    sample_sequences,
)
from flashspec.sampling import SamplingParams


VOCAB = 5
LENGTH = 3
NUM_SEQUENCES = 20_000


@dataclass(frozen=True)
class ChiSquareCase:
    """One χ² configuration of the exactness suite."""

    name: str
    gamma: int
    params: SamplingParams
    drafts: str = "two"  # two | deterministic | same | disjoint
    rows_per_call: int | None = None  # B; None = every sequence in one call
    num_sequences: int = NUM_SEQUENCES


def _grid() -> list[ChiSquareCase]:
    """The suite's configurations: γ, temperature, truncation, draft kinds and call sizes B."""
    configs = []
    for gamma in (1, 2, 4, 7):
        for temperature in (0.5, 1.0, 1.7):
            configs.append(ChiSquareCase(f"two-g{gamma}-T{temperature}", gamma, SamplingParams(temperature)))
    for gamma in (2, 4):
        configs.append(ChiSquareCase(f"topk3-g{gamma}", gamma, SamplingParams(1.0, top_k=3)))
        configs.append(ChiSquareCase(f"topp0.8-g{gamma}", gamma, SamplingParams(1.3, top_p=0.8)))
        configs.append(ChiSquareCase(f"topk4-topp0.9-g{gamma}", gamma, SamplingParams(0.7, top_k=4, top_p=0.9)))
    configs.append(ChiSquareCase("two-g3-T1.2", 3, SamplingParams(1.2)))
    configs += [
        ChiSquareCase("deterministic-g1-T1", 1, SamplingParams(1.0), drafts="deterministic"),
        ChiSquareCase("deterministic-g3-T0.5", 3, SamplingParams(0.5), drafts="deterministic"),
        ChiSquareCase("deterministic-g4-T1.7-topp", 4, SamplingParams(1.7, top_p=0.9), drafts="deterministic"),
        ChiSquareCase("deterministic-g2-T1-topk", 2, SamplingParams(1.0, top_k=3), drafts="deterministic"),
        ChiSquareCase("deterministic-g7-T0.7", 7, SamplingParams(0.7), drafts="deterministic"),
        ChiSquareCase("same-g1-T1", 1, SamplingParams(1.0), drafts="same"),
        ChiSquareCase("same-g4-T1.7", 4, SamplingParams(1.7), drafts="same"),
        ChiSquareCase("same-g2-T0.5-topk-topp", 2, SamplingParams(0.5, top_k=4, top_p=0.9), drafts="same"),
        ChiSquareCase("disjoint-g1-T1.7", 1, SamplingParams(1.7), drafts="disjoint"),
        ChiSquareCase("disjoint-g2-T1", 2, SamplingParams(1.0), drafts="disjoint"),
        ChiSquareCase("disjoint-g4-T0.5-topk", 4, SamplingParams(0.5, top_k=3), drafts="disjoint"),
        ChiSquareCase("B1-g2-T1", 2, SamplingParams(1.0), rows_per_call=1, num_sequences=2_000),
        ChiSquareCase("B3-g4-T0.7-topp", 4, SamplingParams(0.7, top_p=0.9), rows_per_call=3, num_sequences=4_500),
        ChiSquareCase("B8-g7-T1.7", 7, SamplingParams(1.7), rows_per_call=8, num_sequences=8_000),
    ]
    return configs


CONFIGS = _grid()
TRITON_CONFIGS = [replace(c, num_sequences=10_000) for c in CONFIGS if c.rows_per_call is None]
# the draft's warped log-probs passed in place of its logits (`draft_is_log_probs`), on both backends
LOG_PROB_CONFIGS = [c for c in TRITON_CONFIGS if c.name in ("two-g2-T0.5", "two-g4-T1.7", "topp0.8-g4",
                                                            "topk4-topp0.9-g2", "same-g4-T1.7", "disjoint-g2-T1")]
# the residual drawn by rejection from p (`residual="rejection"`, the one-launch kernel's sampler), on both backends
REJECTION_CONFIGS = [c for c in TRITON_CONFIGS if c.name in (
    "two-g1-T1.0", "two-g2-T0.5", "two-g4-T1.7", "two-g7-T1.0", "topk4-topp0.9-g2", "topp0.8-g4",
    "deterministic-g3-T0.5", "deterministic-g2-T1-topk", "same-g4-T1.7", "disjoint-g2-T1")]
# block verification (`method="block"`), on both backends: the greedy case is token verification's
BLOCK_CONFIGS = [c for c in TRITON_CONFIGS if c.name in (
    "two-g1-T1.0", "two-g2-T1.0", "two-g4-T0.5", "two-g4-T1.7", "two-g7-T1.0", "two-g3-T1.2", "topk3-g2",
    "topk4-topp0.9-g4", "deterministic-g3-T0.5", "deterministic-g2-T1-topk", "same-g4-T1.7", "disjoint-g2-T1")]
NEGATIVE_CONFIGS = {
    # the bug, and the configurations on which it must be caught
    "post_rejection_leak": ("two-g2-T1.0", "two-g4-T0.5"),
    "bonus_from_residual": ("two-g1-T1.0", "two-g2-T1.7"),
    "accept_reuses_draft_noise": ("two-g1-T1.0", "two-g4-T1.7"),
    "residual_reuses_draft_noise": ("two-g2-T1.0", "two-g2-T0.5"),
    "temperature_after_log_softmax": ("two-g2-T0.5", "two-g2-T1.7"),
    "residual_from_target": ("two-g2-T1.0", "two-g4-T1.7"),
    "block_token_residual": ("topp0.8-g4", "topk3-g4"),  # caught where truncation makes w·p and p differ most
    "block_ratio_threshold": ("two-g3-T1.2", "deterministic-g3-T0.5"),
}
# Bonferroni: every χ² test of the suite shares a family-wise level of 0.01.
NUM_TESTS = (len(CONFIGS) + len(TRITON_CONFIGS) + 2 * len(LOG_PROB_CONFIGS) + 2 * len(REJECTION_CONFIGS)
             + 2 * len(BLOCK_CONFIGS)
             + sum(len(v) for v in NEGATIVE_CONFIGS.values()) + 1)
ALPHA_EACH = 0.01 / NUM_TESTS


def grid_models(config: ChiSquareCase) -> tuple[ToyModel, list[ToyModel]]:
    """The target and drafts of the configuration's draft kind (two, same, deterministic, disjoint)."""
    if config.drafts == "disjoint":
        target = make_toy(VOCAB, 11, support=[2, 3, 4])
        return target, [make_toy(VOCAB, 12, support=[0, 1]), make_toy(VOCAB, 13, support=[0, 1, 2])]
    target = make_toy(VOCAB, 1)
    if config.drafts == "same":
        return target, [target]
    if config.drafts == "deterministic":
        return target, [make_toy(VOCAB, 2, deterministic=True), make_toy(VOCAB, 3, deterministic=True)]
    return target, [make_toy(VOCAB, 2), make_toy(VOCAB, 3, scale=0.8)]


def run_config(config: ChiSquareCase, verifier: Verifier, seed: int = 0,
               selector: Selector = round_robin_selector) -> FitResult:
    """Sample the configuration's sequences through `verifier` and χ²-test them against enumeration.

    The sampling seed mixes in the configuration's name, so configurations that share models
    (e.g. γ = 4 and γ = 7, identical on the first L = 3 tokens under one seed) give independent
    samples and the Bonferroni family is a family of independent tests.
    """
    target, drafts = grid_models(config)
    exact = exact_sequence_probs(target, config.params, LENGTH)
    sequences = sample_sequences(
        target, drafts, config.params, config.gamma, config.num_sequences, LENGTH,
        rng.derive_seed(seed, zlib.crc32(config.name.encode())),
        verifier=verifier, rows_per_call=config.rows_per_call, selector=selector,
    )
    return chi_square_test(sequences, exact, VOCAB)


def gate_target() -> ToyModel:
    """The toy model the paper's gate runs on: the grid's target."""
    return make_toy(VOCAB, 1)


def _row(name: str, result: FitResult, **extra: object) -> dict:
    return {"config": name, "statistic": result.statistic, "dof": result.dof, "p_value": result.p_value,
            "impossible": result.impossible, **extra}


def main(argv: list[str] | None = None) -> int:
    """`python -m experiments.exactness --out results/exactness_cpu.json [--backends torch triton]`."""
    parser = argparse.ArgumentParser(prog="python -m experiments.exactness", description=main.__doc__)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--backends", nargs="+", default=["torch"], choices=["torch", "triton"])
    parser.add_argument("--device", default=None, help="device for the Triton backend (cuda on a GPU)")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    from tqdm import tqdm

    command = ["python -m experiments.exactness", *(argv if argv is not None else sys.argv[1:])]
    started = provenance.record(command)
    report: dict = {"alpha_each": ALPHA_EACH, "family_alpha": 0.01, "num_tests": NUM_TESTS, "grid": {}}
    for backend in args.backends:
        configs = CONFIGS if backend == "torch" else TRITON_CONFIGS
        verifier = library_verifier(backend, args.device if backend == "triton" else None)
        rows = []
        for config in tqdm(configs, desc=f"chi-square [{backend}]"):
            result = run_config(config, verifier, seed=0 if backend == "torch" else 1)
            rows.append(_row(config.name, result, gamma=config.gamma, params=vars(config.params) | {},
                             drafts=config.drafts, rows_per_call=config.rows_per_call,
                             num_sequences=config.num_sequences, passes=result.passes(ALPHA_EACH)))
        report["grid"][backend] = rows
        # the same exactness with the draft's log-probs given, and with the residual drawn by rejection
        modes = (("draft_log_probs", {"draft_log_probs": True}, LOG_PROB_CONFIGS, 2),
                 ("residual_rejection", {"residual": "rejection"}, REJECTION_CONFIGS, 3),
                 ("block", {"method": "block"}, BLOCK_CONFIGS, 4))
        for suffix, options, mode_configs, seed in modes:
            mode_verifier = library_verifier(backend, args.device if backend == "triton" else None, **options)
            rows = []
            for config in tqdm(mode_configs, desc=f"chi-square [{backend}, {suffix.replace('_', ' ')}]"):
                result = run_config(config, mode_verifier, seed=seed)
                rows.append(_row(config.name, result, gamma=config.gamma, params=vars(config.params) | {},
                                 drafts=config.drafts, passes=result.passes(ALPHA_EACH)))
            report["grid"][f"{backend}_{suffix}"] = rows
    controls = []
    for bug, names in tqdm(list(NEGATIVE_CONFIGS.items()), desc="negative controls"):
        for name in names:
            config = next(c for c in CONFIGS if c.name == name)
            result = run_config(config, NEGATIVE_CONTROLS[bug])
            controls.append(_row(name, result, bug=bug, caught=not result.passes(ALPHA_EACH)))
    cherry = run_config(next(c for c in CONFIGS if c.name == "two-g2-T1.0"), library_verifier("torch"),
                        selector=cherry_picking_selector)
    controls.append(_row("two-g2-T1.0", cherry, bug="cherry_picking_selector", caught=not cherry.passes(ALPHA_EACH)))
    report["negative_controls"] = controls
    gates = {name: paper_gate(verifier, gate_target())
             for name, verifier in [("flashspec.verify[torch]", library_verifier("torch")), *NEGATIVE_CONTROLS.items()]}
    report["paper_gate"] = [_row("gamma1-draft=target", gate, verifier=name, passes=gate.passes(0.01))
                            for name, gate in gates.items()]
    provenance.write_result(args.out, started, {"vocab": VOCAB, "length": LENGTH, "num_sequences": NUM_SEQUENCES},
                            report)
    worst = min(row["p_value"] for rows in report["grid"].values() for row in rows)
    print(f"wrote {args.out}: {sum(len(r) for r in report['grid'].values())} chi-square tests, smallest p = {worst:.3g} "
          f"(alpha each {ALPHA_EACH:.2e}); controls caught: {sum(c['caught'] for c in controls)}/{len(controls)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
