"""The domain-switching workload, the oracle, and the switch-cost fit (flashspec_lab.switching)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flashspec import models, runner
from flashspec_lab import switching
from flashspec.bandits import make_policy
from flashspec.fast import FastSpeculativeDecoder
from flashspec_lab.simulate import Blocks


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


@pytest.fixture()
def fake_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast-path sessions "capture" on a CPU: every session uses graphs, and a capture keeps the work to run
    again on each replay (the eager step), so captures happen where they would on a GPU."""
    from flashspec import fast_session

    original = fast_session.Session.__init__

    def init(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        self.use_graphs = True

    monkeypatch.setattr(fast_session.Session, "__init__", init)
    monkeypatch.setattr(fast_session.Session, "_capture", lambda self, run: SimpleNamespace(replay=run))


@pytest.fixture()
def drafts(draft) -> dict:
    return {"near": draft, "far": models.tiny_llama(vocab_size=16, hidden_size=8, num_layers=1, initializer_range=0.3,
                                                    seed=3, max_positions=64)}


REQUESTS = switching.make_workload({"a": [[1, 2, 3], [3, 1]], "b": [[4, 5, 6, 7]]}, "blocks", 4, block_size=2)


def test_fast_decoder_counts_each_graph_it_captures_in_every_session(fake_graphs, target, drafts) -> None:
    decoder = FastSpeculativeDecoder(target, list(drafts.values()), policy=Blocks(2), gamma=3, graphs=False)
    prompt = torch.tensor([[1, 2, 3]])
    decoder.generate(prompt, max_new_tokens=12, ignore_eos=True)
    first = decoder._session
    assert any(key[0] == "catch_up" for key in first.graphs)  # steps that capture two graphs count both
    assert first.prefill_graphs == 1  # the target's prefill, one width bucket (lazy drafts are not prefilled)
    assert decoder.graphs_captured == len(first.graphs) + first.prefill_graphs > first.prefill_graphs
    decoder.generate(prompt, max_new_tokens=12, ignore_eos=True)  # same session: its prefill graphs replay
    assert decoder._session is first and first.prefill_graphs == 1
    assert decoder.graphs_captured == len(first.graphs) + first.prefill_graphs
    before = decoder.graphs_captured
    decoder.generate(prompt, max_new_tokens=40, ignore_eos=True)  # a larger cache: a new session captures again
    assert decoder._session is not first and not first.graphs  # the replaced session dropped its graphs
    assert decoder.graphs_captured == before + len(decoder._session.graphs) + decoder._session.prefill_graphs


def test_replay_warm_up_captures_every_graph_of_the_timed_stream(fake_graphs, target, drafts) -> None:
    def serve(warm_up: str | None) -> tuple[dict, FastSpeculativeDecoder]:
        decoder = FastSpeculativeDecoder(target, list(drafts.values()), policy="fixed", gamma=3, graphs=False)
        run = switching.serve_stream(target, drafts, REQUESTS, make_policy("thompson", 2, seed=0), max_new_tokens=12,
                                     decoder=decoder, warm_up=warm_up)
        return run, decoder

    cold, cold_decoder = serve(None)
    assert len(set(cold["arm_trace"])) == 2  # the policy switches, so the stream needs several arms' graphs
    assert cold["graph_captures"] == cold_decoder.graphs_captured > 0
    warm, warm_decoder = serve("replay")
    assert warm["graph_captures"] == 0 and warm_decoder.graphs_captured == cold_decoder.graphs_captured
    # the timed policy starts untouched by the replay, so it makes the cold run's choices and draws its tokens
    assert warm["arm_trace"] == cold["arm_trace"] and warm["accepted_trace"] == cold["accepted_trace"]
    with pytest.raises(ValueError, match="warm_up"):
        switching.serve_stream(target, drafts, REQUESTS, make_policy("thompson", 2), decoder=warm_decoder,
                               warm_up="short")


class Wander:
    """Arms from a module-level counter that no copy of the policy resets: the timed stream picks other arms
    than its replayed warm-up did, as a throughput reward reading step times can."""

    calls = 0

    def select(self) -> int:
        Wander.calls += 1
        return (Wander.calls * 7 // 3) % 4

    def update(self, arm: int, reward: float) -> None:
        return None


@pytest.fixture()
def frozen_captures(monkeypatch: pytest.MonkeyPatch) -> None:
    """As `fake_graphs`, but a capture first runs its work twice frozen, as the GPU capture's warm-up does, so
    a capture made between requests at another fill must leave no trace in the tokens."""
    from flashspec import fast_session

    original = fast_session.Session.__init__

    def init(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        self.use_graphs = True

    def capture(self, run):
        self.buffers.frozen.fill_(True)
        try:
            run()
            run()
        finally:
            self.buffers.frozen.fill_(False)
        return SimpleNamespace(replay=run)

    monkeypatch.setattr(fast_session.Session, "__init__", init)
    monkeypatch.setattr(fast_session.Session, "_capture", capture)


def test_capturing_every_graph_ahead_leaves_none_to_capture_and_changes_no_token(frozen_captures, target,
                                                                                  drafts) -> None:
    def serve(warm_up: str | None) -> tuple[dict, FastSpeculativeDecoder]:
        decoder = FastSpeculativeDecoder(target, list(drafts.values()), policy="fixed", gamma=3, gammas=[2, 3],
                                         graphs=False)
        run = switching.serve_stream(target, drafts, REQUESTS, Wander(), max_new_tokens=12, decoder=decoder,
                                     warm_up=warm_up)
        return run, decoder

    Wander.calls = 0
    replayed, _ = serve("replay")
    assert replayed["graph_captures"] > 0  # the timed stream wandered onto arms its replay had not captured
    Wander.calls = 0
    ahead, decoder = serve("all")
    assert ahead["graph_captures"] == 0
    keys = set(decoder._session.graphs)
    assert {key[1] for key in keys} == set(range(4)) and any(key[0] == "catch_up" for key in keys)
    # the same arms and seeds without any capture made ahead give the same tokens: the captures changed nothing
    Wander.calls = 0
    plain = FastSpeculativeDecoder(target, list(drafts.values()), policy="fixed", gamma=3, gammas=[2, 3],
                                   graphs=False)
    switching.serve_stream(target, drafts, REQUESTS, Wander(), max_new_tokens=12, decoder=plain)  # the warm-up's draws
    cold = switching.serve_stream(target, drafts, REQUESTS, Wander(), max_new_tokens=12, decoder=plain)
    assert cold["arm_trace"] == ahead["arm_trace"] and cold["accepted_trace"] == ahead["accepted_trace"]
    with pytest.raises(ValueError, match="generate once"):
        FastSpeculativeDecoder(target, list(drafts.values()), gamma=3, graphs=False).capture_graphs([8])
    with pytest.raises(ValueError, match="lengths"):
        decoder.capture_graphs([0])


def test_capturing_ahead_covers_the_prefill_of_every_prompt_width(fake_graphs, target, drafts) -> None:
    decoder = FastSpeculativeDecoder(target, list(drafts.values()), policy="fixed", gamma=3, graphs=False)
    decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=30, ignore_eos=True)
    session = decoder._session
    assert session.prefill_graphs == 1  # width 3: one bucket, the target's prefill (lazy drafts have none)
    buckets = {runner.bucket_for(n, session.capacity) for n in range(1, session.capacity + 1)}
    decoder.capture_graphs(range(1, session.capacity + 1))
    assert session.prefill_graphs == len(buckets) > 1
    before = decoder.graphs_captured
    wide = torch.randint(1, 16, (1, 20), generator=torch.Generator().manual_seed(0))  # another width bucket
    decoder.generate(wide, max_new_tokens=13, ignore_eos=True)
    assert decoder._session is session and decoder.graphs_captured == before


def test_switching_experiment_times_no_capture_on_a_fast_decoder(fake_graphs, target, drafts) -> None:
    prompts = {"a": [[1, 2, 3], [3, 1]], "b": [[4, 5, 6, 7]]}
    decoder = FastSpeculativeDecoder(target, list(drafts.values()), policy="fixed", gamma=3, graphs=False)
    results = switching.run_switching_experiment(target, drafts, prompts, {"a": 0, "b": 1}, num_requests=4,
                                                 block_size=2, max_new_tokens=8, gamma=3, bandits=("thompson",),
                                                 progress=False, decoder=decoder)
    runs = [run for kind in switching.WORKLOADS for run in results[kind]["runs"].values()]
    assert decoder.graphs_captured > 0 and [run["graph_captures"] for run in runs] == [0] * len(runs)
    eager = switching.serve_stream(target, drafts, REQUESTS[:1], make_policy("fixed", 2), gamma=3, max_new_tokens=4)
    assert eager["graph_captures"] is None
