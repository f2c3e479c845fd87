"""The request front both engines share (`flashspec.front`): one key schedule (one seed, one text in either
engine), arguments checked once where they enter, unique arm names, and the fast path's non-finite check."""
from __future__ import annotations

import pytest
import torch

import flashspec as fs
from flashspec import front, models, rng
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder, make_decoder

PROMPT = torch.tensor([[1, 5, 6, 7, 5, 6]])


def tiny(seed: int = 0, **overrides) -> torch.nn.Module:
    return models.tiny_llama(vocab_size=64, hidden_size=32, num_heads=2, seed=seed, **overrides)


@pytest.fixture(scope="module")
def pool() -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    return tiny(0), tiny(1, num_layers=1), tiny(2, num_layers=1)


def both(target, drafts, **options) -> list:
    """The eager and the fast engine (no graphs on a CPU) over the same pool."""
    return [fs.SpeculativeDecoder(target, drafts, **options), FastSpeculativeDecoder(target, drafts, **options)]


# ------------------------------------------------------------------------------ one seed, one text
@pytest.mark.parametrize("temperature", [0.0, 1.0, 0.7])
@pytest.mark.parametrize("kind", ["model", "lookup"])
def test_one_seed_gives_one_text_in_either_engine(pool, temperature, kind):
    target, near, _ = pool
    drafts = [near] if kind == "model" else [fs.PromptLookupDrafter()]
    sampling = fs.SamplingParams(temperature=temperature, top_k=8 if temperature == 0.7 else 0)
    prompts = torch.tensor([[0, 1, 5, 6, 7, 5], [9, 4, 4, 2, 9, 4]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    outputs = [decoder.generate(prompts, attention_mask=mask, max_new_tokens=[17, 11], sampling=sampling, seed=3,
                                ignore_eos=True) for decoder in both(target, drafts, gamma=3)]
    assert torch.equal(outputs[0].sequences, outputs[1].sequences)
    assert outputs[0].num_generated.tolist() == outputs[1].num_generated.tolist() == [17, 11]
    accepted = [[step.num_accepted for step in out.stats.steps] for out in outputs]
    assert accepted[0] == accepted[1]  # the same verdicts step by step, not only the same text


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_block_verification_gives_one_text_in_either_engine(pool, temperature):
    """verify_method="block" on both engines: the same seed, the same tokens and verdicts step by step; greedy, the
    text of token verification; a method it does not know is refused by name."""
    target, near, _ = pool
    sampling = fs.SamplingParams(temperature=temperature)
    outputs = [decoder.generate(PROMPT, max_new_tokens=60, sampling=sampling, seed=5, ignore_eos=True)
               for decoder in both(target, [near], gamma=4, verify_method="block")]
    assert torch.equal(outputs[0].sequences, outputs[1].sequences)
    assert [s.num_accepted for s in outputs[0].stats.steps] == [s.num_accepted for s in outputs[1].stats.steps]
    token = fs.SpeculativeDecoder(target, [near], gamma=4).generate(PROMPT, max_new_tokens=60, sampling=sampling,
                                                                    seed=5, ignore_eos=True)
    if temperature == 0:  # greedy: the two methods are one
        assert torch.equal(token.sequences, outputs[0].sequences)
    with pytest.raises(ValueError, match="verify_method must be one of"):
        fs.SpeculativeDecoder(target, [near], verify_method="tree")


def test_one_seed_gives_one_text_with_a_fixed_policy_over_several_drafts(pool):
    target, near, far = pool
    drafts = [near, far, fs.PromptLookupDrafter()]
    sampling = fs.SamplingParams(temperature=1.0)
    outputs = [decoder.generate(PROMPT, max_new_tokens=20, sampling=sampling, seed=11, ignore_eos=True)
               for decoder in both(target, drafts, policy="fixed", policy_kwargs={"arm": 1}, gamma=4)]
    assert torch.equal(outputs[0].sequences, outputs[1].sequences)
    other = fs.SpeculativeDecoder(target, drafts, policy="fixed", policy_kwargs={"arm": 1}, gamma=4).generate(
        PROMPT, max_new_tokens=20, sampling=sampling, seed=12, ignore_eos=True)
    assert not torch.equal(outputs[0].sequences, other.sequences)  # the seed matters


def test_the_draft_stream_is_the_drafts_own():
    """Drafts sample under the step's key on streams of their own, apart from the verifier's and each other's."""
    streams = {rng.draft_stream(index) for index in range(8)}
    assert len(streams) == 8 and not streams & {rng.STREAM_ACCEPT, rng.STREAM_SAMPLE}


# ------------------------------------------------------------------------------ non-finite logits
def nan_norm(model: torch.nn.Module) -> torch.nn.Module:
    model.model.norm.weight.data.fill_(float("nan"))
    return model


@pytest.mark.parametrize("case", ["plain", "lookup", "nan_draft", "inf_logit", "eager"])
def test_non_finite_logits_raise_on_either_engine(case):
    target = nan_norm(tiny()) if case in ("plain", "lookup", "eager") else tiny()
    if case == "plain":
        decoder = FastPlainDecoder(target)
    elif case == "lookup":
        decoder = FastSpeculativeDecoder(target, [fs.PromptLookupDrafter()])
    elif case == "nan_draft":
        decoder = FastSpeculativeDecoder(target, [nan_norm(tiny(1))])
    elif case == "inf_logit":
        target.lm_head.weight.data[7] = 0.0
        target.lm_head.bias = torch.nn.Parameter(torch.zeros(64))
        target.lm_head.bias.data[7] = float("inf")
        decoder = FastSpeculativeDecoder(target, [fs.PromptLookupDrafter()])
    else:
        decoder = fs.SpeculativeDecoder(target, [fs.PromptLookupDrafter()])
    with pytest.raises(FloatingPointError, match=r"non-finite logits .* at step 0, rows \[0\]"):
        decoder.generate(PROMPT, max_new_tokens=6, ignore_eos=True)


# ------------------------------------------------------------------------------ arguments, once
def test_seeds_past_64_bits_are_refused_not_wrapped(pool):
    target, _, _ = pool
    for decoder in both(target, [fs.PromptLookupDrafter()]):
        for seed in (2**64, -1, 1.5, True):
            with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*64\)"):
                decoder.generate(PROMPT, max_new_tokens=2, seed=seed)
        decoder.generate(PROMPT, max_new_tokens=2, seed=2**64 - 1)
    with pytest.raises(ValueError, match="generator must be an int"):
        fs.verify(torch.randn(1, 2, 5), None, torch.tensor([[1]]), generator=2**64)


def test_masked_prompt_positions_may_hold_any_id(pool):
    """A collator's -100 under a zero mask is never attended: both engines run and return the prompt as given."""
    target, _, _ = pool
    prompts = torch.tensor([[-100, 1, 5], [1, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    outputs = [decoder.generate(prompts, attention_mask=mask, max_new_tokens=torch.tensor(4), seed=1)
               for decoder in both(target, [fs.PromptLookupDrafter()])]
    assert torch.equal(outputs[0].sequences, outputs[1].sequences)
    assert torch.equal(outputs[0].sequences[:, :3], prompts)


def test_arm_names_are_unique_so_statistics_are_per_arm(pool):
    target, _, _ = pool
    drafts = [fs.PromptLookupDrafter(), fs.PromptLookupDrafter(max_ngram=5)]
    for decoder in both(target, drafts, policy="ucb1"):
        assert decoder.arm_names == ["prompt-lookup", "prompt-lookup#2"]
        out = decoder.generate(PROMPT, max_new_tokens=30, seed=0, ignore_eos=True)
        per_arm = out.stats.summary()["per_arm"]
        assert sorted(per_arm) == ["prompt-lookup", "prompt-lookup#2"]
        assert sum(arm["selections"] for arm in per_arm.values()) == len(out.stats.steps)


def test_constructor_arguments_fail_where_they_enter(pool):
    target, near, _ = pool
    for cls in (fs.SpeculativeDecoder, FastSpeculativeDecoder):
        with pytest.raises(ValueError, match="backend must be one of"):
            cls(target, [near], backend="cuda")
        with pytest.raises(ValueError, match=r"policy_kwargs \['junk'\] are not options of policy 'thompson'.*"
                                             r"it takes: batch_size, prior_alpha"):
            cls(target, [near], policy_kwargs={"junk": 1})
        with pytest.raises(ValueError, match="gamma must be an int"):
            cls(target, [near], gamma=2.0)
    for bad in (2.5, "3", None, True):
        with pytest.raises(ValueError, match="max_ngram must be an int"):
            fs.PromptLookupDrafter(max_ngram=bad)


def test_a_prompt_too_long_says_shorten_it_on_either_engine():
    target = tiny(max_positions=32)
    for decoder in both(target, [fs.PromptLookupDrafter()]):
        with pytest.raises(ValueError, match="the prompt is 40 tokens but the target holds only 32 positions; "
                                             "shorten the prompt"):
            decoder.generate(torch.ones((1, 40), dtype=torch.long), max_new_tokens=4)


def test_make_decoder_is_the_one_engine_choice(pool):
    target, near, _ = pool

    class Custom:
        name = "custom"

        def reset(self, batch_size): ...

        def propose(self, context): ...

        def rollback(self, num_valid): ...

    assert type(make_decoder(target, [Custom()], fast="auto", tp=None)).__name__ == "SpeculativeDecoder"
    assert isinstance(make_decoder(target, [near], engine="fast"), FastSpeculativeDecoder)
    assert type(make_decoder(target, [near], engine="eager")).__name__ == "SpeculativeDecoder"
    with pytest.raises(ValueError, match="engine must be one of"):
        make_decoder(target, [near], engine="turbo")
    with pytest.raises(ValueError, match="lag apply to the fast path only"):
        make_decoder(target, [near], engine="eager", lag=3)


def test_check_gamma_is_the_one_range():
    assert front.check_gamma(front.MAX_GAMMA) == front.MAX_GAMMA
    for bad in (0, front.MAX_GAMMA + 1, 2.0, True):
        with pytest.raises(ValueError, match="gamma must be an int in"):
            front.check_gamma(bad)


# ------------------------------------------------------------------------------ on a GPU: graphs and Triton
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: graphs exist only there")


class Cycle:
    """A policy that plays `arms` in turn and learns nothing."""

    def __init__(self, arms: list[int]) -> None:
        self.arms, self.t = arms, -1

    def select(self) -> int:
        self.t += 1
        return self.arms[self.t % len(self.arms)]

    def update(self, arm: int, reward: float) -> None:
        return None


@needs_cuda
@pytest.mark.parametrize("plain", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_one_seed_gives_one_text_on_the_gpu_with_graphs(temperature, plain):
    """fp32 on CUDA: the eager engine (HF forwards, Triton verify) and the fast one (CUDA graphs, Triton verify)
    agree token for token for one draft and one seed, and so they do when the draft's steps alternate with the
    plain arm's (`gammas=[0, 3]`: a graph of its own, one token sampled from the target)."""
    target, near = tiny(0).cuda(), tiny(1, num_layers=1).cuda()
    sampling = fs.SamplingParams(temperature=temperature)
    prompts = PROMPT.expand(2, -1).cuda()
    options = (lambda: dict(gammas=[0, 3], policy=Cycle([1, 0, 1, 1, 0]))) if plain else (lambda: dict(gamma=3))
    eager = fs.SpeculativeDecoder(target, [near], **options())
    fast = FastSpeculativeDecoder(target, [near], graphs=True, **options())
    outputs = [decoder.generate(prompts, max_new_tokens=24, sampling=sampling, seed=9, ignore_eos=True)
               for decoder in (eager, fast)]
    assert fast.graphs_captured > 0
    assert torch.equal(outputs[0].sequences.cpu(), outputs[1].sequences.cpu())
    if plain:
        assert any(key[:2] == ("step", 1) for key in fast._session.graphs)
        assert [s.arm for s in outputs[0].stats.steps] == [s.arm for s in outputs[1].stats.steps]


@needs_cuda
@pytest.mark.parametrize("plain", [True, False])
def test_non_finite_logits_raise_from_captured_graphs(plain):
    target = nan_norm(tiny()).cuda()
    decoder = (FastPlainDecoder(target, graphs=True) if plain
               else FastSpeculativeDecoder(target, [fs.PromptLookupDrafter()], graphs=True))
    with pytest.raises(FloatingPointError, match=r"non-finite logits .* at step 0, rows \[0, 1\]"):
        decoder.generate(PROMPT.expand(2, -1).cuda(), max_new_tokens=8, ignore_eos=True)
    assert decoder.graphs_captured > 0
