"""The fast path (static caches, device-held step state, lagged host reads) is exact: greedy equals
the target's own greedy `generate`, and the joint law of the first tokens matches exact enumeration
with two model drafts and prompt lookup under a bandit that switches. On CPU the steps run eagerly;
the same step code is what CUDA graphs capture on a GPU."""
from __future__ import annotations

import copy

import pytest
import torch

import flashspec as fs
from flashspec import models, runner
from flashspec.drafters import PromptLookupDrafter
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder, make_decoder
from flashspec.fast_session import capture_fill, catch_up_length, session_capacity
from flashspec_lab.simulate import Blocks

from test_engine_exact import (LENGTH, PROMPT, ROWS_PER_CALL, SETTINGS, VOCAB, exact_continuations, fit_p_values,
                               passes, peaked_trio)


@pytest.fixture(scope="module")
def pool():
    target = models.tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=1, initializer_range=0.3, seed=1)
    near = copy.deepcopy(target)
    noise = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in near.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=noise) * 0.003 * 0.3)
    far = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    return target, near, far


def variant(name: str) -> torch.nn.Module:
    """A GQA Llama, a tied-embedding model or a llama3-RoPE model (what the fast runner must match)."""
    config = models.llama_config(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                                 max_positions=64, initializer_range=0.3)
    if name == "tied":
        config.tie_word_embeddings = True
    if name == "llama3":
        config.rope_parameters = {"rope_theta": 10000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    torch.manual_seed(3)
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("name", ["gqa", "tied", "llama3"])
def test_greedy_equals_target_greedy_generate(name):
    target = variant(name)
    draft = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9], [1, 4, 4, 4, 4]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    decoder = FastSpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="exp3", gamma=3)
    result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=20, sampling=fs.SamplingParams(0.0))
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    assert torch.equal(result.sequences, expected)


def test_greedy_with_eos_and_budgets_per_row(pool):
    target, near, far = pool
    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9], [1, 4, 4, 4, 4]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    decoder = FastSpeculativeDecoder(target, [near, far, PromptLookupDrafter()], policy="ucb1", gamma=4)
    result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=14, sampling=fs.SamplingParams(0.0))
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=14, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    assert torch.equal(result.sequences, expected)
    budgets = decoder.generate(prompts, attention_mask=mask, max_new_tokens=[3, 0, 7], ignore_eos=True,
                               sampling=fs.SamplingParams(0.0))
    assert budgets.num_generated.tolist() == [3, 0, 7]


def test_same_seed_same_output_on_fresh_and_reused_decoders(pool):
    target, near, far = pool
    prompt = PROMPT.expand(4, -1)
    make = lambda: FastSpeculativeDecoder(target, [near, far, PromptLookupDrafter()], policy="thompson", gamma=3)  # noqa: E731
    first = make().generate(prompt, max_new_tokens=12, seed=7, ignore_eos=True)
    again = make().generate(prompt, max_new_tokens=12, seed=7, ignore_eos=True)
    other = make().generate(prompt, max_new_tokens=12, seed=8, ignore_eos=True)
    assert torch.equal(first.sequences, again.sequences)
    assert [s.arm for s in first.stats.steps] == [s.arm for s in again.stats.steps]
    assert not torch.equal(first.sequences, other.sequences)


def test_model_drafts_are_verified_with_the_log_probs_they_sampled_from(pool, monkeypatch):
    """A model draft's step hands the verifier the warped log-probs it sampled from (`draft_is_log_probs`: rows that
    sum to one, no pass over the draft's vocabulary to normalise it); prompt lookup hands no draft distribution."""
    from flashspec import fast_session

    target, near, _ = pool
    calls = []
    reference = fast_session.verify_reference

    def recording(target_logits, draft_logits, draft_tokens, params, key, draft_is_log_probs=False, **options):
        calls.append((draft_logits, draft_is_log_probs))
        return reference(target_logits, draft_logits, draft_tokens, params, key, draft_is_log_probs, **options)

    monkeypatch.setattr(fast_session, "verify_reference", recording)
    params = fs.SamplingParams(0.8, top_k=3)
    FastSpeculativeDecoder(target, [near], gamma=3, backend="torch").generate(
        PROMPT.expand(2, -1), max_new_tokens=6, sampling=params, seed=1, ignore_eos=True)
    FastSpeculativeDecoder(target, [PromptLookupDrafter()], gamma=3, backend="torch").generate(
        PROMPT.expand(2, -1), max_new_tokens=6, sampling=params, seed=1, ignore_eos=True)
    given = [(logits, flag) for logits, flag in calls if logits is not None]
    assert given and all(flag for _, flag in given)
    for log_probs, _ in given:
        assert torch.allclose(torch.logsumexp(log_probs.double(), dim=-1), torch.zeros(()).double(), atol=1e-5)
        assert bool((log_probs == float("-inf")).any())  # top-k applied: the warped q, not the logits
    assert any(logits is None and not flag for logits, flag in calls)


def test_requests_of_similar_lengths_share_a_session_and_a_seed_still_fixes_the_run(pool):
    target, near, far = pool
    make = lambda: FastSpeculativeDecoder(target, [near, far, PromptLookupDrafter()], policy="fixed", gamma=3)  # noqa: E731
    decoder = make()
    long_prompt = torch.cat([PROMPT, PROMPT[-3:]])
    decoder.generate(PROMPT[None], max_new_tokens=12, seed=1, ignore_eos=True)
    session = decoder._session
    second = decoder.generate(long_prompt[None], max_new_tokens=10, seed=7, ignore_eos=True)
    assert decoder._session is session  # another prompt length and budget, the same rounded cache size
    fresh = make().generate(long_prompt[None], max_new_tokens=10, seed=7, ignore_eos=True)
    assert torch.equal(second.sequences, fresh.sequences)  # what ran before changes nothing
    decoder.generate(PROMPT[None], max_new_tokens=40, seed=1, ignore_eos=True)
    assert decoder._session is not session and decoder._session.capacity >= len(PROMPT) + 40 + 4


def test_a_replaced_session_is_freed_at_once_with_its_graphs(pool):
    """A runner and its prefill graphs refer to each other: a session replaced by a request of another size
    must drop them itself, or they (graphs and caches) wait for a garbage collection, which may come in the
    middle of the next capture and invalidate it. Checked with the collector off, on CPU (where a runner's
    prefill graph is a `GraphedStep` that runs eagerly)."""
    import gc
    import weakref

    target, near, _ = pool
    decoder = FastSpeculativeDecoder(target, [near], policy="fixed", gamma=3)
    decoder.generate(PROMPT[None], max_new_tokens=8, ignore_eos=True)
    old = decoder._session
    for model in old.runners():
        model.prefill_graph(1, len(PROMPT))          # what a graphed prefill leaves in each runner
    held = [weakref.ref(obj) for obj in (old, *old.runners())]
    del old, model
    gc.disable()
    try:
        decoder.generate(PROMPT[None], max_new_tokens=60, ignore_eos=True)  # another cache size: a new session
        assert [ref() is None for ref in held] == [True] * len(held)
        replacement = weakref.ref(decoder._session)
        decoder.close()
        assert replacement() is None
    finally:
        gc.enable()


def test_kept_sessions_serve_alternating_cache_sizes_without_rebuilding(pool):
    """`sessions=2`: requests alternating between two cache sizes reuse both sessions (the least recently used
    goes when a third shape comes), and a kept session gives the tokens a fresh decoder gives."""
    target, near, _ = pool
    decoder = FastSpeculativeDecoder(target, [near], policy="fixed", gamma=3, sessions=2)
    short, long = dict(max_new_tokens=8), dict(max_new_tokens=60)
    decoder.generate(PROMPT[None], seed=1, ignore_eos=True, **short)
    small = decoder._session
    decoder.generate(PROMPT[None], seed=1, ignore_eos=True, **long)
    large = decoder._session
    again = decoder.generate(PROMPT[None], seed=3, ignore_eos=True, **short)
    assert decoder._session is small and small is not large and len(decoder._sessions) == 2
    fresh = FastSpeculativeDecoder(target, [near], policy="fixed", gamma=3).generate(
        PROMPT[None], seed=3, ignore_eos=True, **short)
    assert torch.equal(again.sequences, fresh.sequences)
    decoder.generate(PROMPT[None].repeat(2, 1), seed=1, ignore_eos=True, **short)  # a third shape: `large` goes
    assert list(decoder._sessions.values())[0] is small and large not in decoder._sessions.values()
    decoder.close()
    assert decoder._session is None and not decoder._sessions
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="sessions must be an int >= 1"):
            FastSpeculativeDecoder(target, [near], sessions=bad)


def test_session_capacity_rounds_onto_the_bucket_grid():
    from flashspec.fast_session import session_capacity

    assert session_capacity(10, 5) == 16 and session_capacity(12, 5) == 32 and session_capacity(176, 5) == 256
    assert session_capacity(300, 5) == 512 and session_capacity(1000, 9) == 1024
    assert session_capacity(60, 5, max_positions=60) == 65  # capped at the models' positions + slack
    assert session_capacity(20, 5, max_positions=64) == 32


def test_on_step_events_rebuild_the_output(pool):
    target, near, _ = pool
    events = []
    decoder = FastSpeculativeDecoder(target, [near], policy="fixed", gamma=3)
    result = decoder.generate(PROMPT.expand(2, -1), max_new_tokens=10, ignore_eos=True, on_step=events.append)
    for row in range(2):
        tokens = [token for event in events for token in event.new_tokens[row]]
        assert tokens == result.sequences[row, len(PROMPT):].tolist()


def test_bad_inputs_and_fallback(pool):
    target, near, _ = pool
    with pytest.raises(ValueError, match="gamma"):
        FastSpeculativeDecoder(target, [near], gamma=0)
    with pytest.raises(ValueError, match="lag"):
        FastSpeculativeDecoder(target, [near], lag=0)
    with pytest.raises(ValueError, match="graphs=True needs"):
        FastSpeculativeDecoder(target, [near], graphs=True).generate(PROMPT[None], max_new_tokens=2)

    class Custom:
        name = "custom"

        def reset(self, batch_size): ...

        def propose(self, context): ...

        def rollback(self, num_valid): ...

    decoder = make_decoder(target, [Custom()], fast="auto")  # on a CPU "auto" is the eager engine anyway
    assert type(decoder).__name__ == "SpeculativeDecoder"
    assert type(make_decoder(target, [near], engine="auto")).__name__ == "SpeculativeDecoder"
    assert type(make_decoder(target, [near], engine="fast")).__name__ == "FastSpeculativeDecoder"
    with pytest.raises(ValueError, match="cannot run these models"):
        make_decoder(target, [Custom()], fast=True)
    with pytest.raises(ValueError, match="tp .* needs the fast path"):  # no TypeError from the eager fallback
        make_decoder(target, [Custom()], fast="auto", tp=object())
    assert type(make_decoder(target, [Custom()], fast="auto", tp=None)).__name__ == "SpeculativeDecoder"
    with pytest.raises(ValueError, match="compile apply to the fast path only"):
        make_decoder(target, [Custom()], engine="auto", compile="default")


def test_catch_up_length():
    assert catch_up_length(1, 4, 512) == 0                  # ran the step before: the γ+1 window suffices
    assert catch_up_length(2, 4, 512) == 8                  # up to 5 older tokens missed
    assert catch_up_length(7, 3, 512) == 32                 # up to 24
    assert catch_up_length(400, 4, 512) == 512              # capped at the bucket: re-read everything


def test_lazy_drafts_catch_up_after_a_switch(pool):
    """A draft chosen again after 4 steps away re-reads the <= 12 older tokens it missed (16, a power
    of two) before its window, and a draft's first step of a request (lazy drafts are not prefilled) reads the
    whole context (32, its bucket): greedy still equals the target's greedy decoding, whichever draft runs,
    and the catch-ups really occur. A draft the policy never plays is never run."""
    target, near, far = pool

    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    for sync in ("lazy", "all"):
        decoder = FastSpeculativeDecoder(target, [near, far], policy=Blocks(3), gamma=3, draft_sync=sync)
        result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=24, sampling=fs.SamplingParams(0.0))
        assert torch.equal(result.sequences, expected), sync
        catch_ups = decoder._session.catch_ups
        assert ({16, 32} <= set(catch_ups) and 0 in catch_ups) if sync == "lazy" else not catch_ups, (sync, catch_ups)
    decoder = FastSpeculativeDecoder(target, [near, far], policy="fixed", gamma=3)
    result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=24, sampling=fs.SamplingParams(0.0))
    assert torch.equal(result.sequences, expected)
    unplayed = decoder._session.drafts[1]
    assert not any(store.any() for store in unplayed.cache.k + unplayed.cache.v)  # neither prefilled nor run


SYNC_CASES = [(params, "lazy") for params in SETTINGS] + [(SETTINGS[0], "all")]


def chi2_calls(decoder: FastSpeculativeDecoder, params: fs.SamplingParams, device: str = "cpu",
               calls: int = 64, rows: int = ROWS_PER_CALL) -> tuple[torch.Tensor, list[int], list[int]]:
    """The χ² runs: `calls` requests of `rows` copies of PROMPT, seeds 1000...; returns the
    continuations [calls * rows, LENGTH], the arm of every step and every row's kept count per step.
    Fewer, wider calls draw as many samples in fewer steps (where a step's fixed cost dominates)."""
    continuations, arms, kept = [], [], []
    for call in range(calls):
        result = decoder.generate(PROMPT.expand(rows, -1).to(device), max_new_tokens=LENGTH,
                                  sampling=params, seed=1000 + call, ignore_eos=True)
        continuations.append(result.sequences[:, -LENGTH:].cpu())
        arms += [step.arm for step in result.stats.steps]
        kept += [count for step in result.stats.steps for count in step.kept]
    return torch.cat(continuations), arms, kept


@pytest.mark.slow
@pytest.mark.parametrize("params,sync", SYNC_CASES, ids=lambda x: x if isinstance(x, str) else
                         f"T{x.temperature}-top_p{x.top_p}")
def test_fast_output_matches_exact_target_distribution(pool, params, sync):
    target, near, far = pool
    decoder = FastSpeculativeDecoder(target, [near, far, PromptLookupDrafter()], policy="exp3", gamma=3,
                                     policy_kwargs={"seed": 0}, draft_sync=sync)
    continuations, arms, kept = chi2_calls(decoder, params)
    p_values = fit_p_values(continuations, exact_continuations(target, params))
    assert passes(p_values), p_values
    assert len(set(arms)) == 3, f"every arm must be played, trace {arms}"
    assert max(kept) >= 2, "multi-token steps must occur for the test to cover them"
    if sync == "lazy":
        assert max(decoder._session.catch_ups) > 0, "catch-ups must occur"


def test_compiled_regions_match_target_greedy_generate():
    """compile=True with compile_scope="regions" (torch.compile of the per-layer dense regions and the draft sampler) changes
    no greedy token, and the compiled regions really run (Dynamo traces new graphs)."""
    from torch._dynamo.utils import counters

    target = variant("gqa")
    draft = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    before = counters["stats"]["unique_graphs"]
    decoder = FastSpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="exp3", gamma=3, compile=True,
                                     compile_scope="regions")  # the whole-forward scope: tests/test_runner.py
    result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=12, sampling=fs.SamplingParams(0.0))
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    assert torch.equal(result.sequences, expected)
    assert counters["stats"]["unique_graphs"] - before >= 3
    with pytest.raises(ValueError, match="compile must be"):
        FastSpeculativeDecoder(target, [draft], compile="fastest")
    with pytest.raises(ValueError, match="compile_scope must be one of"):
        FastSpeculativeDecoder(target, [draft], compile=True, compile_scope="layer")
    with pytest.raises(ValueError, match="draft_sync"):
        FastSpeculativeDecoder(target, [draft], draft_sync="sometimes")


def test_the_compiled_draft_sampler_compiles_once_for_every_position_and_draft(pool):
    """With two model drafts at γ = 3 and T = 1 the compiled step samples at three positions on two draft streams:
    the positions and streams reach the sampler as device scalars, so it compiles once (Python ints would
    specialise it: a recompile for the second position and another for the second draft)."""
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    target, near, _ = pool
    torch._dynamo.reset()  # earlier tests' compiled samplers would be reused, and not counted
    clear_compilation_metrics()
    # two drafts of one shape (their compiled regions are shared: a quicker test)
    decoder = FastSpeculativeDecoder(target, [near, copy.deepcopy(near)], policy="exp3", gamma=3, compile=True,
                                     compile_scope="regions", policy_kwargs={"seed": 0})
    result = decoder.generate(PROMPT.expand(4, -1), max_new_tokens=16, sampling=fs.SamplingParams(1.0), seed=3,
                              ignore_eos=True)
    assert result.stats.steps and len({step.arm for step in result.stats.steps}) == 2  # both drafts sampled
    frames = [m for m in get_compilation_metrics() if m.co_name == "sample_from_logits"]
    assert len(frames) == 1, [m.fail_reason for m in frames]


def test_fast_plain_greedy_equals_generate_and_samples_are_seeded(pool):
    from flashspec.fast import FastPlainDecoder

    target, _, _ = pool
    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    plain = FastPlainDecoder(target)
    result = plain.generate(prompts, attention_mask=mask, max_new_tokens=9, sampling=fs.SamplingParams(0.0))
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=9, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    assert torch.equal(result.sequences, expected)
    assert all(step.kept == [1] * len(step.kept) for step in result.stats.steps)
    first = plain.generate(prompts, attention_mask=mask, max_new_tokens=9, seed=4, ignore_eos=True).sequences
    again = FastPlainDecoder(target).generate(prompts, attention_mask=mask, max_new_tokens=9, seed=4,
                                              ignore_eos=True).sequences
    assert torch.equal(first, again)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: graphs and host syncs exist only there")
def test_graph_replayed_steps_make_no_host_sync():
    """After capture, 16+ replayed steps and their pinned-memory outcome copies never sync the host."""
    target = models.tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=1, seed=1).cuda()
    draft = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, seed=2).cuda()
    decoder = FastSpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="fixed", gamma=3)
    decoder.generate(PROMPT[None].cuda(), max_new_tokens=60, ignore_eos=True)  # captures (0, bucket) graphs
    session = decoder._session
    session.prefill(PROMPT[None].cuda(), torch.ones(1, len(PROMPT), dtype=torch.bool, device="cuda"), [60], 1, 0)
    pinned = torch.zeros(session.buffers.outcome.shape, dtype=torch.long, pin_memory=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(16):
            session.launch(0, 64)
            pinned.copy_(session.buffers.outcome, non_blocking=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert session.buffers.lengths.item() > len(PROMPT) + 16


def test_capture_fill_keeps_the_step_in_its_bucket_and_the_commit_in_the_cache():
    """Every arm's capture-ahead fill, at every bucket a session can reach: the step's γ+1 positions inside the
    bucket, and the commit's fixed Γ+1 columns (Γ the largest γ, also for a shorter arm) inside the cache.
    The fill once bounded by the arm's own γ put a γ = 2 commit past a Γ = 8 session's last slot."""
    for tokens in (5, 40, 176, 300, 1000):
        for gammas in ((1, 4), (2, 4, 6, 8), (3,), (1, 16)):
            top = max(gammas)
            capacity = session_capacity(tokens, top + 1)
            buckets = {runner.bucket_for(n, capacity) for n in range(1, capacity + 1)}
            for bucket in buckets:
                for gamma in (g for g in gammas if bucket >= g + 1):  # the buckets a step of γ can use
                    fill = capture_fill(bucket, capacity, gamma, top)
                    assert fill >= 1 and fill + gamma <= bucket and fill + top < capacity, (tokens, gammas, bucket, gamma)


class Replayed:
    """A stand-in for a captured CUDA graph on a CPU: replaying it runs the step eagerly."""

    def __init__(self, run) -> None:
        self.replay = run


class Scripted:
    """A policy that plays `arms` cyclically from the start of every request and learns nothing."""

    def __init__(self, arms: list[int]) -> None:
        self.arms, self.t = arms, -1

    def on_request_start(self) -> None:
        self.t = -1

    def select(self) -> int:
        self.t += 1
        return self.arms[self.t % len(self.arms)]

    def update(self, arm: int, reward: float) -> None:
        return None


def test_capture_graphs_covers_the_plain_arm_at_every_bucket(pool, monkeypatch):
    """`capture_graphs` enumerates every graph the step loop can replay, the plain arm's step (γ = 0, no
    catch-up: it has no draft) at each bucket included: with captures stood in by eager replays, a stream served
    afterwards that mixes plain and draft steps asks for no new graph and gives a graph-free decoder's tokens."""
    target, near, far = pool
    script = [4, 0, 4, 4, 3, 4, 1, 2, 4]  # arms: near@2, near@4, far@2, far@4, plain

    def make():
        return FastSpeculativeDecoder(target, [near, far], policy=Scripted(script), gammas=[0, 2, 4])

    sampling = fs.SamplingParams(temperature=1.0)
    decoder = make()
    decoder.generate(PROMPT[None], max_new_tokens=40, sampling=sampling, seed=1, ignore_eos=True)
    session = decoder._session
    monkeypatch.setattr(session, "_capture", Replayed)
    session.use_graphs = True
    assert decoder.capture_graphs(range(1, len(PROMPT) + 40 + 5)) > 0
    plain = decoder.arms.index((-1, 0))
    buckets = {key[2] for key in session.graphs if key[0] == "step"}
    assert {key[2] for key in session.graphs if key[:2] == ("step", plain)} == buckets and len(buckets) >= 2
    assert not any(key[0] == "catch_up" and key[1] == plain for key in session.graphs)
    before = decoder.graphs_captured
    served = [decoder.generate(PROMPT[None], max_new_tokens=40, sampling=sampling, seed=seed, ignore_eos=True)
              for seed in (2, 3)]
    assert decoder.graphs_captured == before
    assert any(step.arm == plain for step in served[0].stats.steps)
    for seed, result in zip((2, 3), served):
        fresh = make().generate(PROMPT[None], max_new_tokens=40, sampling=sampling, seed=seed, ignore_eos=True)
        assert torch.equal(result.sequences, fresh.sequences)


def serve_after_capture(decoder: FastSpeculativeDecoder, prompts: list, sampling: fs.SamplingParams,
                        ahead: bool) -> tuple[list, int]:
    """One request that sets the session up, then (`ahead`) `capture_graphs` over every length the stream reaches,
    then each prompt twice (seeds 0, 1, ...): the outputs and the graphs captured while serving them."""
    decoder.generate(prompts[0], max_new_tokens=40, sampling=sampling, seed=99, ignore_eos=True)
    if ahead:
        assert decoder.capture_graphs(range(1, len(PROMPT) + 40 + 8)) > 0
    before = decoder.graphs_captured
    outputs = [decoder.generate(p, max_new_tokens=40, sampling=sampling, seed=i, ignore_eos=True).sequences
               for i, p in enumerate(prompts * 2)]
    return outputs, decoder.graphs_captured - before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: graphs exist only there")
@pytest.mark.parametrize("gammas", [(1, 4), (0, 1, 4)], ids=["drafts", "with-plain"])
def test_graphs_captured_ahead_serve_a_stream_without_capturing_and_change_no_token(gammas):
    """`capture_graphs` on a GPU, real captures: a stream served afterwards in the session captures nothing, and
    every request's tokens equal those of a decoder that captured as it went (the frozen warm-ups of the
    captures ahead, run between requests at other fills, leave no trace)."""
    target = models.tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=1, seed=1).cuda()
    drafts = [models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, seed=s).cuda() for s in (2, 3)]
    prompts = [PROMPT[None].cuda(), PROMPT[None, :3].cuda()]
    sampling = fs.SamplingParams(temperature=1.0)

    def serve(decoder, ahead: bool) -> tuple[list, int]:
        return serve_after_capture(decoder, prompts, sampling, ahead)

    def make():  # fixed arm costs: the throughput reward then does not read step times, so both decoders choose alike
        # γ = 1 beside Γ = 4 > 2γ: captured at the top bucket, the γ = 1 step's commit writes Γ + 1 columns (the
        # plain arm's too, from its one token)
        arms = 2 * 2 + (0 in gammas)
        return FastSpeculativeDecoder(target, drafts, policy="thompson", gamma=4, gammas=list(gammas),
                                      arm_costs=[1.0] * arms)

    decoder = make()
    ahead, captured = serve(decoder, True)
    as_it_went, _ = serve(make(), False)
    assert captured == 0
    assert all(torch.equal(a, b) for a, b in zip(ahead, as_it_went))
    if 0 in gammas:
        assert any(key[:2] == ("step", 4) for key in decoder._session.graphs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scope", ["forward", "regions"])
def test_compiled_graphed_greedy_equals_generate_on_gpu(scope):
    """Greedy through compiled forwards replayed from CUDA graphs, speculative and plain, equals the target's
    greedy generate (fp32 on the GPU)."""
    target = variant("gqa").cuda()
    draft = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2).cuda()
    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9]], device="cuda")
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]], device="cuda")
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=24, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    greedy = fs.SamplingParams(0.0)
    for decoder in (FastSpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="exp3", gamma=3,
                                           compile=True, compile_scope=scope),
                    FastPlainDecoder(target, compile=True, compile_scope=scope)):
        result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=24, sampling=greedy)
        assert torch.equal(result.sequences.cpu(), expected.cpu()), (scope, type(decoder).__name__)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("params,compile", [(SETTINGS[0], False), (SETTINGS[1], False), (SETTINGS[0], True)],
                         ids=lambda x: f"compile={x}" if isinstance(x, bool) else f"T{x.temperature}")
def test_graphed_fast_path_matches_exact_distribution_on_gpu(pool, params, compile):
    target, near, far = (copy.deepcopy(model).cuda() for model in pool)
    decoder = FastSpeculativeDecoder(target, [near, far, PromptLookupDrafter()], policy="exp3", gamma=3,
                                     policy_kwargs={"seed": 0}, compile=compile)
    continuations, _, _ = chi2_calls(decoder, params, device="cuda")
    p_values = fit_p_values(continuations, exact_continuations(pool[0], params))
    assert passes(p_values), p_values


# ------------------------------------------------------------------------------------------ several paths


@pytest.fixture(scope="module")
def peaked_pair():
    """`test_engine_exact.peaked_trio`: the target, a perturbed draft and an exact copy."""
    return peaked_trio()


@pytest.mark.parametrize("compile_scope", [None, "forward", "regions"], ids=["eager", "compiled", "regions"])
def test_paths_decoder_greedy_equals_target_greedy_generate(compile_scope, monkeypatch):
    """Greedy equals the target's greedy generate, eagerly and compiled; compiled, the target's tree forward runs
    through the compiled forward (scope "forward") or its compiled regions, as its chain forwards do."""
    from flashspec.fast import FastPathsDecoder

    lengths: list[int] = []
    compile_region = runner.compile_region

    def counted(fn, mode="default", options=None):  # the target's compiled forward, recording its query lengths
        compiled = compile_region(fn, mode, options)

        def call(*args, **kwargs):
            first = next(arg for arg in args if isinstance(arg, torch.Tensor))  # tokens, or a region's x
            lengths.append(first.shape[1])
            return compiled(*args, **kwargs)
        return call
    monkeypatch.setattr(runner, "compile_region", counted)
    target = variant("gqa")
    drafts = [PromptLookupDrafter(),
              models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2),
              copy.deepcopy(target)]
    prompts = torch.tensor([[0, 0, 5, 6, 7], [0, 3, 7, 3, 9], [1, 4, 4, 4, 4]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    decoder = FastPathsDecoder(target, drafts, gamma=3, compile=compile_scope is not None,
                               compile_scope=compile_scope or "forward")
    result = decoder.generate(prompts, attention_mask=mask, max_new_tokens=20, sampling=fs.SamplingParams(0.0))
    expected = target.generate(prompts, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    assert torch.equal(result.sequences, expected)
    assert max(count for step in result.stats.steps for count in step.kept) == 4  # the copy's whole chain
    tree = 1 + len(drafts) * 3
    assert (tree in lengths) == (compile_scope is not None), lengths  # the 10-node tree, compiled


@pytest.mark.slow
@pytest.mark.parametrize("gamma, lookup, control", [(1, False, False), (2, False, False), (2, True, False),
                                                    (1, False, True)],
                         ids=["g1", "g2", "g2-with-prompt-lookup", "g1-control-path-0-kept"])
def test_paths_decoder_output_matches_exact_target_distribution(peaked_pair, gamma, lookup, control, monkeypatch):
    """Two drafts' chains verified together each step (the perturbed draft's path first), T = 1, and with prompt
    lookup's fixed proposals as a third path: the χ² family accepts the target's law of the first three tokens.
    The control leaves every step's cache as the tree forward wrote it (path 0's keys and values, whichever path
    was kept) and must fail."""
    from flashspec.fast import FastPathsDecoder

    target, perturbed, copied = peaked_pair
    if control:
        monkeypatch.setattr(runner.LlamaRunner, "keep_path", lambda self, root, path_nodes: None)
    drafts = [perturbed, copied] + ([PromptLookupDrafter()] if lookup else [])
    decoder = FastPathsDecoder(target, drafts, gamma=gamma)
    params = fs.SamplingParams(1.0)
    continuations, _, kept = chi2_calls(decoder, params)
    p_values = fit_p_values(continuations, exact_continuations(target, params))
    assert passes(p_values) != control, p_values
    assert max(kept) == gamma + 1 and min(kept) == 1  # whole chains and first-token rejections both occur


def test_paths_decoder_verifies_with_triton_as_with_torch(peaked_pair):
    """The paths decoder's Triton verification (one launch reading the step key's prefixes from memory, what a
    captured graph replays) draws what the PyTorch reference draws: a seed gives the same tokens, T = 1, two
    drafts and prompt lookup, several steps of two rows (on a CPU under Triton's interpreter)."""
    pytest.importorskip("triton")
    from flashspec.fast import FastPathsDecoder

    target, perturbed, copied = peaked_pair
    prompts = torch.tensor([[3, 5, 7, 3, 5], [4, 4, 6, 8, 4]])

    def decode(backend: str) -> tuple[torch.Tensor, list]:
        decoder = FastPathsDecoder(target, [perturbed, copied, PromptLookupDrafter()], gamma=2, backend=backend)
        assert decoder.backend == backend
        result = decoder.generate(prompts, max_new_tokens=12, sampling=fs.SamplingParams(1.0), seed=3,
                                  ignore_eos=True)
        assert decoder._session.verify_triton == (backend == "triton")
        return result.sequences, [step.kept for step in result.stats.steps]

    with_torch, with_triton = decode("torch"), decode("triton")
    assert torch.equal(with_torch[0], with_triton[0]) and with_torch[1] == with_triton[1]
    assert max(count for kept in with_torch[1] for count in kept) > 1  # multi-token steps occurred


def test_paths_decoder_refuses_drafts_it_cannot_run(pool):
    from flashspec.fast import FastPathsDecoder

    target, near, _ = pool
    with pytest.raises(ValueError, match="at least one draft"):
        FastPathsDecoder(target, [])
    with pytest.raises(ValueError, match=r"drafts\[1\] must be a Llama-family HF model, a FeatureDraft or a Prompt"):
        FastPathsDecoder(target, [near, "a draft"])
    with pytest.raises(ValueError, match="gamma"):
        FastPathsDecoder(target, [near], gamma=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: graphs exist only there")
def test_graphed_paths_decoder_equals_its_graph_free_run_and_captures_ahead(peaked_pair):
    """On a GPU the paths decoder's steps replay from CUDA graphs: greedy equals the target's greedy generate, a
    seed gives the tokens of the same decoder without graphs, and after `capture_graphs` a stream captures
    nothing and changes no token."""
    from flashspec.fast import FastPathsDecoder

    target, perturbed, copied = (model.cuda() for model in peaked_pair)
    prompts = [PROMPT[None].cuda(), PROMPT[None, :3].cuda()]
    sampling = fs.SamplingParams(1.0)
    greedy = FastPathsDecoder(target, [perturbed, copied], gamma=3).generate(
        prompts[0], max_new_tokens=24, sampling=fs.SamplingParams(0.0))
    expected = target.generate(prompts[0], max_new_tokens=24, do_sample=False, eos_token_id=2, pad_token_id=2)
    assert torch.equal(greedy.sequences, expected.cpu())

    def serve(graphs: bool, ahead: bool) -> tuple[list, int]:
        decoder = FastPathsDecoder(target, [perturbed, copied], gamma=3, graphs=graphs)
        return serve_after_capture(decoder, prompts, sampling, ahead)

    graphed, captured = serve(True, True)
    free, _ = serve(False, False)
    assert captured == 0
    assert all(torch.equal(a, b) for a, b in zip(graphed, free))
