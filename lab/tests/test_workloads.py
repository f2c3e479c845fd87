"""flashspec_lab.workloads: the chat prompt set every real-model measurement serves.

Rendering goes through an offline byte-level tokenizer carrying SmolLM2-135M-Instruct's ChatML template and its
special tokens (the library's `models.char_tokenizer` is ASCII-only and the documentation passages are not), so
the rendered ids decode back to the exact template text.
"""
from __future__ import annotations

import json
from collections import Counter

import pydoc_data.topics
import pytest
import torch

from flashspec import models
from flashspec_lab import workloads as w

SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2, as in SmolLM2
ASSISTANT_HEADER = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def chatml_tokenizer():
    """A lossless byte-level tokenizer (one token per byte, no merges) with ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as token_models
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate([*SPECIALS, *alphabet])}
    backend = Tokenizer(token_models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<|endoftext|>",
                                        bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>",
                                        additional_special_tokens=list(SPECIALS))
    tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    return tokenizer


def ids_of(served: list[w.Prompt]) -> list[str]:
    return [prompt.id for prompt in served]


def key_of(prompt: w.Prompt) -> str:
    assert prompt.source is not None and prompt.source.startswith(w.SOURCE_PREFIX)
    return prompt.source[len(w.SOURCE_PREFIX):]


# ----------------------------------------------------------------------------------------------- the set


def test_six_categories_of_at_least_twenty_prompts_with_unique_ids():
    everything = w.prompts()
    counts = Counter(prompt.category for prompt in everything)
    assert tuple(counts) == w.CATEGORIES and len(w.CATEGORIES) >= 6
    assert min(counts.values()) >= 20
    assert len(set(ids_of(everything))) == len(everything)
    assert ids_of(everything) == ids_of(w.prompts())  # deterministic
    assert [p.category for p in w.prompts(["math", "coding"])] == ["math"] * counts["math"] + ["coding"] * counts[
        "coding"]


def test_conversations_alternate_roles_and_end_with_a_user_turn():
    for prompt in w.prompts(["conversation"]):
        roles = [message["role"] for message in prompt.messages]
        assert len(roles) >= 3 and roles[-1] == "user", prompt.id
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"], prompt.id
    for prompt in w.prompts([c for c in w.CATEGORIES if c != "conversation"]):
        assert [message["role"] for message in prompt.messages] == ["user"], prompt.id


def test_every_message_is_real_text_with_no_placeholder_left():
    for prompt in w.prompts():
        for message in prompt.messages:
            assert set(message) == {"role", "content"} and len(message["content"].strip()) >= 20, prompt.id
            assert w.PLACEHOLDER not in message["content"], prompt.id


def test_passages_come_from_the_recorded_pydoc_topic():
    for prompt in w.prompts(list(w.PASSAGE_LIMITS)):
        key = key_of(prompt)
        topic = pydoc_data.topics.topics[key]
        text = w.passage(key, w.PASSAGE_LIMITS[prompt.category])
        assert w.MIN_PASSAGE_CHARS <= len(text) <= w.PASSAGE_LIMITS[prompt.category], prompt.id
        assert text in topic and text in prompt.messages[-1]["content"], prompt.id
        rest = topic.split(text, 1)[1]
        assert rest.startswith("\n\n") or not rest.strip(), prompt.id  # cut at a paragraph boundary
    for prompt in w.prompts(["conversation", "coding", "math"]):
        assert prompt.source is None
    for category in w.PASSAGE_LIMITS:  # one passage per topic inside a category
        keys = [key_of(prompt) for prompt in w.prompts([category])]
        assert len(set(keys)) == len(keys)


def test_a_missing_topic_key_is_an_error_naming_it(monkeypatch):
    key = key_of(w.prompts(["qa"])[0])
    monkeypatch.delitem(pydoc_data.topics.topics, key)
    with pytest.raises(ValueError, match=f"no topic '{key}'"):
        w.prompts(["qa"])
    assert len(w.prompts(["math"])) >= 20  # categories without passages do not need the topics


def test_a_topic_too_short_for_a_passage_is_an_error(monkeypatch):
    monkeypatch.setitem(pydoc_data.topics.topics, "assert", "Title\n*****\n\nOne short sentence.")
    with pytest.raises(ValueError, match=r"'assert' gives a passage of 19 characters"):
        w.passage("assert")


# ----------------------------------------------------------------------------------------------- rendering


def test_every_prompt_renders_through_chatml_ending_with_the_assistant_header(chatml_tokenizer):
    start = chatml_tokenizer.convert_tokens_to_ids("<|im_start|>")
    for prompt in w.prompts():
        ids = w.render(chatml_tokenizer, prompt)
        assert ids.dtype == torch.long and ids.dim() == 2 and ids.shape[0] == 1, prompt.id
        text = chatml_tokenizer.decode(ids[0])
        assert text == chatml_tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True,
                                                            tokenize=False), prompt.id
        assert text.endswith(ASSISTANT_HEADER), prompt.id
        for message in prompt.messages:
            assert f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n" in text, prompt.id
        assert int((ids[0] == start).sum()) == len(prompt.messages) + 2, prompt.id  # + system, + assistant


def test_render_without_a_chat_template_names_the_fix():
    with pytest.raises(ValueError, match=r"needs a tokenizer with a chat template.*set tokenizer\.chat_template"):
        w.render(models.char_tokenizer(), w.prompts(["math"])[0])


def test_render_refuses_what_is_not_a_prompt(chatml_tokenizer):
    with pytest.raises(TypeError, match="prompt must be a workloads.Prompt"):
        w.render(chatml_tokenizer, [{"role": "user", "content": "hi"}])


# ----------------------------------------------------------------------------------------------- streams


@pytest.mark.parametrize("switch_every", [1, 3, 4, 7])
def test_stream_switches_category_exactly_every_switch_every_requests(switch_every):
    served = w.stream(switch_every=switch_every, requests=100, seed=3)
    assert len(served) == 100
    blocks = [served[i:i + switch_every] for i in range(0, len(served), switch_every)]
    for block in blocks:
        assert len({prompt.category for prompt in block}) == 1
    heads = [block[0].category for block in blocks]
    assert all(a != b for a, b in zip(heads, heads[1:]))
    cycle = heads[:len(w.CATEGORIES)]
    assert sorted(cycle) == sorted(w.CATEGORIES)
    assert heads == (cycle * len(heads))[:len(heads)]  # the same category order, cycling


def test_default_stream_serves_every_prompt_once():
    everything = ids_of(w.prompts())
    served = ids_of(w.stream())
    assert sorted(served) == sorted(everything)
    subset = ids_of(w.stream(["qa", "math"], switch_every=2, seed=5))
    assert sorted(subset) == sorted(ids_of(w.prompts(["qa", "math"])))


def test_stream_uses_every_prompt_of_a_category_before_any_repeats():
    size = len(w.prompts(["coding"]))
    served = w.stream(["coding", "math"], switch_every=5, requests=4 * size + 10, seed=1)
    for category in ("coding", "math"):
        ids = [prompt.id for prompt in served if prompt.category == category]
        passes = [ids[i:i + size] for i in range(0, len(ids), size)]
        assert len(passes) >= 2
        for one_pass in passes:
            assert len(set(one_pass)) == len(one_pass)
        assert passes[0] != passes[1]  # each further pass in a fresh order


def test_stream_is_deterministic_for_a_seed_and_differs_for_another():
    assert ids_of(w.stream(seed=7)) == ids_of(w.stream(seed=7))
    assert ids_of(w.stream(seed=7)) != ids_of(w.stream(seed=8))
    assert ids_of(w.stream(["math"], seed=7)) != ids_of(w.stream(["math"], seed=8))  # the order inside a category


def test_mixed_is_every_prompt_once_interleaved_and_seeded():
    served = w.mixed(seed=0)
    assert sorted(ids_of(served)) == sorted(ids_of(w.prompts()))
    assert ids_of(served) == ids_of(w.mixed(seed=0)) and ids_of(served) != ids_of(w.mixed(seed=1))
    switches = sum(a.category != b.category for a, b in zip(served, served[1:]))
    assert switches > len(served) // 2  # interleaved, not grouped by category
    assert {p.category for p in w.mixed(seed=2, categories=["qa"])} == {"qa"}


def test_fingerprint_names_the_exact_text():
    served = w.stream(seed=0)
    assert w.fingerprint(served) == w.fingerprint(w.stream(seed=0))
    assert w.fingerprint(served) != w.fingerprint(w.stream(seed=1))
    edited = served[0].messages[-1] | {"content": served[0].messages[-1]["content"] + " "}
    changed = [w.Prompt(served[0].id, served[0].category, served[0].messages[:-1] + (edited,), served[0].source)]
    assert w.fingerprint(changed) != w.fingerprint(served[:1])
    json.dumps([p.messages for p in served])  # plain JSON-ready dicts


# ----------------------------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("call, pattern", [
    (lambda: w.prompts(["maths"]), r"categories: unknown \['maths'\]; the valid ones are \['conversation'"),
    (lambda: w.prompts("math"), r"categories must be a list .* pass \['math'\]"),
    (lambda: w.prompts([]), r"categories is empty"),
    (lambda: w.prompts(["qa", "qa"]), r"categories: \['qa'\] given more than once"),
    (lambda: w.prompts(3), r"categories must be a list"),
    (lambda: w.stream(switch_every=0), r"switch_every must be an int >= 1, got 0"),
    (lambda: w.stream(switch_every=2.0), r"switch_every must be an int >= 1, got 2.0"),
    (lambda: w.stream(switch_every=True), r"switch_every must be an int >= 1, got True"),
    (lambda: w.stream(requests=0), r"requests must be an int >= 1, got 0"),
    (lambda: w.stream(seed="0"), r"seed must be an int, got '0'"),
    (lambda: w.stream(categories=["code"]), r"categories: unknown \['code'\]"),
    (lambda: w.mixed(seed=1.5), r"seed must be an int, got 1.5"),
    (lambda: w.mixed(categories=["chat"]), r"categories: unknown \['chat'\]"),
])
def test_argument_errors_name_the_argument_and_the_fix(call, pattern):
    with pytest.raises(ValueError, match=pattern):
        call()
