"""Figures for the book and results/: flat functions that take data, return a matplotlib Figure, optionally save it.

No pyplot state: figures are built with `matplotlib.figure.Figure` (safe under the Agg backend, in
scripts, tests and notebooks alike).  Each function accepts either the data dict or a results record
({"provenance": ..., "settings": ..., "results": data}, `flashspec_lab.provenance`) and then prints the settings
and the record's caption (hardware, versions, git SHA, date) under the figure.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter

from flashspec_lab.provenance import caption
from flashspec_lab.simulate import auer_ucb1_bound, sqrt_kt_log_t

__all__ = [
    "plot_reproduced_regret",
    "plot_nonstationary_regret",
    "plot_bandit_sensitivity",
    "plot_cost_aware_shares",
]


def _unpack(record: dict[str, Any], settings: bool = True) -> tuple[Any, str]:
    """(data, footer): the results part of a record and a one-line footer (its settings, when `settings`, and
    its provenance caption)."""
    if "results" not in record:
        return record, ""
    parts = [f"{key}={value}" for key, value in record.get("settings", {}).items()] if settings else []
    if "provenance" in record:
        parts.append(caption(record))
    return record["results"], ", ".join(parts)


def _finish(fig: Figure, footer: str, path: str | Path | None) -> Figure:
    if footer:
        engine = fig.get_layout_engine()
        if engine is not None and hasattr(engine, "set"):
            engine.set(rect=(0, 0.035, 1, 0.965))  # keep the footer clear of the axes labels
        fig.text(0.005, 0.005, footer, fontsize=6.5, color="0.4", ha="left", va="bottom")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=130)
    return fig


def plot_reproduced_regret(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Cumulative regret of UCB1 and Thompson on Bernoulli arms, mean ± 95% CI, with reference curves.

    Draws Auer et al. (2002) Theorem 1's bound for UCB1 at every t and √(K·t·ln t), labelled as the
    scale of a minimax rate (the paper's "≈526" is this number at T = 10⁴, not a bound on either policy).
    """
    data, footer = _unpack(record)
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    colours = {"ucb1": "tab:blue", "thompson": "tab:orange"}
    names = {"ucb1": "UCB1", "thompson": "Thompson sampling"}
    n_arms = len(data["arms"])
    t_max = 1
    for key, entry in data["policies"].items():
        curve = entry["curve"]
        t = np.asarray(curve["t"], dtype=float)
        t_max = max(t_max, int(t[-1]))
        label = (f"{names.get(key, key)}: {entry['final_regret_mean']:.1f} ± {entry['final_regret_ci95']:.1f} "
                 f"({entry['n_seeds']} seeds); seeds 0-4: {entry['seeds_0_4_mean']:.1f}; paper {entry['paper_reported']}")
        ax.plot(t, curve["mean"], color=colours.get(key), label=label)
        ax.fill_between(t, curve["low"], curve["high"], color=colours.get(key), alpha=0.25, linewidth=0)
        ax.plot([t[-1]], [entry["paper_reported"]], marker="x", color=colours.get(key), markersize=8)
    t = np.linspace(2, t_max, 300)
    ax.plot(t, auer_ucb1_bound(data["arms"], t), "k--", label=f"Auer et al. 2002, Thm 1 bound for UCB1 (= {data['auer_bound']:.1f} at T)")
    ax.plot(t, sqrt_kt_log_t(n_arms, t), ":", color="0.35",
            label=f"√(K·t·ln t) = {data['sqrt_kt_log_t']:.2f} at T: a rate's scale, not a bound (paper's ≈526)")
    ax.set_yscale("log")
    ax.set_xlabel("step t")
    ax.set_ylabel("cumulative pseudo-regret")
    ax.set_title(f"Bernoulli arms {data['arms']}: reproduced regret (× = paper's reported value)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    return _finish(fig, footer, path)


def _information_colour(entry: dict[str, Any]) -> str:
    if entry.get("policy") == "oracle":
        return "0.6"
    if entry.get("feedback") == "full":
        return "tab:green"
    if entry.get("request_boundaries"):
        return "tab:purple"
    if entry.get("observation") == "step":
        return "tab:orange"
    return "tab:blue"


def plot_nonstationary_regret(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Final regret relative to UCB1 (1 bit) for every policy × information, one panel per switch interval."""
    data, footer = _unpack(record)
    regimes = data["regimes"]
    fig = Figure(figsize=(11, 0.38 * max(len(r["configs"]) for r in regimes.values()) + 1.6), layout="constrained")
    axes = fig.subplots(1, len(regimes), sharey=True, squeeze=False)[0]
    for ax, (switch, regime) in zip(axes, regimes.items()):
        labels = list(regime["configs"])
        entries = [regime["configs"][label] for label in labels]
        baseline = regime["configs"]["UCB1 (1 bit)"]["final_regret_mean"]
        ratios = [entry["ratio_to_ucb1"] for entry in entries]
        errors = [entry["final_regret_ci95"] / baseline for entry in entries]
        y = np.arange(len(labels))[::-1]
        ax.barh(y, ratios, xerr=errors, color=[_information_colour(e) for e in entries], alpha=0.85, capsize=2)
        offset = 0.015 * max(ratios)
        for yy, ratio, error, entry in zip(y, ratios, errors, entries):
            ax.text(ratio + error + offset, yy, f"{ratio:.2f} ({entry['final_regret_mean']:.0f})", va="center", fontsize=7)
        ax.axvline(1.0, color="k", linewidth=0.8)
        ax.axvline(0.5, color="tab:red", linestyle="--", linewidth=1, label="target ≤ 0.5× UCB1")
        ax.set_yticks(y, labels, fontsize=7.5)
        ax.set_xlabel("final regret / UCB1 (1 bit)   (label: ratio, regret)")
        ax.set_title(f"domain switch every {switch} steps (UCB1 regret {baseline:.0f})", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Piecewise-stationary drafts, γ=4, acceptance levels "
                 f"{data['levels']}, requests of {data['request_length']} steps\ncolour = information used "
                 "(blue 1 bit, orange step n of γ, purple + request boundaries, green full feedback)", fontsize=8.5)
    return _finish(fig, footer, path)


def plot_bandit_sensitivity(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Regret / UCB1 against each knob (discount as memory 1/(1-δ), window, request re-prior ρ), per regime."""
    data, footer = _unpack(record)
    regimes = data["regimes"]
    sweep_names = list(next(iter(regimes.values()))["sweeps"])
    fig = Figure(figsize=(4.0 * len(sweep_names), 3.4 * len(regimes)), layout="constrained")
    axes = fig.subplots(len(regimes), len(sweep_names), squeeze=False)
    for row, (switch, regime) in enumerate(regimes.items()):
        for col, sweep in enumerate(sweep_names):
            ax = axes[row][col]
            for info, series in regime["sweeps"][sweep].items():
                x = np.asarray(series["x"], dtype=float)
                if "discount" in sweep:
                    x = 1.0 / (1.0 - x)
                ax.errorbar(x, series["ratio"], yerr=series["ci95"], marker="o", markersize=3, capsize=2, label=info)
            ax.axhline(1.0, color="k", linewidth=0.8)
            ax.axhline(0.5, color="tab:red", linestyle="--", linewidth=1)
            if "discount" in sweep or "window" in sweep:
                ax.set_xscale("log")
            xlabel = {"d-ucb discount": "D-UCB memory 1/(1-δ) [steps]", "sw-ucb window": "SW-UCB window W [steps]",
                      "request_decay": "request re-prior ρ (0 = reset, 1 = ignore)"}.get(sweep, sweep)
            ax.set_xlabel(xlabel, fontsize=8)
            ax.set_ylabel("regret / UCB1 (1 bit)", fontsize=8)
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(FixedLocator([0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10]))
            ax.yaxis.set_major_formatter(FormatStrFormatter("%.2g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_title(f"switch every {switch} (UCB1 {regime['ucb1_regret']:.0f})", fontsize=8.5)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=6.5)
    fig.suptitle("Sensitivity to window / discount / request re-prior (dashed red: 0.5× target)", fontsize=9)
    return _finish(fig, footer, path)


def plot_cost_aware_shares(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Share of steps on each draft under acceptance vs throughput rewards, when the best-accepted draft is slow."""
    data, footer = _unpack(record)
    policies = data["policies"]
    n_arms = len(data["acceptance"])
    fig = Figure(figsize=(8, 3.8), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / max(len(policies), 1)
    x = np.arange(n_arms)
    for index, (label, entry) in enumerate(policies.items()):
        bars = ax.bar(x + (index - (len(policies) - 1) / 2) * width, entry["pull_share"], width,
                      label=f"{label} (throughput regret {entry['final_regret_mean']:.0f} ± {entry['final_regret_ci95']:.0f})")
        ax.bar_label(bars, fmt="%.2f", fontsize=6.5)
    ticks = [f"draft {k}\nα={data['acceptance'][k]}, cost={data['draft_costs'][k]}\n"
             f"tokens/step={data['expected_tokens_per_step'][k]:.2f}, thr.={data['expected_throughput_reward'][k]:.3f}"
             for k in range(n_arms)]
    ax.set_xticks(x, ticks, fontsize=7)
    ax.set_ylabel("share of steps")
    ax.set_ylim(0, 1.5)
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.set_title(f"Cost-aware selection, γ={data['gamma']}: highest acceptance is not fastest", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", ncol=2)
    return _finish(fig, footer, path)


# ---------------------------------------------------------------- model zoo (flashspec_lab.zoo, flashspec_lab.switching)

def plot_acceptance_matrix(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Heatmaps of draft x domain acceptance: engine-measured (accepted / drafted), exact Σ min(p, q), and
    exact greedy agreement, whichever the record holds.

    Takes the record written by `experiments.zoo.report` (zoo_<size>_acceptance.json), or any record whose
    results hold "drafts", "domains" and those matrices with their margins; each panel's title states the
    specialist margin (specialist minus best other draft, per domain).
    """
    data, footer = _unpack(record)
    panels = [("engine_token_acceptance", "engine_margins", f"engine, γ={data.get('gamma')}, T=1: per-token α"),
              ("engine_accepted_fraction", "engine_fraction_margins",
               f"engine, γ={data.get('gamma')}, T=1: accepted / drafted"),
              ("teacher_forced_expected_acceptance", "teacher_forced_margins", "exact Σ min(p, q), held-out text"),
              ("teacher_forced_greedy_acceptance", "teacher_forced_greedy_margins",
               "exact argmax agreement (T = 0), held-out text")]
    panels = [panel for panel in panels if panel[0] in data]
    drafts, domains = data["drafts"], data["domains"]
    fig = Figure(figsize=(4.2 * len(panels) + 0.8, 0.55 * len(drafts) + 2.2), layout="constrained")
    for index, (key, margin_key, title) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), index + 1)
        values = np.array([[data[key][draft][domain] for domain in domains] for draft in drafts])
        image = ax.imshow(values, cmap="viridis", vmin=0.0, vmax=max(1e-9, float(values.max())), aspect="auto")
        for row in range(len(drafts)):
            for col in range(len(domains)):
                best = values[row, col] == values[:, col].max()
                ax.text(col, row, f"{values[row, col]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if values[row, col] > 0.6 * values.max() else "white",
                        fontweight="bold" if best else "normal")
        ax.set_xticks(range(len(domains)), domains)
        ax.set_yticks(range(len(drafts)), [f"draft: {d}" for d in drafts])
        ax.set_xlabel("domain of the prompts / text")
        margins = data[margin_key]["margins"]
        ax.set_title(title + "\nmargin " + ", ".join(f"{d} {m:+.2f}" for d, m in margins.items()), fontsize=8)
        fig.colorbar(image, ax=ax, shrink=0.8)
    return _finish(fig, footer, path)


def plot_temperature_fit(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Σ min(p, q_τ) at T = 1 against the draft temperature τ, a line per distilled draft, its fitted τ marked.

    Takes a record of `experiments/real_pool.py` (or a zoo manifest's "models"): each draft's
    "calibration" entry from `flashspec_lab.zoo.distill.calibrate`.
    """
    data, footer = _unpack(record, settings=False)
    models = data["build"]["models"] if "build" in data else data
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    for name, info in models.items():
        fit = info.get("calibration")
        if fit is None:
            continue
        table = {float(t): v for t, v in fit["sum_min_t1_by_temperature"].items()}
        temperatures = sorted(table)
        line, = ax.plot(temperatures, [table[t] for t in temperatures], marker=".", label=name)
        chosen = fit["temperature"]
        ax.plot([chosen], [table[chosen]], marker="o", markersize=8, fillstyle="none", color=line.get_color())
    ax.axvline(1.0, color="0.6", linestyle=":", linewidth=1)
    ax.set_xlabel("draft temperature τ (draft logits / τ)")
    ax.set_ylabel("Σ min(p, q_τ) at T = 1, training windows")
    ax.set_title("Fitting each draft's temperature (circle: the τ folded into its weights)", fontsize=9)
    ax.legend(fontsize=8)
    return _finish(fig, footer, path)


def plot_arm_trace(record: dict[str, Any], path: str | Path | None = None,
                   policies: tuple[str, ...] | None = None) -> Figure:
    """Arm chosen at every step of the domain-switching stream, one strip per policy, per workload.

    Background bands show each request's domain; the right margin prints tokens/s and tokens/step.
    Default policies: the oracle, the best fixed draft and the two best bandits by tokens/s.
    """
    from matplotlib.patches import Patch

    data, footer = _unpack(record)
    kinds = list(data)
    fig = Figure(figsize=(10, 2.6 * len(kinds) + 0.6), layout="constrained")
    band_colours = ["#dbe9f6", "#fde2cf", "#dcefd8", "#eadcf0", "#f6f0c8"]
    for index, kind in enumerate(kinds):
        block = data[kind]
        runs, summary = block["runs"], block["summary"]
        if policies is None:
            bandits = sorted((k for k in runs if k != "oracle" and not k.startswith("fixed:")),
                             key=lambda k: -runs[k]["tokens_per_s"])[:2]
            chosen = ["oracle", summary["best_fixed"], *bandits]
        else:
            chosen = [p for p in policies if p in runs]
        ax = fig.add_subplot(len(kinds), 1, index + 1)
        arm_names = list(runs[chosen[0]]["arm_share"])
        seen = set(block["requests"])  # colour by domain in draft order, the same in every panel
        domains = [d for d in arm_names if d in seen] + sorted(seen - set(arm_names))
        for start in range(len(block["requests"])):  # one band per request, coloured by its domain
            domain = block["requests"][start]
            ax.axvspan(start, start + 1, color=band_colours[domains.index(domain) % len(band_colours)], lw=0)
        ax.legend(handles=[Patch(color=band_colours[i % len(band_colours)], label=f"{d} request")
                           for i, d in enumerate(domains)], loc="lower right", bbox_to_anchor=(1.0, 1.0),
                  ncol=len(domains), fontsize=6, frameon=False, borderaxespad=0.1)
        for lane, label in enumerate(chosen):
            run = runs[label]
            request_of_step = np.asarray(run["request_of_step"])
            counts = np.bincount(request_of_step, minlength=len(block["requests"]))
            first = np.r_[0, np.cumsum(counts)[:-1]]
            within = np.arange(len(request_of_step)) - first[request_of_step]
            position = request_of_step + within / counts[request_of_step]
            offset = lane * (len(arm_names) + 1)
            ax.scatter(position, offset + np.asarray(run["arm_trace"]), s=3, color=f"C{lane}")
            ax.text(1.01, offset + (len(arm_names) - 1) / 2,
                    f"{label}\n{run['tokens_per_s']:.0f} tok/s, {run['tokens_per_step']:.2f} tok/step",
                    transform=ax.get_yaxis_transform(), fontsize=7, va="center")
        ax.set_yticks([lane * (len(arm_names) + 1) + a for lane in range(len(chosen)) for a in range(len(arm_names))],
                      [name for _ in chosen for name in arm_names], fontsize=6)
        ax.set_xlim(0, len(block["requests"]))
        ax.set_xlabel("request index (steps spread evenly within each request); band colour = request domain: "
                      + ", ".join(f"{d}" for d in domains), fontsize=7)
        per_s, per_step = summary["tokens_per_s"], summary["tokens_per_step"]
        ax.set_title(f"{kind}: best bandit {summary['best_bandit']} = "
                     f"{per_s['best_bandit_vs_oracle']:.2f}× oracle, {per_s['best_bandit_vs_best_fixed']:.2f}× best "
                     f"fixed (tok/s); {per_step['best_bandit_vs_oracle']:.2f}×, "
                     f"{per_step['best_bandit_vs_best_fixed']:.2f}× (tok/step)", fontsize=7.5, loc="left")
    return _finish(fig, footer, path)


__all__ += ["plot_acceptance_matrix", "plot_arm_trace"]


def plot_verify_benchmark(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Verification step time per (B, V) on a log axis: floor, kernels, CUDA-graph replay, the Triton step,
    the PyTorch reference and the per-token host loop, from a `flashspec bench verify` record."""
    data, footer = _unpack(record, settings=False)
    points = data["points"]
    series = [
        ("floor (launch or bytes / bandwidth)", lambda p: p["floor_us"], "0.25"),
        ("two kernels, each timed alone (sum)", lambda p: p["triton_stats_kernel_us"] + p["triton_sample_kernel_us"],
         "C2"),
        ("Triton step, CUDA-graph replay", lambda p: p["triton_graph_replay_us"], "C9"),
        ("Triton step (eager launch)", lambda p: p["triton_us"], "C0"),
        ("PyTorch reference", lambda p: p["torch_us"], "C1"),
        ("per-token .item() host loop", lambda p: p.get("host_loop_us", float("nan")), "C3"),
    ]
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(series)
    positions = np.arange(len(points))
    for index, (label, value, colour) in enumerate(series):
        ax.bar(positions + (index - (len(series) - 1) / 2) * width, [value(p) for p in points], width,
               label=label, color=colour)
    ax.set_yscale("log")
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, top * 20)  # headroom for the legend
    ax.set_xticks(positions, [f"B={p['batch']}\nV={p['vocab']:,}" for p in points], fontsize=8)
    ax.set_ylabel("time per verification step (µs, median)")
    ax.set_title(f"One verification step, γ={points[0]['gamma']}, {points[0]['dtype']} logits, "
                 f"T={points[0]['temperature']}", fontsize=9, loc="left")
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    ax.grid(axis="y", which="both", alpha=0.3)
    return _finish(fig, footer, path)


__all__ += ["plot_verify_benchmark"]


PRECEDING_CALLS = {"after_itself": "itself", "after_honest": "the honest verify",
                   "after_honest_gc_off": "the honest verify, gc off", "after_cpu_cache_sweep": "64 MB read on the host",
                   "after_cpu_torch_ops": "30 CPU torch ops"}


def plot_preceding_call(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """One eager verify step and one honest PyTorch verify, each from an idle GPU with the launch included, after
    different untimed calls (`experiments/verify_interference.py`): a bar per preceding call and (B, V), the host
    time of the call itself hatched inside it."""
    data, footer = _unpack(record, settings=False)
    points = data["points"]
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    width = 0.8 / len(PRECEDING_CALLS)
    positions = np.arange(len(points))
    for column, (call, title) in enumerate((("step", "Triton verify step (verify_triton)"),
                                            ("honest", "honest PyTorch verify"))):
        ax = fig.add_subplot(1, 2, column + 1)
        for index, (key, label) in enumerate(PRECEDING_CALLS.items()):
            where = positions + (index - (len(PRECEDING_CALLS) - 1) / 2) * width
            rows = [point[call].get(key, {}) for point in points]
            ax.bar(where, [row.get("event_us", np.nan) for row in rows], width, color=f"C{index}",
                   label=f"after {label}")
            ax.bar(where, [row.get("host_us", np.nan) for row in rows], width * 0.5, color="none",
                   edgecolor="0.2", hatch="///", linewidth=0.4)
        ax.set_xticks(positions, [f"B={p['batch']}\nV={p['vocab']:,}" for p in points], fontsize=8)
        ax.set_ylabel("µs from an idle GPU (median)")
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(axis="y", alpha=0.3)
        if column == 0:
            ax.legend(fontsize=7, loc="upper left", title="hatched: the host's time in the call", title_fontsize=7)
    return _finish(fig, footer, path)


__all__ += ["plot_preceding_call"]


def plot_kernel_floors(record: dict[str, Any], path: str | Path | None = None, variant: str = "default") -> Figure:
    """Each verify kernel's duration under Nsight Compute at each (B, V) (`experiments/verify_ncu.py`), with its
    issue floor (its instructions at full issue) hatched inside the bar: where the two meet, the kernel is bound by
    the instructions it issues."""
    data, footer = _unpack(record, settings=False)
    entries = [entry for entry in data if entry["variant"] == variant]
    roles = (("stats", "stats pass"), ("sample", "sampling pass"))
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    positions = np.arange(len(entries))
    width = 0.38
    for index, (role, label) in enumerate(roles):
        where = positions + (index - 0.5) * width
        kernels = [next((k for k in entry["launched"] if f"_{role}" in k["name"]), {}) for entry in entries]
        ax.bar(where, [k.get("duration_us", np.nan) for k in kernels], width, color=f"C{index}", label=label)
        ax.bar(where, [k.get("issue_floor_us") or np.nan for k in kernels], width * 0.5, color="none",
               edgecolor="0.2", hatch="///", linewidth=0.4)
    ax.set_xticks(positions, [f"B={e['batch']}\nV={e['vocab']:,}" for e in entries], fontsize=8)
    ax.set_ylabel("µs (one kernel, caches flushed)")
    ax.set_title(f"verify kernels under Nsight Compute ({variant} plan); hatched: the instructions at full issue",
                 fontsize=9, loc="left")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return _finish(fig, footer, path)


__all__ += ["plot_kernel_floors"]


def plot_one_pass_split(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """The one-pass verify step (residual="rejection") at each (B, V) of a `flashspec bench verify` record that timed
    its diagnostics, as a stack: its streaming part alone, what the ticket and the accept test add, and what the
    proposals (and any fallback race) add, beside the two-launch step's replay and 2x the floor (the bar)."""
    data, footer = _unpack(record, settings=False)
    points = [p for p in data["points"] if "diagnostic_one_pass_stream" in p.get("variants", {})]
    stream = np.array([p["variants"]["diagnostic_one_pass_stream"].get("graph_warm_us") or np.nan for p in points])
    accept = np.array([p["variants"]["diagnostic_one_pass_accept"].get("graph_warm_us") or np.nan for p in points])
    whole = np.array([p.get("rejection_graph_warm_us") or np.nan for p in points])
    two = np.array([p.get("triton_graph_warm_us") or np.nan for p in points])
    fig = Figure(figsize=(9, 3.6), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    positions = np.arange(len(points))
    width = 0.38
    left = positions - width / 2
    parts = (("streaming part", np.zeros_like(stream), stream),
             ("+ ticket and accept test", stream, np.maximum(accept - stream, 0)),
             ("+ proposals (and fallback)", np.maximum(accept, stream), np.maximum(whole - np.maximum(accept, stream), 0)))
    for index, (label, bottom, height) in enumerate(parts):
        ax.bar(left, height, width, bottom=bottom, color=f"C{index}", label=label)
    ax.bar(positions + width / 2, two, width, color="0.6", label="two launches (race)")
    bars = np.array([2 * p["floor_us"] for p in points])
    ax.hlines(bars, positions - width, positions + width, colors="k", linestyles="--", linewidth=1,
              label="bar: 2x the floor")
    ax.set_xticks(positions, [f"B={p['batch']}\nV={p['vocab']:,}" for p in points], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("µs (warm CUDA-graph replay)")
    ax.set_title("one launch, residual by rejection: where its replay goes", fontsize=9, loc="left")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _finish(fig, footer, path)


__all__ += ["plot_one_pass_split"]


def plot_standings(records: list[dict[str, Any]], path: str | Path | None = None) -> Figure:
    """The replay bar across every structure of the verify step (`flashspec_lab.bench.standings`), over one or more
    `flashspec bench verify` records of the same points: per (B, V) and structure, the fastest exact warm replay
    over the floor (a marker at the runs' median, a line across their range), and the bar at 2x the floor."""
    from flashspec_lab.bench import GIVEN_LOG_PROBS, STRUCTURES, TARGETS_GRAPH_OVER_FLOOR, standings

    footer = caption(records[0]) if records and "provenance" in records[0] else ""
    shas = sorted({str(r["provenance"].get("git_sha") or "")[:7] for r in records if "provenance" in r} - {""})
    if len(records) > 1 and shas:
        footer += f"; {len(records)} runs, at git {', '.join(shas)}"
    ratios: dict[tuple[int, int], dict[str, list[float]]] = {}
    for record in records:
        for point in _unpack(record, settings=False)[0]["points"]:
            for name, row in standings(point).items():
                ratios.setdefault((point["batch"], point["vocab"]), {}).setdefault(name, []).append(row["over_floor"])
    keys = sorted(ratios, key=lambda key: (key[1], key[0]))
    log_probs = [given[0] for given in GIVEN_LOG_PROBS]
    names = [name for name in (*STRUCTURES, *log_probs)
             if any(name in ratios[key] for key in keys)]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / max(len(names), 1)
    for index, name in enumerate(names):
        x, mid, low, high = [], [], [], []
        for position, key in enumerate(keys):
            values = ratios[key].get(name)
            if values:
                x.append(position - 0.4 + width * (index + 0.5))
                mid.append(float(np.median(values)))
                low.append(min(values))
                high.append(max(values))
        hollow = name in log_probs
        ax.vlines(x, low, high, colors=f"C{index}", linewidth=1.5)
        ax.plot(x, mid, "o", color=f"C{index}", mfc="none" if hollow else f"C{index}", ms=6,
                label=name + (" (floor counts the draft's logits)" if hollow else ""))
    ax.axhline(TARGETS_GRAPH_OVER_FLOOR, color="k", linestyle="--", linewidth=1,
               label=f"bar: {TARGETS_GRAPH_OVER_FLOOR:g}x the floor")
    ax.set_xticks(range(len(keys)), [f"B={b}\nV={v:,}" for b, v in keys], fontsize=8)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(FixedLocator([1, 1.5, 2, 3, 5, 10, 20, 40]))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("fastest exact replay / floor")
    ax.set_title(f"the replay bar, every structure ({len(records)} run{'s' if len(records) != 1 else ''}: "
                 "marker at the median, line across the runs)", fontsize=9, loc="left")
    ax.grid(axis="y", alpha=0.3)
    fig.legend(fontsize=7, loc="outside right upper")
    return _finish(fig, footer, path)


__all__ += ["plot_standings"]


def plot_generation_trace(stats: Any, path: str | Path | None = None, window: int = 8) -> Figure:
    """Arm chosen and acceptance at every step of one speculative generation.

    `stats` is a `flashspec.stats.GenerationStats`, its `to_dict()`, or a record {"results": that dict}.
    Top: the arm each step played. Bottom: per-step mean acceptance (accepted / γ over active rows),
    its running mean over `window` steps, and the tokens each row kept.
    """
    record = stats.to_dict() if hasattr(stats, "to_dict") else stats
    data, footer = _unpack(record)
    names, steps = data["arm_names"], data["steps"]
    index = np.arange(len(steps))
    arms = np.array([step["arm"] for step in steps], dtype=int)
    acceptance = np.array([np.mean(step["num_accepted"]) / step["gamma"] if step["num_accepted"] else np.nan
                           for step in steps])
    kept = np.array([np.mean(step["kept"]) if step["kept"] else np.nan for step in steps])
    fig = Figure(figsize=(8, 4.4), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[1, 1.6])
    colours = [f"C{arm % 10}" for arm in arms]
    top.scatter(index, arms, c=colours, s=14, marker="s")
    top.set_yticks(range(len(names)), names, fontsize=7)
    top.set_ylim(-0.6, len(names) - 0.4)
    top.set_title("arm chosen per step", fontsize=9, loc="left")
    bottom.plot(index, acceptance, ".", color="0.5", ms=4, label="step acceptance (accepted / γ)")
    if len(steps) >= 1:
        width = max(1, min(window, len(steps)))
        running = np.convolve(np.nan_to_num(acceptance), np.ones(width) / width, mode="valid")
        bottom.plot(index[width - 1:], running, color="C3", lw=1.5, label=f"running mean ({width} steps)")
    bottom.set_ylim(-0.05, 1.05)
    bottom.set_ylabel("acceptance")
    bottom.set_xlabel("step")
    kept_axis = bottom.twinx()
    kept_axis.step(index, kept, where="mid", color="C0", alpha=0.35, lw=1, label="tokens kept (row mean)")
    kept_axis.set_ylabel("tokens kept", fontsize=8, color="C0")
    bottom.legend(fontsize=7, loc="lower left")
    summary = data.get("summary", {})
    if summary:
        bottom.set_title(
            f"B={summary.get('batch_size')}, acceptance rate "
            f"{summary.get('acceptance_rate', summary.get('mean_acceptance')) or float('nan'):.3f}, "
            f"{summary.get('generated_tokens')} tokens in {summary.get('steps')} steps",
            fontsize=9, loc="left",
        )
    return _finish(fig, footer, path)


__all__ += ["plot_generation_trace"]


def plot_engine_benchmark(record: dict[str, Any], path: str | Path | None = None) -> Figure:
    """Tokens/s of each method per batch size, side by side, from a `flashspec bench engine` record; each bar is
    labelled with its acceptance rate (accepted / drafted, where the method has one) and p50 step latency."""
    results, footer = _unpack(record, settings=False)
    batches = list(results)
    methods = list(dict.fromkeys(method for batch in batches for method in results[batch]["cells"]))
    fig = Figure(figsize=(9, 4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(methods)
    for index, method in enumerate(methods):
        for position, batch in enumerate(batches):
            cell = results[batch]["cells"].get(method, {})
            sequential = "hf_assisted_sequential" in cell
            cell = cell.get("hf_assisted_sequential", cell)
            if "tokens_per_s" not in cell:
                continue
            x = position + (index - (len(methods) - 1) / 2) * width
            ax.bar(x, cell["tokens_per_s"], width, color=f"C{index}", hatch="//" if sequential else None,
                   label=method if position == 0 else None)
            rate = cell.get("acceptance_rate", cell.get("alpha"))  # "alpha": its name in older records
            label = f"acc. {rate:.2f}\n" if rate is not None else ""
            ax.text(x, cell["tokens_per_s"], f"{label}{cell['p50_step_latency_ms']:.1f} ms",
                    ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(batches)), batches)
    ax.set_ylabel("tokens/s (all rows)")
    settings = record.get("settings", {})
    ax.set_title(f"Decoding throughput, γ={settings.get('gamma')}, {settings.get('max_new_tokens')} new tokens, "
                 f"T={settings.get('temperature')} (hatched: run one row at a time)", fontsize=9, loc="left")
    ax.legend(fontsize=7, ncol=len(methods), loc="upper left")
    bottom, top = ax.get_ylim()
    ax.set_ylim(bottom, top * 1.25)
    return _finish(fig, footer, path)


__all__ += ["plot_engine_benchmark"]


def plot_stacked_bars(rows: dict[str, dict[str, float]], colours: dict[str, str], xlabel: str,
                      path: str | Path | None = None) -> Figure:
    """One horizontal bar per row (label -> {part: value}), its parts stacked in the order of `colours`
    (part -> colour); e.g. a step's or a forward's time split into its pieces."""
    fig = Figure(figsize=(6.5, 0.6 + 0.65 * len(rows)), layout="constrained")
    axis = fig.subplots()
    for index, (label, values) in enumerate(rows.items()):
        left = 0.0
        for part, colour in colours.items():
            axis.barh(label, values.get(part, 0.0), left=left, color=colour, label=part if index == 0 else None)
            left += values.get(part, 0.0)
    axis.invert_yaxis()
    axis.set_xlabel(xlabel)
    # beside the axes: inside, it would cover the end of the longest bar
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _finish(fig, "", path)
