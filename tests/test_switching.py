"""The domain-switching workload, the oracle, and the switch-cost fit (flashspec.switching)."""
from __future__ import annotations

import pytest

from flashspec import switching


def test_workloads_and_the_oracle() -> None:
    prompts = {"a": [[1], [2]], "b": [[3]], "c": [[4]]}
    blocks = switching.make_workload(prompts, "blocks", 7, block_size=2)
    assert [r.domain for r in blocks] == ["a", "a", "b", "b", "c", "c", "a"]
    assert [r.prompt_ids for r in blocks[:2]] == [[1], [2]] and blocks[6].prompt_ids == [1]
    mixed = switching.make_workload(prompts, "mixed", 30, seed=3)
    assert mixed == switching.make_workload(prompts, "mixed", 30, seed=3)
    assert {r.domain for r in mixed} == {"a", "b", "c"}
    with pytest.raises(ValueError, match="kind"):
        switching.make_workload(prompts, "zigzag", 3)
    oracle = switching.DomainOracle({"a": 0, "b": 2})
    oracle.set_domain("b")
    assert oracle.select() == 2
    acceptance = {"x": {"a": 0.7, "b": 0.2}, "y": {"a": 0.6, "b": 0.5}, "z": {"a": 0.1, "b": 0.4}}
    assert switching.oracle_arms(acceptance, ["x", "y", "z"], ["a", "b"]) == {"a": 0, "b": 1}
    assert switching.oracle_arms(acceptance, ["z", "y", "x"], ["a", "b"]) == {"a": 2, "b": 1}


def test_switch_rate_and_cost_fit() -> None:
    run = {"arm_trace": [0, 1, 1, 2, 2, 0], "request_of_step": [0, 0, 0, 1, 1, 1]}
    assert switching.switches_per_step(run) == pytest.approx(2 / 6)  # 0->1 and 2->0; 1->2 is a new request

    def contestant(arms: list[int], ms_per_step: float) -> dict:
        return {"arm_trace": arms, "request_of_step": [0] * len(arms), "steps": len(arms),
                "seconds": ms_per_step * len(arms) / 1000}

    runs = {"fixed": contestant([0] * 10, 30.0), "half": contestant([0, 1] * 5, 30.0 + 20.0 * 0.9),
            "some": contestant([0, 0, 1, 1, 1, 1, 1, 1, 1, 1], 30.0 + 20.0 * 0.1)}
    fit = switching.switching_cost({"results": {"blocks": {"runs": runs}}})
    assert fit["base_ms"] == pytest.approx(30.0) and fit["per_switch_ms"] == pytest.approx(20.0)
    with pytest.raises(ValueError, match="different switching rates"):
        switching.switching_cost({"results": {"blocks": {"runs": {"a": runs["fixed"], "b": runs["fixed"],
                                                                  "c": runs["fixed"]}}}})
