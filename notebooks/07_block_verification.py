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
# # Block verification: judging the drafted chain as a whole
#
# Token verification (chapter 1) tests the drafted tokens one at a time and stops at the first rejection. That
# throws away chains the target likes as a whole: if the draft over-rates the first token ($p/q<1$) and
# under-rates the next ones ($p/q>1$), the first test may reject although the chain's joint ratio is above one.
# **Block verification** {cite}`sun2025block` tests the chain as a whole. It is exact, it never keeps fewer drafts
# in expectation than token verification with the same draft, and among verifiers of one drafted chain it is
# optimal. `flashspec` offers it everywhere token verification is offered: `fs.verify(..., method="block")` on both
# backends, `verify_method="block"` on both engines, `flashspec generate --verify block` on the command line.
#
# This chapter states the algorithm, proves that its output law is the target's, checks the proof by exact
# enumeration and then by sampling through `fs.verify` (with two broken variants that must fail), and reads what
# it gains on a real model and real prompts from a committed record.

# %% tags=["hide-input"]
import itertools
import random
import sys
from collections import defaultdict
from fractions import Fraction
from math import prod

# the Colab copy of this chapter installs the package first
ON_COLAB = "google.colab" in sys.modules

import numpy as np
import torch

import flashspec as fs
from flashspec_lab import exactness, provenance
from flashspec_lab.pages import glue  # glue: numbers in the prose

device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
print(f"flashspec {fs.__version__}, torch {torch.__version__}, running on "
      f"{device_name}{' (Colab)' if ON_COLAB else ''}")

# %% [markdown]
# ## The algorithm
#
# As in chapter 1, the draft sampled $x_0,\dots,x_{\gamma-1}$ with $x_n\sim q_n$, and the target scored
# $p_0,\dots,p_\gamma$, where $p_n$ and $q_n$ are the warped distributions of the token after the prefix and the first
# $n$ drafts. Write $r_n = p_n(x_n)/q_n(x_n)$. Block verification carries a **weight** along the chain, the
# cumulative ratio capped at one,
#
# $$ w_0 = 1, \qquad w_{n+1} = \min\left(w_n\, r_n,\ 1\right), $$
#
# and at every prefix the **residual mass** $Z_n = \sum_v \left(w_n\,p_n(v) - q_n(v)\right)^+$. Prefix $n$ of the
# chain *passes* with probability
#
# $$ h_n = \frac{Z_n}{Z_n + 1 - w_n}\quad (1 \le n < \gamma), \qquad h_\gamma = w_\gamma, $$
#
# each on its own uniform, and the step keeps the **longest** prefix that passed: $\tau = \max\{n : \text{prefix }
# n \text{ passed}\}$, or $\tau=0$ if none did. A failed prefix does not end the scan; a longer one may still pass.
# The step emits $x_0,\dots,x_{\tau-1}$ and one more token $y$: if $\tau<\gamma$, from the **block residual**
#
# $$ \rho_\tau = \frac{\left(w_\tau\,p_\tau - q_\tau\right)^+}{Z_\tau}, $$
#
# and if $\tau=\gamma$, from $p_\gamma$ (the bonus). At $\tau=0$ the block residual is the token residual
# $(p_0-q_0)^+$, since $w_0=1$. `flashspec.verify.block_acceptance` computes $\tau$ and $w_\tau$ from the chain; the
# correction token is drawn by the same race as token verification's residual, with $p_\tau$ scaled by $w_\tau$.
#
# **Lemma.** Given the first $n$ drafts, $P(\tau \ge n \mid x_{<n}) = w_n$ for $n = 0,\dots,\gamma$.
#
# *Proof.* $h_n$, $w_n$ and $Z_n$ depend on $x_{<n}$ only. Let $R_n$ be the probability, given $x_{<n}$, that no
# prefix $m \ge n$ passes. $R_\gamma = 1 - h_\gamma = 1-w_\gamma$. Averaging over $x_n \sim q_n$,
#
# $$ E\left[w_{n+1} \mid x_{<n}\right] = \sum_v q_n(v)\min\left(\tfrac{w_n p_n(v)}{q_n(v)}, 1\right)
#    = \sum_v \min\left(w_n p_n(v), q_n(v)\right) = w_n - Z_n , $$
#
# so if $R_{n+1} = 1 - w_{n+1}$, then $R_n = (1-h_n)\,E[R_{n+1}\mid x_{<n}] = \frac{1-w_n}{Z_n+1-w_n}(1-w_n+Z_n) =
# 1 - w_n$. And $\tau \ge n$ exactly when some prefix $m \ge n$ passes. $\square$
#
# Two consequences: $P(\tau = n \mid x_{<n}) = w_n - E[w_{n+1}\mid x_{<n}] = Z_n$ for $n<\gamma$, and the
# probability that the step keeps the drafts $s_{<n}$ is $a_n(s_{<n}) = q(s_{<n})\,w_n(s_{<n})$, where
# $q(s_{<n}) = \prod_{m<n} q_m(s_m)$.
#
# **Theorem.** Complete the step's output with tokens sampled from the target until it has $\gamma+1$ tokens; the
# completed sequence has the target's law $p(s_0,\dots,s_\gamma) = \prod_n p_n(s_n)$.
#
# *Proof.* Let $F_n(s_{<n})$ be the probability that the completed sequence starts with $s_{<n}$. Its next token is
# $y$ in one of two ways. (i) The step kept $s_{<n}$ ($\tau \ge n$, probability $a_n$): then either $x_n = y$ is
# kept too, with probability $a_{n+1}(s_{<n}y) = q(s_{<n})\min(w_n p_n(y), q_n(y))$, or $\tau = n$ and the correction
# is $y$, with probability $q(s_{<n})\,Z_n\,\rho_n(y) = q(s_{<n})\,(w_n p_n(y) - q_n(y))^+$. Since
# $\min(A,B) + (A-B)^+ = A$, the two add up to $a_n\,p_n(y)$ (at $n=\gamma$ the bonus gives $a_\gamma p_\gamma(y)$
# directly). (ii) The step's output ended before position $n$ (probability $F_n - a_n$): $y$ is the target's own
# sample, with probability $p_n(y)$. So $F_{n+1}(s_{<n}y) = F_n(s_{<n})\,p_n(y)$, and $F_0 = 1$. $\square$
#
# The next step starts from the emitted prefix, so steps compose as in chapter 1, and the condition of Theorem 1 on
# how the draft may be chosen carries over unchanged.
#
# **Why it keeps more.** Token verification keeps $s_{<n}$ with probability $q(s_{<n})\,v_n$, where
# $v_n = \prod_{m<n}\min(1, r_m)$. By induction $w_n \ge v_n$: $w_{n+1} = \min(w_n r_n, 1) \ge \min(v_n r_n, v_n)
# = v_{n+1}$. As $E[\tau] = \sum_{n=1}^{\gamma} E[P(\tau \ge n \mid x_{<n})]$, block verification keeps at least as
# many drafts on average, for every draft and every context. The difference comes from chains whose low ratio is
# paid back later: token verification rejects at $r_n<1$ with probability $1-r_n$, block verification carries the
# deficit forward in $w$. Both pieces are needed: with a pass probability of $w_n$ instead of $h_n$, the lemma
# fails; with the correction drawn from the token residual $(p_n-q_n)^+$, step (i) of the proof fails.

# %% [markdown]
# ## Checking it exactly
#
# The cell below enumerates one step with rational arithmetic. Target and draft are random tables over $V=3$
# tokens, one distribution per prefix, so no two positions look alike; $\gamma = 3$. For every chain, it computes
# the law of $\tau$ from the definitions above (the product of the pass and fail probabilities, or, for token
# verification, of the accept tests), then the correction's law, and completes the output with the target. Beside
# the two exact methods stand the two broken variants of the last paragraph.

# %%
V, GAMMA = 3, 3
draw = random.Random(26)  # a draw on which both broken variants are far off


def random_law() -> tuple[Fraction, ...]:
    weights = [Fraction(draw.randint(1, 9)) for _ in range(V)]
    return tuple(weight / sum(weights) for weight in weights)


prefixes = [c for n in range(GAMMA + 1) for c in itertools.product(range(V), repeat=n)]
P = {prefix: random_law() for prefix in prefixes}  # target: prefixes of 0..GAMMA
Q = {prefix: random_law() for prefix in prefixes if len(prefix) < GAMMA}  # draft

METHODS = ("token", "block", "block, token residual", "block, ratio thresholds")


def chain_weights(chain: tuple[int, ...]) -> list[Fraction]:
    """w_0..w_GAMMA of a chain: the capped cumulative ratio."""
    w = [Fraction(1)]
    for n, x in enumerate(chain):
        w.append(min(w[-1] * P[chain[:n]][x] / Q[chain[:n]][x], Fraction(1)))
    return w


def residual(n: int, chain: tuple[int, ...], weight: Fraction) -> list[Fraction]:
    """(weight * p_n - q_n)^+ after the first n drafts of the chain."""
    p, q = P[chain[:n]], Q[chain[:n]]
    return [max(weight * p[v] - q[v], Fraction(0)) for v in range(V)]


def stop_law(method: str, chain: tuple[int, ...]) -> dict[int, Fraction]:
    """P(tau = n | the whole chain) for n = 0..GAMMA."""
    if method == "token":
        ratios = [min(Fraction(1), P[chain[:n]][x] / Q[chain[:n]][x])
                  for n, x in enumerate(chain)]
        law = {n: prod(ratios[:n]) * (1 - ratios[n]) for n in range(GAMMA)}
        return law | {GAMMA: prod(ratios)}
    w = chain_weights(chain)
    passes = {GAMMA: w[GAMMA]}
    for n in range(1, GAMMA):
        mass = sum(residual(n, chain, w[n]))
        exact = mass / (mass + 1 - w[n]) if mass + 1 - w[n] > 0 else Fraction(1)
        passes[n] = w[n] if method == "block, ratio thresholds" else exact
    law = {n: passes[n] * prod(1 - passes[m] for m in range(n + 1, GAMMA + 1))
           for n in range(1, GAMMA + 1)}
    return law | {0: prod(1 - passes[m] for m in range(1, GAMMA + 1))}


def correction_law(method: str, chain: tuple[int, ...], tau: int) -> list[Fraction]:
    """The law of the token emitted after the tau kept drafts."""
    if tau == GAMMA:
        return list(P[chain])
    block_residual = method in ("block", "block, ratio thresholds")
    weight = chain_weights(chain)[tau] if block_residual else Fraction(1)
    mass = residual(tau, chain, weight)
    return [m / sum(mass) for m in mass] if sum(mass) > 0 else list(P[chain[:tau]])


def completed_law(method: str) -> tuple[dict, Fraction]:
    """The step's output completed by the target to GAMMA + 1 tokens, and E[tau]."""
    law, kept = defaultdict(Fraction), Fraction(0)

    def complete(sequence: tuple[int, ...], mass: Fraction) -> None:
        if len(sequence) == GAMMA + 1:
            law[sequence] += mass
            return
        for v in range(V):
            complete(sequence + (v,), mass * P[sequence][v])

    for chain in itertools.product(range(V), repeat=GAMMA):
        chain_mass = prod(Q[chain[:n]][x] for n, x in enumerate(chain))
        for tau, tau_mass in stop_law(method, chain).items():
            kept += chain_mass * tau_mass * tau
            for y, y_mass in enumerate(correction_law(method, chain, tau)):
                complete(chain[:tau] + (y,), chain_mass * tau_mass * y_mass)
    return law, kept


def target_law(sequence: tuple[int, ...]) -> Fraction:
    return prod(P[sequence[:n]][s] for n, s in enumerate(sequence))


sequences = list(itertools.product(range(V), repeat=GAMMA + 1))
exact_kept = {}
print(f"{'method':24s} {'max |law - target|':>19s} {'E[drafts kept]':>15s}")
for method in METHODS:
    law, kept = completed_law(method)
    gap = max(abs(law[s] - target_law(s)) for s in sequences)
    exact_kept[method] = kept
    print(f"{method:24s} {float(gap):19.3g} {float(kept):15.4f}")
glue("exact_token_kept", float(exact_kept["token"]), display=False)
glue("exact_block_kept", float(exact_kept["block"]), display=False)

# %% [markdown]
# Token and block verification give the target's law with no error at all (the arithmetic is rational), and block
# verification keeps {glue:text}`exact_block_kept:.3f` drafts per step in expectation against
# {glue:text}`exact_token_kept:.3f` for token verification, on the same draft. Each broken variant moves the law
# away from the target's; the variant without the residual-mass thresholds also keeps a different number of
# drafts, while the one with the wrong correction keeps exactly as many as block verification does: counting
# accepted tokens cannot tell it from the real thing, only the law of the text can.
#
# ## Checking `flashspec.verify` by sampling
#
# The same step through the library: 200,000 rows, each a chain sampled from the draft, the target's logits and
# the draft's looked up from the tables, one call of `fs.verify(..., method="block")` on the PyTorch backend, and
# each output completed by sampling the target. A $\chi^2$ test compares the completed sequences' frequencies with
# the target's law over the $3^4$ sequences. The two broken variants (`flashspec_lab.exactness`) go through the
# same test and must fail it.

# %%
ROWS = 200_000
sampler = torch.Generator().manual_seed(0)


def table_logits(table: dict, contexts: torch.Tensor) -> torch.Tensor:
    """Log-probs [N, V] of each row's context (the row of `contexts` [N, n])."""
    n = contexts.shape[1]
    contexts_n = itertools.product(range(V), repeat=n)
    every = [[float(x) for x in table[c]] for c in contexts_n]
    dense = torch.tensor(every, dtype=torch.float64).log().float()  # lexicographic
    return dense[(contexts * V ** torch.arange(n - 1, -1, -1)).sum(dim=1)]


def draw_from(table: dict, contexts: torch.Tensor) -> torch.Tensor:
    probs = table_logits(table, contexts).exp()
    return torch.multinomial(probs, 1, generator=sampler)[:, 0]


chains = torch.zeros(ROWS, 0, dtype=torch.long)
for n in range(GAMMA):
    chains = torch.cat([chains, draw_from(Q, chains)[:, None]], dim=1)
target_logits = torch.stack(
    [table_logits(P, chains[:, :n]) for n in range(GAMMA + 1)], dim=1)
draft_logits = torch.stack(
    [table_logits(Q, chains[:, :n]) for n in range(GAMMA)], dim=1)
exact = np.zeros(V ** (GAMMA + 1))
exact[exactness.sequence_index(torch.tensor(sequences), V)] = [
    float(target_law(s)) for s in sequences]
VERIFIERS = {
    "block": exactness.library_verifier("torch", method="block"),
    "token": exactness.library_verifier("torch"),
    "block, token residual": exactness.block_token_residual_verifier,
    "block, ratio thresholds": exactness.block_ratio_threshold_verifier,
}
ALPHA = 0.01 / len(VERIFIERS)  # Bonferroni over the four tests
fits = {}
print(f"{'verifier':24s} {'kept/step':>9s} {'chi2':>8s} {'dof':>4s} {'p-value':>9s}"
      "  verdict")
for name, verifier in VERIFIERS.items():
    out = verifier(target_logits, draft_logits, chains, fs.SamplingParams(1.0), 7, None)
    completed = out.tokens.clone()
    for n in range(1, GAMMA + 1):  # the target completes what the step left open
        open_rows = out.num_accepted < n
        completed[open_rows, n] = draw_from(P, completed[open_rows, :n])
    fits[name] = exactness.chi_square_test(completed, exact, V)
    verdict = "target law" if fits[name].passes(ALPHA) else "REJECTED"
    fit, kept = fits[name], out.num_accepted.double().mean()
    print(f"{name:24s} {kept:9.4f} {fit.statistic:8.1f} {fit.dof:4d} "
          f"{fit.p_value:9.3g}  {verdict}")
assert fits["block"].passes(ALPHA) and fits["token"].passes(ALPHA)
assert not fits["block, token residual"].passes(ALPHA), "the test has no power"
assert not fits["block, ratio thresholds"].passes(ALPHA), "the test has no power"

# %% [markdown]
# The sampled drafts kept per step agree with the exact expectations above, both exact methods pass, and both broken
# variants are rejected. The test suite runs the same joint-law test on the sequences of a whole decode (three
# tokens, several steps, several drafts chosen by a policy) over {glue:text}`block_configs` configurations of
# temperature, truncation, $\gamma$ and deterministic drafts, on the PyTorch backend and on the Triton kernels, with
# the two broken variants as negative controls (`tests/test_exactness.py`; the committed run is read below).

# %%
suite = provenance.load_result("exactness_cpu.json")["results"]
block_rows = {backend: suite["grid"][f"{backend}_block"]
              for backend in ("torch", "triton")}
for backend, rows in block_rows.items():
    passed = sum(row["passes"] for row in rows)
    print(f"{backend:7s} method='block': {passed} of {len(rows)} configurations pass")
caught = [row for row in suite["negative_controls"] if row["bug"].startswith("block")]
print(f"block controls rejected: {sum(row['caught'] for row in caught)} "
      f"of {len(caught)}")
assert all(row["passes"] for rows in block_rows.values() for row in rows)
assert caught and all(row["caught"] for row in caught)
glue("block_configs", len(block_rows["torch"]), display=False)

# %% [markdown]
# ## On a real model
#
# What block verification gains depends on how the draft errs, so the number that matters is measured on a real
# target and real prompts: SmolLM2-135M-Instruct {cite}`smollm2` with a two-layer draft distilled from it on this
# CPU, on the chat prompt set of `flashspec_lab.workloads` (conversation, coding, math reasoning, summarising a
# given passage, answering from a given passage, rewriting), {glue:text}`bg_prompts` prompts per category, each
# rendered with the model's chat template, $\gamma = $ {glue:text}`bg_gamma`. Both methods emit the target's law, so
# they can be compared on the very same chains: at every step of a decode, the record sums
# $\sum_n P(\tau \ge n \mid x_{<n})$ under either method ($v_n$ and $w_n$ of the drafted chain), each an unbiased
# estimate of that method's expected drafts kept in that context. The gain is paired prompt by prompt, with its
# standard error over prompts (`experiments/block_gain.py`, `results/block_gain_smollm2_cpu.json`).

# %%
record = provenance.load_result("block_gain_smollm2_cpu.json")
settings, summary = record["settings"], record["results"]["summary"]
glue("bg_prompts", settings["prompts_per_category"], display=False)
glue("bg_gamma", settings["gamma"], display=False)
print(f"{'T':>4s} {'category':14s} {'token':>6s} {'block':>6s} {'gain':>14s} "
      f"{'ratio':>6s}")
for label, categories in summary.items():
    for category, row in categories.items():
        gain = f"{row['gain']:+.3f} ± {row['gain_standard_error']:.3f}"
        print(f"{label[2:]:>4s} {category:14s} {row['token']:6.3f} {row['block']:6.3f} "
              f"{gain:>14s} {row['ratio']:6.3f}")
print("tokens per step (1 + expected drafts kept); gain = block - token, ± one SE")
at_one = summary["T=1"]
categories = [name for name in at_one if name != "mixed"]
glue("bg_gain", at_one["mixed"]["gain"], display=False)
glue("bg_token", at_one["mixed"]["token"], display=False)
glue("bg_gain_se", at_one["mixed"]["gain_standard_error"], display=False)
glue("bg_ratio_pct", 100 * (at_one["mixed"]["ratio"] - 1), display=False)
glue("bg_min_gain", min(at_one[name]["gain"] for name in categories), display=False)
glue("bg_categories", len(categories), display=False)
made = record["provenance"]
print(f"measured on {made['hardware'].get('cpu') or 'a CPU'} "
      f"({made['hardware'].get('cpu_count')} cores), {made['date_utc'][:10]}")

# %% [markdown]
# At $T=1$, over the mixed prompt set, block verification makes {glue:text}`bg_gain:+.3f` tokens per step
# (± {glue:text}`bg_gain_se:.3f`), {glue:text}`bg_ratio_pct:.1f`% more than token verification; the smallest gain
# over the {glue:text}`bg_categories` categories is {glue:text}`bg_min_gain:+.3f`. No estimate here can be negative:
# $w_n \ge v_n$ holds chain by chain, so the record measures how much more block verification keeps, not whether.
# The gain is small because this draft is weak (token verification makes {glue:text}`bg_token:.2f` tokens per
# step with it), and block verification helps only chains whose deficit later tokens can pay back. Sun et al. report gains of the same kind,
# larger with longer chains and better drafts {cite}`sun2025block`. In time, block verification adds a pass over the
# vocabulary at each of the $\gamma-1$ inner positions (the residual masses $Z_n$) to a verify step that is already
# a small part of a decode step (chapters 2 and 4), and changes nothing in the forward passes.
#
# ## Summary
#
# - Block verification keeps the longest prefix that passes a test on the chain's capped cumulative ratio $w_n$,
#   with pass probabilities set from the residual masses so that $P(\tau\ge n\mid x_{<n}) = w_n$, and draws the
#   correction from the block residual $(w_\tau p_\tau - q_\tau)^+$.
# - Its output law is the target's (the theorem above; exact enumeration; a $\chi^2$ test through `fs.verify`),
#   and the two ways of getting it almost right are caught by the same test.
# - Since $w_n \ge \prod_{m<n}\min(1, r_m)$, it never keeps fewer drafts in expectation than token verification; on
#   SmolLM2 with a small distilled draft the gain is {glue:text}`bg_ratio_pct:.1f`% tokens per step at $T=1$.
# - Use it with `method="block"`, `verify_method="block"` or `--verify block`; it combines with every draft and
#   policy, since the choice of draft is untouched.
