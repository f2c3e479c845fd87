"""The engine: greedy and sampled paths, the drafter protocol through it, seeds, faults and clear errors
(the distribution tests live in test_engine_exact.py; the models are conftest.py's tiny Llamas)."""
from __future__ import annotations

import copy

import pytest
import torch

import flashspec as fs
from flashspec import models
from flashspec.drafters import DraftContext, PromptLookupDrafter, Proposal
from flashspec.engine import SpeculativeDecoder

VOCAB = 16  # the vocabulary of conftest.py's target and draft


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


# ----------------------------------------------------------------------------------------- drafters in the engine


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


def test_model_drafter_hands_the_verifier_its_log_probs(target, draft, monkeypatch):
    """A model drafter keeps the warped log-probs it sampled from, and the engine verifies with them
    (`draft_is_log_probs`): the same tokens as verifying with its logits, every step."""
    from flashspec import engine as engine_module

    calls = []
    real = engine_module.verify_with_key

    def spy(target_logits, draft_logits, draft_tokens, params, key, **kwargs):
        out = real(target_logits, draft_logits, draft_tokens, params, key, **kwargs)
        if kwargs.get("draft_is_log_probs"):  # the same step from the logits the log-probs were warped from
            logits = spy.proposal_logits
            again = real(target_logits, logits, draft_tokens, params, key, **{**kwargs, "draft_is_log_probs": False})
            calls.append(torch.equal(out.tokens, again.tokens) and torch.equal(out.num_accepted, again.num_accepted))
        return out

    propose = fs.drafters.ModelDrafter.propose

    def keep_logits(self, context):
        proposal = propose(self, context)
        assert proposal.log_probs is not None and proposal.log_probs.shape == proposal.logits.shape
        spy.proposal_logits = proposal.logits
        return proposal

    monkeypatch.setattr(engine_module, "verify_with_key", spy)
    monkeypatch.setattr(fs.drafters.ModelDrafter, "propose", keep_logits)
    decoder = SpeculativeDecoder(target, [draft], policy="fixed", gamma=3)
    decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=12, sampling=fs.SamplingParams(0.8, top_k=5),
                     seed=3, ignore_eos=True)
    assert calls and all(calls)


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
    with pytest.raises(ValueError, match="the target holds only 64 positions; shorten the prompt"):
        decoder.generate(torch.ones((1, 65), dtype=torch.long))
    with pytest.raises(ValueError, match="lower max_new_tokens"):
        decoder.generate(prompt, max_new_tokens=62)
    with pytest.raises(ValueError, match="right padding"):
        decoder.generate(torch.tensor([[1, 2, 0]]), attention_mask=torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        decoder.generate(torch.tensor([[1, 99]]))
    with pytest.raises(ValueError, match="gamma"):
        SpeculativeDecoder(target, [draft], gamma=0)
    with pytest.raises(ValueError, match="unknown policy"):
        SpeculativeDecoder(target, [draft], policy="no-such-policy")
    with pytest.raises(ValueError, match="simulation only"):
        SpeculativeDecoder(target, [draft], policy="oracle")
    with pytest.raises(ValueError, match="non-empty list"):
        SpeculativeDecoder(target, [])
    with pytest.raises(ValueError, match="Drafter"):
        SpeculativeDecoder(target, [object()])


def test_vocabulary_mismatch_is_rejected_without_a_common_tokenizer(target):
    other = models.tiny_llama(vocab_size=VOCAB + 1, hidden_size=8, seed=3)
    other.config.bos_token_id = other.generation_config.bos_token_id = None
    with pytest.raises(ValueError, match="embedding has 17 rows but the target's 16"):
        SpeculativeDecoder(target, [other])


@pytest.mark.parametrize("rows", [VOCAB + 16, VOCAB - 4])
def test_a_padded_draft_embedding_proposes_only_the_targets_ids(target, rows):
    """A draft of the target's tokenizer whose embedding has other rows (Qwen2.5-0.5B drafting for 7B): its
    logits are cut or padded with -inf to the target's vocabulary, both engines, and the output is valid."""
    from flashspec.fast import FastSpeculativeDecoder

    other = models.tiny_llama(vocab_size=rows, hidden_size=8, seed=3, initializer_range=0.3)
    sampling = fs.SamplingParams(temperature=1.0)
    prompt = torch.tensor([[1, 2, 3, 1, 2]])
    results = [decoder(target, [other], gamma=3).generate(prompt, max_new_tokens=12, sampling=sampling, seed=4,
                                                           ignore_eos=True)
               for decoder in (SpeculativeDecoder, FastSpeculativeDecoder)]
    for result in results:
        assert int(result.sequences.max()) < VOCAB and result.num_generated.tolist() == [12]
    assert torch.equal(results[0].sequences, results[1].sequences)  # one seed, one text


def test_special_token_mismatch_is_rejected(target):
    other = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, seed=3, eos_token_id=5)
    with pytest.raises(ValueError, match="eos_token_id"):
        SpeculativeDecoder(target, [other])


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
    from flashspec.checks import nonfinite_rows

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
    with pytest.raises(ValueError, match=r"exceeds the drafts\[0\]'s 16 positions; lower max_new_tokens to at most 13"):
        SpeculativeDecoder(target, [short]).generate(torch.tensor([[1, 2, 3]]), max_new_tokens=20)


@pytest.mark.parametrize("temperature", [1e-45, 1e-5, 10**400])
def test_absurd_temperatures_are_rejected(temperature):
    with pytest.raises(ValueError, match="temperature"):
        fs.SamplingParams(temperature=temperature)
