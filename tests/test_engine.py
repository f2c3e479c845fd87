"""Engine, drafters, loader and stats: behaviour and clear errors (the distribution tests live in
test_engine_exact.py)."""
from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import flashspec as fs
from flashspec import models
from flashspec.drafters import DraftContext, PromptLookupDrafter, Proposal, lookup_ngram
from flashspec.engine import SpeculativeDecoder
from flashspec.stats import GenerationStats, StepRecord, percentile

VOCAB = 16


@pytest.fixture(scope="module")
def target():
    return models.tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=2, initializer_range=0.3, seed=1, max_positions=64)


@pytest.fixture(scope="module")
def draft():
    return models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2, max_positions=64)


def greedy_reference(target, prompts, max_new_tokens, **kwargs):
    """HF greedy generate (explicit mask: HF would otherwise treat pad-id tokens in a prompt as padding)."""
    return target.generate(
        prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=max_new_tokens, do_sample=False,
        pad_token_id=2, **kwargs,
    )


# ----------------------------------------------------------------------------------------- greedy paths


def test_draft_equal_to_target_accepts_everything_and_matches_greedy(target):
    """A draft identical to the target: every step accepts γ and emits the bonus; caches stay right."""
    twin = copy.deepcopy(target)
    decoder = SpeculativeDecoder(target, [twin], policy="fixed", gamma=3)
    prompt = torch.tensor([[5, 6, 7, 8]])
    result = decoder.generate(prompt, max_new_tokens=16, sampling=fs.SamplingParams(0.0), ignore_eos=True)
    assert torch.equal(result.sequences, greedy_reference(target, prompt, 16, eos_token_id=None))
    assert all(step.num_accepted == [step.gamma] for step in result.stats.steps)
    assert result.stats.summary()["mean_acceptance"] == 1.0


def test_one_call_generate_defaults_to_prompt_lookup(target):
    prompt = torch.tensor([[3, 3, 4, 3, 3]])
    result = fs.generate(target, prompt, max_new_tokens=10, sampling=fs.SamplingParams(0.0), ignore_eos=True)
    assert torch.equal(result.sequences, greedy_reference(target, prompt, 10, eos_token_id=None))
    assert result.stats.arm_names == ["prompt-lookup"]


def test_sampling_with_identical_draft_accepts_all(target):
    """p == q: the accept test log u <= 0 always passes (a uniform is never 0)."""
    twin = copy.deepcopy(target)
    decoder = SpeculativeDecoder(target, [twin], policy="fixed", gamma=4)
    result = decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=15, sampling=fs.SamplingParams(1.0), ignore_eos=True)
    assert result.stats.summary()["mean_acceptance"] == 1.0
    assert result.sequences.shape == (1, 18)


def test_greedy_with_eos_stops_rows_and_pads(target, draft):
    """Per-row EOS: each row ends at its first EOS, then pad; the same as HF greedy generate."""
    prompts = torch.tensor([[3, 4, 5], [9, 9, 1], [7, 0, 12]])
    eos = 4
    decoder = SpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="ucb1", gamma=3)
    result = decoder.generate(prompts, max_new_tokens=20, sampling=fs.SamplingParams(0.0), eos_token_id=eos, pad_token_id=0)
    expected = target.generate(
        prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=20, do_sample=False, eos_token_id=eos, pad_token_id=0
    )
    assert torch.equal(result.sequences, expected)
    for row in range(3):
        generated = result.sequences[row, 3:]
        count = int(result.num_generated[row])
        assert torch.all(generated[count:] == 0)
        if count < 20:
            assert int(generated[count - 1]) == eos


def test_per_row_budgets(target, draft):
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    decoder = SpeculativeDecoder(target, [draft], policy="thompson", gamma=4)
    result = decoder.generate(prompts, max_new_tokens=[3, 9], sampling=fs.SamplingParams(0.0), ignore_eos=True, pad_token_id=0)
    assert result.num_generated.tolist() == [3, 9]
    assert result.sequences.shape == (2, 12)
    assert torch.all(result.sequences[0, 6:] == 0)
    full = greedy_reference(target, prompts, 9, eos_token_id=None)
    assert torch.equal(result.sequences[1], full[1])
    assert torch.equal(result.sequences[0, :6], full[0, :6])


def test_zero_new_tokens_returns_the_prompt(target, draft):
    prompt = torch.tensor([[1, 2, 3]])
    result = SpeculativeDecoder(target, [draft]).generate(prompt, max_new_tokens=0)
    assert torch.equal(result.sequences, prompt)
    assert result.stats.steps == []


def test_same_seed_same_output_and_seeds_differ(target, draft):
    decoder = SpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="fixed", gamma=3)
    prompt = torch.tensor([[1, 2, 3]] * 4)
    kwargs = dict(max_new_tokens=12, sampling=fs.SamplingParams(1.0), ignore_eos=True)
    first = decoder.generate(prompt, seed=7, **kwargs).sequences
    again = decoder.generate(prompt, seed=7, **kwargs).sequences
    other = decoder.generate(prompt, seed=8, **kwargs).sequences
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert not all(torch.equal(first[0], first[row]) for row in range(1, 4)), "rows must use independent noise"


def test_on_step_events_rebuild_the_output(target, draft):
    events = []
    decoder = SpeculativeDecoder(target, [draft], policy="fixed", gamma=3)
    result = decoder.generate(
        torch.tensor([[2, 3]]), max_new_tokens=10, sampling=fs.SamplingParams(0.9), ignore_eos=True, on_step=events.append
    )
    streamed = [token for event in events for token in event.new_tokens[0]]
    assert streamed == result.sequences[0, 2:].tolist()
    assert events[-1].num_generated == [10]


# ----------------------------------------------------------------------------------------- drafters


def test_lookup_ngram_finds_most_recent_earlier_occurrence():
    tokens = torch.tensor([[1, 2, 3, 9, 1, 2, 4, 1, 2]])
    valid = torch.ones_like(tokens, dtype=torch.bool)
    assert lookup_ngram(tokens, valid, 2).tolist() == [6]  # "1 2" last seen at 4..5, then 4
    assert lookup_ngram(tokens, valid, 3).tolist() == [-1]


def test_prompt_lookup_proposal_is_periodic_and_falls_back_to_last_token():
    drafter = PromptLookupDrafter(max_ngram=2)
    tokens = torch.tensor([[5, 6, 7, 5, 6], [1, 2, 3, 4, 8]])
    context = DraftContext(
        tokens=tokens, valid=torch.ones_like(tokens, dtype=torch.bool), position_ids=torch.arange(5).expand(2, -1),
        lengths=[5, 5], next_position=torch.tensor([5, 5]), gamma=4, sampling=fs.SamplingParams(), key=fs.rng.Key(1, 2),
    )
    proposal = drafter.propose(context)
    assert proposal.logits is None
    assert proposal.tokens.tolist() == [[7, 5, 6, 7], [8, 8, 8, 8]]


def test_prompt_lookup_on_right_aligned_rows_of_different_lengths():
    """Row 1 is two tokens shorter: its first two columns are outside the row and never match."""
    drafter = PromptLookupDrafter(max_ngram=1)
    tokens = torch.tensor([[4, 4, 9, 4], [9, 9, 2, 9]])
    valid = torch.tensor([[True, True, True, True], [False, False, True, True]])
    context = DraftContext(
        tokens=tokens, valid=valid, position_ids=torch.tensor([[0, 1, 2, 3], [0, 0, 0, 1]]), lengths=[4, 2],
        next_position=torch.tensor([4, 2]), gamma=2, sampling=fs.SamplingParams(), key=fs.rng.Key(1, 2),
    )
    assert drafter.propose(context).tokens.tolist() == [[9, 4], [9, 9]]


def test_prompt_lookup_ignores_padding():
    tokens = torch.tensor([[0, 0, 3, 0]])
    valid = torch.tensor([[False, False, True, True]])
    assert lookup_ngram(tokens, valid, 1).tolist() == [-1]


class ConstantDrafter:
    """A user drafter through the protocol: always proposes the same token (deterministic q)."""

    name = "constant"

    def __init__(self, token: int) -> None:
        self.token = token
        self.rollbacks: list[int] = []

    def reset(self, batch_size: int) -> None:
        self.rollbacks.clear()

    def propose(self, context: DraftContext) -> Proposal:
        shape = (context.tokens.shape[0], context.gamma)
        return Proposal(tokens=torch.full(shape, self.token, dtype=torch.long), logits=None)

    def rollback(self, num_valid: list[int]) -> None:
        self.rollbacks.append(list(num_valid))


def test_user_drafter_protocol(target):
    drafter = ConstantDrafter(3)
    assert isinstance(drafter, fs.drafters.Drafter)
    decoder = SpeculativeDecoder(target, [drafter], policy="fixed", gamma=2)
    prompt = torch.tensor([[1, 2]])
    result = decoder.generate(prompt, max_new_tokens=8, sampling=fs.SamplingParams(0.0), ignore_eos=True)
    assert torch.equal(result.sequences, greedy_reference(target, prompt, 8, eos_token_id=None))
    assert drafter.rollbacks and drafter.rollbacks[0][0] >= 2


def test_model_drafter_catches_up_lazily(target, draft):
    """Two model arms alternated by a policy object: each catches up on tokens it has not seen."""

    class Alternate:
        def __init__(self):
            self.calls = 0
            self.rewards = []

        def select(self, context=None):
            self.calls += 1
            return self.calls % 2

        def update(self, arm, reward):
            self.rewards.append(reward)

        def reset(self):
            self.calls = 0

    policy = Alternate()
    twin = copy.deepcopy(target)
    decoder = SpeculativeDecoder(target, [draft, twin], policy=policy, gamma=3)
    prompt = torch.tensor([[4, 5, 6]])
    result = decoder.generate(prompt, max_new_tokens=20, sampling=fs.SamplingParams(0.0), ignore_eos=True)
    assert torch.equal(result.sequences, greedy_reference(target, prompt, 20, eos_token_id=None))
    assert set(result.stats.arm_trace) == {0, 1}
    assert all(0.0 <= reward <= 1.0 for reward in policy.rewards)
    for drafter in decoder.drafts:
        assert all(seen <= result.sequences.shape[1] - 1 for seen in drafter.cached_tokens)


def test_crop_cache_removes_only_the_tail(target):
    cache = models.new_cache(target)
    models.forward_logits(target, torch.tensor([[1, 2, 3, 4, 5]]), cache)
    models.crop_cache(cache, 5)
    assert models.cache_length(cache) == 5
    models.crop_cache(cache, 3)
    assert models.cache_length(cache) == 3
    cropped = models.forward_logits(target, torch.tensor([[4, 5]]), cache)
    fresh = target(torch.tensor([[1, 2, 3, 4, 5]])).logits[:, -2:]
    assert torch.allclose(cropped, fresh, atol=1e-5)


def test_cache_keyword_follows_the_forward_signature(target):
    assert models.cache_keyword(target) in ("cache", "past_key_values")

    class OldStyle(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, **kwargs):
            return input_ids

    assert models.cache_keyword(OldStyle()) == "past_key_values"


# ----------------------------------------------------------------------------------------- errors


def test_bad_inputs_raise_clear_errors(target, draft):
    decoder = SpeculativeDecoder(target, [draft])
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="empty prompt"):
        decoder.generate(torch.zeros((1, 0), dtype=torch.long))
    with pytest.raises(ValueError, match="row 1 is empty"):
        decoder.generate(torch.tensor([[1, 2], [3, 4]]), attention_mask=torch.tensor([[1, 1], [0, 0]]))
    with pytest.raises(ValueError, match="max_new_tokens"):
        decoder.generate(prompt, max_new_tokens=-1)
    with pytest.raises(ValueError, match="exceeds the target's 64 positions"):
        decoder.generate(torch.ones((1, 65), dtype=torch.long))
    with pytest.raises(ValueError, match="lower max_new_tokens"):
        decoder.generate(prompt, max_new_tokens=62)
    with pytest.raises(ValueError, match="right padding"):
        decoder.generate(torch.tensor([[1, 2, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        decoder.generate(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="gamma"):
        SpeculativeDecoder(target, [draft], gamma=0)
    with pytest.raises(ValueError, match="unknown or invalid policy"):
        SpeculativeDecoder(target, [draft], policy="no-such-policy")
    with pytest.raises(ValueError, match="simulation only"):
        SpeculativeDecoder(target, [draft], policy="oracle")
    with pytest.raises(ValueError, match="non-empty list"):
        SpeculativeDecoder(target, [])
    with pytest.raises(ValueError, match="Drafter"):
        SpeculativeDecoder(target, [object()])


def test_vocabulary_mismatch_is_rejected(target):
    other = models.tiny_llama(vocab_size=VOCAB + 1, hidden_size=8, seed=3)
    with pytest.raises(ValueError, match="vocabulary of 17 tokens but the target has 16"):
        SpeculativeDecoder(target, [other])


def test_special_token_mismatch_is_rejected(target):
    other = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, seed=3, eos_token_id=5)
    with pytest.raises(ValueError, match="eos_token_id"):
        SpeculativeDecoder(target, [other])


def test_tokenizer_mismatch_is_rejected(target):
    tokenizer = models.char_tokenizer()
    different = copy.deepcopy(tokenizer)
    different.add_tokens(["<extra>"])
    models.check_compatible(target, target, tokenizer, tokenizer)
    with pytest.raises(ValueError, match="tokenizer vocabulary differs"):
        models.check_compatible(target, target, tokenizer, different)


# ----------------------------------------------------------------------------------------- loading


def test_load_model_round_trip(tmp_path, draft):
    draft.save_pretrained(tmp_path / "draft")
    loaded = models.load_model(str(tmp_path / "draft"), dtype="fp32", device="cpu")
    prompt = torch.tensor([[1, 2, 3]])
    assert torch.allclose(loaded(prompt).logits, draft(prompt).logits)
    assert not loaded.training


def test_load_model_errors(tmp_path):
    with pytest.raises(ValueError, match="quantization"):
        models.load_model("x", quantization="int3")
    with pytest.raises(ValueError, match="dtype"):
        models.load_model("x", dtype="float8")
    with pytest.raises(ValueError, match="could not load"):
        models.load_model(str(tmp_path / "missing"))
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="bitsandbytes"):
            models.load_model(str(tmp_path), quantization="nf4")


def test_nf4_compute_dtype_is_half_precision():
    assert models.nf4_compute_dtype() in (torch.bfloat16, torch.float16)


# ----------------------------------------------------------------------------------------- stats


def test_stats_summary_json_and_table(tmp_path, target, draft):
    decoder = SpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="thompson", gamma=3, policy_kwargs={"seed": 1})
    result = decoder.generate(torch.tensor([[1, 2, 3]] * 3), max_new_tokens=10, sampling=fs.SamplingParams(1.0), ignore_eos=True)
    stats = result.stats
    summary = stats.summary()
    assert summary["generated_tokens"] == 30
    assert summary["steps"] == len(stats.steps) == len(stats.arm_trace)
    assert 0.0 <= summary["mean_acceptance"] <= 1.0
    assert summary["p50_step_latency_s"] <= summary["p99_step_latency_s"]
    assert 0.0 < summary["kept_fraction"] <= 1.0
    assert 0.0 < summary["kv_cache_fill"] <= 1.0
    assert sum(arm["selections"] for arm in summary["per_arm"].values()) == summary["steps"]
    path = tmp_path / "stats.json"
    text = stats.to_json(str(path))
    loaded = json.loads(path.read_text())
    assert loaded == json.loads(text)
    assert loaded["arm_trace"] == stats.arm_trace
    table = stats.format_table()
    assert "tokens/s" in table and "prompt-lookup" in table


def test_stats_reduction_by_hand():
    stats = GenerationStats(arm_names=["a", "b"], batch_size=2, prompt_length=3)
    stats.record(StepRecord(step=0, arm=0, gamma=4, num_accepted=[4, 2], kept=[5, 2], latency_s=0.01))
    stats.record(StepRecord(step=1, arm=1, gamma=4, num_accepted=[0, 1], kept=[1, 1], latency_s=0.03))
    stats.generated_tokens, stats.total_s = 9, 0.04
    stats.cache_columns, stats.cache_tokens = 20, 15.0
    summary = stats.summary()
    assert summary["mean_acceptance"] == pytest.approx(7 / 16)
    assert summary["mean_accepted_length"] == pytest.approx(7 / 4)
    assert summary["kept_fraction"] == pytest.approx(9 / 11)
    assert summary["mean_tokens_per_step"] == pytest.approx(9 / 4)
    assert summary["kv_cache_fill"] == pytest.approx(0.75)
    assert summary["tokens_per_s"] == pytest.approx(225.0)
    assert summary["per_arm"]["a"]["mean_acceptance"] == pytest.approx(6 / 8)
    assert percentile([1.0, 2.0, 3.0], 50) == 2.0
    assert math.isnan(percentile([], 50))
    empty = GenerationStats(arm_names=["a"], batch_size=1, prompt_length=1)
    assert "null" in empty.to_json()


def test_plot_generation_trace(tmp_path, target, draft):
    from flashspec.plots import plot_generation_trace

    decoder = SpeculativeDecoder(target, [draft, PromptLookupDrafter()], policy="exp3", gamma=3, policy_kwargs={"seed": 0})
    result = decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=12, sampling=fs.SamplingParams(1.0), ignore_eos=True)
    path = tmp_path / "trace.png"
    figure = plot_generation_trace(result.stats, path)
    assert path.stat().st_size > 0
    arm_axis = figure.axes[0]
    assert [label.get_text() for label in arm_axis.get_yticklabels()] == result.stats.arm_names
    assert len(arm_axis.collections[0].get_offsets()) == len(result.stats.steps)


# ----------------------------------------------------------------------------------------- seeds and faults


@pytest.mark.parametrize("policy", ["thompson", "exp3", "discounted-thompson", "ucb1"])
def test_seed_fixes_the_policy_of_a_fresh_decoder(target, draft, policy):
    """Fresh decoders built the same way and given one seed make the same choices and tokens, for
    policies with their own randomness too (their generator restarts from the run's seed)."""
    twin = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=5,
                             max_positions=64)
    prompt = torch.tensor([[1, 2, 3, 1, 2]] * 2)
    kwargs = dict(max_new_tokens=16, sampling=fs.SamplingParams(1.0), ignore_eos=True, seed=7)
    runs = [SpeculativeDecoder(target, [draft, twin, PromptLookupDrafter()], policy=policy, gamma=2).generate(
        prompt, **kwargs) for _ in range(3)]
    arms = [[step.arm for step in run.stats.steps] for run in runs]
    assert all(torch.equal(runs[0].sequences, run.sequences) for run in runs[1:])
    assert arms[0] == arms[1] == arms[2]
    other = SpeculativeDecoder(target, [draft, twin, PromptLookupDrafter()], policy=policy, gamma=2).generate(
        prompt, **{**kwargs, "seed": 8})
    assert not torch.equal(runs[0].sequences, other.sequences)


def test_one_call_generate_takes_policy_kwargs_and_is_deterministic(target, draft):
    prompt = torch.tensor([[1, 2, 3]])
    kwargs = dict(drafts=[draft, PromptLookupDrafter()], policy="sliding-window-ucb", policy_kwargs={"window": 8},
                  max_new_tokens=12, sampling=fs.SamplingParams(1.0), ignore_eos=True, seed=3)
    first, second = fs.generate(target, prompt, **kwargs), fs.generate(target, prompt, **kwargs)
    assert torch.equal(first.sequences, second.sequences)


def test_nan_logits_raise_instead_of_emitting_garbage(target, draft):
    broken = copy.deepcopy(target)
    with torch.no_grad():
        broken.lm_head.weight[3, 0] = float("nan")
    prompt = torch.tensor([[1, 2, 3]])
    for sampling in (fs.SamplingParams(0.0), fs.SamplingParams(1.0)):
        with pytest.raises(FloatingPointError, match="non-finite logits"):
            SpeculativeDecoder(broken, [draft], policy="fixed").generate(prompt, max_new_tokens=8, sampling=sampling)
    broken_draft = copy.deepcopy(draft)
    with torch.no_grad():
        broken_draft.lm_head.weight[1, 0] = float("inf")
    with pytest.raises(FloatingPointError, match="draft"):
        SpeculativeDecoder(target, [broken_draft], policy="fixed").generate(prompt, max_new_tokens=8)


def test_minus_inf_logits_are_allowed_when_a_row_keeps_support(target, draft):
    """Models may mask tokens with -inf; only a position with no finite logit is an error."""
    from flashspec.engine import nonfinite_rows

    logits = torch.zeros(2, 3, 5)
    logits[0, :, 1] = float("-inf")
    assert nonfinite_rows(logits, None).tolist() == [0, 0]
    logits[1, 2, :] = float("-inf")
    assert nonfinite_rows(logits, None).tolist() == [0, 1]
    logits[0, 0, 4] = float("nan")
    assert nonfinite_rows(logits, logits[:, :2]).tolist() == [1, 1]


def test_absurd_gamma_is_rejected_before_allocating(target, draft):
    with pytest.raises(ValueError, match=r"gamma must be an int in \[1, 256\]"):
        SpeculativeDecoder(target, [draft], gamma=100_000_000)
    decoder = SpeculativeDecoder(target, [draft], policy="fixed", gamma=256)
    result = decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, ignore_eos=True)
    assert result.sequences.shape == (1, 8)


def test_target_mask_grows_when_rows_take_turns_at_long_accepts():
    """Columns grow by the largest kept count per step, which can exceed any one row's budget."""
    from flashspec.engine import RowState

    state = RowState.start(torch.tensor([[1, 2], [3, 4]]), torch.ones(2, 2, dtype=torch.bool), [4, 4], 3, 0)
    start = state.target_mask.shape[1]
    for _ in range(4):
        state.open_columns(4)
        state.columns += 4
    assert state.target_mask.shape[1] >= state.columns > start


def test_token_id_arguments_are_range_checked(target, draft):
    decoder = SpeculativeDecoder(target, [draft])
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"pad_token_id \[16\] lies outside"):
        decoder.generate(prompt, max_new_tokens=4, pad_token_id=VOCAB)
    with pytest.raises(ValueError, match=r"eos_token_id \[-1\] lies outside"):
        decoder.generate(prompt, max_new_tokens=4, eos_token_id=-1)
    with pytest.raises(ValueError, match=r"eos_token_id \[99\] lies outside"):
        decoder.generate(prompt, max_new_tokens=4, eos_token_id=[2, 99])


def test_draft_with_too_few_positions_is_rejected(target):
    short = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, seed=2, max_positions=16)
    with pytest.raises(ValueError, match=r"drafts\[0\].*holds 16 positions but this run can reach 23"):
        SpeculativeDecoder(target, [short]).generate(torch.tensor([[1, 2, 3]]), max_new_tokens=20)


@pytest.mark.parametrize("temperature", [1e-45, 1e-5, 10**400])
def test_absurd_temperatures_are_rejected(temperature):
    with pytest.raises(ValueError, match="temperature"):
        fs.SamplingParams(temperature=temperature)
