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
# # The verification kernel: measurement records
#
# Chapter 2 builds the verification step and shows what it costs on the newest records. This page keeps every
# measurement behind it: each launch structure the step was built in and how it stands against the bars, what holds
# the replay above its floor, the instruction counts of the kernels, the launch-plan tables per Triton version, the
# host's share of an eager call, and the records those replaced. Topics run from the newest records to the oldest.
# Each section names the files it reads (under `results/`); every number on the page is computed from them with
# `flashspec_lab.provenance`, `flashspec_lab.bench` and `flashspec_lab.plots`.
#
# **How to read the records.** Every record is one run of `flashspec bench verify` (or of an `experiments/verify_*`
# driver) on an NVIDIA H200, at $\gamma = 4$ with bf16 logits, at the points $B \in \{1, 8, 64\}$,
# $V \in \{32000, 128256\}$ unless a section says otherwise.
#
# - The **floor** of a point is the larger of one empty Triton launch (timed like the step) and the bytes of every
#   logit read once at the copy bandwidth the same run measured. It is a bound of the problem, not of a design.
# - A **warm replay** is the step captured in a CUDA graph, 20 steps per replay: GPU time, no host work.
# - An **eager** step is one call from Python. Three timings of it appear: the median of `triton.testing.do_bench`;
#   one call *from an idle GPU* (caches flushed, device synchronised, CUDA events around the call, the host's launch
#   included); and *paired*, the honest PyTorch verification and the step called alternately, one call each, judged
#   on the median of the pairs' ratios with their 20th and 80th percentiles as its spread.
# - The **bars** (`flashspec_lab.bench.TARGETS`): the warm replay within 2× the floor at every point (the *replay
#   bar*); the eager step at least 10× faster than the honest verification at $B \le 8$ and 3× at $B = 64$ (the
#   *eager bars*). A bar whose spread lies on both sides of its target is WITHIN SPREAD, neither met nor missed.
# - A **chain probe** (`flashspec_lab.kernels.chain_probe`) replays a launch structure's chain of dependent memory
#   round trips with the least work each program's place asks (one tile load, one store, a ticket): a latency floor
#   of the design, not of the problem.
# - **Structures** (`flashspec_lab.bench.STRUCTURES`): *two launches* (a statistics pass, then a sampling pass; the
#   library's default), the same with the sampling launch a programmatic *dependent launch* (PDL, SM90+), one launch
#   whose last program per row samples the whole row (*fused*), one *cooperative* launch with a barrier per row, one
#   launch per row over a thread-block *cluster*, and the *one pass* that draws the residual by rejection
#   (`residual="rejection"`). Every variant the benchmark times returns the reference's tokens bit for bit (it
#   checks), except the ones named `diagnostic_*`, which stop a kernel early or change its arithmetic and are never
#   chosen.

# %% tags=["remove-input"]
import statistics
import textwrap

from flashspec_lab.pages import glue

from flashspec_lab import bench, plots, provenance

# %matplotlib inline
RESULTS = provenance.results_dir()
BAR_NAMES = {"graph_over_floor_max": "replay <= 2 floors", "honest_over_eager_min_for_batch_le_8":
             "eager >= 10x, B<=8", "honest_over_eager_at_batch_64": "eager >= 3x, B=64"}
assert set(BAR_NAMES) == set(bench.TARGETS)


def read_record(stem: str) -> dict:
    """One results file by its stem; FileNotFoundError names it when it is missing."""
    path = RESULTS / f"{stem}.json"
    if not path.exists():
        raise FileNotFoundError(f"results/{stem}.json is cited on this page but missing")
    return provenance.load_result(stem)


def read_family(pattern: str) -> list[dict]:
    """Every results file matching `pattern`, oldest first (by its provenance date)."""
    found = [provenance.load_result(path.stem) for path in RESULTS.glob(pattern)]
    assert found, f"no results/{pattern}"
    return sorted(found, key=lambda record: record["provenance"]["date_utc"])


def where_run(record: dict) -> str:
    """The machine, software and date of a record, for a caption."""
    origin = record["provenance"]
    machine = origin["hardware"].get("gpu") or "a CPU (compiled, not run)"
    versions = origin["versions"]
    return (f"{machine}; torch {versions.get('torch')}, Triton {versions.get('triton')}; "
            f"{origin['date_utc'][:16].replace('T', ' ')} UTC")


def shape(point: dict) -> tuple[int, int]:
    return point["batch"], point["vocab"]


def label(key: tuple[int, int]) -> str:
    """'8, 128k': the column label of a point (B, V)."""
    return f"{key[0]}, {key[1] // 1000}k"


def spans(values, fmt: str = ".1f") -> str:
    """'low–high' of some values (one value alone when they agree at this precision)."""
    low, high = f"{min(values):{fmt}}", f"{max(values):{fmt}}"
    return low if low == high else f"{low}–{high}"


def per_run(values, fmt: str = ".2f") -> str:
    """One value per run, ' / '-separated ('-' where a run has none)."""
    return " / ".join("-" if value is None else f"{value:{fmt}}" for value in values)


def points_text(keys) -> str:
    return "; ".join(f"B = {b}, V = {v}" for b, v in keys) or "none"


def note(text: str) -> None:
    """A table's note, wrapped to the column."""
    print(textwrap.fill(text, 88))


def show_table(header: list[str], rows: list[list], width: int = 9, first: int = 0,
               text_last: bool = False) -> None:
    """A plain-text table: the first column `first` wide (0: as wide as needed), the rest `width`
    wide and right-aligned (`text_last`: the last column left-aligned after the others)."""
    first = first or max(len(str(row[0])) for row in [header, *rows])
    for row in [header, *rows]:
        middle = row[1:-1] if text_last else row[1:]
        cells = [str(row[0]).ljust(first)] + [str(cell).rjust(width) for cell in middle]
        line = " ".join(cells) + (f"  {row[-1]}" if text_last else "")
        assert len(line) <= 88, f"table line wider than the column: {line}"
        print(line)


def glue_all(values: dict) -> None:
    for name, value in values.items():
        glue(name, value, display=False)

# %% [markdown]
# ## Every structure side by side
#
# The newest records time every structure in the same runs at all six points under Triton 3.9: two launches (the plain
# plan and its tuned variants), the same with a dependent launch, fused, cooperative, cluster, and the one pass. The
# floor is measured in each run and moves a little between runs, so each structure is judged by its fastest exact
# replay over its own run's floor. The steps given the draft's log-probs instead of its logits stand apart: where the
# bytes set the floor ($B = 64$, and $B = 8$ at $V = 128256$) they read fewer bytes than the floor counts, so there
# their ratio flatters them. Three runs of the same code and command (their dates in the output):
# `results/verify_h200_standings_f8ef125.json`, `results/verify_h200_standings_f8ef125_run2.json`,
# `results/verify_h200_standings_f8ef125_run3.json`.

# %% tags=["remove-input"]
standing_runs = read_family("verify_h200_standings_*.json")
for run in standing_runs:
    print(where_run(run))
standing_points: dict[tuple[int, int], list[dict]] = {}
for run in standing_runs:
    for point in run["results"]["points"]:
        standing_points.setdefault(shape(point), []).append(point)
standing_keys = sorted(standing_points, key=lambda key: (key[1], key[0]))
short_names = {"two launches": "2 launches", "two launches, dependent launch": "PDL",
               "one launch, fused": "fused", "one launch, cooperative": "cooperative",
               "one launch, cluster": "cluster", "one launch, rejection": "one pass",
               "two launches given log-probs": "2 launches, lp",
               "one launch, rejection, given log-probs": "one pass, lp"}


def chain_ratios(key: tuple[int, int], field: str) -> list[float]:
    """The plain plan's chain probe `field` over the floor, one per run, at one point."""
    return [p["variants"]["two_launch"][field] / p["floor_us"] for p in standing_points[key]]


rows = []
for name, short in short_names.items():
    cells = []
    for key in standing_keys:
        ratios = [bench.standings(p)[name]["over_floor"] for p in standing_points[key]
                  if name in bench.standings(p)]
        cells.append(f"{statistics.median(ratios):.2f}" if ratios else "-")
    rows.append([short, *cells])
for probe, field in (("chain, 1 launch", "one_launch_chain_floor_us"),
                     ("chain, 2 launches", "chain_floor_us")):
    rows.append([probe, *(f"{statistics.median(chain_ratios(key, field)):.2f}" for key in standing_keys)])
print()
show_table(["B, V:", *map(label, standing_keys)], rows, first=17)
note("(fastest exact warm replay over its run's floor, the median of the runs; lp: given the "
     "draft's log-probs; chain: the plain plan's chain probes over the floor)")
display(plots.plot_standings(standing_runs))

every_point = [p for points in standing_points.values() for p in points]
judged = bench.bar_reached(every_point)
judged_lp = bench.bar_reached(every_point, given_log_probs=True)
verdict_keys = {verdict: [key for key, row in judged.items() if row["verdict"] == verdict]
                for verdict in ("met", "within spread", "missed")}
small_keys = [key for key in standing_keys if key[0] <= 8]
chain_share = [p["variants"]["two_launch"]["one_launch_chain_floor_us"] / (2 * p["floor_us"])
               for key in small_keys for p in standing_points[key]]
widest = max(small_keys, key=lambda key: key[1] * key[0])  # B = 8 at the larger V
stats_share, stats_left, empty_replay, two_chain, stream_share = [], [], [], [], []
for run in standing_runs:
    p = next(q for q in run["results"]["points"] if shape(q) == widest)
    bar = 2 * p["floor_us"]
    two = bench.best_replay(p, bench.STRUCTURES["two launches"])
    stats_share.append(100 * p["variants"][two[0]]["stats_kernel_warm_us"] / bar)
    stats_left.append(bar - p["variants"][two[0]]["stats_kernel_warm_us"])
    empty_replay.append(run["results"]["floors"]["empty_launch_graph_warm_us"])
    two_chain.append(100 * p["variants"]["two_launch"]["chain_floor_us"] / bar)
    stream_share.append(100 * p["variants"]["diagnostic_one_pass_stream"]["graph_warm_us"] / bar)
eager_bars = {}
for name, bar_key in (("small", "honest_over_eager_min_for_batch_le_8"),
                      ("large", "honest_over_eager_at_batch_64")):
    eager_bars[name] = "; ".join(
        f"{row['verdict']} {row['measured']:.1f}× ({row['range'][0]:.1f}–{row['range'][1]:.1f}×)"
        for row in (run["results"]["verdicts"][bar_key]["as_run"] for run in standing_runs))
assert verdict_keys["within spread"] == [], "the prose below has no within-spread case"
glue_all({
    "st_points": len(judged),
    "st_met_n": len(verdict_keys["met"]), "st_met": points_text(verdict_keys["met"]),
    "st_missed_n": len(verdict_keys["missed"]),
    "st_missed": "; ".join(
        f"B = {b}, V = {v}: best " + ", ".join(f"{ratio:.2f}×" for _, ratio in judged[(b, v)]["best"])
        + f" ({judged[(b, v)]['best'][0][0]})" for b, v in verdict_keys["missed"]),
    "st_lp_n": sum(row["verdict"] == "met" for row in judged_lp.values()),
    "st_lp": points_text(key for key, row in judged_lp.items() if row["verdict"] == "met"),
    "st_chain_share": spans([100 * share for share in chain_share], ".0f"),
    "st_widest": points_text([widest]), "st_stats_share": per_run(stats_share, ".0f"),
    "st_stats_left": per_run(stats_left), "st_empty": per_run(empty_replay),
    "st_two_chain": per_run(two_chain, ".0f"), "st_stream": per_run(stream_share, ".0f"),
    "st_eager_small": eager_bars["small"], "st_eager_large": eager_bars["large"],
})

# %% [markdown]
# **The replay bar, with the draft's logits (the step the floor counts), is met at {glue:text}`st_met_n` of
# {glue:text}`st_points` points** ({glue:text}`st_met`) and missed in every run at {glue:text}`st_missed_n`
# ({glue:text}`st_missed`; one ratio per run, and the structure of the first). Given the draft's log-probs, every run
# is within the bar at {glue:text}`st_lp_n` of {glue:text}`st_points` points ({glue:text}`st_lp`).
#
# Why the bar is out of reach at small batches: at $B \le 8$ the chain of a single launch with no arithmetic at all
# (stream, ticket, partials, a sample's loads, the store) already takes {glue:text}`st_chain_share`% of the bar; the
# two log-sum-exps over every logit, the accept test and the residual's draw must fit in what is left. At
# {glue:text}`st_widest` the fastest two-launch plan's statistics kernel alone takes {glue:text}`st_stats_share`% of
# the bar (one value per run), leaving {glue:text}`st_stats_left` µs for the sampling launch, whose own structure (its
# launch, the accept outcome, its row, the winners) is a chain of dependent round trips. An empty launch alone replays
# in {glue:text}`st_empty` µs; the two launches' chain probe takes {glue:text}`st_two_chain`% of the bar, and the one
# pass's streaming part alone {glue:text}`st_stream`%.
#
# The eager bars in the same runs (the default plan, paired with the honest baseline), one verdict per run: at least
# 10× at $B \le 8$: {glue:text}`st_eager_small`; at least 3× at $B = 64$: {glue:text}`st_eager_large`.

# %% [markdown]
# ## One launch: the residual by rejection
#
# ### The design, and the chain it would leave
#
# Where the replay bar is missed at small batches, even the shortest two-launch chain is near or past 2× the floor
# (the table above): the way forward is a shorter chain, not faster arithmetic. A step that samples inside its
# statistics launch has one: the last program of each row, which already reads the row's partials, draws the token
# itself. It needs proposals it can draw without a second pass over $V$. The bonus token can be drawn exactly as
# `fs.sampling.block_race` draws it if the statistics pass keeps, per block of 256 tokens, the sum of $p$'s weights
# (it computes those weights anyway for the log-sum-exp): race the blocks, then the tokens of the winning block, one
# tile load. The residual $\max(0, p - q)$ has no block sums before both normalisers are known, but it can be drawn by
# rejection from $p$: propose $t \sim p$ and accept it with probability $\max(0, 1 - q_t / p_t)$. An accepted $t$ has
# probability proportional to $p_t \max(0, 1 - q_t / p_t) = \max(0, p_t - q_t)$, the residual itself, and $k$
# proposals drawn at once cost one round trip. A proposal is accepted with probability
# $a = \sum_v \max(0, p_v - q_v)$, the residual's mass; a row whose $k$ proposals all fail needs an exact fallback
# (the residual race over $V$: a second pass, in that row only).
#
# **The residual by rejection is exact.** Let $a > 0$ and $r = \max(0, p - q) / a$. Draw $t \sim p$ and an independent
# uniform $u$, and accept when $u \le \max(0, 1 - q_t / p_t)$. Then
# $P(\text{accept}, t = v) = p_v \max(0, 1 - q_v / p_v) = \max(0, p_v - q_v)$, so $P(\text{accept}) = a$ and
# $P(t = v \mid \text{accept}) = r_v$. With $K$ independent proposals, the first accepted one taken, and an
# independent exact draw from $r$ when all $K$ fail, the token is $v$ with probability
# $\sum_{k<K} (1-a)^k a\, r_v + (1-a)^K r_v = r_v$. The fallback's noise must be independent of the proposals': the
# event that sends a row there is made of them. `flashspec.sampling.residual_by_rejection` is this sampler written
# once in PyTorch, each proposal drawn by `block_race` from $p$ with its own hash; `tests/test_verify.py` fits it by
# $\chi^2$ at three residual masses, with two controls that must fail (no accept test; $p$ restricted to the
# residual's support).
#
# The runs of the two-level race timed that chain ahead of the kernel (`chain_step(..., one_launch=True)`: the
# statistics launch's grid, and the row's last program loading from its partials sixteen block tiles and eight
# proposals of $p$ and of $q$) beside each plan's two-launch chain, with the statistics kernel alone, which the one
# launch still contains. The records are the runs of the two-level race (next sections), each point read from the
# newest run that timed it (`flashspec_lab.bench.newest_points`): `results/verify_h200_blocks_8bdaf87.json`,
# `results/verify_h200_blocks_b64_44a4c2b.json`, `results/verify_h200_blocks_all_decba52.json`.

# %% tags=["remove-input"]
block_runs = read_family("verify_h200_blocks_*.json")
block_points = bench.newest_points(block_runs)
for run in block_runs:
    print(where_run(run), "-", len(run["results"]["points"]), "points")
rows, fits, rooms = [], [], {}
for key in sorted(block_points, key=lambda key: (key[1], key[0])):
    p, _ = block_points[key]
    two = bench.shortest_chain_floor(p, lambda row: row.get("launches") == 2)
    one = bench.shortest_chain_floor(p, key="one_launch_chain_floor_us")
    bar = 2 * p["floor_us"]
    rooms[key] = bar - p["triton_stats_kernel_warm_us"]
    if one < bar:
        fits.append((key, one))
    rows.append([label(key), f"{p['floor_us']:.2f}", f"{bar:.2f}", f"{two:.2f}", f"{one:.2f}",
                 f"{p['triton_stats_kernel_warm_us']:.2f}", f"{rooms[key]:.2f}"])
print()
show_table(["B, V", "floor", "bar", "2-launch", "1-launch", "stats", "bar-stats"], rows)
note("(µs, warm CUDA-graph replays; chains: the shortest chain probe over the run's plan variants; "
     "stats: the default plan's statistics kernel alone)")
proposals = 8
worst_fallback = max(r * (1 - r) ** proposals for r in (i / 1000 for i in range(1, 1000)))
glue_all({
    "ol_fits_n": len(fits), "ol_points": len(rows),
    "ol_fits": "; ".join(f"B = {b}, V = {v}: {one:.1f} µs" for (b, v), one in fits),
    "ol_rooms": "; ".join(f"{room:.1f} µs at B = {b}, V = {v}" for (b, v), room in rooms.items()),
    "ol_tight": points_text(key for key, room in rooms.items() if room < 1.5),
    "ol_proposals": proposals, "ol_worst": 100 * worst_fallback,
    "ol_worst_r": f"1/{proposals + 1}", "ol_any_of_64": 100 * (1 - (1 - worst_fallback) ** 64),
})

# %% [markdown]
# The one-launch chain is shorter than the bar at {glue:text}`ol_fits_n` of {glue:text}`ol_points` points
# ({glue:text}`ol_fits`). What the chain does not hold is the step's work: the statistics kernel alone leaves
# {glue:text}`ol_rooms` under the bar for everything the row's last program adds (its round trips and its race); at
# {glue:text}`ol_tight` that is under 1.5 µs, so a one-launch step there also needs a faster statistics pass. A row
# needs the fallback when it rejected (probability $a$ at that position) and all {glue:text}`ol_proposals` proposals
# failed ($(1 - a)^{8}$): at most {glue:text}`ol_worst:.1f`% of rows per step, at $a$ = {glue:text}`ol_worst_r`, where
# some row of 64 falls back in {glue:text}`ol_any_of_64:.0f`% of steps. The fallback's cost is part of the design's
# price at large batches. These were a prediction's inputs, not a measured step; the step itself follows.
#
# ### The one pass, built and timed
#
# `flashspec/kernels/one_pass.py` is that step, behind `fs.verify(..., residual="rejection")`. Its grid is the
# statistics pass's; every program streams its chunk once and keeps, besides its log-sum-exp partial, a (max, sum)
# pair per block of 256 tokens of the target's row. The last program of each row block (an acquire-release ticket)
# loads every position's block pairs with the partials, runs the accept test, then draws eight proposals from $p$ at
# the first rejection (the blocks raced from their pairs, then one tile of logits, the draft's read over the same
# tiles) and takes the first one its accept test keeps; only if all eight fail does it race the residual over the
# whole row alone. A row that accepted everything draws its bonus token the same way, once. The proposals use other
# hashes than the race's, so `residual="rejection"` is its own random stream with its own reference
# (`verify_reference(..., residual="rejection")`); the exactness suite fits it by $\chi^2$ on ten configurations on
# both backends, beside a control that draws the replacement from $p$ and must fail.
#
# Two runs timed it under Triton 3.9. The newer one (`results/verify_h200_one_pass_tail_7370da2.json`) adds two
# diagnostics that stop the kernel after its streaming part and after its accept test (wrong tokens, never chosen),
# which split its replay into what the stream, the ticket and accept test, and the proposals cost:

# %% tags=["remove-input"]
split_run = read_record("verify_h200_one_pass_tail_7370da2")
print(where_run(split_run))
split_points = split_run["results"]["points"]
rows = []
for p in split_points:
    variants = p["variants"]
    exact = p["rejection_tokens_equal_reference"] and p["rejection_log_probs_tokens_equal_reference"]
    rows.append([label(shape(p)), f"{p['floor_us']:.2f}", f"{p['triton_graph_warm_us']:.2f}",
                 f"{p['rejection_graph_warm_us']:.2f}", f"{p['rejection_log_probs_graph_warm_us']:.2f}",
                 f"{variants['diagnostic_one_pass_stream']['graph_warm_us']:.2f}",
                 f"{variants['diagnostic_one_pass_accept']['graph_warm_us']:.2f}",
                 f"{p['rejection_rows']['rejected']}/{p['rejection_rows']['rows']}",
                 p["rejection_rows"]["fallback"]])
    assert exact, f"the one pass's tokens differ from its reference at {label(shape(p))}"
print()
show_table(["B, V", "floor", "2 launch", "one pass", "lp", "stream", "+accept", "rejected",
            "fallback"], rows, width=8)
note("(µs, warm CUDA-graph replays; 2 launch: the default plan, racing the residual; one pass, and "
     "lp: given the draft's log-probs; stream / +accept: the one pass stopped after its streaming "
     "part / after its accept test; rejected, fallback: rows of the benchmark's inputs. The one "
     "pass returned its reference's tokens at every point, in both modes)")
display(plots.plot_one_pass_split(split_run))
bars = split_run["results"]["rejection_verdicts"]
small_split = [p for p in split_points if p["batch"] <= 8]
stream_of = {shape(p): p["variants"]["diagnostic_one_pass_stream"]["graph_warm_us"] for p in split_points}
accept_of = {shape(p): p["variants"]["diagnostic_one_pass_accept"]["graph_warm_us"] for p in split_points}
footprint = [p["variants"]["one_pass"]["registers"]["one_pass"] for p in split_points]
diagnostic_registers = [p["variants"][name]["registers"]["one_pass"]["registers"] for p in split_points
                        for name in ("diagnostic_one_pass_stream", "diagnostic_one_pass_accept")]
fell_back = [p for p in split_points if p["rejection_rows"]["fallback"]]
assert all(p["rejection_tokens_equal_reference"] for p in split_points)
assert len(fell_back) == 1, "the prose names one point where a row fell back"
glue_all({
    "op_points": len(split_points),
    "op_met": sum(p["rejection_graph_warm_over_floor"] <= 2 for p in split_points),
    "op_met_lp": sum(p["rejection_log_probs_graph_warm_over_floor"] <= 2 for p in split_points),
    "op_bar": f"{bars['graph_over_floor_max']['as_run']['verdict']}, worst "
              f"{bars['graph_over_floor_max']['as_run']['measured']:.2f}×",
    "op_bar_lp": f"{bars['graph_over_floor_max_given_log_probs']['as_run']['verdict']}, worst "
                 f"{bars['graph_over_floor_max_given_log_probs']['as_run']['measured']:.2f}×",
    "op_faster": sum(p["rejection_graph_warm_us"] < p["triton_graph_warm_us"] for p in split_points),
    "op_stream": spans([stream_of[shape(p)] / p["triton_stats_kernel_warm_us"] for p in split_points],
                       ".2f"),
    "op_accept": spans([accept_of[shape(p)] - stream_of[shape(p)] for p in small_split]),
    "op_tail": spans([p["rejection_graph_warm_us"] - stream_of[shape(p)] for p in small_split]),
    "op_second": spans([p["triton_graph_warm_us"] - p["triton_stats_kernel_warm_us"]
                        for p in small_split]),
    "op_registers": spans([f["registers"] for f in footprint], ".0f"),
    "op_shared_kb": max(f["shared_bytes"] for f in footprint) // 1024,
    "op_diag_registers": spans(diagnostic_registers, ".0f"),
    "op_fallback_at": points_text(shape(p) for p in fell_back),
    "op_fallback_ratio": fell_back[0]["rejection_graph_warm_us"] / fell_back[0]["triton_graph_warm_us"],
})

# %% [markdown]
# **One launch is not shorter here.** The one pass replays within 2× the floor at {glue:text}`op_met` of
# {glue:text}`op_points` points with the draft's logits and {glue:text}`op_met_lp` given its log-probs (replay bar:
# {glue:text}`op_bar`; given log-probs {glue:text}`op_bar_lp`), and beats the two launches at {glue:text}`op_faster`
# of {glue:text}`op_points` points. Its streaming part alone takes {glue:text}`op_stream`× the two launches'
# statistics kernel (it also keeps the block pairs); everything after it is a chain one program walks through. At
# $B \le 8$ the ticket and the accept test add {glue:text}`op_accept` µs and the whole rest {glue:text}`op_tail` µs
# (the proposals, and the whole kernel's larger footprint: {glue:text}`op_registers` registers and
# {glue:text}`op_shared_kb` KB of shared memory, against {glue:text}`op_diag_registers` registers for the diagnostics,
# which may slow its streaming part too), where the two launches' whole second half (their replay less their
# statistics kernel) costs {glue:text}`op_second` µs. The chain probe measured the structure with independent loads;
# the real tail's loads depend on each other (the partials, then the accept test, then the blocks' race, then a tile),
# and together they cost about what the second launch does. Where a row's proposals all failed
# ({glue:text}`op_fallback_at`), one program races that row's residual over $V$ alone, the fused launch's structure,
# and the step took {glue:text}`op_fallback_ratio:.1f`× the two launches': at 64 rows some row falls back in most
# steps when residuals are small, so there the slow path is the common one. So `residual="race"` stays the default;
# the one pass stays in the library as an exact, tested alternative. A faster one launch would need a tail without
# dependent round trips (the drafted tokens' logits and the proposals' blocks known before the ticket) and a fallback
# spread over many programs.
#
# The older run (`results/verify_h200_one_pass_a3b7e34.json`) timed the one pass in four grids (the default, at most
# two or one tile per statistics program, tiles of 2048):

# %% tags=["remove-input"]
grid_run = read_record("verify_h200_one_pass_a3b7e34")
print(where_run(grid_run))
one_pass_grids = [name for name in grid_run["settings"]["plan_variants"] if name.startswith("one_pass")]
rows = [[label(shape(p)), f"{p['triton_graph_warm_us']:.2f}",
         *(f"{p['variants'][name]['graph_warm_us']:.2f}" for name in one_pass_grids)]
        for p in grid_run["results"]["points"]]
print()
show_table(["B, V", "2 launch", *(name.removeprefix("one_pass").strip("_") or "default"
                                  for name in one_pass_grids)], rows, width=10)
note("(µs, warm CUDA-graph replays: the two launches' default plan, then the one pass in each grid)")
grid_gain = [min(p["variants"][name]["graph_warm_us"] for name in one_pass_grids)
             / p["variants"]["one_pass"]["graph_warm_us"] for p in grid_run["results"]["points"]]
glue_all({"og_gain": spans(grid_gain, ".2f")})

# %% [markdown]
# The fastest grid replayed in {glue:text}`og_gain`× the default grid's time: the grid is not what holds the one pass
# back. Superseded, for the one pass's standing, by the runs of "Every structure side by side".

# %% [markdown]
# ## The statistics pass: its grid, its bytes, and the draft's log-probs
#
# Can the statistics pass itself go faster? One run timed it alone in four more grids around the default's (at most
# two tiles or one per program, tiles of 8192 logits, twice the programs per SM;
# `results/verify_h200_stats_grid_ae19163.json`), and another timed it without draft logits, streaming the target's
# logits only (`results/verify_h200_target_only_13563fb.json`): what it would read if the drafter, which computed the
# draft's log-normalisers when it sampled, handed them over with its tokens.

# %% tags=["remove-input"]
stats_grid_run = read_record("verify_h200_stats_grid_ae19163")
target_run = read_record("verify_h200_target_only_13563fb")
print("grids:", where_run(stats_grid_run))
print("target only:", where_run(target_run))


def stats_alone(point: dict) -> dict[str, float]:
    """Each variant's statistics kernel alone (warm replay, µs), for the variants whose statistics launch
    is the plain pass (not the one that also runs the accept test)."""
    return {name: row["stats_kernel_warm_us"] for name, row in point["variants"].items()
            if row.get("stats_kernel_warm_us") is not None and not row["overrides"].get("accept_once")}


grid_points = {shape(p): p for p in stats_grid_run["results"]["points"]}
copy_rate = target_run["results"]["floors"]["bandwidth_bytes_per_s"]
rows, target_rooms = [], {}
for p in target_run["results"]["points"]:
    alone = stats_alone(grid_points[shape(p)])
    fastest = min(alone, key=alone.get)
    bar = 2 * p["floor_us"]
    target_rooms[shape(p)] = bar - p["target_only_stats_kernel_warm_us"]
    rows.append([label(shape(p)), f"{alone[fastest]:.2f}", f"{max(alone.values()):.2f}",
                 f"{p['floor_us']:.2f}", f"{bar:.2f}", f"{p['triton_stats_kernel_warm_us']:.2f}",
                 f"{p['target_only_stats_kernel_warm_us']:.2f}",
                 f"{p['target_logit_bytes'] / copy_rate * 1e6:.2f}", f"{target_rooms[shape(p)]:.2f}"])
print()
show_table(["B, V", "fastest", "slowest", "floor", "bar", "stats", "target", "its bytes",
            "bar-it"], rows, width=8)
note("(µs, warm CUDA-graph replays of the statistics kernel alone: the fastest and the slowest "
     "plain grid of the grid run; then the target-only run: its floor and bar, the default "
     "plan's statistics kernel with both logits and with the target's only, and the target's "
     "logits at its copy bandwidth)")
grid_spread = [max(alone.values()) / min(alone.values())
               for alone in map(stats_alone, grid_points.values()) if alone]
tight_key = (8, 128256)
tight = next(p for p in target_run["results"]["points"] if shape(p) == tight_key)
glue_all({
    "sg_spread": 100 * (max(grid_spread) - 1),
    "sg_tight_room": target_rooms[tight_key],
    "sg_tight_before": 2 * tight["floor_us"] - tight["triton_stats_kernel_warm_us"],
    "sg_rooms": "; ".join(f"{room:.1f} µs at B = {b}, V = {v}"
                          for (b, v), room in sorted(target_rooms.items()) if (b, v) != tight_key),
})

# %% [markdown]
# Grid, tile width and per-lane partials move the statistics kernel by at most {glue:text}`sg_spread:.0f`% at any
# point (slowest over fastest plain grid): they are not what holds it back. Its bytes are: without the draft's logits
# the pass at $B = 8$, $V = 128256$ leaves {glue:text}`sg_tight_room:.1f` µs of the bar instead of
# {glue:text}`sg_tight_before:.1f` µs, and {glue:text}`sg_rooms` elsewhere. That gave the one-launch step its plan:
# the drafter hands over its log-normalisers, the statistics pass streams the target's logits alone and keeps $p$'s
# block sums, and the last program of each row runs the accept test, draws the bonus token from the blocks, or draws
# the residual by rejection from $p$, reading the draft's logits only in the proposals' tiles ("One launch" above).
#
# ### The draft's log-probs: the statistics pass on the target alone
#
# The drafter samples from its warped log-probs, so it holds them already; `fs.verify(..., draft_is_log_probs=True)`
# takes them in place of the draft's logits and reads them as given. That is exactly the $q$ the draft sampled from
# (recomputing it from the logits gives the same $q$ up to rounding), so the output distribution is unchanged, and
# `tests/test_verify.py` checks that every token is the same as from the logits. The kernels then skip the draft's
# rows in the statistics pass: the accept test reads $\log q$ at the drafted tokens and the residual reads the draft's
# row where it samples, both as given. `tests/test_kernels.py` checks every launch plan against the reference in this
# mode, with a control: rows shifted off one must come back exactly as the reference reads them, which fails if a
# kernel normalises them again. Both engines hand the verifier their model drafters' log-probs: the eager
# `SpeculativeDecoder` and the CUDA-graph `FastSpeculativeDecoder`. The step on the H200 at each point (the default
# plan; the floor stays the one with both logits read), `results/verify_h200_log_probs_c303303.json`:

# %% tags=["remove-input"]
log_probs_run = read_record("verify_h200_log_probs_c303303")
print(where_run(log_probs_run))
lp_points = log_probs_run["results"]["points"]
rows = []
for p in lp_points:
    assert p["log_probs_tokens_equal_reference"], f"log-probs tokens differ at {label(shape(p))}"
    rows.append([label(shape(p)), f"{p['floor_us']:.2f}", f"{p['triton_stats_kernel_warm_us']:.2f}",
                 f"{p['triton_graph_warm_us']:.2f}", f"{p['triton_graph_warm_us'] / p['floor_us']:.2f}",
                 f"{p['log_probs_stats_kernel_warm_us']:.2f}", f"{p['log_probs_graph_warm_us']:.2f}",
                 f"{p['log_probs_graph_warm_us'] / p['floor_us']:.2f}"])
print()
show_table(["B, V", "floor", "stats", "step", "/ floor", "lp stats", "lp step", "/ floor"], rows)
note("(µs, warm CUDA-graph replays of the default plan, given the draft's logits, then given its "
     "log-probs (lp); the log-probs step returned the reference's tokens at every point)")


def grid_chain_share(point: dict) -> float:
    """The shortest two-launch chain at this point in the grid run, over this run's bar (%)."""
    chain = bench.shortest_chain_floor(grid_points[shape(point)], lambda row: row.get("launches") == 2)
    return 100 * chain / (2 * point["floor_us"])


within = [p for p in lp_points if p["log_probs_graph_warm_us"] <= 2 * p["floor_us"]]
above = [p for p in lp_points if p not in within]
launch_floors = [p["floor_launch_us"] for run in (*block_runs, stats_grid_run, target_run, log_probs_run)
                 for p in run["results"]["points"]]
marginal = [p for p in within if p["floor_set_by"] == "one launch"
            and 2 * p["floor_us"] / p["log_probs_graph_warm_us"] < max(launch_floors) / min(launch_floors)]
glue_all({
    "lp_saved": spans([100 * (1 - p["log_probs_graph_warm_us"] / p["triton_graph_warm_us"])
                       for p in lp_points], ".0f"),
    "lp_within_n": len(within), "lp_points": len(lp_points),
    "lp_within": "; ".join(f"B = {p['batch']}, V = {p['vocab']}: "
                           f"{p['log_probs_graph_warm_us'] / p['floor_us']:.2f}×" for p in within),
    "lp_within_logits": sum(p["triton_graph_warm_us"] <= 2 * p["floor_us"] for p in lp_points),
    "lp_above": "; ".join(f"B = {p['batch']}, V = {p['vocab']} "
                          f"({p['log_probs_graph_warm_us'] / p['floor_us']:.2f}×, the shortest "
                          f"two-launch chain {grid_chain_share(p):.0f}% of the bar)" for p in above),
    "lp_launch_floors": spans(launch_floors, ".2f"),
    "lp_marginal": points_text(shape(p) for p in marginal),
})

# %% [markdown]
# Given the draft's log-probs the step replays in {glue:text}`lp_saved`% less time than given its logits, and within
# 2× the floor at {glue:text}`lp_within_n` of {glue:text}`lp_points` points ({glue:text}`lp_within`; with the logits
# in the same run: {glue:text}`lp_within_logits`). Still above it: {glue:text}`lp_above` (the chains of the grid run
# above): the other half of the plan, sampling inside the statistics launch, is the one pass. The launch floor itself
# moved between the H200 runs of this period ({glue:text}`lp_launch_floors` µs, one empty launch per run), so a point
# within 2× by less than that spread ({glue:text}`lp_marginal`) would have missed on another run's floor: met within
# the floor's spread, not beyond it.

# %% [markdown]
# ## The race in two levels: before and after
#
# The sampling pass first raced every token of the sampled row (the *element race*): a counter hash and two correctly
# rounded logarithms (its Gumbel noise) for every token and, on a rejected row, an `exp` and a `log1p` (the residual
# in log space). The library samples in two levels (`fs.sampling.block_race`; chapter 2, step 5, derives it and checks
# it by $\chi^2$): the pass over $V$ only forms each weight and sums it per block of 256 tokens, and noise and
# logarithms are drawn only for the blocks and for the tokens of the winning block. The same key no longer draws the
# same token as the element race did: a seed still determines the run, and every backend and launch plan draws the
# same token for it, but records made before the change hold other samples of the same distribution.
#
# The instruction counts of the sampling kernel, compiled for SM90 on a CPU by `experiments/verify_sass.py`:
# `results/verify_sass_sm90_7cdf841.json` (the element race) and `results/verify_sass_sm90.json` (two levels).

# %% tags=["remove-input"]
sass_element = read_record("verify_sass_sm90_7cdf841")
sass_blocks = read_record("verify_sass_sm90")


def race_loops(record: dict, batch: int = 64, vocab: int = 128256) -> list[float]:
    """Instructions per vocabulary position of the sampling kernel's loops over tiles (default plan)."""
    return [loop["per_position"] for point in record["results"]
            if (point["batch"], point["vocab"], point["variant"]) == (batch, vocab, "default")
            for launch in point["launches"] if launch["kernel"] == "_sample_kernel"
            for loop in launch["loops"]]


element_loops, block_loops = race_loops(sass_element), race_loops(sass_blocks)
print("element race:", where_run(sass_element).replace(" (compiled, not run)", ""))
print("two levels:  ", where_run(sass_blocks).replace(" (compiled, not run)", ""))
print("\nsampling kernel at B = 64, V = 128256, instructions per position and thread")
show_table(["loop", "element", "two levels"],
           [[name, f"{before:.1f}", f"{after:.1f}"] for name, before, after
            in zip(("residual", "p (fallback)", "p"), element_loops, block_loops)], width=11)
glue_all({"sa_residual_before": element_loops[0], "sa_residual_after": block_loops[0],
          "sa_p_before": element_loops[1], "sa_p_after": block_loops[1],
          "sa_residual_fewer": element_loops[0] / block_loops[0],
          "sa_p_fewer": element_loops[1] / block_loops[1]})

# %% [markdown]
# The residual's loop fell from {glue:text}`sa_residual_before:.0f` to {glue:text}`sa_residual_after:.0f` instructions
# per position, $p$'s from {glue:text}`sa_p_before:.0f` to {glue:text}`sa_p_after:.0f`:
# {glue:text}`sa_residual_fewer:.1f`× and {glue:text}`sa_p_fewer:.1f`× fewer, the prediction for the sampling kernel's
# time where it was bound by its instructions ($B = 64$).
#
# On the H200, under Triton 3.9 with every plan variant: the whole benchmark with the element race
# (`results/verify_h200.json`) and with two levels: `results/verify_h200_blocks_8bdaf87.json` (cut by its time limit
# before its sixth point), `results/verify_h200_blocks_b64_44a4c2b.json` (that point alone) and
# `results/verify_h200_blocks_all_decba52.json` (all six points with every structure's tuned variants; the run the
# Triton 3.9 launch-plan table comes from). Each point is read from the newest run that timed it. Per point: the warm
# replay of the default plan and of the fastest variant, and each kernel's own warm time in the default plan.

# %% tags=["remove-input"]
element_run = read_record("verify_h200")
element_points = element_run["results"]["points"]
print("element race:", where_run(element_run))
for run in block_runs:
    print("two levels:  ", where_run(run))
fields = (("default", "triton_graph_warm_us"), ("best", "best_graph_warm_us"),
          ("sample", "triton_sample_kernel_warm_us"), ("stats", "triton_stats_kernel_warm_us"))
rows, sample_ratio, best_over = [], {}, {}
for old in element_points:
    new, _ = block_points[shape(old)]
    pairs = [(old[field], new[field]) for _, field in fields]
    sample_ratio[shape(old)] = pairs[2][0] / pairs[2][1]
    best_over[shape(old)] = new["best_graph_warm_over_floor"]
    rows.append([label(shape(old)), *(f"{a:.1f}>{b:.1f}" for a, b in pairs),
                 f"{old['best_graph_warm_over_floor']:.2f}>{new['best_graph_warm_over_floor']:.2f}"])
print()
show_table(["B, V", *(name for name, _ in fields), "best/floor"], rows, width=12)
note("(µs, warm CUDA-graph replays, element race > two levels; default: the default plan's step, "
     "best: the fastest variant's, sample / stats: the default plan's kernels alone)")
worst = max(best_over, key=best_over.get)
worst_point = block_points[worst][0]
glue_all({
    "bl_sample_ratio": "; ".join(f"{ratio:.2f}× at B = {b}, V = {v}"
                                 for (b, v), ratio in sorted(sample_ratio.items())),
    "bl_gained": points_text(key for key, ratio in sorted(sample_ratio.items()) if ratio > 1.2),
    "bl_worst": points_text([worst]), "bl_worst_ratio": best_over[worst],
    "bl_worst_stats": worst_point["triton_stats_kernel_warm_us"],
    "bl_worst_budget": 2 * worst_point["floor_us"],
    "bl_launch_before": spans([p["floor_launch_us"] for p in element_points], ".2f"),
    "bl_launch_after": spans([p["floor_launch_us"] for p, _ in block_points.values()], ".2f"),
})

# %% [markdown]
# The sampling kernel's warm time changed by {glue:text}`bl_sample_ratio` (element race over two levels). It fell
# where it streamed enough tokens to be bound by its instructions ({glue:text}`bl_gained`); at $B = 1$ a program
# streams a few tiles and waits on its chain of memory round trips, to which the race inside the winning block adds
# one dependent load (a reading, not measured apart). The replay bar is still missed: with each point's fastest plan
# the farthest point is {glue:text}`bl_worst` at {glue:text}`bl_worst_ratio:.2f`× its floor, where the statistics pass
# alone takes {glue:text}`bl_worst_stats:.1f` µs of a {glue:text}`bl_worst_budget:.1f` µs budget. Each run measures
# its own floor: the launch floor was {glue:text}`bl_launch_before` µs in the element race's run and
# {glue:text}`bl_launch_after` µs after, so a ratio to the floor can move against the replay where the machine's empty
# launch did.
#
# The bars of the two-level runs, per run (the replay bar read with each point's fastest plan, the eager bars with the
# alternating pairs of one call each), and the four columns of chapter 2's figure at each point:

# %% tags=["remove-input"]
rows = []
for key in sorted(block_points, key=lambda key: (key[1], key[0])):
    p, run = block_points[key]
    rows.append([label(key), f"{p['floor_us']:.1f}", f"{p['honest_torch_latency_us']:.0f}",
                 f"{p['triton_latency_us']:.1f}", f"{p['triton_graph_warm_us']:.1f}",
                 f"{p['best_graph_warm_us']:.1f}",
                 f"{p['honest_torch_latency_us'] / p['triton_latency_us']:.1f}",
                 f"{p['best_graph_warm_over_floor']:.2f}", block_runs.index(run) + 1])
show_table(["B, V", "floor", "honest", "eager", "replay", "best", "h/eager", "best/fl", "run"], rows,
           width=8)
note("(µs; honest and eager: one call from an idle GPU, launch included, and h/eager the ratio "
     "of those two medians, timed apart (the eager bars read the alternating pairs instead: "
     "\"What the call before it does\" below); replay and best: warm CUDA-graph replays of the "
     "default plan and of the fastest variant; run: the run read, in the order below)")
print()


def bar_cell(run: dict, name: str) -> str:
    """One bar of a run: its verdict and measured value ('-' where the run did not judge it)."""
    bar = run["results"]["verdicts"][name]
    row = bar["with_plan_choice" if name == "graph_over_floor_max" else "as_run"]
    return "-" if row["measured"] is None else f"{row['verdict']} {row['measured']:.2f}"


show_table(["run", *BAR_NAMES.values()],
           [[number, *(bar_cell(run, name) for name in bench.TARGETS)]
            for number, run in enumerate(block_runs, 1)], width=20)
note("(the replay bar with each point's fastest plan, over the points the run timed; the eager bars "
     "with the alternating pairs)")

# %% [markdown]
# Runs 1–3 are `results/verify_h200_blocks_8bdaf87.json`, `results/verify_h200_blocks_b64_44a4c2b.json` and
# `results/verify_h200_blocks_all_decba52.json`. Superseded, for the standing of each structure, by the runs of "Every
# structure side by side"; the element race's run is read again in "The element race's whole record".

# %% [markdown]
# ## The kernels' own work: hardware counters and instruction counts
#
# `experiments/verify_ncu.py` runs each point's step once under Nsight Compute on the H200 (caches flushed before each
# kernel, clocks left alone) and reads each kernel's counters: its duration, how busy DRAM and the SMs were, the
# occupancy, the instructions its threads executed per logit of the step ($B(2\gamma+1)V$ logits) and what its warps
# waited on most. `experiments/verify_sass.py` compiles the same launches for SM90 on a CPU and counts the machine
# code of each loop: what one tile costs a thread. Both records here are of the element race. Two Nsight Compute runs:
# before and after the statistics pass kept its partials per lane (`stats_lane_elems` in
# `flashspec.kernels.plan.GPU_PLAN`: a running (max, sum) for each 8 logits a thread loads, met once per program,
# instead of four reductions across the program's threads per tile, and each exponential one `MUFU.EX2`):
# `results/verify_ncu_h200_40ffb85.json` (before) and `results/verify_ncu_h200_ced19fd.json` (after); the machine
# code: `results/verify_sass_sm90_7cdf841.json`.

# %% tags=["remove-input"]
ncu_before, ncu_after = read_record("verify_ncu_h200_40ffb85"), read_record("verify_ncu_h200_ced19fd")


def ncu_kernels(record: dict, variant: str = "default") -> dict:
    """{(B, V, kernel role): the kernel's row} of one Nsight Compute record's plan."""
    rows = {}
    for entry in record["results"]:
        if entry["variant"] == variant:
            for kernel in entry["launched"]:
                role = "stats" if "_stats" in kernel["name"] else "sample"
                rows[(entry["batch"], entry["vocab"], role)] = kernel
    return rows


for title, record in (("before", ncu_before), ("after", ncu_after)):
    print(f"{title}: {where_run(record)}")
    show_table(["B, V", "kernel", "µs", "DRAM %", "SM %", "occ. %", "inst/logit", "waited on"],
               [[label(key[:2]), key[2], f"{k['duration_us']:.1f}", f"{k['dram_throughput_pct']:.0f}",
                 f"{k['compute_sm_throughput_pct']:.0f}", f"{k['achieved_occupancy_pct']:.0f}",
                 f"{k['thread_instructions_per_element']:.1f}", next(iter(k["top_stalls"]))]
                for key, k in sorted(ncu_kernels(record).items())], width=8, text_last=True)
    print()
note("(one kernel each, caches flushed; waited on: the stall its warps spent most cycles in)")
display(plots.plot_kernel_floors(ncu_after))
share = {key[:2]: k["issue_floor_us"] / k["duration_us"]
         for key, k in ncu_kernels(ncu_after).items() if key[2] == "sample"}
big = (64, 128256)
print(f"\nSM90 machine code at B = 64, V = 128256 (instructions per position and thread)\n"
      f"{where_run(sass_element)}")
for point in sass_element["results"]:
    if (point["batch"], point["vocab"]) == big:
        for launch in point["launches"]:
            loops = ", ".join(f"{loop['per_position']:.1f}" for loop in launch["loops"])
            print(f"  {point['variant']:<20} {launch['kernel']:<22} "
                  + (f"loops: {loops}" if loops
                     else f"no loop ({launch['total_instructions']} in all)"))
before_k, after_k = ncu_kernels(ncu_before), ncu_kernels(ncu_after)
sample_big = before_k[(*big, "sample")]
fast_sample = ncu_kernels(ncu_before, "diagnostic_fast_math")[(8, 32000, "sample")]
plain_sample = before_k[(8, 32000, "sample")]
bytes_floor = next(p["floor_us"] for p in element_points if shape(p) == big)
least = bench.issue_bound_step_us(ncu_after, *big, bytes_floor)
busy = [k["issue_slots_busy_pct"] for key, k in after_k.items() if key[:2] == big]
glue_all({
    "nc_share_big": 100 * share[big],
    "nc_share_small": spans([100 * v for key, v in share.items() if key[0] <= 8], ".0f"),
    "nc_sample_sm": sample_big["compute_sm_throughput_pct"],
    "nc_sample_dram": sample_big["dram_throughput_pct"],
    "nc_residual": element_loops[0], "nc_bonus": element_loops[1],
    "nc_fast": fast_sample["thread_instructions_per_element"],
    "nc_plain": plain_sample["thread_instructions_per_element"],
    "nc_stats_before": f"{before_k[(*big, 'stats')]['compute_sm_throughput_pct']:.0f}% SM and "
                       f"{before_k[(*big, 'stats')]['dram_throughput_pct']:.0f}% DRAM",
    "nc_stats_after": f"{after_k[(*big, 'stats')]['compute_sm_throughput_pct']:.0f}% and "
                      f"{after_k[(*big, 'stats')]['dram_throughput_pct']:.0f}%",
    "nc_moved": "; ".join(f"B = {b}, V = {v}: {before_k[(b, v, r)]['duration_us']:.1f} → "
                          f"{after_k[(b, v, r)]['duration_us']:.1f}"
                          for b, v, r in sorted(before_k) if r == "stats"),
    "nc_issue_stats": after_k[(*big, "stats")]["issue_floor_us"],
    "nc_issue_sample": after_k[(*big, "sample")]["issue_floor_us"],
    "nc_bytes_floor": bytes_floor, "nc_least": least, "nc_least_ratio": least / bytes_floor,
    "nc_busy": spans(busy, ".0f"),
})

# %% [markdown]
# **Figure.** Each kernel's time under Nsight Compute (after the per-lane partials) and, hatched, its instructions at
# the full instruction rate. The sampling pass's instruction floor is {glue:text}`nc_share_big:.0f`% of its time at
# $B = 64$, $V = 128256$, and {glue:text}`nc_share_small`% at $B \le 8$, where both kernels wait on memory latency and
# on each other rather than on their arithmetic.
#
# At $B = 64$, $V = 128256$ the sampling kernel kept the SMs {glue:text}`nc_sample_sm:.0f`% busy and DRAM
# {glue:text}`nc_sample_dram:.0f`%: it is bound by the instructions it executes, not by the bytes it reads. Its
# residual race costs {glue:text}`nc_residual:.0f` instructions per vocabulary position and thread, the bonus race
# {glue:text}`nc_bonus:.0f` (the libdevice logarithms of the Gumbel noise, `log1p` and `exp` of the residual, and the
# counter hash): the float multiply-adds are the polynomials of the correctly rounded functions the bit-exact
# reference needs. `diagnostic_fast_math` swaps them for Triton's approximate ones and saved no instructions ($B = 8$,
# $V = 32000$: {glue:text}`nc_fast:.1f` per logit against {glue:text}`nc_plain:.1f`): Triton's `tl.log` compiles to a
# polynomial as well. The statistics pass ran at {glue:text}`nc_stats_before` at that point before the per-lane
# partials, {glue:text}`nc_stats_after` after; its duration at each point, before → after (µs, one kernel, caches
# flushed): {glue:text}`nc_moved`.
#
# How far can this design go at $B = 64$, $V = 128256$? Each kernel needs at least its instructions at the full rate
# (one warp instruction a cycle from each of an SM's four schedulers, at the clock Nsight Compute read): after the
# change, {glue:text}`nc_issue_stats:.1f` µs for the statistics pass and {glue:text}`nc_issue_sample:.1f` µs for the
# sampling pass. The statistics pass also reads every logit ({glue:text}`nc_bytes_floor:.1f` µs at the copy bandwidth:
# the floor) and can overlap the two; the sampling pass cannot start before it ends. So the two-launch step needs at
# least {glue:text}`nc_least:.1f` µs there, {glue:text}`nc_least_ratio:.2f`× the floor, against the bar's 2×. The
# kernels measured kept their schedulers busy {glue:text}`nc_busy`% of the time at that point, so the bar was out of
# reach of these instruction counts: the sampling race's per-logit arithmetic must shrink first, which is what the
# race in two levels (above) does.
#
# ### The per-lane partials, timed
#
# The same change timed as the benchmark times the step (warm CUDA-graph replay, both kernels), each plan beside
# itself with the per-lane partials turned off, in two runs on one H200 a few minutes apart:
# `results/verify_h200_lanes_ced19fd.json` (three pairs and other plans) and
# `results/verify_h200_lanes_ced19fd_run2.json` (the two pairs below only). The ratio is on / off: below 1 the
# per-lane statistics pass is faster. The replay bar is compared with the last six-point record before the change,
# `results/verify_h200_straight_all_f93f0d7.json`.

# %% tags=["remove-input"]
lanes_runs = [read_record("verify_h200_lanes_ced19fd"), read_record("verify_h200_lanes_ced19fd_run2")]
lane_pairs = (("two_launch", "stats_lanes_off"), ("stats_bv2048_pdl", "stats_bv2048_pdl_lanes_off"))
lane_ratios: dict[tuple[int, int, str], list[float]] = {}
for run in lanes_runs:
    print(where_run(run))
    for point in run["results"]["points"]:
        for on, off in lane_pairs:
            on_us, off_us = (point["variants"][name]["graph_warm_us"] for name in (on, off))
            lane_ratios.setdefault((*shape(point), on), []).append(on_us / off_us)
print()
show_table(["B, V", *(f"{on} on/off" for on, _ in lane_pairs)],
           [[label(key), *(per_run(lane_ratios[(*key, on)], ".3f") for on, _ in lane_pairs)]
            for key in sorted({key[:2] for key in lane_ratios}, key=lambda key: (key[1], key[0]))],
           width=28)
note("(warm replay with the per-lane partials over the same plan without them; one value per run)")
lanes_bar = lanes_runs[0]["results"]["verdicts"]["graph_over_floor_max"]["as_run"]
before_bar = read_record("verify_h200_straight_all_f93f0d7")["results"]["verdicts"][
    "graph_over_floor_max"]["as_run"]
looping = [ratio for (batch, vocab, on), ratios in lane_ratios.items() if on == "two_launch"
           and (batch, vocab) in {(64, 32000), (8, 128256), (64, 128256)} for ratio in ratios]
other_plan = [ratio for (_, _, on), ratios in lane_ratios.items() if on == "stats_bv2048_pdl"
              for ratio in ratios]
glue_all({
    "ln_gain": spans([100 * (1 - ratio) for ratio in looping], ".0f"),
    "ln_other": spans(other_plan, ".2f"),
    "ln_bar": f"{lanes_bar['measured']:.2f}× ({lanes_bar['verdict']})",
    "ln_bar_before": f"{before_bar['measured']:.2f}×",
})

# %% [markdown]
# Where the statistics programs loop over tiles ($B = 64$, and $B = 8$ at $V = 128256$), the per-lane partials made
# the default two-launch plan {glue:text}`ln_gain`% faster in both runs; where a program covers one tile they are off,
# and the two columns time the same code. In `stats_bv2048_pdl`, whose statistics programs are 4 warps over two tiles
# of 2048, they moved the replay by {glue:text}`ln_other`×. The gain is small beside the bar: the worst point of the
# default plans replayed at {glue:text}`ln_bar` of its floor, against {glue:text}`ln_bar_before` before.
#
# ### Cheaper math
#
# Is the per-element math what is left at large batches? The sampling kernel hashes a counter to a uniform and takes a
# log, an exp and a log1p for every logit of the sampled row. `diagnostic_fast_math_bv2048` is `stats_bv2048` with the
# GPU's approximate `log` and `exp` (MUFU) instead of libdevice's correctly rounded ones, and `diagnostic_fast_math`
# the same for the default plan; their tokens may differ at near-ties, so they are never chosen. One run under Triton
# 3.9, with the element race: `results/verify_fast_math_h200_triton39.json`.

# %% tags=["remove-input"]
fast_math = read_record("verify_fast_math_h200_triton39")
print(where_run(fast_math))
math_pairs = (("stats_bv2048", "diagnostic_fast_math_bv2048"), ("two_launch", "diagnostic_fast_math"))
rows, math_ratio = [], []
for point in fast_math["results"]["points"]:
    cells = []
    for precise, fast in math_pairs:
        slow_us, fast_us = (point["variants"][name]["graph_warm_us"] for name in (precise, fast))
        cells += [f"{slow_us:.1f}", f"{fast_us:.1f}"]
        math_ratio.append((point["batch"], fast_us / slow_us))
    rows.append([label(shape(point)), *cells])
print()
show_table(["B, V", "bv2048", "fast", "default", "fast"], rows, width=10)
note("(µs, warm CUDA-graph replays: each plan with libdevice's math, then with the approximate math)")
assert min(ratio for _, ratio in math_ratio) > 0.95, "the prose says no point got 5% faster"
glue_all({"fm_ratio": spans([ratio for _, ratio in math_ratio], ".2f"),
          "fm_ratio_64": spans([ratio for batch, ratio in math_ratio if batch == 64], ".2f")})

# %% [markdown]
# With approximate math the replay took {glue:text}`fm_ratio`× the precise plan's ({glue:text}`fm_ratio_64`× at
# $B = 64$). **The per-element math is not what held these points at their replay times**: with the cheaper math no
# point got more than 5% faster. Cheaper math as such is closed by measurement; fewer logarithms per logit (the race
# in two levels) is what moved the sampling kernel.

# %% [markdown]
# ## The eager step and the host
#
# An eager step is mostly host work: Python, Triton's launcher and the driver. This part keeps what was measured about
# it, newest first: what the call before a step does to it, the step launched straight from its binding, where its
# host time goes, and how the eager step is timed at all.
#
# ### What the call before it does
#
# In the runs of the straight launch (next section) the paired ratio sits well below the ratio of the two calls'
# medians timed apart. The pairs alternate the honest baseline and the step, so half the steps run right after an
# honest call. `experiments/verify_interference.py` times the step from an idle GPU after different untimed calls,
# with the host time of the call itself beside the event time (`results/verify_interference_h200.json`); a benchmark
# run at the same commit records each pair's sides and the ratio by which call ran first
# (`results/verify_h200_paired_sides_71b79a0.json`); and a later run times the pairs with both calls finding the host
# alike: each right after an untimed call of itself ("warm"), or right after reading 64 MB on the host, which empties
# the CPU caches without touching torch or the GPU ("cold"; `results/verify_h200_host_state_2b88980.json`).

# %% tags=["remove-input"]
straight_runs = read_family("verify_h200_straight_*.json")
paired = [p["honest_over_triton_paired"] for run in straight_runs for p in run["results"]["points"]]
apart = [p["honest_over_triton_latency"] for run in straight_runs for p in run["results"]["points"]]
interference = read_record("verify_interference_h200")
sides = read_record("verify_h200_paired_sides_71b79a0")
host_state = read_record("verify_h200_host_state_2b88980")
for record in (interference, sides, host_state):
    print(where_run(record))
calls = {"after_itself": "itself", "after_honest": "honest", "after_honest_gc_off": "honest, gc off",
         "after_cpu_cache_sweep": "64 MB read", "after_cpu_torch_ops": "CPU torch ops"}
print("\nthe step and the honest baseline after each preceding call: µs from an idle GPU")
for call in ("step", "honest"):
    show_table([f"{call} after:", *(label(shape(p)) for p in interference["results"]["points"])],
               [[name, *(f"{p[call][key]['event_us']:.1f}" for p in interference["results"]["points"])]
                for key, name in calls.items()], width=9, first=15)
    print()
by_order = [(shape(p), p["honest_over_triton_paired_by_order"]) for p in sides["results"]["points"]]
show_table(["pairs by order", *(label(key) for key, _ in by_order)],
           [[f"{first.replace('_', ' ')}", *(f"{orders[first]:.1f}" for _, orders in by_order)]
            for first in ("honest_first", "step_first")], width=9, first=15)
note("(honest baseline over step, median of the pairs, by which call of the pair ran first)")
display(plots.plot_preceding_call(interference))
steps = interference["results"]["points"]
slower = [p["step"]["after_honest"]["event_us"] / p["step"]["after_itself"]["event_us"] for p in steps]
host_share = [(p["step"]["after_honest"]["host_us"] - p["step"]["after_itself"]["host_us"])
              / (p["step"]["after_honest"]["event_us"] - p["step"]["after_itself"]["event_us"])
              for p in steps]
gc_off = [p["step"]["after_honest_gc_off"]["event_us"] / p["step"]["after_honest"]["event_us"]
          for p in steps]
state_bar = host_state["results"]["verdicts"]["honest_over_eager_min_for_batch_le_8"]
print("\nthe B <= 8 bar, paired, by what each call finds on the host")
show_table(["pairs", "verdict", "least", "spread"],
           [[label_, row["verdict"], f"{row['measured']:.2f}",
             f"{row['range'][0]:.2f}–{row['range'][1]:.2f}"]
            for label_, row in (("as found", state_bar["as_run"]),
                                *state_bar["by_host_state"].items())], width=14)
warm, cold = state_bar["by_host_state"]["warm"], state_bar["by_host_state"]["cold"]
glue_all({
    "hs_paired": spans(paired), "hs_apart": spans(apart),
    "hs_slower": spans(slower, ".2f"), "hs_share": spans([100 * s for s in host_share], ".0f"),
    "hs_gc": spans(gc_off, ".2f"),
    "hs_honest_first": spans([orders["honest_first"] for _, orders in by_order]),
    "hs_step_first": spans([orders["step_first"] for _, orders in by_order]),
    "hs_warm": f"{warm['verdict']} warm ({warm['measured']:.1f}×, its spread "
               f"{warm['range'][0]:.1f}–{warm['range'][1]:.1f}×)",
    "hs_cold": f"{cold['verdict']} cold ({cold['measured']:.1f}×, {cold['range'][0]:.1f}–"
               f"{cold['range'][1]:.1f}×)",
    "hs_as_run": state_bar["as_run"]["verdict"],
})

# %% [markdown]
# **Figure.** The step and the honest baseline after each preceding call, from an idle GPU with the launch included;
# hatched: the host's time in the call (`results/verify_interference_h200.json`).
#
# Over the straight-launch runs the paired ratio is {glue:text}`hs_paired`× where the two calls' medians timed apart
# give {glue:text}`hs_apart`×. Right after an honest call the step takes {glue:text}`hs_slower`× as long as right
# after itself, and the host's own time in the call grows by {glue:text}`hs_share`% of that difference (host and event
# times are separate clocks): the extra time is host time. The garbage collector is not the cause (off for the whole
# loop, the step takes {glue:text}`hs_gc`× its time after an honest call with it on); reading 64 MB on the host with
# no torch in it slows the step more than the honest call does, and slows the honest baseline too. The likeliest
# reading: the call before it evicts the step's code and data from the CPU caches, and a cold host launches slower
# (not profiled further). The honest call barely notices the step before it, so the alternating pairs are not
# symmetric: the ratio is {glue:text}`hs_honest_first`× when the honest call runs first in the pair and
# {glue:text}`hs_step_first`× when the step does. With both calls finding the host alike, the $B \le 8$ bar reads
# **{glue:text}`hs_warm`** and **{glue:text}`hs_cold`**. An eager engine that calls `verify` between model forwards
# runs it nearer the cold end; a loop with little else on the host, nearer the warm one. The bar is met on a warm host
# and missed on a cold one, and the verdict kept for it is the alternating pairs' ({glue:text}`hs_as_run`), which lies
# between.
#
# ### The step launched straight
#
# A warm `verify_triton` call is launched straight from its binding (`_WarmStep.launch`): one allocation, the slots
# filled into a copy of each launch's argument list, each binary fired through Triton 3.9's C launch entry, the
# outputs returned as two strided views. The benchmark, trimmed to the four points of the $B \le 8$ bar (a few
# launch-plan variants, no host loop, no tile sweep), ran four times on one H200 with it:
# `results/verify_h200_straight_5a69dae.json`, `results/verify_h200_straight_5a69dae_run2.json`,
# `results/verify_h200_straight_5a69dae_run3.json`, `results/verify_h200_straight_5a69dae_run4.json`; once more with
# all six points on a fresh H200 at a later commit with the same kernels and launch path,
# `results/verify_h200_straight_all_f93f0d7.json`; and once more at the $B \le 8$ points after the statistics pass
# kept per-lane partials, `results/verify_h200_straight_lanes_80261a5.json`. Each run also timed one and two empty
# launches from an idle GPU the same way: the least any step of that many launches can take. Compared with the last
# whole record before the straight launch, `results/verify_h200.json`.

# %% tags=["remove-input"]
rows, straddled, bar_values = [], [], []
for number, run in enumerate(straight_runs, 1):
    print(f"run {number}: {where_run(run)}")
    bar = run["results"]["verdicts"]["honest_over_eager_min_for_batch_le_8"]["as_run"]
    bar_values.append(bar["measured"])
    straddled.append(bar["verdict"] == "WITHIN SPREAD")
    small = [p for p in run["results"]["points"] if p["batch"] <= 8]
    rows.append([number, f"{run['results']['floors']['two_empty_launches_latency_us']:.1f}",
                 *(f"{p['triton_latency_us']:.0f}|{p['honest_over_triton_paired']:.1f}" for p in small),
                 f"{bar['measured']:.2f}"])
print()
show_table(["run", "2 empty", *(label(shape(p)) for p in straight_runs[0]["results"]["points"]), "bar"],
           rows)
note("(per point: the step from an idle GPU, launch included, in µs | the honest baseline over "
     "it, paired; 2 empty: two empty launches timed the same way, µs; bar: the B <= 8 bar, its "
     "least point)")
small_now = [p["triton_latency_us"] for run in straight_runs for p in run["results"]["points"] if p["batch"] <= 8]
small_before = [p["triton_latency_us"] for p in element_points if p["batch"] <= 8]
above = [p["triton_latency_us"] - run["results"]["floors"]["two_empty_launches_latency_us"]
         for run in straight_runs for p in run["results"]["points"] if p["batch"] <= 8]
correct = all(row.get("tokens_equal_reference") for run in straight_runs for p in run["results"]["points"]
              for row in p["variants"].values())
assert correct and all(straddled), "the prose says every variant was exact and every run within spread"
whole = [run for run in straight_runs if any(p["batch"] > 8 for p in run["results"]["points"])]
assert len(whole) == 1
whole_bars = whole[0]["results"]["verdicts"]
glue_all({
    "sl_now": spans(small_now, ".0f"), "sl_before": spans(small_before, ".0f"),
    "sl_runs": len(straight_runs), "sl_bar": spans(bar_values, ".2f"),
    "sl_above": spans(above, ".0f"),
    "sl_large": "; ".join(f"B = 64, V = {p['vocab']}: {p['triton_latency_us']:.0f} µs, "
                          f"{p['honest_over_triton_paired']:.1f}× paired "
                          f"({p['honest_over_triton_paired_range'][0]:.1f}–"
                          f"{p['honest_over_triton_paired_range'][1]:.1f})"
                          for p in whole[0]["results"]["points"] if p["batch"] > 8),
    "sl_large_bar": f"{whole_bars['honest_over_eager_at_batch_64']['as_run']['verdict']} "
                    f"({whole_bars['honest_over_eager_at_batch_64']['as_run']['measured']:.2f}×)",
    "sl_replay_bar": f"{whole_bars['graph_over_floor_max']['as_run']['verdict']} "
                     f"({whole_bars['graph_over_floor_max']['as_run']['measured']:.2f}×)",
})

# %% [markdown]
# Launched straight, the step takes {glue:text}`sl_now` µs from an idle GPU over the {glue:text}`sl_runs` runs at
# $B \le 8$, against {glue:text}`sl_before` µs before. The $B \le 8$ bar (its least point, paired) reads
# {glue:text}`sl_bar`× over the runs, and the 20th–80th percentiles of the pairs straddle 10× in every one of them:
# **within the spread, neither a pass nor a miss**. Every plan variant returned the reference's tokens through the
# straight path. The step stands {glue:text}`sl_above` µs above two empty launches timed the same way in the same run:
# the kernels' own time plus the host work that is left. The run with all six points also judges the other two bars:
# the eager step at $B = 64$ ({glue:text}`sl_large`): {glue:text}`sl_large_bar`; the warm replay (unchanged kernels):
# {glue:text}`sl_replay_bar`.
#
# ### Where the host time goes
#
# `experiments/verify_host_profile.py` calls the step in a loop without synchronising, so the host sets the pace, and
# records the wall time per call, split into preparing the step (plan, allocation, argument binding) and its launches,
# and where cProfile sees the time go. At the four points of the $B \le 8$ bar, on the same host under Triton 3.9, for
# four versions of the launch path: the step bound afresh on every call; bound once per shape (a `_WarmStep` keyed by
# what the call's arguments alone decide, with slots where each call's addresses and key go); on top, the cached
# binaries launched directly, without Triton's empty hook chains; and launched straight (above). The sixteen records
# (four launch paths, four points each):
#
# :::{dropdown} The records, launch path by launch path
# - bound every call: `results/verify_host_profile_b1_v32000_h200_triton39_5bddba6.json`,
#   `results/verify_host_profile_b8_v32000_h200_triton39_5bddba6.json`,
#   `results/verify_host_profile_b1_v128256_h200_triton39_5bddba6.json`,
#   `results/verify_host_profile_b8_v128256_h200_triton39_5bddba6.json`
# - bound once per shape: `results/verify_host_profile_b1_v32000_h200_triton39_3391351.json`,
#   `results/verify_host_profile_b8_v32000_h200_triton39_3391351.json`,
#   `results/verify_host_profile_b1_v128256_h200_triton39_3391351.json`,
#   `results/verify_host_profile_b8_v128256_h200_triton39_3391351.json`
# - + direct launches: `results/verify_host_profile_b1_v32000_h200_triton39_0c13bdf.json`,
#   `results/verify_host_profile_b8_v32000_h200_triton39_0c13bdf.json`,
#   `results/verify_host_profile_b1_v128256_h200_triton39_0c13bdf.json`,
#   `results/verify_host_profile_b8_v128256_h200_triton39_0c13bdf.json`
# - launched straight: `results/verify_host_profile_b1_v32000_h200_triton39_5a69dae.json`,
#   `results/verify_host_profile_b8_v32000_h200_triton39_5a69dae.json`,
#   `results/verify_host_profile_b1_v128256_h200_triton39_5a69dae.json`,
#   `results/verify_host_profile_b8_v128256_h200_triton39_5a69dae.json`
# :::

# %% tags=["remove-input"]
launch_paths = {"bound every call": "5bddba6", "bound once per shape": "3391351",
                "+ direct launches": "0c13bdf", "launched straight": "5a69dae"}
profiles = {name: {(p["settings"]["batch"], p["settings"]["vocab"]): p["results"]
                   for p in read_family(f"verify_host_profile_b*_h200_triton39_{suffix}.json")}
            for name, suffix in launch_paths.items()}
keys = sorted(profiles["bound every call"], key=lambda key: (key[1], key[0]))
print(where_run(read_record("verify_host_profile_b1_v32000_h200_triton39_5bddba6")), "(the first)")
rows = []
for name, by_point in profiles.items():
    cells = []
    for key in keys:
        got = by_point[key]
        cells.append(f"{got['wall_us_per_call_unprofiled']:.0f}" if got.get("step")
                     else f"{got['prepare_us_per_call']:.0f}+{got['run_us_per_call']:.0f}"
                          f"={got['wall_us_per_call_unprofiled']:.0f}")
    rows.append([name, *cells])
print()
show_table(["launch path", *map(label, keys)], rows, width=11, first=20)
note("(µs per step back to back: preparing it + its launches = the whole step; launched straight, "
     "the whole step is one verify_triton call and nothing is prepared apart)")
same_code = [read_record("verify_h200_3391351"), read_record("verify_h200_3391351_run1")]
direct = read_record("verify_h200_eager_0c13bdf")
direct_small = [p for p in direct["results"]["points"] if p["batch"] <= 8]
direct_bar = direct["results"]["verdicts"]["honest_over_eager_min_for_batch_le_8"]["as_run"]
mean_wall = {name: statistics.mean(g["wall_us_per_call_unprofiled"] for g in by_point.values())
             for name, by_point in profiles.items()}
mean_prepare = {name: statistics.mean(g["prepare_us_per_call"] for g in by_point.values())
                for name, by_point in profiles.items()}
host_moves = [max(a["triton_wall_us_per_call"], b["triton_wall_us_per_call"])
              / min(a["triton_wall_us_per_call"], b["triton_wall_us_per_call"])
              for a, b in zip(*(run["results"]["points"] for run in same_code))]
per_launch = statistics.mean(g["run_us_per_call"] / g["launches_per_step"]
                             for g in profiles["launched straight"].values())
glue_all({
    "hp_first_prepare": mean_prepare["bound every call"], "hp_first_wall": mean_wall["bound every call"],
    "hp_steps": "; ".join(f"{name}: {mean_wall[name]:.0f} µs "
                          f"({mean_wall[name] / mean_wall['bound every call']:.2f}× the first)"
                          for name in list(launch_paths)[1:]),
    "hp_direct_step": spans([p["triton_latency_us"] for p in direct_small], ".0f"),
    "hp_direct_bar": f"{direct_bar['verdict']} ({direct_bar['measured']:.2f}×, "
                     f"{direct_bar['range'][0]:.1f}–{direct_bar['range'][1]:.1f}×)",
    "hp_moves": max(host_moves), "hp_per_launch": per_launch, "hp_two_launches": 2 * per_launch,
})

# %% [markdown]
# Bound every call, preparing took {glue:text}`hp_first_prepare:.0f` µs of a {glue:text}`hp_first_wall:.0f` µs step on
# average over the four points; the whole step, averaged the same way: {glue:text}`hp_steps`. The same code's
# back-to-back step time moved by up to {glue:text}`hp_moves:.1f`× between two whole runs on one machine minutes apart
# (`results/verify_h200_3391351.json` and `results/verify_h200_3391351_run1.json`), so a change smaller than that
# between two profiles is not shown. What is left is mostly the launches themselves: {glue:text}`hp_per_launch:.0f` µs
# each in the newest profiles (Triton's launcher and the driver), so a step of two launches from Python keeps about
# {glue:text}`hp_two_launches:.0f` µs of host time however it is prepared. The benchmark at the commit of the direct
# launches, with the plain two-launch plan only (`results/verify_h200_eager_0c13bdf.json`), timed the step at
# {glue:text}`hp_direct_step` µs from an idle GPU at $B \le 8$, and its $B \le 8$ bar read {glue:text}`hp_direct_bar`.
#
# The earlier profiles, under Triton 3.6, recorded only the step's wall time and where cProfile saw it go (superseded
# by the four launch paths above): `results/verify_host_profile_h200_02c4a26.json`,
# `results/verify_host_profile_h200.json`, `results/verify_host_profile_b1_v32k_h200.json`.

# %% tags=["remove-input"]
for stem in ("verify_host_profile_h200_02c4a26", "verify_host_profile_h200", "verify_host_profile_b1_v32k_h200"):
    profile = read_record(stem)
    print(f"results/{stem}.json\n  {where_run(profile)}")
    print(f"  B = {profile['settings']['batch']}, V = {profile['settings']['vocab']}: "
          f"{profile['results']['wall_us_per_call_unprofiled']:.0f} µs per call; most own time in")
    for row in profile["results"]["top_own_time"][:3]:
        print(f"    {row['function']:<36} {row['own_us_per_step']:5.0f} µs")

# %% [markdown]
# ### How the eager step is timed
#
# `triton.testing.do_bench` flushes the L2 cache before each call by writing 256 MB, then records its start event
# while the GPU is still writing. A call the host launches before that write ends is timed as GPU time alone; a call
# whose launch takes longer is timed with the host time past the write. A host-bound step lands on either side from
# call to call, and how far past depends on how fast the host was. The whole Triton 3.9 run with the element race
# (`results/verify_triton39_h200.json`) shows it: its two-launch variants' do_bench times beside their warm replays at
# each $B \le 8$ point.

# %% tags=["remove-input"]
triton39 = read_record("verify_triton39_h200")
print(where_run(triton39))
rows = []
for p in triton39["results"]["points"]:
    plans = [row for row in p["variants"].values()
             if row.get("launches") == 2 and row.get("graph_warm_us") is not None]
    if p["batch"] <= 8:
        rows.append([label(shape(p)), len(plans), spans([row["eager_us"] for row in plans]),
                     spans([row["graph_warm_us"] for row in plans])])
show_table(["B, V", "plans", "do_bench µs", "replay µs"], rows, width=12)
note("(the two-launch variants of one run: their do_bench medians and their warm replays)")

# %% [markdown]
# The replays, GPU time alone, are close together at each point; the do_bench times are not. So the benchmark also
# times one call from an idle GPU (flush, synchronise, then CUDA events around the call: the launch included), for the
# Triton step, every variant and the honest baseline alike, and judges the eager bars on that where a record has it.
# Two such medians taken minutes apart still move with the host's speed, so the benchmark also times the honest
# baseline and the step alternately, call by call, and judges the eager bars on the pairs' ratios where a record has
# them. The element race's whole record, `results/verify_h200.json`, times each eager step both ways:

# %% tags=["remove-input"]
rows, plan_spreads = [], []
for p in element_points:
    plans = [row["latency_us"] for row in p["variants"].values()
             if row.get("latency_us") is not None and not bench.is_diagnostic(row["overrides"])]
    rows.append([label(shape(p)), f"{p['honest_torch_us']:.0f}", f"{p['honest_torch_latency_us']:.0f}",
                 f"{p['triton_us']:.1f}", f"{p['triton_latency_us']:.1f}", spans(plans, ".0f")])
show_table(["B, V", "honest db", "honest idle", "step db", "step idle", "plans idle"], rows, width=11)
note("(µs; db: do_bench median; idle: one call from an idle GPU, launch included; plans: every "
     "launch plan the run timed that way)")
same_plan = [max(p["triton_latency_us"], row["latency_us"]) / min(p["triton_latency_us"], row["latency_us"])
             for p in element_points for row in p["variants"].values()
             if row.get("plan") == p["plan"] and row.get("latency_us") is not None]
replays = [row["graph_warm_us"] for p in element_points for row in p["variants"].values()
           if row.get("graph_warm_us") is not None and row.get("launches") == 2]
glue_all({
    "tm_step": spans([p["triton_latency_us"] for p in element_points], ".0f"),
    "tm_honest": spans([p["honest_torch_latency_us"] for p in element_points], ".0f"),
    "tm_same_plan": max(same_plan), "tm_replays": spans(replays, ".0f"),
    "tm_ceiling": "; ".join(f"{p['honest_over_launch_floor_latency']:.1f}× at B = {p['batch']}, "
                            f"V = {p['vocab']}" for p in element_points),
})

# %% [markdown]
# Timed with its launch, one Triton step takes {glue:text}`tm_step` µs and the honest baseline {glue:text}`tm_honest`
# µs: both are host-bound, so the eager bars compare two Python launch paths on this host. The same plan timed twice
# in one run (the default step and a variant naming its plan) took up to {glue:text}`tm_same_plan:.1f`× as long once
# as the other, so no verdict on these bars is firmer than that. The plans' warm replays, their kernels alone, take
# {glue:text}`tm_replays` µs over the same points: the spread of the launch-included times is the host's. The honest
# baseline over as many empty launches as the step makes, both from an idle GPU, is the most the eager ratio can reach
# with that many launches: {glue:text}`tm_ceiling`.

# %% [markdown]
# ## Shorter chains: the chain floor, cooperative and dependent launches, clusters
#
# How much of a replay is the design itself? The floor is one launch or the bytes; but a two-launch step cannot sample
# before every chunk's statistics are in, nor write a token before every chunk's winner is in, so it is a chain of
# dependent global-memory round trips and two launches whatever its math. The benchmark replays that chain alone at
# each plan's grids (the chain probe): the **chain floor**, a latency floor of the design. The record is the element
# race's whole benchmark under Triton 3.9 with every structure among its variants, `results/verify_h200.json`.

# %% tags=["remove-input"]
print(where_run(element_run))


def two_launch_chain(point: dict) -> float:
    """The shortest chain probe among a point's two-launch variants."""
    return bench.shortest_chain_floor(point, lambda row: row.get("launches") == 2)


rows = [[label(shape(p)), f"{p['floor_us']:.1f}", f"{p['best_chain_floor_us']:.1f}",
         f"{two_launch_chain(p):.1f}", f"{p['best_graph_warm_us']:.1f}",
         f"{p['best_graph_warm_over_chain_floor']:.2f}", f"{p['best_graph_warm_over_floor']:.2f}"]
        for p in element_points]
print()
show_table(["B, V", "floor", "chain", "shortest", "best", "best/chain", "best/floor"], rows,
           width=10)
note("(µs, warm CUDA-graph replays; chain: the chain probe of the fastest variant's plan; "
     "shortest: the shortest chain of any two-launch plan; best: the fastest variant's replay)")
small_el = [p for p in element_points if p["batch"] <= 8]
large_el = [p for p in element_points if p["batch"] > 8]
beyond = [p for p in small_el if two_launch_chain(p) >= 2 * p["floor_us"]]
room = [p for p in small_el if p not in beyond]
fused_slowest = [p["variants"]["fused"]["graph_warm_us"] == max(
    row["graph_warm_us"] for name, row in p["variants"].items()
    if row.get("graph_warm_us") is not None and not name.startswith(("cluster", "diagnostic")))
    for p in element_points]
glue_all({
    "cf_small_chain": spans([p["best_chain_floor_us"] / p["floor_us"] for p in small_el]),
    "cf_beyond": points_text(shape(p) for p in beyond),
    "cf_room": "; ".join(f"{2 * p['floor_us'] - two_launch_chain(p):.1f} µs at B = {p['batch']}, "
                         f"V = {p['vocab']}" for p in room),
    "cf_within": spans([p["best_graph_warm_over_chain_floor"] for p in small_el], ".2f"),
    "cf_large_chain": per_run([p["best_chain_floor_us"] / p["floor_us"] for p in large_el], ".1f"),
    "cf_large_over": per_run([p["best_graph_warm_over_chain_floor"] for p in large_el], ".1f"),
    "cf_fused_slowest": sum(fused_slowest), "cf_points": len(element_points),
})

# %% [markdown]
# At $B \le 8$ the best plan's chain alone is {glue:text}`cf_small_chain`× the floor. At {glue:text}`cf_beyond` even
# the shortest chain of any two-launch plan is 2× the floor or more: no two-launch step can replay within 2× the floor
# there. Elsewhere at $B \le 8$ the bar leaves {glue:text}`cf_room` for all of the step's work beyond the shortest
# two-launch chain. The bar asks for a shorter chain, not faster kernels on this one. The best replays are
# {glue:text}`cf_within`× their chain floor at those points. At $B = 64$ the chain is {glue:text}`cf_large_chain`× the
# floor ($V$ = 32000 / 128256) and the replays {glue:text}`cf_large_over`× their chain floor: there the kernels' own
# work, not the chain, stands above the bar. The fused plan has one launch but streams each sampled row in a single
# program; among the two-launch, fused, cooperative and dependent-launch variants its replay was the slowest at
# {glue:text}`cf_fused_slowest` of {glue:text}`cf_points` points.
#
# ### Two attempts at a shorter chain: a cooperative launch, a dependent launch
#
# **coop** is one *cooperative* launch (`flashspec_lab/kernels/coop_pass.py`): a grid of one row per program row and
# V-splits, every program resident at once (the launch guarantees it, or refuses to start). Each program loads its
# chunk of all $2\gamma+1$ rows in one round trip, stores their partials, and spins on a per-row counter until every
# program of its row has arrived; then it runs the sampling pass's program on its own chunk. One launch instead of
# two, and no second launch's worth of scheduling. **pdl** keeps the two launches but makes the second a *programmatic
# dependent launch* (SM90+): the statistics launch lets it start at once, and it waits on the GPU
# (`griddepcontrol.wait`) for the statistics launch's writes, so its launch overlaps the statistics pass. Both return
# the reference's tokens bit for bit. The table reads, at each $B \le 8$ point of `results/verify_h200.json`, the
# shortest chain each structure reached and its best replay; how far the same variant moves between two runs of the
# same code minutes apart comes from `results/verify_h200_3391351.json` and `results/verify_h200_3391351_run1.json`.

# %% tags=["remove-input"]
chain_structures = {"2 launches": bench.STRUCTURES["two launches"],
                    "pdl": bench.STRUCTURES["two launches, dependent launch"],
                    "coop": bench.STRUCTURES["one launch, cooperative"]}


def structure_chain(point: dict, keep) -> float:
    """The shortest chain probe among the variants whose overrides `keep` selects."""
    return bench.shortest_chain_floor(point, lambda row: keep(row["overrides"]))


rows = [[label(shape(p)), f"{p['floor_us']:.1f}",
         *(f"{structure_chain(p, keep):.1f} / {bench.best_replay(p, keep)[1]:.1f}"
           for keep in chain_structures.values())] for p in small_el]
show_table(["B, V", "floor", *chain_structures], rows, width=13)
note("(µs, warm CUDA-graph replays: each structure's shortest chain probe / its fastest replay)")
pdl_pairs = [(p, name, row, p["variants"][name.removesuffix("_pdl")]) for p in element_points
             for name, row in p["variants"].items()
             if name.endswith("_pdl") and name.removesuffix("_pdl") in p["variants"]]
chain_gain = [base["chain_floor_us"] - row["chain_floor_us"] for _, _, row, base in pdl_pairs]
replay_gain = [base["graph_warm_us"] - row["graph_warm_us"] for _, _, row, base in pdl_pairs]
moves = []
for first, second in zip(*(run["results"]["points"] for run in same_code)):
    for name, row in first["variants"].items():
        other = second["variants"].get(name, {})
        if row.get("graph_warm_us") and other.get("graph_warm_us"):
            moves.append(abs(row["graph_warm_us"] - other["graph_warm_us"]))
glue_all({
    "co_chain": spans([structure_chain(p, chain_structures["coop"])
                       / structure_chain(p, chain_structures["2 launches"]) for p in small_el], ".2f"),
    "co_best": spans([bench.best_replay(p, chain_structures["coop"])[1]
                      / bench.best_replay(p, chain_structures["2 launches"])[1] for p in small_el],
                     ".2f"),
    "pd_pairs": len(pdl_pairs), "pd_chain_gain": spans(chain_gain),
    "pd_all_shorter": "every time" if min(chain_gain) > 0 else "not every time",
    "pd_faster": max(replay_gain), "pd_slower": -min(replay_gain),
    "pd_moves": max(moves), "pd_moves_median": statistics.median(moves),
    "pd_beyond_noise": sum(gain > max(moves) for gain in replay_gain),
    "pd_chain_floor": spans([structure_chain(p, chain_structures["pdl"]) / p["floor_us"]
                             for p in small_el]),
})

# %% [markdown]
# **The cooperative launch does not shorten the chain.** Its chain is {glue:text}`co_chain`× the two launches' at
# $B \le 8$, and its best replay {glue:text}`co_best`× theirs. A spin barrier through global memory costs about what a
# kernel boundary inside a graph does; both come down to a release, a wait and an acquire through L2 (an
# interpretation, not a profile). **The dependent launch does shorten it, a little**: across {glue:text}`pd_pairs`
# pairs of a plan with and without it, the chain fell by {glue:text}`pd_chain_gain` µs, {glue:text}`pd_all_shorter`.
# The real replays did not follow: they ranged from {glue:text}`pd_faster:.1f` µs faster to {glue:text}`pd_slower:.1f`
# µs slower with it, while the same variant at the same point moved by up to {glue:text}`pd_moves:.1f` µs (median
# {glue:text}`pd_moves_median:.1f`) between two runs of the same code, and {glue:text}`pd_beyond_noise` of the pairs
# gained more than that: on this record the dependent launch is no gain beyond the noise. With it the shortest chain
# at $B \le 8$ is {glue:text}`pd_chain_floor`× the floor: both structures keep the chain of global round trips (a
# statistic per V-chunk must meet the others before any chunk can sample, and the chunks' winners must meet again),
# and each round trip through L2 costs, by the chain probes, a good part of a microsecond. What is left is to keep
# those meetings off global memory: one row's programs as one *thread-block cluster*, reducing through distributed
# shared memory.
#
# ### Thread-block clusters
#
# Whether Triton can reduce across a cluster's blocks was first probed by compiling for sm_90 on a CPU
# (`experiments/cluster_reduce_probe.py`): `results/cluster_reduce_probe_triton36.json` and
# `results/cluster_reduce_probe_triton39.json`.

# %% tags=["remove-input"]
for stem in ("cluster_reduce_probe_triton36", "cluster_reduce_probe_triton39"):
    probe = read_record(stem)["results"]
    spread = [row["num_ctas"] for row in probe["probes"] if row["num_ctas"] > 1 and row.get("cross_cta")]
    failed = [row["num_ctas"] for row in probe["probes"] if row["num_ctas"] > 1 and not row["lowered"]]
    note(f"Triton {probe['triton']}: " + (
        f"lowers a row's max and sum across {', '.join(map(str, spread))} blocks through cluster "
        "shared memory" if spread else f"fails to compile it across {', '.join(map(str, failed))} blocks"))

# %% [markdown]
# `flashspec_lab/kernels/cluster_pass.py` is that kernel. One program owns a whole row, all $2\gamma+1$ of its logit
# rows, and the GPU spreads it over `num_ctas` blocks of a thread-block cluster (SM90+). Its reductions across those
# blocks run through distributed shared memory; nothing meets in global memory, so there are no partials, tickets or
# barriers there. Pass 1 keeps a running (max, sum of exp) per lane over the whole vocabulary and reduces across lanes
# once. The accept test reads two logits per candidate. Pass 2 races over the one sampled position's row with per-lane
# winners, reduced once. It shares the accept test and the race with the other plans, and the kernel tests run it like
# every plan: in the interpreter (one block) and, with Triton 3.9, on the H200. Triton 3.6 cannot compile it, so the
# runs below are under Triton 3.9, each timing the cluster variants beside two-launch plans (the element race):
# `results/verify_cluster_first_h200_triton39.json` (2, 4 and 8 blocks), `results/verify_cluster_h200_triton39.json`
# (8 blocks, 4 or 8 warps, prefetch depths), and the cluster variants of `results/verify_h200.json`.

# %% tags=["remove-input"]
cluster_runs = [read_record("verify_cluster_first_h200_triton39"), read_record("verify_cluster_h200_triton39"),
                element_run]
cluster_ratios, cluster_correct, rows = [], [], []
for number, record in enumerate(cluster_runs, 1):
    print(f"run {number}: {where_run(record)}")
    for point in record["results"]["points"]:
        cluster_correct += [bool(row.get("tokens_equal_reference")) for row in point["variants"].values()
                            if row["overrides"].get("cluster")]
        other = bench.best_replay(point, lambda overrides: not overrides.get("cluster"))
        cluster = bench.best_replay(point, lambda overrides: bool(overrides.get("cluster")))
        ratio = bench.cluster_over_others(point)
        cluster_ratios.append((point["batch"], ratio))
        rows.append([label(shape(point)), number, f"{other[1]:.1f}", f"{cluster[1]:.1f}",
                     f"{ratio:.2f}", cluster[0]])
print()
show_table(["B, V", "run", "other", "cluster", "ratio", "fastest cluster variant"], rows,
           text_last=True)
note("(µs, warm CUDA-graph replays: the fastest plan without a cluster, the fastest with one, "
     "and their ratio)")
first_cluster = cluster_runs[0]
by_blocks = {ctas: {p["vocab"]: p["variants"][f"cluster_c{ctas}"]["graph_warm_us"]
                    for p in first_cluster["results"]["points"] if p["batch"] == 1} for ctas in (2, 4, 8)}
staged = [p["variants"]["cluster_c8_w8"]["graph_warm_us"] / p["variants"]["cluster_c8_w8_s1"]["graph_warm_us"]
          for record in cluster_runs[1:] for p in record["results"]["points"]]
assert min(ratio for _, ratio in cluster_ratios) > 1, "the prose says the cluster plan is never faster"
glue_all({
    "cl_correct": sum(cluster_correct), "cl_timed": len(cluster_correct),
    "cl_small": spans([ratio for batch, ratio in cluster_ratios if batch <= 8]),
    "cl_large": spans([ratio for batch, ratio in cluster_ratios if batch > 8]),
    "cl_blocks": "; ".join(f"V = {vocab}: " + ", ".join(f"{by_blocks[c][vocab]:.0f}" for c in (2, 4, 8))
                           + " µs" for vocab in sorted(by_blocks[8])),
    "cl_staged": spans(staged, ".2f"),
})

# %% [markdown]
# **The cluster kernel is correct and slow.** {glue:text}`cl_correct` of {glue:text}`cl_timed` cluster variant timings
# returned the reference's tokens on the H200. Its best variant's replay was {glue:text}`cl_small`× the best other
# plan's at $B \le 8$ and {glue:text}`cl_large`× at $B = 64$: it is never faster, so no shape's plan uses it. Why it
# loses, from the variants' times: at $B = 1$ only the cluster's blocks stream the whole row, and its replay falls
# with the blocks per cluster, 2, 4 and 8 ({glue:text}`cl_blocks`, run 1), as a stream limited per SM does. At
# $B = 64$ every SM is busy and it is still slower, so the per-element cost of the per-lane partials (two running
# values per logit, a padded power-of-two block of rows) counts too. The default prefetch depth (`cluster_stages`)
# took {glue:text}`cl_staged`× the replay without prefetching. The chain of global round trips is gone, and a few SMs
# doing a whole row's work replace it. A cluster kernel that wins would have to split rows across clusters again
# (meeting in global memory once) or stream through shared memory with bulk copies; neither is built.

# %% [markdown]
# ## The element race's whole record
#
# The last whole benchmark with the element race, under Triton 3.9 with every plan variant and every column:
# `results/verify_h200.json`. Superseded, for the standing of each structure and for chapter 2's figure, by the runs
# of "Every structure side by side"; its variants, chain probes and eager timings are read in the sections above.
# Here: its four columns, every column it timed (the bit-exact reference and the per-token host loop of chapter 2's
# step 1 included), its verdicts, every variant's replay, and where its time goes.

# %% tags=["remove-input"]
print(where_run(element_run))
floors = element_run["results"]["floors"]
rows = [[label(shape(p)), f"{p['floor_us']:.1f}",
         "bytes" if p["floor_us"] > floors["empty_launch_us"] else "launch",
         f"{p['honest_torch_latency_us']:.0f}", f"{p['triton_latency_us']:.1f}",
         f"{p['triton_graph_warm_us']:.1f}", f"{p['honest_torch_latency_us'] / p['triton_latency_us']:.1f}",
         f"{p['triton_graph_warm_us'] / p['floor_us']:.2f}"] for p in element_points]
print()
show_table(["B, V", "floor", "set by", "honest", "eager", "replay", "h/eager", "rep/floor"], rows)
note("(µs; honest and eager: one call from an idle GPU, launch included; replay: warm CUDA-graph "
     "replay of the default plan)")
display(plots.plot_verify_benchmark(element_run))

# %% [markdown]
# **Figure.** Every column of the record, log scale: the floor, the two kernels each timed alone, the step replayed
# from a CUDA graph, the eager step (do_bench), the bit-exact PyTorch reference and the per-token `.item()` host loop.
#
# Its verdicts, with the plan each point ran by default (`as_run`) and with the fastest plan the run measured
# (`with_plan_choice`: the default once that plan is the shape's table entry); the eager bars read the alternating
# pairs, judged at both ends of their spread:

# %% tags=["remove-input"]
rows = []
for name, bar in element_run["results"]["verdicts"].items():
    for which in ("as_run", "with_plan_choice"):
        row = bar[which]
        spread = row.get("range")
        rows.append([BAR_NAMES[name] if which == "as_run" else "", which.replace("_", " "),
                     row["verdict"], f"{row['measured']:.2f}",
                     f"{spread[0]:.2f}–{spread[1]:.2f}" if spread else "-"])
show_table(["bar", "plans", "verdict", "measured", "spread"], rows, width=16, first=18)
print()
show_table(["fastest plan per point", ""],
           [[where, chosen["variant"]] for where, chosen in
            element_run["results"]["plan_choice"]["chosen"].items()], width=1, first=24, text_last=True)

# %% [markdown]
# The launch-plan variants of the same run: every variant returns the reference's tokens bit for bit (the benchmark
# checks it), so they differ only in time. Two change the sampling pass itself. **lanes**: the race keeps a running
# winner per lane and reduces across the program's warps once per V-chunk instead of once per tile. **accept_once**:
# the last statistics program of each row block (an acquire-release ticket, as in the fused launch) runs the accept
# test and stores six words per row, so the sampling programs read them instead of each redoing the test from the
# partials. The register count per thread of the sampling kernel (from the compiled binary) bounds how many of its
# programs an SM holds: an H200 SM has 65,536 registers, so a 4-warp program at 168 registers fits 3 at a time, at 32
# registers 16.

# %% tags=["remove-input"]
def sampler_registers(row: dict) -> int | None:
    """Registers per thread of a variant's sampling kernel (of its one-launch kernel for a one-launch plan)."""
    registers = row.get("registers") or {}
    found = (registers.get("sample") or registers.get("fused") or registers.get("coop")
             or registers.get("cluster") or {})
    return found.get("registers")


variant_names = [name for name, row in element_points[0]["variants"].items()
                 if not bench.is_diagnostic(row["overrides"])]
largest = max(element_points, key=lambda p: p["batch"] * p["vocab"])
rows = [[name, *(f"{p['variants'][name]['graph_warm_us']:.1f}" for p in element_points),
         sampler_registers(largest["variants"][name]) or "-"] for name in variant_names]
show_table(["variant", *(label(shape(p)) for p in element_points), "regs"], rows, width=7, first=27)
note("(µs, warm CUDA-graph replays; regs: registers per thread of the sampling kernel, or of the "
     "one-launch kernel, at B = 64, V = 128256)")
timed = {name: largest["variants"][name] for name in variant_names
         if sampler_registers(largest["variants"][name])
         and not largest["variants"][name]["overrides"].get("cluster")}
fastest = min(timed, key=lambda name: timed[name]["graph_warm_us"])
base, best = timed["two_launch"], timed[fastest]
glue_all({
    "vr_base_regs": sampler_registers(base),
    "vr_base_programs": 65536 // (128 * sampler_registers(base)),
    "vr_base_us": base["graph_warm_us"], "vr_fastest": fastest,
    "vr_best_regs": sampler_registers(best),
    "vr_best_programs": min(16, 65536 // (128 * sampler_registers(best))),
    "vr_best_us": best["graph_warm_us"], "vr_gain": base["graph_warm_us"] / best["graph_warm_us"],
    "vr_best_floor": best["graph_warm_us"] / largest["floor_us"], "vr_floor": largest["floor_us"],
})

# %% [markdown]
# At the largest point ($B = 64$, $V = 128256$) the plain two-launch plan's sampling kernel uses
# {glue:text}`vr_base_regs` registers per thread ({glue:text}`vr_base_programs` four-warp programs per SM) and its
# step replays in {glue:text}`vr_base_us:.0f` µs; the fastest variant, {glue:text}`vr_fastest`, uses
# {glue:text}`vr_best_regs` ({glue:text}`vr_best_programs` programs per SM, counting registers only) and replays in
# {glue:text}`vr_best_us:.0f` µs, {glue:text}`vr_gain:.1f`× faster, still {glue:text}`vr_best_floor:.1f`× the
# {glue:text}`vr_floor:.0f` µs floor.
#
# Where the time goes, from the same record. The gap between the eager step and the CUDA-graph replay of the *same
# launches* is host-side launch work from Python; what remains in the replay is the kernels' GPU time:

# %% tags=["remove-input"]
rows = []
for p in element_points:
    share = 1 - p["triton_graph_replay_us"] / p["triton_latency_us"]
    kernels = p["triton_stats_kernel_us"] + p["triton_sample_kernel_us"]
    rows.append([label(shape(p)), f"{p['floor_us']:.1f}", f"{p['triton_latency_us']:.1f}",
                 f"{p['triton_graph_replay_us']:.1f}", f"{p['triton_graph_warm_us']:.1f}",
                 f"{kernels:.1f}", f"{100 * share:.0f}%"])
show_table(["B, V", "floor", "eager", "graph", "warm", "kernels", "launch"], rows)
note("(µs; eager: one call from an idle GPU; graph: one replay; warm: a replay of 20 steps, per "
     "step; kernels: the two kernels each timed alone; launch: the share of the eager step that "
     "the graph removes)")
launch_bound = [p for p in element_points
                if 1 - p["triton_graph_replay_us"] / p["triton_latency_us"] > 0.5]
device_bound = [p for p in element_points if p not in launch_bound]
assert device_bound and all(p["floor_us"] > floors["empty_launch_us"] for p in device_bound), \
    "the prose says the points that are not launch-bound have a floor set by the bytes"
glue_all({
    "wt_lb_n": len(launch_bound), "wt_points": len(element_points),
    "wt_lb": points_text(shape(p) for p in launch_bound),
    "wt_share": spans([100 * (1 - p["triton_graph_replay_us"] / p["triton_latency_us"])
                       for p in launch_bound], ".0f"),
    "wt_device": "; ".join(
        f"B = {p['batch']}, V = {p['vocab']}: eager {p['triton_latency_us']:.0f} µs, one replay "
        f"{p['triton_graph_replay_us']:.0f} µs ({p['triton_graph_warm_us']:.0f} µs warm), the two "
        f"kernels alone {p['triton_stats_kernel_us'] + p['triton_sample_kernel_us']:.0f} µs, "
        f"against a floor of {p['floor_us']:.0f} µs" for p in device_bound),
    "wt_over_floor": spans([p["graph_warm_over_floor"] for p in element_points]),
    "wt_honest": spans([p["honest_torch_latency_us"] / p["triton_latency_us"] for p in element_points]),
    "wt_oracle": spans([p["torch_us"] / p["triton_us"] for p in element_points], ".0f"),
    "wt_loop": spans([p["host_loop_us"] / p["triton_us"] for p in element_points]),
})

# %% [markdown]
# At {glue:text}`wt_lb_n` of {glue:text}`wt_points` points ({glue:text}`wt_lb`) launch work is more than half of the
# eager step ({glue:text}`wt_share`%): there the step is bound by launches, and an engine that replays its decode step
# from a CUDA graph gets the graph column instead of the eager one. The rest is not launch-bound
# ({glue:text}`wt_device`, set by the bytes it must read): a CUDA graph does not help it. No point's warm replay is
# within 2× the floor ({glue:text}`wt_over_floor`×): getting closer needs shorter chains and faster kernels, not only
# fewer launches. Against the honest PyTorch baseline (medians timed apart) the eager Triton step is
# {glue:text}`wt_honest`× faster; against the bit-exact PyTorch reference (the correctness oracle, not a speed
# baseline) {glue:text}`wt_oracle`× (do_bench medians), and against the per-token host loop of chapter 2's step 1
# {glue:text}`wt_loop`×.
#
# ## What the verification step weighs in an engine step
#
# A faster verification step matters only as much as verification weighs in a whole engine step, which also runs the
# draft model $\gamma$ times and the target once. The engine benchmark on the same kind of GPU,
# `results/bench_engine_nvidia_h200.json` (a 1.1B-parameter target with random weights, $\gamma = 4$), records the
# median step time of plain decoding and of `flashspec`'s speculative loop; the element race's record
# (`results/verify_h200.json`) records what the per-token host loop of chapter 2's step 1 and the Triton step cost at
# the same batch size and vocabulary.

# %% tags=["remove-input"]
engine = read_record("bench_engine_nvidia_h200")
engine_vocab = engine["settings"]["models"]["target"]["vocab_size"]
print("engine:", where_run(engine))
print("verify:", where_run(element_run))
rows, end_to_end = [], {}
for batch in engine["settings"]["batch_sizes"]:
    cells = engine["results"][f"B={batch}"]["cells"]
    verify_point = next(p for p in element_points if shape(p) == (batch, engine_vocab))
    spec_ms = cells["flashspec"]["p50_step_latency_ms"]
    saved = (verify_point["host_loop_us"] - verify_point["triton_us"]) / 1000 / spec_ms
    end_to_end[batch] = {"plain": cells["plain"]["p50_step_latency_ms"], "spec": spec_ms,
                         "loop": verify_point["host_loop_us"] / 1000, "saved": 100 * saved}
    rows.append([batch, f"{end_to_end[batch]['plain']:.1f}", f"{spec_ms:.1f}",
                 f"{end_to_end[batch]['loop']:.2f}", f"{verify_point['triton_us'] / 1000:.3f}",
                 f"{100 * saved:.1f}%"])
print()
show_table(["B", "plain", "spec.", "host loop", "Triton", "saved"], rows, width=10)
note(f"(ms, medians, V = {engine_vocab}; saved: what replacing the host loop by the Triton step "
     "saves, as a share of the speculative step)")
one = end_to_end[1]
glue_all({
    "ee_loop": one["loop"], "ee_plain": one["plain"], "ee_spec": one["spec"], "ee_saved": one["saved"],
    "ee_others": "; ".join(f"at B = {batch} the loop would cost {row['loop']:.1f} ms of a "
                           f"{row['spec']:.0f} ms speculative step, at most {row['saved']:.0f}% saved"
                           for batch, row in end_to_end.items() if batch != 1),
})

# %% [markdown]
# At $B = 1$ the per-token host loop costs {glue:text}`ee_loop:.2f` ms, against engine steps of
# {glue:text}`ee_plain:.0f` ms (plain decoding) to {glue:text}`ee_spec:.0f` ms (speculative): replacing it with the
# Triton step saves at most {glue:text}`ee_saved:.1f`% of a speculative step. **The verify kernel alone does not
# change end-to-end throughput at $B = 1$**; the rest of the step (the draft and target forward passes and the
# engine's own host work) decides it. Larger batches: {glue:text}`ee_others`, a larger share because the loop's cost
# grows with the batch. These are two separate benchmarks: the engine's step time was not measured with the host loop
# in place.

# %% [markdown]
# ## Launch plans per Triton version
#
# A launch plan is chosen by timing, and the same plan compiles to other code under another Triton. So
# `flashspec.kernels.plan` keeps one table per Triton version it was measured under (`SHAPE_PLANS_BY_TRITON`), and the
# installed Triton reads the table of the newest measured version not newer than itself. The Triton 3.6 table is the
# plan choice of `results/verify_h200_70751e3.json`, measured before the sampler raced blocks. The Triton 3.9 table
# was first the plan choice of a whole benchmark on the H200 under Triton 3.9 with the element race,
# `results/verify_triton39_h200.json`; since the sampler races blocks it is the choice of
# `results/verify_h200_blocks_all_decba52.json`. That first Triton 3.9 run's default plans were still the Triton 3.6
# table's, so it timed both choices side by side:

# %% tags=["remove-input"]
triton39 = read_record("verify_triton39_h200")
print(where_run(triton39))
rows, gains39, over39 = [], [], []
for p in triton39["results"]["points"]:
    gains39.append(p["triton_graph_warm_us"] / p["best_graph_warm_us"])
    over39.append(p["best_graph_warm_over_floor"])
    rows.append([label(shape(p)), f"{p['floor_us']:.2f}", f"{p['triton_graph_warm_us']:.2f}",
                 f"{p['best_graph_warm_us']:.2f}", f"{gains39[-1]:.2f}", f"{over39[-1]:.2f}",
                 p["best_variant"]])
print()
show_table(["B, V", "floor", "3.6 plan", "3.9 plan", "ratio", "best/fl", "Triton 3.9 choice"], rows,
           width=8, text_last=True)
note("(µs, warm CUDA-graph replays: the Triton 3.6 table's plan and the fastest variant, the Triton "
     "3.9 choice; ratio: the first over the second)")
replay39 = triton39["results"]["verdicts"]["graph_over_floor_max"]["with_plan_choice"]
glue_all({
    "tv_gain": spans(gains39, ".2f"), "tv_slower": sum(gain > 1.05 for gain in gains39),
    "tv_points": len(gains39),
    "tv_slower_at": points_text(shape(p) for p, gain in zip(triton39["results"]["points"], gains39)
                                if gain > 1.05),
    "tv_bar": f"{replay39['measured']:.2f}× ({replay39['verdict']})", "tv_over": spans(over39, ".2f"),
})

# %% [markdown]
# Under Triton 3.9 the Triton 3.6 table's plans replayed in {glue:text}`tv_gain`× the time of the fastest plan,
# {glue:text}`tv_slower` of {glue:text}`tv_points` points by more than 5% ({glue:text}`tv_slower_at`). Where the two
# choices are within a few per cent, which plan the table names is a coin the run's noise tossed, and it costs nothing
# either way. The replay bar does not move: with the Triton 3.9 choice the worst point is {glue:text}`tv_bar` its
# floor, and every point is {glue:text}`tv_over`× its floor.
#
# The same variants under both versions: the Triton 3.9 run against the last whole run under Triton 3.6,
# `results/verify_h200_40586a6.json`. The two runs are hours apart on machines of the same kind, and at two commits of
# the element race (same tokens; the kernels' code may differ too), so a pair moving by a few tenths of a microsecond
# says nothing, while a plan taking a fraction of its time says the compiler (or the code) changed it.

# %% tags=["remove-input"]
triton36 = read_record("verify_h200_40586a6")
print("Triton 3.6:", where_run(triton36))
version_ratios = []
for new, old in zip(triton39["results"]["points"], triton36["results"]["points"]):
    assert shape(new) == shape(old)
    for name, row in new["variants"].items():
        before = old["variants"].get(name, {})
        if (row.get("graph_warm_us") and before.get("graph_warm_us") and not bench.is_diagnostic(row["overrides"])):
            version_ratios.append((shape(new), name, row["graph_warm_us"] / before["graph_warm_us"]))
rows = []
for key in [shape(p) for p in triton39["results"]["points"]]:
    ratios = [ratio for where, _, ratio in version_ratios if where == key]
    rows.append([label(key), len(ratios), f"{min(ratios):.2f}", f"{statistics.median(ratios):.2f}",
                 f"{max(ratios):.2f}", sum(ratio < 0.8 for ratio in ratios)])
print()
show_table(["B, V", "variants", "least", "median", "most", "< 0.8"], rows)
note("(each variant's warm replay under Triton 3.9 over the same variant's under Triton 3.6)")
glue_all({"tv_pairs": len(version_ratios), "tv_fast": sum(r < 0.8 for _, _, r in version_ratios),
          "tv_range": spans([r for _, _, r in version_ratios], ".2f")})

# %% [markdown]
# Of {glue:text}`tv_pairs` (point, variant) pairs, {glue:text}`tv_fast` replayed in under 0.8× their Triton 3.6 time
# (all pairs: {glue:text}`tv_range`×). The fastest plan differs by Triton version, which is why the plan tables are
# kept per version, and why every record on this page names the Triton it ran.

# %% [markdown]
# ## Every benchmark record, oldest first
#
# Every `flashspec bench verify` record of the verification step, with the three bars as each run judged them (the
# replay bar as run; P: met, M: missed, S: within the spread, -: not judged). Five of them are read nowhere else on
# this page: `results/verify_h200_a4cbfe0.json`, `results/verify_h200_219669c.json`,
# `results/verify_h200_27bcc98.json` and `results/verify_h200_06e14c7.json` under Triton 3.6, and
# `results/verify_h200_6dfdce8.json` under Triton 3.9. They, like every record before the two-level race, are
# superseded by the later runs of the same benchmark (the same bars, newer kernels and launch path) and, for every
# structure's standing, by the runs of "Every structure side by side".

# %% tags=["remove-input"]
benchmark_records = sorted(
    ((path.stem, provenance.load_result(path.stem)) for pattern in ("verify_h200*.json", "verify_triton39_*.json",
                                                                    "verify_cluster*.json", "verify_fast_math_*.json")
     for path in RESULTS.glob(pattern)),
    key=lambda item: item[1]["provenance"]["date_utc"])
letters = {"PASS": "P", "MISS": "M", "WITHIN SPREAD": "S", "NOT MEASURED": "-"}
rows = []
for stem, record in benchmark_records:
    verdicts = record["results"]["verdicts"]
    cells = []
    for name in bench.TARGETS:
        row = verdicts[name]["as_run"]
        cells.append("-" if row["measured"] is None else f"{letters[row['verdict']]} {row['measured']:.2f}")
    rows.append([stem.removeprefix("verify_"), record["provenance"]["date_utc"][5:16].replace("T", " "),
                 record["provenance"]["versions"]["triton"][:3], len(record["results"]["points"]), *cells])
show_table(["record (results/verify_...)", "date", "Triton", "points", "replay", "B<=8", "B=64"], rows,
           width=7, first=30)
note("(the replay bar: the worst point's warm replay over its floor; the eager bars: the honest "
     "baseline over the eager step at the least point, paired where the record has pairs)")
