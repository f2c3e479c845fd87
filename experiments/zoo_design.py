"""``python -m experiments.zoo_design``: the draft-recipe sweeps that chose the zoo's recipe (results/zoo_design/).

A run takes one zoo variant -- a tokenizer and target trained with the size's config plus ``--overrides``,
built once under ``--work-dir`` -- and trains several draft recipes on it with the zoo's own training plan
(`flashspec_lab.zoo.training_plan`), scoring each by the exact teacher-forced acceptance Σ min(p, q) (T = 1) and
the held-out perplexity on every domain.  ``margins``: a specialist's acceptance on its own domain minus the
best other draft's there (the zoo asks for 0.10 on every domain).

    python -m experiments.zoo_design from-scratch --size cpu --name D --overrides '{"train_chars_per_domain": 2000000}' \\
        --variants '[{"name": "d600", "steps": 600}]' --out results/zoo_design/cpu_no_docstrings_from_scratch.json
    python -m experiments.zoo_design fine-tuned --size gpu --name G2 \\
        --variants '[{"name": "g600ft400", "steps": 600, "ft_steps": 400, "ft_lr": 0.003}]' --out results/zoo_design/x.json

Recipes (``--variants``, a JSON list): ``name``; ``draft`` (ModelSpec fields to change); ``steps``, ``lr``,
``batch`` (the generalist's training and, from scratch, every draft's); ``ft_steps``, ``ft_lr``, ``ft_batch``
(fine-tuned: each specialist's, from the trained generalist).  Unset fields keep the config's values.  The
recipe named ``default`` scores the zoo variant's own drafts.  Without ``--name`` the size's cached zoo is
used as it is (``--overrides`` then must be empty).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from flashspec import models
from flashspec_lab import cli_checks, corpora, provenance, zoo
from flashspec_lab.zoo import GENERALIST, ModelSpec, ZooConfig

MODES = ("from-scratch", "fine-tuned")


def variant_config(config: ZooConfig, overrides: dict[str, Any]) -> ZooConfig:
    """`config` with field overrides; "target" and "draft" take a dict of ModelSpec fields to change."""
    changes = dict(overrides)
    for part in ("target", "draft"):
        if part in changes:
            changes[part] = ModelSpec(**{**dataclasses.asdict(getattr(config, part)), **changes[part]})
    return config.with_overrides(**changes)


def recipe_plan(config: ZooConfig, recipe: dict[str, Any], mode: str) -> tuple[ZooConfig, list[zoo.PlanStep]]:
    """The config and the draft steps of the zoo's training plan for one recipe (the target is not retrained)."""
    config = variant_config(config, {
        "draft": recipe.get("draft", {}), "draft_steps": recipe.get("steps", config.draft_steps),
        "draft_lr": recipe.get("lr", config.draft_lr), "draft_batch_size": recipe.get("batch", config.draft_batch_size),
        "specialist_steps": recipe.get("ft_steps", config.specialist_steps),
        "specialist_lr": recipe.get("ft_lr", config.specialist_lr),
    })
    start = f"draft-{GENERALIST}" if mode == "fine-tuned" else None
    plan = [step for step in zoo.training_plan(config, specialists_from=start) if step.name != "target"]
    if "ft_batch" in recipe:
        plan = [dataclasses.replace(step, batch_size=recipe["ft_batch"]) if step.start_from else step for step in plan]
    return config, plan


def train_recipe(loaded: zoo.Zoo, train_ids: dict[str, torch.Tensor], config: ZooConfig, recipe: dict[str, Any],
                 mode: str, device: torch.device) -> dict[str, torch.nn.Module]:
    """Draft name (domain or "general") -> trained draft, in float32 on `device`, specialists first."""
    config, plan = recipe_plan(config, recipe, mode)
    drafts = {step.name.removeprefix("draft-"): model.to(device).float().eval()
              for step, model, _ in zoo.train_plan(plan, config, loaded.tokenizer, train_ids, device, progress=False)}
    return {name: drafts[name] for name in zoo.draft_names(config)}


def score(loaded: zoo.Zoo, drafts: dict[str, torch.nn.Module]) -> dict[str, Any]:
    """Exact acceptance and perplexity of `drafts` on the zoo's held-out text, and the specialists' margins."""
    acceptance = zoo.expected_acceptance_matrix(loaded, drafts=drafts)
    return {"acc": acceptance, "ppl": zoo.perplexity_table(loaded, models=drafts),
            "margins": zoo.specialisation_margins(acceptance, loaded.domains)["margins"]}


def load_variant(size: str, name: str | None, overrides: dict[str, Any], work_dir: Path,
                 device: torch.device) -> tuple[ZooConfig, zoo.Zoo, dict[str, corpora.DomainCorpus]]:
    """The zoo variant `name` (built into `work_dir` on first use), or the size's cached zoo when no name."""
    config = variant_config(zoo.get_config(size), overrides)
    domain_corpora = corpora.assemble(config.train_chars_per_domain, config.domains)
    if name is None:
        if overrides:
            raise ValueError("--overrides needs --name: the cached zoo is the size's config as it is")
        path = zoo.zoo_dir(config, device=str(device), progress=False)
    else:
        path = work_dir / name
        if not (path / zoo.MANIFEST).is_file():
            zoo.build_zoo(config, path, device=str(device), progress=False, domain_corpora=domain_corpora)
    loaded = zoo.load_zoo(config, device=str(device), dtype=torch.float32, path=path, progress=False)
    return config, loaded, domain_corpora


def summary_line(name: str, seconds: float, scored: dict[str, Any]) -> str:
    """One JSON line per recipe: margins, the specialists' and the generalist's acceptance and perplexity."""
    acc, ppl = scored["acc"], scored["ppl"]
    domains = list(scored["margins"])
    return json.dumps({"v": name, "train_s": round(seconds, 1),
                       "margins": {d: round(m, 3) for d, m in scored["margins"].items()},
                       "diag": {d: round(acc[d][d], 3) for d in domains},
                       "gen": {d: round(acc[GENERALIST][d], 3) for d in domains},
                       "ppl_spec": {d: round(ppl[d][d], 1) for d in domains},
                       "ppl_gen": {d: round(ppl[GENERALIST][d], 1) for d in domains}})


def main(argv: list[str] | None = None) -> int:
    """`python -m experiments.zoo_design {from-scratch,fine-tuned} --size S [--name N] ... --out FILE`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m experiments.zoo_design", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=MODES, help="specialists trained from scratch or fine-tuned from the generalist")
    parser.add_argument("--size", choices=sorted(zoo.SIZES), default="cpu")
    parser.add_argument("--name", default=None, help="zoo variant to build or reuse (default: the cached zoo)")
    parser.add_argument("--overrides", type=json.loads, default={}, help="ZooConfig fields of the variant, as JSON")
    parser.add_argument("--variants", type=json.loads, required=True, help="draft recipes, a JSON list")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where zoo variants are built (default: zoo_design/ beside the zoo cache)")
    parser.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    parser.add_argument("--out", type=Path, required=True, help="results file (JSON)")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    cli_checks.output_folder(parser, "--work-dir", args.work_dir)
    device = torch.device(args.device) if args.device else models.default_device()
    work_dir = args.work_dir or zoo.check_cache_root().parent / "zoo_design"
    started = provenance.record(["python -m experiments.zoo_design", *argv])
    config, loaded, domain_corpora = load_variant(args.size, args.name, args.overrides, work_dir, device)
    train_ids = {d: zoo.encode_text(loaded.tokenizer, domain_corpora[d].train_text) for d in config.domains}
    settings = {"mode": args.mode, "size": args.size, "zoo": args.name or f"{args.size} (cached)",
                "overrides": args.overrides, "config": dataclasses.asdict(config)}
    target_ppl = zoo.perplexity_table(loaded, models={"target": loaded.target})["target"]
    print(json.dumps({"zoo": settings["zoo"], "target_ppl": {d: round(p, 2) for d, p in target_ppl.items()}}), flush=True)
    results: dict[str, Any] = {"target_ppl": target_ppl, "variants": []}
    for recipe in args.variants:
        mark = time.perf_counter()
        own = recipe["name"] == "default"
        drafts = loaded.drafts if own else train_recipe(loaded, train_ids, config, recipe, args.mode, device)
        seconds = time.perf_counter() - mark
        scored = score(loaded, drafts)
        results["variants"].append({"variant": recipe, "train_s": seconds, **scored,
                                    "params": zoo.count_parameters(drafts[GENERALIST])})
        print(summary_line(recipe["name"], seconds, scored), flush=True)
        provenance.write_result(args.out, started, settings, results)  # after every recipe: a crash keeps them
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
