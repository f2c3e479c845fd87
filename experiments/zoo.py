"""``flashspec zoo ...``: build and inspect the offline model zoo, and measure it into results/zoo_<size>_*.

    flashspec zoo build --size cpu          # or gpu; builds once, then loads from the cache
    flashspec zoo info --size cpu
    flashspec zoo perplexity --size cpu     # held-out perplexity, models x domains
    flashspec zoo acceptance --size cpu     # acceptance matrix (engine + exact teacher-forced)
    flashspec zoo switching --size cpu      # domain-switching experiment
    flashspec zoo report --size cpu --out results     # all of the above: JSON + PNG
    flashspec zoo gpu-report --out DIR      # H200: build from scratch, then the report
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashspec_lab import cli_checks, corpora, provenance, switching, zoo
from flashspec_lab.zoo.cache import say


@dataclass(frozen=True)
class MeasurementBudget:
    """How much to measure per size: acceptance-matrix and switching-workload budgets."""

    matrix_prompts: int
    matrix_new_tokens: int
    switching_requests: int
    switching_block: int
    switching_new_tokens: int
    bandits: tuple[str, ...]
    gamma: int = 4


BUDGETS: dict[str, MeasurementBudget] = {
    # Sized for a shared 2-core CPU (the engine runs ~3-10 steps/s there).
    "cpu": MeasurementBudget(matrix_prompts=24, matrix_new_tokens=64, switching_requests=12, switching_block=2,
                             switching_new_tokens=20, bandits=("thompson", "d-ts")),
    # Sized for ~5 minutes of measurement on one H200 after a ~2-minute build (one 10-minute device call).
    "gpu": MeasurementBudget(matrix_prompts=32, matrix_new_tokens=64, switching_requests=12, switching_block=3,
                             switching_new_tokens=40, bandits=("thompson", "d-ts")),
    # SmolLM2 and its distilled pool on one H200 (the pool needs a GPU to build).
    "smollm2": MeasurementBudget(matrix_prompts=32, matrix_new_tokens=64, switching_requests=12, switching_block=3,
                                 switching_new_tokens=64, bandits=("thompson", "d-ts")),
    "micro-distill": MeasurementBudget(matrix_prompts=2, matrix_new_tokens=6, switching_requests=4, switching_block=2,
                                       switching_new_tokens=6, bandits=("thompson",)),
    "micro": MeasurementBudget(matrix_prompts=2, matrix_new_tokens=6, switching_requests=4, switching_block=2,
                               switching_new_tokens=6, bandits=("thompson",)),
}


def build_summary(loaded: zoo.Zoo) -> dict[str, Any]:
    """What was built: config, corpora (licences, SHA-256), token counts, model sizes, timings."""
    manifest = loaded.manifest
    models = manifest["models"]
    target_params = models["target"]["parameters"]
    return {
        "key": manifest["key"], "config": manifest["config"], "corpus_sha256": manifest["corpus_sha256"],
        "corpora": manifest["corpora"], "tokens": manifest["tokens"], "models": models,
        "target_to_draft_parameter_ratio": {name: target_params / info["parameters"]
                                            for name, info in models.items() if name != "target"},
        "build_device": manifest["device"], "build_timings": manifest["timings"],
        "build_environment": manifest["environment"],
    }


def measure_acceptance(loaded: zoo.Zoo, budget: MeasurementBudget, progress: bool = True,
                       backend: str = "auto") -> dict[str, Any]:
    """Engine-measured acceptance matrix (γ, T = 1) + exact teacher-forced Σ min(p, q), with the margins."""
    engine = zoo.engine_acceptance_matrix(loaded, budget.gamma, budget.matrix_new_tokens, budget.matrix_prompts,
                                          progress=progress, backend=backend)
    engine_alpha = {name: {d: cell["token_acceptance"] for d, cell in row.items()} for name, row in engine.items()}
    engine_fraction = {name: {d: cell["mean_acceptance"] for d, cell in row.items()} for name, row in engine.items()}
    say("flashspec zoo: exact teacher-forced acceptance (sum of min(p, q))", progress)
    exact = zoo.expected_acceptance_matrix(loaded)
    return {
        "gamma": budget.gamma, "temperature": 1.0, "domains": list(loaded.domains), "drafts": list(loaded.drafts),
        "definitions": {
            "engine_token_acceptance": "per-token α = accepted / (accepted + rejections), engine steps",
            "engine_accepted_fraction": "accepted / drafted = E[n]/γ, engine steps (stats.summary mean_acceptance)",
            "teacher_forced_expected_acceptance": "mean Σ_v min(p_v, q_v) on held-out text, T = 1 (exact α)",
        },
        "engine": engine, "engine_token_acceptance": engine_alpha,
        "engine_margins": zoo.specialisation_margins(engine_alpha, loaded.domains),
        "engine_accepted_fraction": engine_fraction,
        "engine_fraction_margins": zoo.specialisation_margins(engine_fraction, loaded.domains),
        "teacher_forced_expected_acceptance": exact,
        "teacher_forced_margins": zoo.specialisation_margins(exact, loaded.domains),
    }


def measure_switching(loaded: zoo.Zoo, budget: MeasurementBudget, oracle: dict[str, int], progress: bool = True,
                      backend: str = "auto") -> dict[str, Any]:
    """The domain-switching experiment (`flashspec_lab.switching`) on the zoo's held-out prompts."""
    return switching.run_switching_experiment(
        loaded.target, loaded.drafts, loaded.prompts, oracle, budget.switching_requests, budget.switching_block,
        budget.switching_new_tokens, budget.gamma, budget.bandits, progress=progress, backend=backend)


def switching_settings(size: str, budget: MeasurementBudget, loaded: zoo.Zoo, oracle: dict[str, int]) -> dict[str, Any]:
    """The settings of a switching run: its budget, the bandits and the oracle's draft per domain."""
    names = list(loaded.drafts)
    return {"size": size, **{key: value for key, value in dataclasses.asdict(budget).items()
                             if key.startswith("switching") or key == "gamma"},
            "bandits": list(budget.bandits), "oracle_arms": {d: names[a] for d, a in oracle.items()},
            "oracle": switching.ORACLE}


def report(size: str, out_dir: str | Path, fresh: bool = False, device: str | None = None,
           budget: MeasurementBudget | None = None, command: str | list[str] | None = None,
           progress: bool = True, backend: str = "auto") -> list[Path]:
    """Build (from scratch when `fresh`) and measure a zoo; write JSON + PNG files into `out_dir`.

    Files: zoo_<size>_build.json, zoo_<size>_perplexity.json, zoo_<size>_acceptance.json/.png,
    zoo_<size>_switching.json, zoo_<size>_switching_trace.png (6 files).
    """
    from flashspec_lab import plots

    config = zoo.get_config(size)
    budget = budget or BUDGETS[config.size]
    out = Path(out_dir)
    started = time.perf_counter()
    stage: dict[str, float] = {}
    path = zoo.zoo_dir(config, device=device, progress=progress, rebuild=fresh)
    stage["build_or_load_s"] = time.perf_counter() - started
    loaded = zoo.load_zoo(config, device=device, path=path, progress=progress)
    prefix = f"zoo_{config.size}"
    written = []

    def save(name: str, settings: dict[str, Any], results: Any, **extra: Any) -> dict[str, Any]:
        file = provenance.write_result(out / f"{prefix}_{name}.json", {**provenance.record(command), **extra},
                                       {"size": config.size, **settings}, results)
        written.append(file)
        say(f"flashspec zoo: wrote {file}", progress)
        return json.loads(file.read_text())

    save("build", {"fresh": fresh}, build_summary(loaded))
    mark = time.perf_counter()
    say("flashspec zoo: held-out perplexity", progress)
    save("perplexity", {"eval_tokens_per_domain": config.eval_tokens}, zoo.perplexity_table(loaded))
    stage["perplexity_s"] = time.perf_counter() - mark

    mark = time.perf_counter()
    acceptance = measure_acceptance(loaded, budget, progress, backend)
    stage["acceptance_s"] = time.perf_counter() - mark
    record = save("acceptance", {"gamma": budget.gamma, "temperature": 1.0, "prompts": budget.matrix_prompts,
                                 "new_tokens": budget.matrix_new_tokens, "verify_backend": backend}, acceptance)
    figure = out / f"{prefix}_acceptance.png"
    plots.plot_acceptance_matrix(record, figure)
    written.append(figure)

    oracle = switching.oracle_arms(acceptance["teacher_forced_expected_acceptance"], list(loaded.drafts),
                                   loaded.domains)
    mark = time.perf_counter()
    switching_results = measure_switching(loaded, budget, oracle, progress, backend)
    stage["switching_s"] = time.perf_counter() - mark
    stage["total_s"] = time.perf_counter() - started
    record = save("switching", switching_settings(config.size, budget, loaded, oracle), switching_results,
                  stage_seconds=stage)
    figure = out / f"{prefix}_switching_trace.png"
    plots.plot_arm_trace(record, figure)
    written.append(figure)
    say(format_report(out, config.size), progress)
    return written


def format_report(out_dir: str | Path, size: str) -> str:
    """A plain-text digest of the report files in `out_dir`."""
    out = Path(out_dir)
    lines = []
    ppl = json.loads((out / f"zoo_{size}_perplexity.json").read_text())["results"]
    domains = list(next(iter(ppl.values())))
    lines.append("held-out perplexity   " + "  ".join(f"{d:>8}" for d in domains))
    for name, row in ppl.items():
        lines.append(f"  {name:<20}" + "  ".join(f"{row[d]:8.2f}" for d in domains))
    acc = json.loads((out / f"zoo_{size}_acceptance.json").read_text())["results"]
    for label, key, margins in (("engine per-token α (γ=4, T=1)", "engine_token_acceptance", "engine_margins"),
                                ("engine accepted/drafted (γ=4, T=1)", "engine_accepted_fraction",
                                 "engine_fraction_margins"),
                                ("teacher-forced Σmin(p,q)", "teacher_forced_expected_acceptance",
                                 "teacher_forced_margins")):
        lines.append(f"{label}   " + "  ".join(f"{d:>8}" for d in domains))
        for name, row in acc[key].items():
            lines.append(f"  {name:<20}" + "  ".join(f"{row[d]:8.3f}" for d in domains))
        margin = acc[margins]
        lines.append("  specialist margin: " + ", ".join(f"{d} {m:+.3f}" for d, m in margin["margins"].items())
                     + f"  (>= {margin['required']}: {'PASS' if margin['passed'] else 'FAIL'})")
    path = out / f"zoo_{size}_switching.json"
    if path.exists():
        switching_results = json.loads(path.read_text())["results"]
        for kind, block in switching_results.items():
            lines.append(f"switching [{kind}]: tokens/s  tokens/step  acceptance")
            for label, run in block["runs"].items():
                lines.append(f"  {label:<20}{run['tokens_per_s']:9.1f}  {run['tokens_per_step']:9.3f}"
                             f"  {run['mean_acceptance']:9.3f}")
            summary = block["summary"]
            ratios = summary["tokens_per_s"]
            lines.append(f"  best bandit {summary['best_bandit']}: {ratios['best_bandit_vs_oracle']:.3f}"
                         f" x oracle, {ratios['best_bandit_vs_best_fixed']:.3f} x best fixed "
                         f"({summary['best_fixed']}) in tokens/s; targets >= 0.95 and >= 1.15")
    return "\n".join(lines)


def info(size: str) -> str:
    """Where a size's zoo lives, whether it is built, and what it holds (does not build)."""
    config = zoo.get_config(size)
    zoo.check_cache_root()  # before the corpora: a wrong FLASHSPEC_CACHE fails at once
    domain_corpora = corpora.assemble(config.train_chars_per_domain, config.domains)
    path = zoo.cache_path(config, domain_corpora)
    lines = [f"zoo size {config.size}: {path}"]
    try:
        manifest = zoo.check_zoo_dir(path)
    except ValueError as error:
        lines.append(f"  not built ({error}); run: flashspec zoo build --size {config.size}")
        manifest = None
    if manifest is not None:
        lines.append(f"  built on {manifest['device']} in {manifest['timings']['total_s']:.1f} s")
        for name, model in manifest["models"].items():
            if "teacher" in model:  # a distilled zoo's target: the teacher it was distilled from, not trained here
                lines.append(f"  {name:<14} {model['parameters']:>11,} parameters  the teacher {model['teacher']}"
                             f" ({model['weights']})")
                continue
            fit = model.get("calibration")
            lines.append(f"  {name:<14} {model['parameters']:>11,} parameters  trained on {'+'.join(model['domains'])}"
                         f" ({model['steps']} steps, final loss {model['final_loss']:.3f}"
                         + ("" if fit is None else f", temperature {fit['temperature']:.2f} folded in") + ")")
    for domain, corpus in domain_corpora.items():
        lines.append(f"  corpus {domain:<7} {len(corpus.train_text):>10,} train chars  sha256 {corpus.sha256[:16]}…"
                     f"  licence: {corpus.licence}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`flashspec zoo build|info|perplexity|acceptance|switching|report|gpu-report ...`."""
    parser = argparse.ArgumentParser(prog="flashspec zoo", description="Offline model zoo: build, inspect, measure.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("build", "build (or load from cache) the zoo"), ("info", "show cache folder and contents"),
                       ("perplexity", "held-out perplexity, models x domains"),
                       ("acceptance", "acceptance matrix, drafts x domains (engine + teacher-forced)"),
                       ("switching", "domain-switching experiment"),
                       ("report", "build + perplexity + acceptance + switching; JSON + PNG into --out"),
                       ("gpu-report", "the H200 run: build the gpu zoo from scratch, then everything, into --out")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--size", choices=sorted(zoo.SIZES), default="gpu" if name == "gpu-report" else "cpu")
        sub.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
        sub.add_argument("--verify-backend", default="auto", choices=("auto", "torch", "triton"),
                         help="flashspec.verify backend inside the engine (auto: Triton on CUDA)")
        if name in ("build",):
            sub.add_argument("--rebuild", action="store_true", help="ignore the cache and build again")
        if name in ("perplexity", "acceptance", "switching", "report", "gpu-report"):
            sub.add_argument("--out", default="results", help="folder for the JSON / PNG files")
        if name == "report":
            sub.add_argument("--fresh", action="store_true", help="rebuild from scratch first")
    args = parser.parse_args(argv)
    cli_checks.output_folder(parser, "--out", getattr(args, "out", None))
    command = ["flashspec", "zoo", *(sys.argv[1:] if argv is None else argv)]
    try:
        return _run(args, command)
    except zoo.ZooCacheError as error:  # a cache the user must fix: say how, without a traceback
        print(f"flashspec zoo: {error}", file=sys.stderr)
        return 2
    except ValueError as error:  # bad input or a machine that cannot build this size: one line with the fix
        print(f"flashspec zoo: error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, command: list[str]) -> int:
    """Carry out one parsed `flashspec zoo` command; `command` is recorded in the results files."""
    if args.command == "build":
        path = zoo.zoo_dir(args.size, device=args.device, rebuild=args.rebuild)
        print(info(args.size))
        print(path)
        return 0
    if args.command == "info":
        print(info(args.size))
        return 0
    if args.command in ("report", "gpu-report"):
        fresh = args.command == "gpu-report" or args.fresh
        files = report(args.size, args.out, fresh=fresh, device=args.device, command=command,
                       backend=args.verify_backend)
        print("\n".join(str(f) for f in files))
        return 0
    budget = BUDGETS[args.size]
    loaded = zoo.load_zoo(args.size, device=args.device)
    settings: dict[str, Any] = {"size": args.size, **dataclasses.asdict(budget)}
    if args.command == "perplexity":
        results: dict[str, Any] = zoo.perplexity_table(loaded)
    elif args.command == "acceptance":
        results = measure_acceptance(loaded, budget, backend=args.verify_backend)
    else:
        oracle = switching.oracle_arms(zoo.expected_acceptance_matrix(loaded), list(loaded.drafts), loaded.domains)
        settings = switching_settings(args.size, budget, loaded, oracle)
        results = measure_switching(loaded, budget, oracle, backend=args.verify_backend)
    file = provenance.write_result(Path(args.out) / f"zoo_{args.size}_{args.command}.json",
                                   provenance.record(command), settings, results)
    print(json.dumps(results if args.command != "switching" else
                     {k: v["summary"] for k, v in results.items()}, indent=1)[:4000])
    print(file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
