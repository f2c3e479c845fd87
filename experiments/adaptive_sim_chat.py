"""What an adaptive policy with plain decoding as an arm can make on the chat set, simulated from measured numbers.

The drafts' tokens per step per category come from a switching record of `experiments/real_pool.py` (its oracle's
per-draft table, at the record's γ), the step costs of a speculative and a plain step from a speed record of the
same workload (the pool's contestant at that γ and fast plain), the category order and tokens per category from
the speed record's settings (blocks in the given order). Each seed serves one stream with a policy learning from
nothing (`flashspec_lab.simulate.plain_arm_stream`), for each budget against plain decoding and each prior of the
drafts' acceptance; the record gives each category's throughput as a multiple of plain decoding's, mean, 95%
interval and least over seeds.

    python experiments/adaptive_sim_chat.py --out results/adaptive_sim_chat_cpu.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec import bandits  # noqa: E402
from flashspec_lab import cli_checks, provenance, simulate  # noqa: E402

SWITCHING = "real_pool_chat_switching_h100_2457333.json"
SPEED = "real_pool_chat_h100_571049a.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--switching", default=SWITCHING, help="switching record (results/ name): tokens per step")
    parser.add_argument("--speed", default=SPEED, help="speed record (results/ name): step costs, categories")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--priors", nargs="+", default=["1,1", "1,4"],
                        help="Beta priors of the drafts' acceptance, as alpha,beta")
    parser.add_argument("--budgets", nargs="+", default=["none", "auto"],
                        help="gamma-ts budgets against plain decoding: none, auto (the default's) or a fraction")
    parser.add_argument("--tokens-per-category", type=int, nargs="+", default=None,
                        help="tokens each category serves (default: the speed record's requests per category × "
                             "new tokens); several values give one run each")
    args = parser.parse_args(argv)
    cli_checks.output_file(parser, "--out", args.out)
    if args.seeds < 2:
        parser.error(f"--seeds must be >= 2 (the interval needs two), got {args.seeds}")
    try:
        args.priors = [tuple(float(v) for v in prior.split(",")) for prior in args.priors]
    except ValueError:
        parser.error(f"--priors takes alpha,beta pairs such as 1,4, got {args.priors}")
    if any(len(prior) != 2 or min(prior) <= 0 for prior in args.priors):
        parser.error(f"--priors takes alpha,beta pairs of positive numbers, got {args.priors}")
    try:
        args.budgets = [None if b == "none" else b if b == "auto" else float(b) for b in args.budgets]
    except ValueError:
        parser.error(f"--budgets takes none, auto or fractions in (0, 1), got {args.budgets}")
    if any(isinstance(b, float) and not 0.0 < b < 1.0 for b in args.budgets):
        parser.error(f"--budgets takes fractions in (0, 1), got {args.budgets}")
    if args.tokens_per_category and min(args.tokens_per_category) < 1:
        parser.error(f"--tokens-per-category must be >= 1, got {args.tokens_per_category}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = provenance.record(git_sha=None)
    switching_record = provenance.load_result(args.switching)
    switching = switching_record["results"]["switching[block]"]
    gamma = switching_record["settings"]["gamma"]  # the γ of the fixed drafts' tokens per step
    speed_record = provenance.load_result(args.speed)
    speed = speed_record["results"]["speed[block]"]["t1"]
    categories = list(speed["per_domain_last_round"]["fast_plain"])
    table = switching["oracle_tokens_per_step"]
    acceptance = {draft: {category: simulate.acceptance_for_tokens(table[draft][category], gamma)
                          for category in categories} for draft in table}
    step_ms = speed["breakdown_last_round"][f"gamma{gamma}"]["ms_per_step"]
    plain_ms = speed["breakdown_last_round"]["fast_plain"]["ms_per_step"]
    settings = speed_record["settings"]
    per_category = settings["requests"] // len(categories) * settings["new_tokens"]
    lengths = args.tokens_per_category or [per_category]
    results = []
    for tokens in lengths:
        for budget in args.budgets:
            for prior in args.priors:
                runs = [simulate.plain_arm_stream(acceptance, step_ms, plain_ms, gamma, tokens, seed, budget=budget,
                                                  prior_alpha=prior[0], prior_beta=prior[1])
                        for seed in range(args.seeds)]
                summary = {}
                for category in categories:
                    ratios = np.array([run[category] for run in runs])
                    mean, half = simulate.mean_confidence_interval(ratios)
                    summary[category] = {"mean": mean, "ci95": half, "min": float(ratios.min())}
                results.append({"tokens_per_category": tokens, "budget": budget, "prior": list(prior),
                                "ratio_to_plain": summary})
                print(f"[adaptive_sim] {tokens} tokens per category, budget {budget}, prior {prior}: "
                      + ", ".join(f"{c} {v['mean']:.3f}" for c, v in summary.items()), flush=True)
    best_arm = max(max(row.values()) for row in table.values())
    provenance.write_result(args.out, record, {
        "switching": args.switching, "speed": args.speed, "seeds": args.seeds, "gamma": gamma,
        "categories_in_order": categories, "step_ms": step_ms, "plain_ms": plain_ms,
        "acceptance": acceptance, "best_tokens_per_step": best_arm, "policy": "gamma-ts",
        "auto_budget": bandits.AUTO_BUDGET,
        "costs": "known to the policy from the start"}, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
