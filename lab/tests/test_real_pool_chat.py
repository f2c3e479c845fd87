"""experiments/real_pool.py's chat workload and per-domain numbers, without a model: the chat domains (seeded prompt
order, rendered through a tokenizer's chat template), the oracle measured from fixed drafts, the per-domain
aggregation of served streams, and the command line's checks."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from experiments import real_pool
from flashspec_lab import switching, workloads


class FakeChatTokenizer:
    """What `workloads.render` calls: a chat template and `apply_chat_template` returning {"input_ids": [1, n]}.
    The ids are the number of turns, then the last turn's length and its first characters' codes."""

    chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def apply_chat_template(self, messages: list[dict[str, str]], **options: Any) -> dict[str, torch.Tensor]:
        self.calls.append(options)
        last = messages[-1]["content"]
        return {"input_ids": torch.tensor([[len(messages), len(last), *map(ord, last[:3])]])}


def test_chat_domains_follow_the_seed_and_render_through_the_chat_template() -> None:
    categories = ["math", "coding", "qa"]
    ordered = real_pool.chat_order(categories, seed=3)
    assert list(ordered) == categories  # the block order is the order given
    for category, served in ordered.items():  # every prompt of the category once, in a seeded order
        assert sorted(p.id for p in served) == sorted(p.id for p in workloads.prompts([category]))
    assert {c: [p.id for p in v] for c, v in real_pool.chat_order(categories, 3).items()} == {
        c: [p.id for p in v] for c, v in ordered.items()}
    assert [p.id for p in real_pool.chat_order(categories, 4)["math"]] != [p.id for p in ordered["math"]]

    tokenizer = FakeChatTokenizer()
    domains = real_pool.render_domains(tokenizer, ordered)
    first = ordered["coding"][0]
    content = first.messages[-1]["content"]
    assert domains["coding"][0] == [len(first.messages), len(content), *map(ord, content[:3])]
    assert all(isinstance(i, int) for ids in domains.values() for prompt in ids for i in prompt)
    assert {len(ids) for ids in domains.values()} == {len(v) for v in ordered.values()}
    assert all(call["add_generation_prompt"] and call["tokenize"] for call in tokenizer.calls)
    blocks = switching.make_workload(domains, "blocks", 6, 2)  # k requests per category in turn
    assert [r.domain for r in blocks] == ["math", "math", "coding", "coding", "qa", "qa"]
    assert blocks[1].prompt_ids == domains["math"][1]


def test_the_chat_oracle_takes_each_categorys_draft_of_most_tokens_per_step() -> None:
    a, b, c = switching.Request("math", [1, 2]), switching.Request("qa", [3]), switching.Request("math", [4])
    blocks, mixed = [a, b, a], [switching.Request("math", [1, 2]), b, c]
    assert real_pool.oracle_requests([blocks, mixed]) == [a, b, c]  # each distinct request once, first-served order
    measured = {"general": {"math": 2.0, "qa": 3.1}, "python": {"math": 2.5, "qa": 3.1},
                "prose": {"qa": 1.0, "math": 1.0}}
    assert real_pool.oracle_from_fixed(measured, ["general", "python", "prose"]) == {"math": 1, "qa": 0}  # tie: first
    with pytest.raises(ValueError, match="same requests"):
        real_pool.oracle_from_fixed({**measured, "prose": {"math": 1.0}}, ["general", "python", "prose"])
    with pytest.raises(ValueError, match="same requests"):
        real_pool.oracle_from_fixed({**measured, "prose": {"math": 1.0, "qa": None}}, ["general", "python", "prose"])


def test_per_domain_numbers_of_a_served_stream() -> None:
    domains = ["math", "math", "qa"]
    request_of_step = [0, 0, 1, 1, 1, 2, 2]
    summary = real_pool.domain_summary(domains, request_of_step, [8, 6, 8], [1.0, 1.0, 0.5])
    assert list(summary) == ["math", "qa"]
    assert summary["math"] == {"requests": 2, "tokens": 14, "steps": 5, "seconds": 2.0, "tokens_per_step": 2.8,
                               "tok_s": 7.0}
    assert summary["qa"]["tokens_per_step"] == 4.0 and summary["qa"]["tok_s"] == 16.0
    untimed = real_pool.domain_summary(["math", "qa"], [0], [3, 1])
    assert untimed["qa"] == {"requests": 1, "tokens": 1, "steps": 0, "tokens_per_step": None}
    with pytest.raises(ValueError, match="per request"):
        real_pool.domain_summary(domains, request_of_step, [8, 6])
    plain = real_pool.domain_summary(domains, list(range(3)) * 2, [8, 6, 8], [2.0, 2.0, 2.0])
    assert real_pool.ratio_per_domain(summary, plain) == {"math": 2.0, "qa": 4.0}

    run = {"generated_tokens": 24, "request_of_step": request_of_step}  # a serve_stream run: totals only
    assert real_pool.tokens_per_step_per_domain(run, domains, 8) == {"math": 16 / 5, "qa": 4.0}
    with pytest.raises(ValueError, match="not 8 each"):
        real_pool.budget_tokens({"generated_tokens": 23}, 3, 8)


def test_the_command_line_checks_the_workload_options(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = str(tmp_path / "pool.json")
    chat = real_pool.parse_args(["--out", out, "--workload", "chat", "--block", "2"])
    assert chat.requests == 12 and chat.categories == list(workloads.CATEGORIES) and chat.verify_methods == ["token"]
    corpus = real_pool.parse_args(["--out", out, "--verify-methods", "token", "block"])
    assert corpus.workload == "corpus" and corpus.requests == 12 and corpus.categories is None
    assert real_pool.part_key("speed", "token") == "speed" and real_pool.part_key("speed", "block") == "speed[block]"
    refused = {
        ("--workload", "chat", "--size", "micro-distill"): "--workload chat",
        ("--workload", "chat", "--requests", "5"): "--requests 5",
        ("--categories", "math"): "--categories",
        ("--verify-methods", "block", "block"): "--verify-methods",
    }
    for argv, option in refused.items():
        with pytest.raises(SystemExit):
            real_pool.parse_args(["--out", out, *argv])
        assert f"error: {option}" in capsys.readouterr().err


def test_speed_temperatures_name_their_results_and_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    args = real_pool.parse_args(["--out", str(tmp_path / "r.json"), "--speed-temperatures", "1", "0.7", "0"])
    assert [real_pool.speed_label(t) for t in args.speed_temperatures] == ["t1", "t0.7", "greedy"]
    assert real_pool.parse_args(["--out", str(tmp_path / "r.json")]).speed_temperatures == [0.0, 1.0]
    for bad in (["-0.5"], ["1", "1"]):
        with pytest.raises(SystemExit):
            real_pool.parse_args(["--out", str(tmp_path / "r.json"), "--speed-temperatures", *bad])
        assert "--speed-temperatures" in capsys.readouterr().err
