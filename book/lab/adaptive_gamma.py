# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---


# %% [markdown]
# # Adaptive γ: records
#
# Runs in which the decoder chooses γ as well as the draft, on SmolLM2-135M-Instruct and its distilled pool on the
# H200 (the pool's builds and its fixed-γ speed runs are on the SmolLM2 pool page). Every run here rebuilt the pool
# from the same recipe, and the build record's weight hashes show it is the same pool each time. Each section names
# the files it reads; the records, newest first:

# %% tags=["remove-input"]
import json
import re
import warnings
from pathlib import Path

from IPython.display import Markdown, display

import flashspec as fs
from flashspec import stats
from flashspec_lab import plots, provenance
from flashspec_lab.pages import list_records, print_wrapped, result_file

# %matplotlib inline

RESULTS = provenance.results_dir()
# tqdm's notebook bars need ipywidgets, which the book does not install
warnings.filterwarnings("ignore", message="IProgress not found")
committed_result = result_file


from flashspec import rewards

PAGE_RECORDS = [
    "results/real_pool_gamma_split_run2_h200.json",
    "results/real_pool_gamma_split_h200.json",
    "results/real_pool_gamma_ts_shared_h200.json",
    "results/real_pool_gamma_ts_drawn_run4_h200.json",
    "results/real_pool_gamma_ts_drawn_run3_h200.json",
    "results/real_pool_gamma_ts_drawn_run2_h200.json",
    "results/real_pool_gamma_ts_drawn_h200.json",
    "results/real_pool_gamma_ts_priced_rerun_h200.json",
    "results/real_pool_gamma_ts_priced_h200.json",
    "results/real_pool_adaptive_speed_h200.json",
    "results/real_pool_gamma_ts_h200.json",
    "results/real_pool_prefill_graphs_h200.json",
    "results/real_pool_compiled_rebuild_h200.json",
    "results/real_pool_compiled_h200.json",
    "results/real_pool_switching_h200.json",
]
list_records(PAGE_RECORDS)


def draft_hashes(record: dict) -> dict:
    """Each draft's weight SHA-256 in a real-pool record's build."""
    return {name: info["weights_sha256"] for name, info in record["results"]["build"]["models"].items()
            if name != "target"}


COMPILED = committed_result("real_pool_compiled_h200")  # the pool's build, fixed-γ speed runs, anatomy
POOL = committed_result("real_pool_switching_h200")  # the same pool: held-out quality
REBUILT = committed_result("real_pool_compiled_rebuild_h200")  # built again, warm-up replayed
PREFILL_GRAPHS = committed_result("real_pool_prefill_graphs_h200")  # built again, every graph captured ahead
speed = COMPILED["results"].get("speed", {}) if COMPILED is not None else {}
gamma = COMPILED["settings"]["gamma"] if COMPILED is not None else None
domains = list(POOL["results"]["quality"]["acceptance_t1"]["general"]) if POOL is not None else []
adaptive = COMPILED["results"].get("adaptive_gamma") if COMPILED is not None else None
if REBUILT is not None and "adaptive_gamma" in REBUILT["results"]:  # the run with a replayed warm-up
    adaptive = REBUILT["results"]["adaptive_gamma"]
if PREFILL_GRAPHS is not None and "adaptive_gamma" in PREFILL_GRAPHS["results"]:  # graphs captured before timing
    adaptive = PREFILL_GRAPHS["results"]["adaptive_gamma"]

# %% [markdown]
# ## Thompson sampling over (draft, γ) arms
#
# The same stream ($T = 1$) served with γ fixed at each of several values, Thompson sampling
# choosing among the four drafts, against one Thompson sampler over (draft, γ) arms, each arm a draft at one γ.
# The chosen γ per domain shows whether the policy adapts γ to the domain. Shown from the newest run that has it
# (`results/real_pool_prefill_graphs_h200.json`; earlier: `results/real_pool_compiled_rebuild_h200.json`,
# `results/real_pool_compiled_h200.json`), where every contestant first serves the same stream untimed with a fresh copy of its policy
# and the same seeds, then captures every graph an arm can reach (`capture_graphs`), and the timed stream counts
# the CUDA graphs it still captures: a throughput reward reads step times, so the adaptive policy may choose
# differently the second time, and without the captures ahead it met graphs the warm-up had not. Tokens per step
# do not depend on timing.

# %% tags=["hide-input"]
if adaptive is not None:
    adaptive_record = next(record for record in (PREFILL_GRAPHS, REBUILT, COMPILED)
                           if record is not None and "adaptive_gamma" in record["results"])

    def captures(run: dict) -> str:
        return "not counted" if run.get("graph_captures") is None else str(run["graph_captures"])

    print_wrapped(f"from {provenance.caption(adaptive_record)}:", indent="")
    print(f"  {'contestant':<22}{'tokens/s':>9}{'tokens/step':>12}{'accepted/drafted':>17}{'captures':>12}")
    for g, run in adaptive["fixed"].items():
        print(f"  {'fixed γ = ' + g:<22}{run['tokens_per_s']:>9.1f}{run['tokens_per_step']:>12.3f}"
              f"{run['mean_acceptance']:>17.3f}{captures(run):>12}")
    run = adaptive["adaptive"]
    print(f"  {'adaptive (draft, γ)':<22}{run['tokens_per_s']:>9.1f}{run['tokens_per_step']:>12.3f}"
          f"{run['mean_acceptance']:>17.3f}{captures(run):>12}")
    shares = run["gamma_share_per_domain"]
    print("  share of steps at each γ, adaptive:")
    for domain, share in shares.items():
        print(f"    {domain:<8}" + "  ".join(f"γ = {g}: {s:.0%}" for g, s in share.items()))
    best = str(adaptive["best_fixed_gamma"])
    step_vs_best = run["tokens_per_step"] / adaptive["fixed"][best]["tokens_per_step"]
    below = [g for g in adaptive["fixed"] if adaptive["fixed"][g]["tokens_per_step"] < run["tokens_per_step"]]
    above = [g for g in adaptive["fixed"] if g not in below]
    favourite = {domain: max(share, key=share.get) for domain, share in shares.items()}
    everywhere = all(min(share.values()) > 0 and len(share) == len(adaptive["fixed"]) for share in shares.values())
    arms = len(draft_hashes(adaptive_record)) * len(adaptive["fixed"])
    captured = run.get("graph_captures")
    print_wrapped(f"adaptive vs the best fixed γ ({best}): {adaptive['adaptive_vs_best_fixed']:.2f}x in tokens/s "
                  + ("(captures inside the timed stream, not counted: not its cost)" if captured is None else
                     f"({captured} graph captures inside its timed stream)" if captured else "(no captures)")
                  + f", {step_vs_best:.2f}x in tokens per step", indent="    ")
    intro = (
        "In tokens per step the adaptive policy sits "
        + " and ".join(part for part in (
            f"below γ = {' and '.join(above)}" if above else "", f"above γ = {' and '.join(below)}" if below else "")
            if part)
        + f": {step_vs_best:.2f}× the best fixed γ's. Its most chosen γ is "
        + ", ".join(f"{g} on {d}" for d, g in favourite.items())
        + (f", with every γ taking a share on every domain: over {adaptive_record['settings']['requests']} requests its "
           f"{arms} arms have not settled on one γ per domain, which on a pool this uniform (the matrices above) is "
           "no surprise. " if everywhere else ". "))
    most = max(adaptive["fixed"], key=lambda g: adaptive["fixed"][g]["tokens_per_step"])
    steps_vs_most = run["tokens_per_step"] / adaptive["fixed"][most]["tokens_per_step"]
    text = intro + (f"The adaptive policy makes {steps_vs_most:.2f}× the tokens per step of the fixed γ that makes the most, "
            f"γ = {most}" + (f"; by tokens/s the best fixed γ is {best}, whose cheaper steps pay for its fewer "
                             "tokens. " if most != best else ". "))
    if captured == 0:
        text += (f"No contestant captured a graph while timed (every graph an arm can reach was captured before), "
                 f"so tokens/s is each one's cost: the adaptive policy makes {adaptive['adaptive_vs_best_fixed']:.2f}× "
                 "the best fixed γ's.")
    elif captured:
        text += (
            "The fixed-γ runs captured no graph while timing, so their tokens/s are their cost; the adaptive run "
            f"still captured {captured} graphs: its throughput reward read the warm-up's step times (captures "
            "included) and then the timed ones, chose other (draft, γ) arms the second time, and reached cache "
            "sizes and catch-up lengths the warm-up had not. Its tokens/s "
            f"({adaptive['adaptive_vs_best_fixed']:.2f}× the best fixed γ's) is a bound from below, not its cost. "
            "Capturing every graph an arm can reach before timing would settle the cost.")
    else:
        text += "No run here counted its captures, so tokens/s is not a verdict."
    display(Markdown(text))

# %% [markdown]
# ## gamma-ts: a policy that knows what γ is
#
# Thompson sampling over (draft, γ) arms learns each of its twelve arms from that
# arm's own steps, through a reward that needs every arm's cost and rate. But a step at γ = 2 says as much about the
# draft's per-token acceptance as a step at γ = 6: in the geometric model a step with n of γ accepted is n successes
# and, unless n = γ, one failure, whatever γ was. `flashspec.bandits.GammaThompsonSampling` (`policy="gamma-ts"`)
# keeps one Beta posterior per draft, fed by every γ of that draft, draws an acceptance α̃ per draft, and plays the
# arm with the most expected tokens per unit of measured step cost, $(1 + α̃ + \dots + α̃^γ)/c$; an arm whose cost is
# not measured yet is played first (in these runs; the later runs below price it otherwise). The choice still reads
# only the past, so Theorem 1 holds (the exactness tests run it like every other policy). This run has point costs and no
# switch pricing; in the runs after it, the engines tell the step costs which steps changed draft, and gamma-ts
# compares another draft at its switching cost (a catch-up included). Below, both policies on the same stream,
# decoder and warm-up, each starting with no cost measured, from `results/real_pool_gamma_ts_h200.json`; the
# run-to-run movement is read from the contestants that this run and `results/real_pool_prefill_graphs_h200.json`
# share (same weights).

# %% tags=["hide-input"]
GAMMA_TS = committed_result("real_pool_gamma_ts_h200")
if GAMMA_TS is not None:
    policies = GAMMA_TS["results"]["adaptive_gamma"]
    best = str(policies["best_fixed_gamma"])
    best_rate = policies["fixed"][best]["tokens_per_s"]
    print_wrapped(f"from {provenance.caption(GAMMA_TS)}:", indent="")
    print(f"  {'contestant':<26}{'tokens/s':>9}{'vs best fixed':>15}{'tokens/step':>13}{'captures':>10}")
    for g, run in policies["fixed"].items():
        print(f"  {'fixed γ = ' + g:<26}{run['tokens_per_s']:>9.1f}{run['tokens_per_s'] / best_rate:>15.3f}"
              f"{run['tokens_per_step']:>13.3f}{run['graph_captures']:>10}")
    for name, run in policies["adaptive_by_policy"].items():
        print(f"  {'adaptive, ' + name:<26}{run['tokens_per_s']:>9.1f}{run['vs_best_fixed']:>15.3f}"
              f"{run['tokens_per_step']:>13.3f}{run['graph_captures']:>10}")
    for name, run in policies["adaptive_by_policy"].items():
        print(f"  share of steps at each γ, {name}:")
        for domain, share in run["gamma_share_per_domain"].items():
            print(f"    {domain:<8}" + "  ".join(f"γ = {g}: {v:.0%}" for g, v in share.items()))
    earlier = PREFILL_GRAPHS["results"].get("adaptive_gamma") if PREFILL_GRAPHS is not None else None
    movement = None
    if earlier is not None and draft_hashes(PREFILL_GRAPHS) == draft_hashes(GAMMA_TS):
        pairs = [(policies["fixed"][g]["tokens_per_s"], earlier["fixed"][g]["tokens_per_s"]) for g in policies["fixed"]
                 if g in earlier["fixed"]]
        pairs.append((policies["adaptive_by_policy"]["thompson"]["tokens_per_s"], earlier["adaptive"]["tokens_per_s"]))
        movement = max(abs(a / b - 1) for a, b in pairs)
    ours, theirs = (policies["adaptive_by_policy"][name] for name in ("gamma-ts", "thompson"))
    gap = 1 - ours["vs_best_fixed"]
    text = (f"Over (draft, γ) arms, gamma-ts made {ours['vs_best_fixed']:.2f}× the best fixed γ's tokens/s "
            f"(γ = {best}) and Thompson sampling on the throughput reward {theirs['vs_best_fixed']:.2f}×; gamma-ts made "
            f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}× Thompson's. ")
    if movement is not None:
        text += (f"Between this run and `real_pool_prefill_graphs_h200.json`, the contestants both ran moved by at most {movement:.1%} "
                 f"in tokens/s (one run each, same weights), so " +
                 (f"gamma-ts's {gap:.1%} below the best fixed γ is within that movement: it matches the best fixed γ, "
                  "without being told which γ that is. " if gap <= movement else
                  f"gamma-ts's {gap:.1%} below the best fixed γ is more than that movement: it comes close to the best "
                  "fixed γ without being told which it is, but does not reach it. "))
    slowest = min(policies["fixed"], key=lambda g: policies["fixed"][g]["tokens_per_s"])
    at_slowest = {name: max(share.get(slowest, 0.0) for share in run["gamma_share_per_domain"].values())
                  for name, run in policies["adaptive_by_policy"].items()}
    text += (f"The slowest fixed γ ({slowest}) takes at most {at_slowest['gamma-ts']:.0%} of a domain's steps under "
             f"gamma-ts and up to {at_slowest['thompson']:.0%} under Thompson sampling; gamma-ts's most chosen γ is "
             + ", ".join(f"{max(share, key=share.get)} on {domain}"
                         for domain, share in ours["gamma_share_per_domain"].items()) + ".")
    display(Markdown(text))

# %% [markdown]
# ## Switch pricing, measured twice
#
# The same part ran again with gamma-ts pricing a change of draft,
# on a pool built afresh from the same recipe (the same weight hashes), and once more on the same warm machine right
# after (`results/real_pool_gamma_ts_priced_h200.json` and `results/real_pool_gamma_ts_priced_rerun_h200.json`). Two samples of
# one configuration say how far one run can be trusted:

# %% tags=["hide-input"]
PRICED = [run for run in (committed_result("real_pool_gamma_ts_priced_h200"),
                          committed_result("real_pool_gamma_ts_priced_rerun_h200")) if run is not None]
if GAMMA_TS is not None and PRICED:
    runs = [("before the switch pricing", GAMMA_TS)] + [(f"switch-priced, sample {i + 1}", run)
                                                        for i, run in enumerate(PRICED)]
    same_weights = len({tuple(sorted(draft_hashes(run).items())) for _, run in runs}) == 1
    print(f"  {'run':<28}{'best fixed γ':>13}{'its tokens/s':>13}{'gamma-ts ×':>11}{'Thompson ×':>11}"
          f"{'python at γ = 2':>17}")
    for label, run in runs:
        part = run["results"]["adaptive_gamma"]
        best = str(part["best_fixed_gamma"])
        share = part["adaptive_by_policy"]["gamma-ts"]["gamma_share_per_domain"]["python"].get("2", 0.0)
        print(f"  {label:<28}{best:>13}{part['fixed'][best]['tokens_per_s']:>13.1f}"
              f"{part['adaptive_by_policy']['gamma-ts']['vs_best_fixed']:>11.3f}"
              f"{part['adaptive_by_policy']['thompson']['vs_best_fixed']:>11.3f}{share:>17.0%}")
    priced = [run["results"]["adaptive_gamma"] for run in PRICED]
    ours = [part["adaptive_by_policy"]["gamma-ts"]["vs_best_fixed"] for part in priced]
    fixed_moves = [abs(a["fixed"][g]["tokens_per_s"] / b["fixed"][g]["tokens_per_s"] - 1)
                   for a, b in zip(priced, priced[1:]) for g in a["fixed"]]
    top = [max(part["adaptive_by_policy"]["gamma-ts"]["gamma_share_per_domain"]["python"].items(),
               key=lambda kv: kv[1]) for part in priced]
    display(Markdown(
        ("All runs used the same weights. " if same_weights else "The runs' weights differ. ")
        + f"With the switch priced, gamma-ts made {min(ours):.2f}–{max(ours):.2f}× the best fixed γ's tokens/s"
        + (f", while the fixed-γ contestants moved by at most {max(fixed_moves):.1%} between the two samples" if fixed_moves else "")
        + ". So the policy's own result moved far more than the machine: "
        + ", ".join(f"sample {i + 1} put {share:.0%} of python's steps at γ = {g}" for i, (g, share) in enumerate(top))
        + ". Whether pricing a switch helps on this pool is inside that movement. The movement itself has a cause "
        "in the policy: gamma-ts drew the acceptance but took each arm's cost as a point estimate, and an estimate "
        "moves only when its arm is played. An arm judged on one or two slow steps was then never played again. A "
        "seeded simulation of these costs (γ = 2, 4, 6 at 2.45, 2.85 and 3.2 ms, 15 % timing noise) shut the fastest "
        "γ out in 4 of 30 runs. gamma-ts now draws the cost too, about its estimate with the pooled spread of "
        "step times, each arm is measured three times before it is compared, and the estimates are running medians, "
        "which one host stall barely moves; in the simulation the fastest γ then kept at least half the steps in all 30 runs "
        "(`tests/test_adaptive_gamma.py`). The first H200 run of that version stopped before writing its JSON; its log is "
        "`results/real_pool_gamma_ts_drawn_cut_3027b39.log`; the next cell has three samples of it."))
else:
    print("the switch-priced adaptive γ on the H200: not measured (no committed record)")

# %% [markdown]
# ## Drawn costs, four samples
#
# The same part with gamma-ts drawing each arm's cost about its running
# median, on a fresh build of the pool (the same weight hashes again) and twice more on the same warm machine
# (`results/real_pool_gamma_ts_drawn_h200.json`, `results/real_pool_gamma_ts_drawn_run2_h200.json`,
# `results/real_pool_gamma_ts_drawn_run3_h200.json`), then once on another build, again the same weights
# (`results/real_pool_gamma_ts_drawn_run4_h200.json`, the first run to record each γ's step times and the policy's cost estimates). The cell sets them beside the two samples
# with point costs, and asks of the fixed-γ contestants what gamma-ts would have to believe to prefer the γ it chose
# most: a step at γ costs c_γ = (tokens per step) / (tokens per second) on its own decoder.

# %% tags=["hide-input"]
DRAWN = [run for run in (committed_result(f"real_pool_gamma_ts_drawn{tag}_h200")
                         for tag in ("", "_run2", "_run3", "_run4")) if run is not None]
if DRAWN:
    drawn = [run["results"]["adaptive_gamma"] for run in DRAWN]
    point_costs = [run["results"]["adaptive_gamma"] for run in PRICED]
    print(f"  {'run':<26}{'gamma-ts ×':>11}{'Thompson ×':>11}   gamma-ts's share of steps per γ (python / prose / cpp)")
    for label, part in ([(f"point costs, sample {i + 1}", part) for i, part in enumerate(point_costs)]
                        + [(f"drawn costs, sample {i + 1}", part) for i, part in enumerate(drawn)]):
        shares = part["adaptive_by_policy"]["gamma-ts"]["gamma_share_per_domain"]
        print(f"  {label:<26}{part['adaptive_by_policy']['gamma-ts']['vs_best_fixed']:>11.3f}"
              f"{part['adaptive_by_policy']['thompson']['vs_best_fixed']:>11.3f}   "
              + " / ".join("·".join(f"{shares[d].get(g, 0.0):.0%}" for g in map(str, sorted(map(int, part["fixed"]))))
                           for d in ("python", "prose", "cpp")))
    print("  (shares listed for γ = " + ", ".join(sorted(drawn[0]["fixed"], key=int)) + ")")
    ours_drawn = [part["adaptive_by_policy"]["gamma-ts"]["vs_best_fixed"] for part in drawn]
    ours_point = [part["adaptive_by_policy"]["gamma-ts"]["vs_best_fixed"] for part in point_costs]
    fixed = drawn[0]["fixed"]
    fixed_moves = [abs(part["fixed"][g]["tokens_per_s"] / fixed[g]["tokens_per_s"] - 1) for part in drawn[1:] for g in fixed]
    best = str(drawn[0]["best_fixed_gamma"])
    totals = {}
    for part in drawn:
        for share in part["adaptive_by_policy"]["gamma-ts"]["gamma_share_per_domain"].values():
            for g, v in share.items():
                totals[g] = totals.get(g, 0.0) + v
    chosen = max(totals, key=totals.get)
    cost = {g: row["tokens_per_step"] / row["tokens_per_s"] for g, row in fixed.items()}
    cost_ratio = cost[chosen] / cost[best]
    steps = []  # (predicted, measured) ms per gamma-ts step: its γ mix at the fixed decoders' costs, per sample
    for part in drawn:
        policy = part["adaptive_by_policy"]["gamma-ts"]
        domains = policy["gamma_share_per_domain"].values()
        mix = {g: sum(share.get(g, 0.0) for share in domains) / len(domains) for g in part["fixed"]}
        predicted = sum(mix[g] * part["fixed"][g]["tokens_per_step"] / part["fixed"][g]["tokens_per_s"] for g in mix)
        steps.append((1e3 * predicted, 1e3 * policy["tokens_per_step"] / policy["tokens_per_s"]))
    token_ratio = fixed[chosen]["tokens_per_step"] / fixed[best]["tokens_per_step"]
    display(Markdown(
        f"With drawn costs gamma-ts made {min(ours_drawn):.3f}–{max(ours_drawn):.3f}× the best fixed γ (γ = {best}), "
        f"against {min(ours_point):.3f}–{max(ours_point):.3f}× with point costs; the fixed contestants moved by at "
        f"most {max(fixed_moves):.1%} across the {len(drawn)} samples. "
        + ("**Every drawn sample is below every point-cost sample**, a miss against the version it replaced, though "
           f"{len(drawn) + len(ours_point)} samples in all are few. " if max(ours_drawn) < min(ours_point) else
           "The two versions' samples overlap: no difference between them is shown. ")
        + f"gamma-ts played γ = {chosen} most, over all domains and samples. On the fixed decoders a step at "
        f"γ = {chosen} costs {cost_ratio:.3f}× one at γ = {best} and makes {token_ratio:.3f}× the tokens, so "
        f"preferring γ = {chosen} means believing its cost ratio below {token_ratio:.3f}, "
        f"{1 - token_ratio / cost_ratio:.1%} under the truth on those decoders. Is the adaptive decoder, which "
        "holds every γ's buffers and graphs, simply slower per step? Served at the fixed decoders' per-γ costs and "
        "tokens per step, gamma-ts's mix of γ (its domains weighted equally) predicts a mean step of "
        + ", ".join(f"{predicted:.3f} ms (measured {measured:.3f})" for predicted, measured in steps)
        + f": measured over predicted {min(m / p for p, m in steps):.3f}–{max(m / p for p, m in steps):.3f}, "
        + ("so the adaptive decoder steps no slower, and the loss is in what it chose (γ, and the draft under it). "
           if max(m / p for p, m in steps) < 1.02 else "so part of the loss is the adaptive decoder's own step. ")
        + ("**Adaptive γ on the real pool is below the best fixed γ by more than the fixed contestants move.** "
           if 1 - max(ours_drawn) > max(fixed_moves) else
           "Its gap to the best fixed γ is within the fixed contestants' movement. ")
        + "The next cell reads what misled the choice."))
else:
    print("gamma-ts with drawn costs on the H200: not measured (no committed record)")

# %% [markdown]
# ### What gamma-ts believed
#
# The fourth sample recorded each fixed contestant's step times per γ and, at the end
# of gamma-ts's stream, the cost state it chose from: per arm (draft, γ), the running median of the steps that kept
# the draft ("staying", what it compares arms of the draft it is on by) and the steps behind it. Two explanations
# were open: medians that sit below means where step times lean right (tokens per second is a ratio of means), or
# estimates made from too few steps.

# %% tags=["hide-input"]
EXPLAINED = next((run for run in reversed(DRAWN)
                  if "cost_estimates" in run["results"]["adaptive_gamma"]["adaptive_by_policy"]["gamma-ts"]), None)
if EXPLAINED is not None:
    part = EXPLAINED["results"]["adaptive_gamma"]
    policy = part["adaptive_by_policy"]["gamma-ts"]
    believed = policy["cost_estimates"]
    gammas = sorted(part["fixed"], key=int)
    best = str(part["best_fixed_gamma"])
    played = {g: policy["step_ms_by_gamma"].get(g, {}).get("steps", 0) for g in gammas}
    chosen = max(played, key=played.get)
    fixed_ms = {g: part["fixed"][g]["step_ms"] for g in gammas}
    lean = {g: fixed_ms[g]["mean_ms"] / fixed_ms[g]["median_ms"] for g in gammas}
    print("fixed decoders' steps, ms: " + "; ".join(
        f"γ = {g}: median {fixed_ms[g]['median_ms']:.3f}, mean {fixed_ms[g]['mean_ms']:.3f}" for g in gammas))
    print(f"gamma-ts's staying-cost estimates at the end of its stream (ms, steps behind each):")
    drafts = sorted({label.split("@")[0] for label in believed["stay_ms"]})
    ratios = {}
    for draft in drafts:
        cells = []
        for g in gammas:
            label = f"{draft}@γ={g}"
            value, steps = believed["stay_ms"].get(label), believed["steps"]["stay"].get(label, 0)
            cells.append(f"γ = {g}: " + ("—" if value is None else f"{value:.3f} ({steps})"))
        high, low = believed["stay_ms"].get(f"{draft}@γ={chosen}"), believed["stay_ms"].get(f"{draft}@γ={best}")
        ratios[draft] = None if high is None or low is None else high / low
        print(f"  {draft:<8} " + "   ".join(cells))
    truth = fixed_ms[chosen]["median_ms"] / fixed_ms[best]["median_ms"]
    token_ratio = part["fixed"][chosen]["tokens_per_step"] / part["fixed"][best]["tokens_per_step"]
    fooled = [d for d, r in ratios.items() if r is not None and r < token_ratio]
    sparse = min(drafts, key=lambda d: believed["steps"]["stay"].get(f"{d}@γ={best}", 0))
    sparse_steps = believed["steps"]["stay"].get(f"{sparse}@γ={best}", 0)
    rich = max(drafts, key=lambda d: believed["steps"]["stay"].get(f"{d}@γ={best}", 0))
    display(Markdown(
        f"On the fixed decoders a step at γ = {chosen} costs {truth:.3f}× one at γ = {best} (medians) and makes "
        f"{token_ratio:.3f}× the tokens. gamma-ts's own estimates put that cost ratio at "
        + ", ".join(f"{ratios[d]:.3f} ({d})" for d in drafts if ratios[d] is not None)
        + (f": below the token ratio for {', '.join(fooled)}, so there γ = {chosen} looked the better buy. "
           if fooled else ". ")
        + f"The medians are not the cause: step times lean right by {min(lean.values()):.3f}–{max(lean.values()):.3f}"
        f"× (mean over median) at every γ, {'more' if lean[best] > lean[chosen] else 'less'} at γ = {best} than at "
        f"γ = {chosen}, which would tilt the medians {'towards' if lean[best] > lean[chosen] else 'away from'} "
        f"γ = {best}. The estimates' support is: {sparse}'s γ = {best} arm was priced from "
        f"{sparse_steps} staying steps at {believed['stay_ms'][f'{sparse}@γ={best}']:.3f} ms, while {rich}'s "
        f"γ = {best} arm, the same compute, had {believed['steps']['stay'][f'{rich}@γ={best}']} at "
        f"{believed['stay_ms'][f'{rich}@γ={best}']:.3f} ms, against {fixed_ms[best]['median_ms']:.3f} ms on the fixed "
        f"decoder. An arm the policy rarely stays on is priced from its few staying steps, often the ones just after a "
        f"switch, and the arm it stays on most from many: that lock-in favours the incumbent γ. The four drafts share "
        f"one architecture, so a step's cost depends on γ (and on staying or switching), not on which of them runs it: "
        "arms now share their cost estimates by compute (`StepCosts(groups=...)`, grouped by `engine.cost_signature` "
        "of the draft and γ, on both decoders), so every step of a γ prices every draft at that γ. A test reproduces "
        "this case in simulation (tests/test_adaptive_gamma.py: with shared costs gamma-ts picks the better γ in "
        "nearly every select, with per-arm costs mostly the other); the next cell measures it on the H200."))
else:
    print("gamma-ts's cost estimates on the H200: not recorded in any committed run")

# %% [markdown]
# ## Shared costs
#
# Another build of the pool (the same weight hashes) ran the adaptive-γ part with
# both cost models on one machine: gamma-ts as shipped (arms of one compute share their estimates) and
# `gamma-ts:per-arm`, the replaced model, each from nothing learned (`results/real_pool_gamma_ts_shared_h200.json`).

# %% tags=["hide-input"]
SHARED = committed_result("real_pool_gamma_ts_shared_h200")
if SHARED is not None:
    part = SHARED["results"]["adaptive_gamma"]
    gammas = sorted(part["fixed"], key=int)
    best = str(part["best_fixed_gamma"])
    fixed_ms = {g: part["fixed"][g]["step_ms"]["median_ms"] for g in gammas}
    print("fixed γ: " + ", ".join(f"γ = {g} {part['fixed'][g]['tokens_per_s']:.0f} tok/s "
                                  f"({part['fixed'][g]['tokens_per_step']:.3f} tokens a step, {fixed_ms[g]:.3f} ms)"
                                  for g in gammas))
    beliefs = {}
    for name, policy in part["adaptive_by_policy"].items():
        shares = policy["gamma_share_per_domain"]
        stay = policy["cost_estimates"]["stay_ms"]
        drafts = sorted({label.split("@")[0] for label in stay})
        beliefs[name] = {d: stay[f"{d}@γ=4"] / stay[f"{d}@γ={best}"] for d in drafts
                         if stay.get(f"{d}@γ=4") is not None and stay.get(f"{d}@γ={best}") is not None}
        print(f"{name:<18} {policy['vs_best_fixed']:.3f}× the best fixed γ, {policy['tokens_per_step']:.3f} tokens a "
              "step; share of steps per γ (python / prose / cpp): "
              + " / ".join("·".join(f"{shares[d].get(g, 0.0):.0%}" for g in gammas) for d in ("python", "prose", "cpp")))
    shipped, old = part["adaptive_by_policy"]["gamma-ts"], part["adaptive_by_policy"]["gamma-ts:per-arm"]
    truth = fixed_ms["4"] / fixed_ms[best]
    gap = abs(shipped["vs_best_fixed"] - old["vs_best_fixed"])
    drawn_spread = max(ours_drawn) - min(ours_drawn) if DRAWN else None
    display(Markdown(
        f"Shared, gamma-ts's staying-cost ratio of γ = 4 over γ = {best} ended at "
        + ", ".join(sorted({f'{r:.3f}' for r in beliefs['gamma-ts'].values()}))
        + f" (every draft alike, one estimate per γ), against {truth:.3f} on the fixed decoders; per arm it ended at "
        + ", ".join(f"{r:.3f} ({d})" for d, r in beliefs["gamma-ts:per-arm"].items())
        + f". The belief is repaired, and the choice followed: shared, gamma-ts played γ = {best} on "
        + ", ".join(f"{shipped['gamma_share_per_domain'][d].get(best, 0.0):.0%}" for d in ("python", "prose", "cpp"))
        + " of its steps (python, prose, cpp), per arm on "
        + ", ".join(f"{old['gamma_share_per_domain'][d].get(best, 0.0):.0%}" for d in ("python", "prose", "cpp"))
        + f". **Throughput did not follow**: {shipped['vs_best_fixed']:.3f}× the best fixed γ shared against "
        f"{old['vs_best_fixed']:.3f}× per arm, {gap:.3f} apart"
        + (f", less than the {drawn_spread:.3f} the same policy's samples moved across builds above: no difference "
           "is shown. " if drawn_spread is not None and gap < drawn_spread else ". ")
        + f"Both stay below the best fixed γ. Shared, gamma-ts made {shipped['tokens_per_step']:.3f} tokens a step "
        f"while mostly at γ = {best}, where the fixed decoder made {part['fixed'][best]['tokens_per_step']:.3f}: the "
        "gap left is in the tokens a step makes, not in what the steps cost. Learning "
        f"{len(shipped['cost_estimates']['stay_ms'])} (draft, γ) arms from nothing in a stream this short is the "
        "likely cause; it is not measured here."))
else:
    print("gamma-ts with shared costs on the H200: not measured (no committed record)")

# %% [markdown]
# ## Choosing drafts and choosing γ, apart
#
# gamma-ts picks a draft and a γ at once. To see which choice costs
# throughput, another build (the same weight hashes) ran the adaptive-γ part twice on one machine with two
# policies: gamma-ts as shipped over (draft, γ), and `gamma-ts@2`, the same policy over the drafts alone at γ = 2
# (the best fixed γ) on the fixed γ = 2 decoder (`results/real_pool_gamma_split_h200.json`,
# `results/real_pool_gamma_split_run2_h200.json`). The fixed contestants run Thompson sampling over the drafts.

# %% tags=["hide-input"]
SPLIT_RUNS = [run for run in (committed_result("real_pool_gamma_split_h200"),
                              committed_result("real_pool_gamma_split_run2_h200")) if run is not None]
if SPLIT_RUNS:
    same_weights = all(draft_hashes(run) == draft_hashes(SPLIT_RUNS[0]) for run in SPLIT_RUNS)
    print(f"{'run':>4} {'fixed γ=2':>10} {'gamma-ts':>17} {'gamma-ts@2':>17} {'ts / ts@2':>10}  gamma-ts's share of γ = 2 "
          "(python / prose / cpp)")
    choice_cost, draft_only, shipped_runs, fixed_runs = [], [], [], []
    for index, run in enumerate(SPLIT_RUNS, 1):
        part = run["results"]["adaptive_gamma"]
        best = str(part["best_fixed_gamma"])
        both, alone = part["adaptive_by_policy"]["gamma-ts"], part["adaptive_by_policy"][f"gamma-ts@{best}"]
        choice_cost.append(both["tokens_per_s"] / alone["tokens_per_s"])
        draft_only.append(alone["vs_best_fixed"])
        shipped_runs.append(both["vs_best_fixed"])
        fixed_runs.append(part["fixed"][best]["tokens_per_s"])
        print(f"{index:>4} {part['fixed'][best]['tokens_per_s']:7.0f} /s {both['tokens_per_s']:5.0f} /s ({both['vs_best_fixed']:.3f}×) "
              f"{alone['tokens_per_s']:5.0f} /s ({alone['vs_best_fixed']:.3f}×) {choice_cost[-1]:9.3f}×  "
              + " / ".join(f"{both['gamma_share_per_domain'][d].get(best, 0.0):.0%}" for d in ("python", "prose", "cpp")))
    print(f"(tokens/s; × the best fixed γ, γ = {best}, in the same run; the drafts' weights are the same in every run: "
          f"{'yes' if same_weights else 'NO'})")
    display(Markdown(
        f"In the same run, letting gamma-ts also choose γ made {min(choice_cost):.3f}–{max(choice_cost):.3f}× what "
        f"the same policy made held at γ = {best}, in both runs; held at γ = {best}, its choice of drafts made "
        f"{min(draft_only):.3f}–{max(draft_only):.3f}× Thompson sampling's at that γ. So **choosing γ costs "
        f"{1 - max(choice_cost):.0%}–{1 - min(choice_cost):.0%} in both runs, and choosing drafts costs nothing "
        "measurable**: the price is its exploration of γ = 4 and 6 on a stream where γ = 2 is best, and the steps it "
        "then keeps at γ = 4 (python's share of γ = 2 is the lowest in both runs). The fixed γ = "
        f"{best} decoder moved by {max(fixed_runs) / min(fixed_runs) - 1:.1%} between the two runs, while gamma-ts "
        f"moved from {min(shipped_runs):.3f}× to {max(shipped_runs):.3f}× the best fixed γ and gamma-ts@{best} by "
        f"{max(draft_only) / min(draft_only) - 1:.1%}: both policies read measured step times, so two runs of one "
        "build and one seed differ, and one run per policy cannot place it closer than that."))
else:
    print("draft choice and γ choice apart: not measured (no committed record)")

# %% [markdown]
# ## The adaptive policy in the speed runs
#
# The speed runs of the SmolLM2 pool page fix γ. Here the shipped adaptive
# configuration (every draft at γ ∈ {2, 4, 6, 8}, 16 arms, under gamma-ts) joins it on the same blocks stream,
# greedy, starting each timed stream from nothing learned and no cost measured, with every graph an arm can reach
# captured before timing (`results/real_pool_adaptive_speed_h200.json`; the run stopped before its T = 1 half, so
# only greedy is there).

# %% tags=["hide-input"]
ADAPTIVE_SPEED = committed_result("real_pool_adaptive_speed_h200")
if ADAPTIVE_SPEED is not None:
    greedy = ADAPTIVE_SPEED["results"]["speed"]["greedy"]
    contestants = {f"pool, γ = {ADAPTIVE_SPEED['settings']['gamma']} (Thompson over drafts)": greedy["ratio_per_round"],
                   f"{greedy['one_draft']['draft']} alone, γ = {greedy['one_draft']['gamma']}":
                       greedy["one_draft"]["ratio_per_round"],
                   f"adaptive, {greedy['adaptive']['policy']} over (draft, γ)": greedy["adaptive"]["ratio_per_round"]}
    print_wrapped(f"from {provenance.caption(ADAPTIVE_SPEED)} (greedy, {len(greedy['fast_plain']['runs'])} rounds; "
                  f"fast plain {greedy['fast_plain']['median']:.1f} tok/s):", indent="")
    for name, ratios in contestants.items():
        print(f"  {name:<44} {ratios['median']:.3f}x plain  (rounds {ratios['min']:.3f}-{ratios['max']:.3f})")
    print("  share of steps at each γ, adaptive, last round:")
    for domain, share in greedy["adaptive"]["gamma_share_per_domain_last_round"].items():
        print(f"    {domain:<8}" + "  ".join(f"γ = {g}: {v:.0%}" for g, v in share.items()))
    adaptive_ratio = greedy["adaptive"]["ratio_per_round"]
    best_name, best = max(((n, r) for n, r in contestants.items() if not n.startswith("adaptive")),
                          key=lambda item: item[1]["median"])
    display(Markdown(
        f"Greedy, the adaptive policy made {adaptive_ratio['median']:.2f}× fast plain decoding, "
        + ("below" if adaptive_ratio["max"] < best["min"] else "within the rounds' spread of")
        + f" the best fixed configuration here ({best_name}, {best['median']:.2f}×), and short of 1.5×. Learning "
        "16 arms from nothing inside one 12-request stream spends steps on arms it then leaves, and each switch of "
        "draft costs a catch-up forward; this run does not separate the two, and a policy kept across streams (as "
        "a server would keep it) was not timed. The "
        "tokens it emits agree with plain greedy decoding at "
        f"{greedy['adaptive']['greedy_token_agreement_with_plain']:.0%} of positions, as the fixed-γ runs' do "
        f"({greedy['greedy_token_agreement_with_plain']:.0%}): a near-tie in bf16 breaks differently between a "
        "one-token and a multi-token forward (above), and after the first one the continuations part."))

