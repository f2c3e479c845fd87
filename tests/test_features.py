"""Drafts that read the target's hidden states (`flashspec.features`): the states the target's runner writes
are HF's, the draft's runner reads them as the draft's own forward does, its later depths unroll as a real step
sees them, and on the fast path it keeps the output exactly the target's (greedy token for token, sampled
in law), alone or beside token drafts and prompt lookup."""
from __future__ import annotations

import collections
import copy

import pytest
import torch

import flashspec as fs
from flashspec import models, runner
from flashspec.drafters import PromptLookupDrafter
from flashspec.engine import SpeculativeDecoder
from flashspec.fast import FastSpeculativeDecoder
from flashspec.features import FeatureDraft, FeatureRunner, target_states, unroll

from test_engine_exact import SETTINGS, VOCAB, exact_continuations, fit_p_values, passes
from test_fast import chi2_calls

STATES = (0, 1, -1)  # the embeddings, the first layer's output and the final normed state of a 2-layer target


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    return models.tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=2, initializer_range=0.3, seed=1,
                             max_positions=64)


@pytest.fixture(scope="module")
def feature_draft(target) -> FeatureDraft:
    torch.manual_seed(0)
    return FeatureDraft.from_target(target, (1,), STATES).eval()


PROMPTS = torch.tensor([[0, 0, 5, 6, 7, 5], [0, 3, 7, 3, 9, 4], [1, 4, 4, 4, 4, 2]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])


def real_tokens(row: int) -> torch.Tensor:
    return PROMPTS[row][MASK[row].bool()][None]


def test_the_target_runner_writes_the_states_hf_computes(target):
    run = runner.LlamaRunner(target, max_batch=3, max_len=32, state_layers=STATES)
    run.prefill(PROMPTS, MASK)
    for row in range(3):
        tokens = real_tokens(row)
        expected, _ = target_states(target, tokens, STATES)
        assert torch.allclose(run.read_states(run.states[row, :tokens.shape[1]]), expected[0], atol=1e-5), row
    hidden = target.config.hidden_size
    for chunk in run.read_states(run.states[0, :4]).split(hidden, dim=-1):  # each state at unit RMS
        assert torch.allclose(chunk.pow(2).mean(-1), torch.ones(4), atol=1e-4)
    with pytest.raises(ValueError, match="state_layers"):
        runner.LlamaRunner(target, max_batch=1, max_len=8, state_layers=(3,))


def test_writing_the_states_costs_one_copy_per_state(target):
    """Every target forward writes the states, plain steps included, so a write is one copy per state (the draft
    normalises what it reads): a forward with three state layers runs three more ops than one with none, not the
    two dozen of normalising at the write (each one a kernel launch in a plain step's graph)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if torch.Tag.view_copy not in func.tags and not func.is_view:
                self.count += 1
            return func(*args, **(kwargs or {}))

    def ops(state_layers: tuple[int, ...]) -> int:
        run = runner.LlamaRunner(target, max_batch=1, max_len=32, state_layers=state_layers)
        tokens, positions = torch.zeros((1, 1), dtype=torch.long), torch.full((1, 1), 3)
        run.forward(tokens, positions, 16)
        with Ops() as counted:
            run.forward(tokens, positions, 16)
        return counted.count

    assert ops(STATES) - ops(()) == len(STATES)


def test_the_draft_runner_reads_the_states_as_the_drafts_own_forward(target, feature_draft):
    source = runner.LlamaRunner(target, max_batch=3, max_len=32, state_layers=STATES)
    source.prefill(PROMPTS, MASK)
    draft_run = FeatureRunner(feature_draft, source, max_batch=3, max_len=32)
    logits, _ = draft_run.prefill(PROMPTS, MASK)
    for row in range(3):
        tokens = real_tokens(row)
        states, _ = target_states(target, tokens, STATES)
        fed = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1)  # zeros before position 0
        hidden, expected = feature_draft(tokens, fed)
        assert torch.allclose(logits[row], expected[0, -1], atol=1e-5), row
        assert torch.allclose(draft_run.last_hidden[row, 0], hidden[0, -1], atol=1e-5), row
    with pytest.raises(ValueError, match="state_layers"):
        FeatureRunner(feature_draft, runner.LlamaRunner(target, max_batch=3, max_len=32), max_batch=3, max_len=32)


def test_later_depths_unroll_as_a_real_step_sees_them(target, feature_draft):
    """The exact regime's one masked forward per depth equals running each step on its own: the context read
    with the target's true states, then the step's drafted tokens, each fed the previous one's output."""
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
    features, _ = target_states(target, tokens, STATES)
    draft = feature_draft
    with torch.no_grad():
        exact = unroll(draft, tokens, features, 3)
        pessimistic = unroll(draft, tokens, features, 3, regime="pessimistic")
        assert [logits.shape[1] for _, logits in exact] == [8, 7, 6]
        assert torch.allclose(exact[0][1], pessimistic[0][1], atol=1e-5)  # depth 1 reads true states in both
        assert torch.allclose(exact[0][1], draft(tokens[:, 1:], features[:, :-1])[1], atol=1e-5)
        embed, model = draft.body.model.embed_tokens, draft.body.model
        for start in (0, 3, 5):  # the step whose first drafted position is start + 1
            context = draft.fc(torch.cat([embed(tokens[:, 1:start + 2]), draft.reduce(features[:, :start + 1])], -1))
            sequence, positions = context, list(range(1, start + 2))
            fed = model(inputs_embeds=sequence, position_ids=torch.tensor([positions] * 2)).last_hidden_state[:, -1]
            for depth in (2, 3):
                step = draft.fc(torch.cat([embed(tokens[:, start + depth:start + depth + 1]), fed[:, None]], -1))
                sequence, positions = torch.cat([sequence, step], 1), positions + [start + depth]
                fed = model(inputs_embeds=sequence, position_ids=torch.tensor([positions] * 2)).last_hidden_state[:, -1]
                assert torch.allclose(fed, exact[depth - 1][0][:, start], atol=1e-5), (start, depth)
        assert not torch.allclose(exact[1][1], pessimistic[1][1], atol=1e-3)  # the regimes differ past depth 1
    with pytest.raises(ValueError, match="regime"):
        unroll(draft, tokens, features, 2, regime="optimistic")


def test_a_saved_feature_draft_loads_back(tmp_path, feature_draft):
    tokens = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(4))
    features = torch.randn(1, 6, len(STATES) * feature_draft.config.hidden_size, generator=torch.Generator().manual_seed(5))
    feature_draft.save_pretrained(tmp_path / "fd")
    loaded = FeatureDraft.from_pretrained(tmp_path / "fd")
    assert loaded.feature_layers == STATES
    with torch.no_grad():
        assert torch.allclose(loaded(tokens, features)[1], feature_draft(tokens, features)[1], atol=1e-6)
    with pytest.raises(ValueError, match="no feature draft"):
        FeatureDraft.from_pretrained(tmp_path)


@pytest.mark.parametrize("sync,gammas,compile", [("lazy", None, False), ("all", None, False), ("lazy", [1, 3], False),
                                                  ("lazy", None, "forward")])
def test_greedy_with_a_feature_draft_equals_the_targets_greedy_generate(target, feature_draft, sync, gammas, compile,
                                                                         monkeypatch):
    """Greedy equals the target's greedy generate (eager; with every region compiled: the target's stored
    states, the draft's inputs and head; or with the target's whole forward compiled, which then writes the
    states inside its graph), and after the steps the states buffer holds the target's states."""
    calls: collections.Counter[str] = collections.Counter()
    compile_region = runner.compile_region

    def counted(fn, mode="default", options=None):  # each compiled region, counting its calls
        compiled = compile_region(fn, mode, options)

        def call(*args, **kwargs):
            calls[fn.__name__] += 1
            return compiled(*args, **kwargs)
        return call
    monkeypatch.setattr(runner, "compile_region", counted)
    token_draft = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3, seed=2)
    decoder = FastSpeculativeDecoder(target, [feature_draft, token_draft, PromptLookupDrafter()], policy="exp3",
                                     gamma=3, gammas=gammas, draft_sync=sync, policy_kwargs={"seed": 0},
                                     compile=bool(compile), compile_scope=compile or "forward")
    result = decoder.generate(PROMPTS, attention_mask=MASK, max_new_tokens=20, sampling=fs.SamplingParams(0.0))
    expected = target.generate(PROMPTS, attention_mask=MASK, max_new_tokens=20, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    assert torch.equal(result.sequences, expected)
    names = decoder.arm_names
    played = {names[step.arm] for step in result.stats.steps}
    assert any(name.startswith("draft0") for name in played), played  # the feature draft was played
    assert_the_drafts_window_reads_the_targets_states(decoder, target, feature_draft)
    # compiled, the feature draft's own pieces ran compiled, beside the body's regions
    expected_calls = {"window_inputs", "fed_inputs", "hidden_and_logits", "project_qkv"}
    if compile == "forward":  # the target's forward whole; a feature draft always compiles regions
        expected_calls = {"_layers", "window_inputs", "fed_inputs", "hidden_and_logits", "project_qkv"}
    assert expected_calls <= set(calls) if compile else not calls, calls


def assert_the_drafts_window_reads_the_targets_states(decoder: FastSpeculativeDecoder, target: torch.nn.Module,
                                                      feature_draft: FeatureDraft) -> None:
    """After the steps, the states the verify forwards wrote are the target's own: the feature draft (the
    decoder's draft 0) reads them at each row's pending token as its HF forward over the whole row does."""
    session = decoder._session
    draft_run, lengths, seq = session.drafts[0], session.buffers.lengths, session.buffers.seq
    window = (lengths[:, None] - 4 + torch.arange(4)).clamp(min=0)
    logits = draft_run.forward(seq.gather(1, window), window, runner.bucket_for(int(lengths.max()), session.capacity),
                               torch.full((3, 1), 3))[:, 0]
    for row in range(3):
        tokens = seq[row:row + 1, :int(lengths[row])]
        states, _ = target_states(target, tokens, STATES)
        _, expected = feature_draft(tokens, torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1))
        assert torch.allclose(logits[row], expected[0, -1], atol=1e-4), row


@pytest.mark.parametrize("control, compile", [(False, False), (True, False), (False, True)],
                         ids=["kept-path", "control-states-left-in-tree-slots", "kept-path-compiled"])
def test_the_paths_decoder_keeps_the_kept_paths_states_for_a_feature_draft(target, feature_draft, control, compile,
                                                                          monkeypatch):
    """A feature draft among the paths decoder's chains (beside a copy of the target, whose chain is often kept,
    and prompt lookup): greedy equals the target's greedy generate, and after the steps the feature draft reads
    the target's states, which holds only if `keep_path` moves the kept path's states out of its tree slots
    (the control leaves them there and must fail); also with the target's forwards compiled, the tree's among
    them, which then write the states inside the compiled graph."""
    from flashspec.fast import FastPathsDecoder

    if control:
        keep_path = runner.LlamaRunner.keep_path

        def keep_cache_only(self, root, path_nodes):  # the K/V moved, the states left where the tree wrote them
            states, self.states = self.states, None
            try:
                keep_path(self, root, path_nodes)
            finally:
                self.states = states
        monkeypatch.setattr(runner.LlamaRunner, "keep_path", keep_cache_only)
    decoder = FastPathsDecoder(target, [feature_draft, copy.deepcopy(target), PromptLookupDrafter()], gamma=3,
                               compile=compile)
    result = decoder.generate(PROMPTS, attention_mask=MASK, max_new_tokens=20, sampling=fs.SamplingParams(0.0))
    expected = target.generate(PROMPTS, attention_mask=MASK, max_new_tokens=20, do_sample=False, eos_token_id=2,
                               pad_token_id=2)
    assert torch.equal(result.sequences, expected)  # greedy is exact whatever the draft reads
    assert max(count for step in result.stats.steps for count in step.kept) == 4  # the copy's whole chain kept
    if control:
        with pytest.raises(AssertionError):
            assert_the_drafts_window_reads_the_targets_states(decoder, target, feature_draft)
    else:
        assert_the_drafts_window_reads_the_targets_states(decoder, target, feature_draft)


@pytest.mark.parametrize("regime", ["exact", "pessimistic"])
def test_a_folded_temperature_divides_every_depths_logits_and_nothing_else(target, feature_draft, regime):
    """`distill.fold_temperature` on a feature draft: at every depth (each fed the one before's output, which
    the fold rescales) the logits are the unfolded draft's divided by τ, so its distributions are q_τ."""
    from flashspec_lab.zoo import distill

    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    states, _ = target_states(target, tokens, STATES)
    with torch.no_grad():
        before = unroll(feature_draft, tokens, states, 3, regime)
        after = unroll(distill.fold_temperature(feature_draft, 0.8), tokens, states, 3, regime)
    for (_, plain), (_, folded) in zip(before, after):
        assert torch.allclose(folded, plain / 0.8, atol=1e-4)  # float32 rounding grows with depth
    with pytest.raises(ValueError, match="two or more feature_layers"):
        distill.fold_temperature(FeatureDraft.from_target(target, (1,), (-1,)), 0.8)


def test_feature_drafts_are_checked(target, feature_draft):
    other = FeatureDraft.from_target(target, (1,), (-1,))
    with pytest.raises(ValueError, match="same target states"):
        FastSpeculativeDecoder(target, [feature_draft, other])
    with pytest.raises(ValueError, match="only the fast path"):
        SpeculativeDecoder(target, [feature_draft])


BAD_LAYERS = {  # layers= of FeatureDraft.from_target on the 2-layer target: what it says back
    (5,): r"layers must name decoder layers of the target, which has 2: 0\.\.1 \(or -2\.\.-1 from the end\), got "
          r"\(5,\); e\.g\. layers=\(1,\)",
    (-3,): r"0\.\.1 \(or -2\.\.-1 from the end\), got \(-3,\)",
    (): r"layers must name at least one decoder layer of the target.*got \(\); e\.g\. layers=\(1,\)",
    (1.5,): r"layers must be a tuple of ints, got \(1\.5,\)",
    (True,): r"layers must be a tuple of ints, got \(True,\)",
    1: r"layers must be a tuple of ints, got 1; e\.g\. layers=\(1,\)",
}
BAD_FEATURE_LAYERS = {  # feature_layers= on the 2-layer target
    (7,): r"feature_layers must be distinct hidden-state indices of the target in 0\.\.2 \(0 the embeddings, i the "
          r"output of decoder layer i, 2 or -1 the final normed state\), got \(7,\); e\.g\. feature_layers=\(1, -1\)",
    (-2,): r"in 0\.\.2 .*got \(-2,\)",
    (0, 0): r"feature_layers names hidden state 0 twice, got \(0, 0\); e\.g\. feature_layers=\(1, -1\)",
    (2, -1): r"feature_layers names hidden state 2 twice \(-1 is 2 here\), got \(2, -1\)",
    (): r"feature_layers must name at least one hidden state of the target",
    (0.5, -1): r"feature_layers must be a tuple of ints, got \(0\.5, -1\)",
}


@pytest.mark.parametrize("layers", list(BAD_LAYERS), ids=repr)
def test_from_target_names_bad_decoder_layers_and_their_range(target, layers):
    with pytest.raises(ValueError, match=BAD_LAYERS[layers]) as caught:
        FeatureDraft.from_target(target, layers, (-1,))
    assert "state_layers" not in str(caught.value)


@pytest.mark.parametrize("feature_layers", list(BAD_FEATURE_LAYERS), ids=repr)
def test_from_target_names_bad_feature_layers_and_their_range(target, feature_layers):
    with pytest.raises(ValueError, match=BAD_FEATURE_LAYERS[feature_layers]) as caught:
        FeatureDraft.from_target(target, (1,), feature_layers)
    assert "state_layers" not in str(caught.value)


def test_from_target_takes_every_valid_index(target):
    """Decoder layers count from the end when negative and may repeat (each copy trains on its own); hidden
    states run from the embeddings (0) to the final normed state (2 or -1)."""
    draft = FeatureDraft.from_target(target, [-1, 0, 0], [0, 1, 2])
    assert draft.body.config.num_hidden_layers == 3 and draft.feature_layers == (0, 1, 2)
    assert torch.equal(draft.body.model.layers[0].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)


@pytest.mark.slow
def test_fast_output_with_a_feature_draft_matches_the_exact_target_distribution(target, feature_draft):
    """The joint law of the first three tokens, a feature draft beside a token draft and prompt lookup
    under a switching bandit (T = 0.7)."""
    token_draft = copy.deepcopy(target)
    with torch.no_grad():
        for parameter in token_draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(6)) * 0.001)
    decoder = FastSpeculativeDecoder(target, [feature_draft, token_draft, PromptLookupDrafter()], policy="exp3",
                                     gamma=3, policy_kwargs={"seed": 0})
    params = SETTINGS[0]
    continuations, arms, kept = chi2_calls(decoder, params)
    p_values = fit_p_values(continuations, exact_continuations(target, params))
    assert passes(p_values), p_values
    assert 0 in set(arms) and max(kept) >= 2


@pytest.mark.slow
def test_paths_output_with_a_feature_draft_matches_the_exact_target_distribution(target, feature_draft):
    """The joint law of the first three tokens at T = 1 when the feature draft's chain is verified together with
    a token draft's and prompt lookup's (`FastPathsDecoder`, γ = 2)."""
    from flashspec.fast import FastPathsDecoder

    token_draft = copy.deepcopy(target)
    with torch.no_grad():
        for parameter in token_draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(6)) * 0.001)
    decoder = FastPathsDecoder(target, [feature_draft, token_draft, PromptLookupDrafter()], gamma=2)
    params = fs.SamplingParams(1.0)
    continuations, _, kept = chi2_calls(decoder, params)
    p_values = fit_p_values(continuations, exact_continuations(target, params))
    assert passes(p_values), p_values
    assert max(kept) == 3 and min(kept) == 1


def test_a_zoo_with_a_feature_draft_builds_loads_measures_and_decodes(tmp_path, monkeypatch):
    """micro-distill-features: the pool plus a feature draft trained two depths deep on the tiny teacher; it loads
    as a FeatureDraft beside the token drafts, its acceptance and perplexity are measured on the target's states,
    and the fast path serves the whole pool exactly (greedy)."""
    from flashspec_lab import zoo
    from flashspec_lab.zoo import distill

    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    loaded = zoo.load_zoo("micro-distill-features", device="cpu", progress=False)
    assert list(loaded.drafts) == ["python", "prose", "cpp", "general", "features"]
    features = loaded.drafts["features"]
    assert isinstance(features, FeatureDraft) and features.feature_layers == (1, -1)
    info = loaded.manifest["models"][distill.FEATURE_DRAFT]
    assert info["steps"] == 6 and info["training_depths"] == 2 and info["feature_layers"] == [1, -1]
    assert zoo.SIZES["micro-distill-features"].key("x") != zoo.SIZES["micro-distill"].key("x")
    fit = info["calibration"]  # its temperature was fitted (on its first drafted token) and folded in
    assert fit["temperature"] in distill.TEMPERATURE_GRID
    assert fit["sum_min_t1_by_temperature"][str(fit["temperature"])] >= fit["sum_min_t1_by_temperature"]["1.0"]
    assert (fit["uncalibrated_weights_sha256"] == info["weights_sha256"]) == (fit["temperature"] == 1.0)
    acceptance = zoo.expected_acceptance_matrix(loaded, 64)
    assert all(0.0 < value <= 1.0 for value in acceptance["features"].values())
    assert all(value > 1.0 for value in zoo.perplexity_table(loaded, 64)["features"].values())
    prompt = torch.tensor([loaded.prompts["python"][0]])
    decoder = FastSpeculativeDecoder(loaded.target, list(loaded.drafts.values()), policy="exp3", gamma=2,
                                     policy_kwargs={"seed": 0})
    result = decoder.generate(prompt, max_new_tokens=12, sampling=fs.SamplingParams(0.0), ignore_eos=True)
    expected = loaded.target.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None,
                                      pad_token_id=0)
    assert torch.equal(result.sequences, expected)


def test_real_pool_measures_a_pool_with_a_feature_draft(tmp_path, monkeypatch):
    """experiments/real_pool.py on micro-distill-features: a budget fits the feature draft's steps too, the
    quality part covers it and the speed part's choosing contestants draw from it (on the CPU, float32: greedy
    agrees with plain greedy)."""
    import json

    from experiments import real_pool

    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "pool.json"
    assert real_pool.main(["--size", "micro-distill-features", "--out", str(out), "--requests", "2", "--block", "1",
                           "--new-tokens", "4", "--repeats", "1", "--device", "cpu", "--parts", "quality", "speed",
                           "--speed-adaptive-gammas", "2", "4", "--train-budget-s", "0.5", "--single-draft",
                           "features"]) == 0
    results = json.loads(out.read_text())["results"]
    fitted = results["build"]["fitted_to_budget"]  # the feature draft's steps are fitted with the others
    assert fitted["feature_seconds_per_step"] > 0 and results["build"]["config"]["feature_steps"] == fitted["feature_steps"]
    assert "error" not in results["quality"] and "error" not in results["speed"], results
    assert set(results["quality"]["acceptance_t1"]) == {"python", "prose", "cpp", "general", "features"}
    assert results["build"]["models"]["draft-features"]["feature_layers"] == [1, -1]
    assert results["speed"]["greedy"]["greedy_token_agreement_with_plain"] == 1.0
    assert results["speed"]["t1"]["one_draft"]["draft"] == "features"
    assert results["speed"]["greedy"]["one_draft"]["greedy_token_agreement_with_plain"] == 1.0  # the feature draft


def test_the_cli_serves_a_pool_with_a_feature_draft_on_the_fast_path(tmp_path, monkeypatch, capsys):
    """`flashspec generate --zoo micro-distill-features`: auto takes the fast path on a CPU too (the eager engine
    cannot feed a feature draft), and --engine eager says so in one line."""
    from flashspec import cli

    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    base = ["generate", "--zoo", "micro-distill-features", "--prompt", "def f(x):", "--max-new-tokens", "6",
            "--no-progress"]
    assert cli.main(base) == 0
    assert "draft4:draft-features" in capsys.readouterr().err
    assert cli.main([*base, "--engine", "eager"]) == 2
    assert "the eager engine cannot run a feature draft" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compile", [False, True], ids=["graphs", "graphs+compile"])
def test_graphed_fast_path_with_a_feature_draft_on_gpu(target, feature_draft, compile):
    """With CUDA graphs (the step, the catch-ups and the prefills captured and replayed), with and without the
    compiled regions (the feature draft's own included): the sampled law is the
    target's (χ², T = 0.7), greedy is the target's greedy generate, and after the steps the states the graphs wrote
    are HF's."""
    gpu_target, gpu_draft = copy.deepcopy(target).cuda(), copy.deepcopy(feature_draft).cuda()
    token_draft = models.tiny_llama(vocab_size=VOCAB, hidden_size=8, num_layers=1, initializer_range=0.3,
                                    seed=2).cuda()
    decoder = FastSpeculativeDecoder(gpu_target, [gpu_draft, token_draft, PromptLookupDrafter()], policy="exp3",
                                     gamma=3, policy_kwargs={"seed": 0}, compile=compile)
    params = SETTINGS[0]
    continuations, arms, _ = chi2_calls(decoder, params, device="cuda")
    assert decoder.graphs_captured > 0 and 0 in set(arms)
    p_values = fit_p_values(continuations, exact_continuations(target, params))
    assert passes(p_values), p_values
    result = decoder.generate(PROMPTS.cuda(), attention_mask=MASK.cuda(), max_new_tokens=12,
                              sampling=fs.SamplingParams(0.0))
    session = decoder._session
    lengths, seq, target_run = session.buffers.lengths, session.buffers.seq, session.target
    for row in range(3):
        tokens = seq[row:row + 1, :int(lengths[row]) - 1]  # every token the target has processed
        expected, _ = target_states(gpu_target, tokens, STATES)
        # loose: TF32 may be on in this process; stale or missing states would be off by O(1)
        read = target_run.read_states(target_run.states[row, :tokens.shape[1]])
        assert torch.allclose(read.float(), expected[0].float(), atol=2e-2), row
    # greedy through the graphs is the GPU target's own greedy generate (row 2 stops at EOS after two tokens)
    expected = gpu_target.generate(PROMPTS.cuda(), attention_mask=MASK.cuda(), max_new_tokens=12, do_sample=False,
                                   eos_token_id=2, pad_token_id=2)
    assert torch.equal(result.sequences.cuda(), expected)
