"""Drafts distilled from a pretrained target (`flashspec_lab.zoo.distill`), through the seconds-long
"micro-distill" size whose teacher is a tiny random Llama: the loss, the draft's starting point, a
deterministic build in the zoo cache, loading with the teacher as target, and the GPU experiment's
driver (`experiments/real_pool.py`) end to end on tiny shapes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flashspec import bandits, models
from flashspec_lab import corpora, zoo
from flashspec_lab.zoo import distill, training


@pytest.fixture()
def micro_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_forward_kl_matches_its_definition_and_vanishes_on_equal_logits() -> None:
    generator = torch.Generator().manual_seed(0)
    teacher, draft = torch.randn(2, 3, 11, generator=generator), torch.randn(2, 3, 11, generator=generator)
    p, q = teacher.softmax(-1), draft.softmax(-1)
    expected = (p * (p.log() - q.log())).sum(-1).mean()
    assert torch.allclose(distill.forward_kl(teacher, draft), expected, atol=1e-6)
    assert float(distill.forward_kl(teacher, teacher)) == pytest.approx(0.0, abs=1e-6)
    assert float(distill.forward_kl(teacher, draft)) > 0  # not symmetric by accident: KL(p || q), not KL(q || p)
    assert not torch.allclose(distill.forward_kl(teacher, draft), distill.forward_kl(draft, teacher))


def test_draft_starts_from_the_teachers_layers_with_its_frozen_embedding() -> None:
    teacher, _ = distill.load_teacher("tiny", "cpu")
    draft = models.draft_from_teacher(teacher, (2, 0))
    assert draft.config.num_hidden_layers == 2 and teacher.config.num_hidden_layers == 3
    for index, layer in enumerate((2, 0)):
        for (name, got), (_, want) in zip(draft.model.layers[index].state_dict().items(),
                                          teacher.model.layers[layer].state_dict().items()):
            assert torch.equal(got, want), name
    assert torch.equal(draft.model.embed_tokens.weight, teacher.model.embed_tokens.weight)
    assert draft.lm_head.weight is draft.model.embed_tokens.weight  # tied, as in the teacher
    assert not draft.model.embed_tokens.weight.requires_grad
    assert all(p.requires_grad for p in draft.model.layers.parameters())
    # a copy, not a view: training the draft leaves the teacher alone
    draft.model.layers[0].mlp.up_proj.weight.data.add_(1.0)
    assert not torch.equal(draft.model.layers[0].mlp.up_proj.weight, teacher.model.layers[2].mlp.up_proj.weight)


def test_a_folded_temperature_divides_the_drafts_logits_and_leaves_the_draft_alone() -> None:
    teacher, _ = distill.load_teacher("tiny", "cpu")
    draft = models.draft_from_teacher(teacher, (2,))
    ids = torch.randint(0, teacher.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    before = draft(input_ids=ids).logits
    folded = distill.fold_temperature(draft, 0.7)
    assert torch.allclose(folded(input_ids=ids).logits, before / 0.7, atol=1e-5, rtol=1e-5)
    assert torch.equal(draft(input_ids=ids).logits, before)  # a copy: the draft passed in is unchanged
    assert folded.lm_head.weight is folded.model.embed_tokens.weight  # still tied
    with pytest.raises(ValueError, match="temperature must be > 0"):
        distill.fold_temperature(draft, 0.0)


def test_calibration_picks_the_best_temperature_on_training_windows_and_never_loses_acceptance() -> None:
    config = zoo.SIZES["micro-distill"].with_overrides(calibration_tokens=96, context=16)
    teacher, _ = distill.load_teacher("tiny", "cpu")
    # a draft whose logits are the teacher's divided by 0.8 (too sharp): the fit must find τ = 1.25
    sharp = distill.fold_temperature(models.draft_from_teacher(teacher, (0, 1, 2)), 0.8)
    stream = [torch.randint(0, teacher.config.vocab_size, (400,), generator=torch.Generator().manual_seed(1))]
    grid = distill.TEMPERATURE_GRID
    assert 1.0 in grid and grid == tuple(sorted(grid))
    calibrated, record = distill.calibrate(sharp, teacher, stream, config, torch.device("cpu"), "draft-general")
    table = {float(t): v for t, v in record["sum_min_t1_by_temperature"].items()}
    assert record["temperature"] == max(table, key=table.get) == 1.25
    assert table[record["temperature"]] >= table[1.0]
    assert record["uncalibrated_weights_sha256"] != training.weights_sha256(calibrated)
    assert record["calibration_tokens"] == (96 // 16) * 16
    windows = torch.stack([stream[0][:16], stream[0][16:32]])
    assert distill.overlap_by_temperature(teacher, calibrated, windows, (1.0,), torch.device("cpu"))[1.0] == \
        pytest.approx(1.0, abs=1e-5)  # the teacher's own distribution


def test_init_layers_checks_and_spreads() -> None:
    config = zoo.SIZES["micro-distill"]
    assert distill.init_layers(config, 3) == (2,)
    assert distill.init_layers(config.with_overrides(draft_init_layers=()), 3) == (0,)
    two = config.with_overrides(draft=zoo.ModelSpec(32, 2, 2, 64, True), draft_init_layers=())
    assert distill.init_layers(two, 30) == (0, 29)
    shape, _ = distill.load_teacher("smollm2-shape", "meta")  # SmolLM2's shapes, no weights needed to check them
    assert (shape.config.num_hidden_layers, shape.config.num_key_value_heads, shape.config.vocab_size) == (30, 3, 49152)
    with pytest.raises(ValueError, match="draft_init_layers"):
        distill.init_layers(config.with_overrides(draft_init_layers=(5,)), 3)
    with pytest.raises(ValueError, match="teacher must be one of"):
        distill.load_teacher("gpt-5", "cpu")


def test_steps_for_budget_scales_both_stages_together() -> None:
    config = zoo.SIZES["smollm2"]
    total = config.draft_steps + 3 * config.specialist_steps
    half = distill.steps_for_budget(config, step_seconds=1.0, budget_seconds=total / 2)
    assert (half.draft_steps, half.specialist_steps) == (config.draft_steps // 2, config.specialist_steps // 2)
    assert distill.steps_for_budget(config, 1.0, 1.0).draft_steps == 50  # a floor, never zero steps
    assert half.key("x") != config.key("x")  # the steps are part of the cache key
    assert half.feature_steps == 0  # no feature draft: nothing to scale
    features = zoo.SIZES["smollm2-features"]
    token_steps = features.draft_steps + 3 * features.specialist_steps
    both = distill.steps_for_budget(features, 1.0, (token_steps + 2 * features.feature_steps) / 2,
                                    feature_step_seconds=2.0)
    assert (both.draft_steps, both.specialist_steps, both.feature_steps) == (
        features.draft_steps // 2, features.specialist_steps // 2, features.feature_steps // 2)


def test_a_feature_draft_step_is_timed_for_the_budget() -> None:
    config = zoo.SIZES["micro-distill-features"].with_overrides(draft_batch_size=2, context=16)
    teacher, _ = distill.load_teacher("tiny", "cpu")
    assert distill.seconds_per_step(config, teacher, torch.device("cpu"), steps=2, features=True) > 0


def test_distillation_lowers_the_kl_on_held_out_windows() -> None:
    config = zoo.SIZES["micro-distill"].with_overrides(draft_batch_size=8, context=32)
    teacher, tokenizer = distill.load_teacher("tiny", "cpu")
    texts = corpora.assemble(40_000, ("python",))["python"]
    train = zoo.encode_text(tokenizer, texts.train_text)
    held = zoo.sample_batch([zoo.encode_text(tokenizer, texts.heldout_text)], 16, 32,
                            torch.Generator().manual_seed(1))[:, :-1]
    draft = models.draft_from_teacher(teacher, (0,))

    def kl() -> float:
        with torch.no_grad():
            return float(distill.forward_kl(teacher(input_ids=held).logits, draft(input_ids=held).logits))

    before = kl()
    losses = distill.distill_model(draft, teacher, [train], 60, config, 1e-2, 0, torch.device("cpu"), "t",
                                   progress=False)
    assert len(losses) == 60 and losses[-1] < losses[0]
    assert kl() < 0.8 * before
    assert torch.equal(draft.model.embed_tokens.weight, teacher.model.embed_tokens.weight)  # stayed frozen


def test_micro_distill_zoo_builds_deterministically_and_loads_the_teacher_as_target(micro_cache: Path) -> None:
    loaded = zoo.load_zoo("micro-distill", device="cpu", progress=False)
    manifest = loaded.manifest
    assert manifest["config"]["teacher"] == "tiny" and "target" not in {p.split("/")[0] for p in manifest["files"]}
    assert manifest["models"]["target"]["teacher"] == "tiny"
    assert manifest["models"]["draft-general"]["initialised_from"] == "tiny layers [2]"
    assert manifest["models"]["draft-python"]["initialised_from"] == "draft-general"
    for name, info in manifest["models"].items():  # each draft's temperature is fitted and folded in
        if name != "target":
            fit = info["calibration"]
            assert fit["temperature"] in distill.TEMPERATURE_GRID
            assert fit["sum_min_t1_by_temperature"][str(fit["temperature"])] >= fit["sum_min_t1_by_temperature"]["1.0"]
            assert (fit["uncalibrated_weights_sha256"] == info["weights_sha256"]) == (fit["temperature"] == 1.0)
    from experiments import zoo as zoo_experiments

    shown = zoo_experiments.info("micro-distill")  # `flashspec zoo info` says which temperature each draft holds
    fitted = manifest["models"]["draft-general"]["calibration"]["temperature"]
    assert f"temperature {fitted:.2f} folded in" in shown and "not built" not in shown
    teacher, tokenizer = distill.load_teacher("tiny", "cpu")
    assert torch.equal(loaded.target.model.embed_tokens.weight, teacher.model.embed_tokens.weight)
    assert loaded.tokenizer.get_vocab() == tokenizer.get_vocab()
    assert list(loaded.drafts) == ["python", "prose", "cpp", "general"]
    again = zoo.build_zoo("micro-distill", micro_cache / "again", device="cpu", progress=False)
    rebuilt = json.loads((again / zoo.MANIFEST).read_text())
    assert {n: m["weights_sha256"] for n, m in rebuilt["models"].items() if n != "target"} == {
        n: m["weights_sha256"] for n, m in manifest["models"].items() if n != "target"}


def test_cache_keys_keep_from_scratch_sizes_and_version_distillation(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashspec_lab.zoo import config as zoo_config

    scratch = {"cpu": "83f6a7091edc8e59", "gpu": "69cc6f497e355e32", "micro": "caf3c2a284771c1e"}

    def keys() -> dict[str, str]:
        return {size: config.key("x") for size, config in zoo.SIZES.items()}

    # sizes trained from scratch keep their keys, so their cached zoos stay valid (the cpu zoo built on the
    # H200 as in results/zoo_cpu_build.json included)
    assert {size: key for size, key in keys().items() if not zoo.SIZES[size].distilled} == scratch
    assert zoo.SIZES["cpu"].key("680c0c5cad9b29f4d8ff85e09f69324b9a848cac88c4882af486487445b92d33") == \
        "84fe308e96791685"
    # the smollm2 pool on the H200's corpus no longer has the key of the pool distilled by the first recipe
    assert zoo.SIZES["smollm2"].key("21aa20ee0c78b707b3643c8317822c4c5c3ae19abb91f2fdb45f4a15fe894fe4") != \
        "842eb7c0cf8e58fd"
    # the recipe's version is in every distilled key and in no from-scratch key
    before = keys()
    monkeypatch.setattr(zoo_config, "DISTILL_RECIPE", zoo_config.DISTILL_RECIPE + 1)
    after = keys()
    assert {size for size in before if before[size] != after[size]} == {
        size for size, config in zoo.SIZES.items() if config.distilled} == {
        "smollm2", "micro-distill", "smollm2-features", "micro-distill-features"}
    # the feature draft's recipe only in the keys of calibrated configs with one
    monkeypatch.setattr(zoo_config, "FEATURE_RECIPE", zoo_config.FEATURE_RECIPE + 1)
    assert {size for size, key in keys().items() if key != after[size]} == {"smollm2-features",
                                                                             "micro-distill-features"}


def test_a_gpu_pool_refuses_to_build_on_a_cpu_by_default(micro_cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from experiments import zoo as zoo_cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = zoo.SIZES["smollm2"].with_overrides(train_chars_per_domain=20_000)
    with pytest.raises(ValueError, match="needs a CUDA GPU.*--device cpu"):
        zoo.build_zoo(config, micro_cache / "never", progress=False)
    assert not (micro_cache / "never").exists()
    monkeypatch.setattr(zoo_cli.zoo, "zoo_dir", lambda *a, **k: zoo.build_zoo(config, micro_cache / "x", progress=False))
    assert zoo_cli.main(["build", "--size", "smollm2"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_real_pool_keeps_the_contestants_a_failed_or_cut_part_finished(micro_cache: Path, tmp_path: Path) -> None:
    """The adaptive-γ part writes each contestant as it finishes, marked partial: a device call cut by its time
    limit keeps them, and a failure records its error beside them."""
    from experiments import real_pool

    out = tmp_path / "pool.json"
    real_pool.main(["--size", "micro-distill", "--out", str(out), "--requests", "2", "--block", "1", "--new-tokens", "4",
                    "--device", "cpu", "--gammas", "2", "--parts", "adaptive_gamma",
                    "--gamma-policies", "thompson", "no-such-policy"])
    part = json.loads(out.read_text())["results"]["adaptive_gamma"]
    assert part["partial"] is True and list(part["fixed"]) == ["2"] and list(part["adaptive_by_policy"]) == ["thompson"]
    assert "no-such-policy" in part["error"]
    with pytest.raises(SystemExit):  # a suffix other than ":per-arm" is refused before anything runs
        real_pool.main(["--size", "micro-distill", "--out", str(out), "--gamma-policies", "gamma-ts:shared"])
    for fixed in ("gamma-ts@3", "gamma-ts@", "gamma-ts@two"):  # a fixed γ must be one of --gammas
        with pytest.raises(SystemExit):
            real_pool.main(["--size", "micro-distill", "--out", str(out), "--gammas", "2", "4",
                            "--gamma-policies", fixed])
    assert real_pool.gamma_policy("gamma-ts@2:per-arm") == ("gamma-ts", True, 2)
    assert real_pool.gamma_policy("thompson") == ("thompson", False, None)


def test_real_pool_speed_part_with_prompt_lookup(micro_cache: Path, tmp_path: Path) -> None:
    """--prompt-lookup: the choosing contestants draw from the pool plus prompt lookup, prompt lookup is timed
    alone, and each choosing contestant records which draft served each domain."""
    from experiments import real_pool

    out = tmp_path / "pool.json"
    assert real_pool.main(["--size", "micro-distill", "--out", str(out), "--requests", "2", "--block", "1",
                           "--new-tokens", "6", "--repeats", "1", "--device", "cpu", "--parts", "speed",
                           "--speed-gammas", "2", "4", "--speed-adaptive-gammas", "2", "4", "--prompt-lookup"]) == 0
    speed = json.loads(out.read_text())["results"]["speed"]
    assert "error" not in speed and speed["prompt_lookup"] is True
    for label in ("greedy", "t1"):
        entry = speed[label]
        assert entry["pool"] == ["python", "prose", "cpp", "general", "prompt-lookup"]
        alone = entry["prompt_lookup_alone"]
        assert alone["gamma"] == 4 and len(alone["ratio_per_round"]["runs"]) == 1 and alone["graph_captures"] == [0]
        assert entry["breakdown_last_round"]["prompt_lookup"]["switches"] == 0
        chosen = entry["draft_share_per_domain_last_round"]
        assert set(chosen) == {"gamma2", "gamma4", "adaptive"}
        for per_domain in chosen.values():
            assert set(per_domain) <= {"python", "prose", "cpp"}
            for shares in per_domain.values():
                assert set(shares) <= set(entry["pool"]) and abs(sum(shares.values()) - 1) < 1e-9
    assert speed["greedy"]["greedy_token_agreement_by_gamma"] == {"2": 1.0, "4": 1.0}  # float32 on a CPU: exact
    assert speed["greedy"]["adaptive"]["greedy_token_agreement_with_plain"] == 1.0
    assert speed["greedy"]["one_draft"]["greedy_token_agreement_with_plain"] == 1.0


@pytest.mark.parametrize("named, drafts", [([], ["python", "prose", "cpp", "general"]),
                                           (["general", "prompt-lookup"], ["general", "prompt-lookup"])],
                         ids=["every-draft", "named"])
def test_real_pool_speed_part_with_the_paths_decoder(micro_cache: Path, tmp_path: Path, named: list[str],
                                                     drafts: list[str]) -> None:
    """--paths: the paths decoder (every draft's chain verified together, or those of --paths-drafts in their
    order) is warmed up and timed beside the others at both temperatures, with its drafts named; a name outside
    the pool is refused before anything runs."""
    from experiments import real_pool

    out = tmp_path / "pool.json"
    common = ["--size", "micro-distill", "--out", str(out), "--requests", "2", "--block", "1", "--new-tokens", "6",
              "--repeats", "1", "--device", "cpu", "--parts", "speed", "--speed-adaptive-gammas", "2", "--gamma", "2",
              "--paths"]
    with pytest.raises(SystemExit, match="--paths-drafts must name distinct drafts"):
        real_pool.main([*common, "--paths-drafts", "general", "general"])
    assert real_pool.main([*common, *(["--paths-drafts", *named] if named else [])]) == 0
    speed = json.loads(out.read_text())["results"]["speed"]
    assert "error" not in speed
    for label in ("greedy", "t1"):
        entry = speed[label]
        assert "paths" in entry["warm_up_s"] and entry["paths"]["drafts"] == drafts
        assert entry["paths"]["gamma"] == 2 and len(entry["paths"]["ratio_per_round"]["runs"]) == 1
        assert entry["breakdown_last_round"]["paths"]["tokens_per_step"] >= 1.0


def test_real_pool_speed_part_at_one_temperature_with_plain_as_an_arm(micro_cache: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--speed-temperatures 1 runs T = 1 alone; the adaptive contestant's γ may be 0 (plain decoding as an arm),
    under both verify methods; each contestant's warm-up time is recorded, and a part cut mid-way keeps the
    warm-ups it finished beside its error."""
    from experiments import real_pool

    out = tmp_path / "pool.json"
    argv = ["--size", "micro-distill", "--out", str(out), "--requests", "2", "--block", "1", "--new-tokens", "6",
            "--repeats", "1", "--device", "cpu", "--parts", "speed", "--speed-temperatures", "1",
            "--speed-adaptive-gammas", "0", "2", "--gamma", "2", "--verify-methods", "token", "block"]
    assert real_pool.main(argv) == 0
    results = json.loads(out.read_text())["results"]
    for key in ("speed", "speed[block]"):
        assert "error" not in results[key] and set(results[key]) >= {"t1"} and "greedy" not in results[key]
        entry = results[key]["t1"]
        assert set(entry["warm_up_s"]) == {"fast_plain", "gamma2", "one_draft", "adaptive", "adaptive_capture_all"}
        assert entry["adaptive"]["gammas"] == [0, 2] and "partial" not in entry
        # the shipped policy bounds its loss against plain decoding; what it believed each arm costs is kept
        assert entry["adaptive"]["budget"] == bandits.AUTO_BUDGET
        assert set(entry["adaptive"]["cost_estimates_last_round"]["stay_ms"]) >= {"plain"}
    served = real_pool.stream
    calls = []

    def cut(*args, **kwargs):  # the third stream (the first speculative contestant's warm-up after γ = 2) fails
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("cut here")
        return served(*args, **kwargs)
    monkeypatch.setattr(real_pool, "stream", cut)
    real_pool.main(argv[:-1])
    speed = json.loads(out.read_text())["results"]["speed"]
    assert "cut here" in speed["error"] and speed["t1"]["partial"] is True
    assert set(speed["t1"]["warm_up_s"]) == {"fast_plain", "gamma2"}


def test_real_pool_experiment_runs_end_to_end_on_tiny_shapes(micro_cache: Path, tmp_path: Path) -> None:
    from experiments import real_pool

    out = tmp_path / "pool.json"
    assert real_pool.main(["--size", "micro-distill", "--out", str(out), "--requests", "4", "--block", "2",
                           "--new-tokens", "6", "--repeats", "1", "--device", "cpu", "--gammas", "2", "4",
                           "--train-budget-s", "0.5", "--gamma-policies", "thompson", "gamma-ts",
                           "gamma-ts:per-arm", "gamma-ts@2"]) == 0
    results = json.loads(out.read_text())["results"]
    fitted = results["build"]["fitted_to_budget"]
    assert fitted["seconds_per_step"] > 0 and results["build"]["config"]["draft_steps"] == fitted["draft_steps"]
    for name in ("build", "quality", "switching", "speed", "adaptive_gamma"):
        assert name in results and "error" not in results[name], (name, results.get(name))
    # every timed stream records the graphs captured inside it (none on a CPU, which runs without graphs)
    assert results["speed"]["t1"]["by_gamma"]["4"]["graph_captures"] == [0]
    assert results["adaptive_gamma"]["adaptive"]["graph_captures"] == 0
    by_policy = results["adaptive_gamma"]["adaptive_by_policy"]
    assert list(by_policy) == ["thompson", "gamma-ts", "gamma-ts:per-arm", "gamma-ts@2"]
    # gamma-ts over the drafts alone at γ = 2, on that γ's decoder: every step at γ = 2, each draft its own arm
    at_two = by_policy.pop("gamma-ts@2")
    assert set(at_two["step_ms_by_gamma"]) == {"2"} and at_two["vs_best_fixed"] > 0
    assert all(set(per) == {"2"} for per in at_two["gamma_share_per_domain"].values())
    assert sorted(at_two["cost_estimates"]["all_ms"]) == sorted(f"{draft}@γ=2" for draft in
                                                                ("python", "prose", "cpp", "general"))
    assert by_policy["thompson"] == results["adaptive_gamma"]["adaptive"]
    assert all(run["graph_captures"] == 0 and run["vs_best_fixed"] > 0 for run in by_policy.values())
    assert {run["graph_captures"] for run in results["switching"]["blocks"]["runs"].values()} == {0}
    assert results["speed"]["greedy"]["greedy_token_agreement_with_plain"] == 1.0  # float32 on a CPU: exact
    # where each method's stream time went: prefills + steps + the rest of generate add up, the steps made the tokens
    speed = results["speed"]["t1"]
    assert speed["one_draft"]["draft"] == "general" and len(speed["one_draft"]["ratio_per_round"]["runs"]) == 1
    for method, parts in speed["breakdown_last_round"].items():
        assert abs(parts["prefill_s"] + parts["steps_s"] + parts["rest_s"] - parts["generate_s"]) < 1e-9, method
        assert parts["steps"] > 0 and parts["tokens_per_step"] >= 1.0, method
    assert speed["breakdown_last_round"]["one_draft"]["switches"] == 0
    adaptive = speed["adaptive"]
    assert adaptive["policy"] == "gamma-ts" and adaptive["graph_captures"] == [0]
    assert len(adaptive["ratio_per_round"]["runs"]) == 1 and results["speed"]["greedy"]["adaptive"][
        "greedy_token_agreement_with_plain"] == 1.0
    assert all(abs(sum(per.values()) - 1) < 1e-9 for per in adaptive["gamma_share_per_domain_last_round"].values())
    assert set(results["quality"]["acceptance_greedy"]) == {"python", "prose", "cpp", "general"}
    shares = results["adaptive_gamma"]["adaptive"]["gamma_share_per_domain"]
    assert all(abs(sum(per.values()) - 1) < 1e-9 for per in shares.values())
    # each contestant's measured step times per γ, and what gamma-ts's cost source held at the end
    gamma_part = results["adaptive_gamma"]
    for gamma, run in gamma_part["fixed"].items():
        assert run["step_ms"]["steps"] > 0 and 0 < run["step_ms"]["median_ms"] <= run["step_ms"]["p90_ms"], gamma
    for run in by_policy.values():
        assert set(run["step_ms_by_gamma"]) <= {"2", "4"} and sum(
            row["steps"] for row in run["step_ms_by_gamma"].values()) > 0
    estimates = by_policy["gamma-ts"]["cost_estimates"]
    assert len(estimates["all_ms"]) == 8 and {key.split("@")[1] for key in estimates["all_ms"]} == {"γ=2", "γ=4"}
    # the four distilled drafts share one architecture: each γ's arms share one cost group and its estimates
    groups = estimates["cost_group"]
    assert all(number == (0 if key.endswith("γ=2") else 1) for key, number in groups.items()), groups
    assert all(estimates["all_ms"][key] == estimates["all_ms"][first] for key in groups
               for first in groups if groups[first] == groups[key])
    # the same policy with per-arm costs (the cost model before sharing): every arm a group of its own
    per_arm = by_policy["gamma-ts:per-arm"]["cost_estimates"]["cost_group"]
    assert sorted(per_arm.values()) == list(range(8)), per_arm
    assert all(ms is None or ms > 0 for kind in ("all_ms", "stay_ms", "switch_ms") for ms in estimates[kind].values())
    # every stream step fed the estimates (the warm-up's measurements were put back before timing)
    assert sum(estimates["steps"]["all"].values()) >= sum(row["steps"] for row in by_policy["gamma-ts"]["step_ms_by_gamma"].values())
    assert estimates["log_spread"] is None or estimates["log_spread"] >= 0


def test_feature_draft_probe_runs_end_to_end(tmp_path: Path) -> None:
    """experiments/feature_draft_probe.py on the tiny teacher: the tokens-per-step arithmetic, and a short run
    of a top-state draft and a several-state draft trained on its own outputs."""
    from experiments import feature_draft_probe as probe

    assert probe.expected_tokens([0.5, 0.4], 2) == pytest.approx(1 + 0.5 + 0.5 * 0.4)
    assert probe.expected_tokens([0.5, 0.4], 4) == probe.expected_tokens([0.5, 0.4], 2)  # only the depths measured

    out = tmp_path / "probe.json"
    probe.main(["--out", str(out), "--teacher", "tiny", "--size", "micro-distill", "--budget-s", "0.3",
                "--train-chars", "40000", "--eval-tokens", "128", "--depth", "2", "--ttt", "2",
                "--variants", "2", "2:1,2,-1"])
    record = json.loads(out.read_text())
    assert record["provenance"]["command"].startswith("python experiments/feature_draft_probe.py --out ")
    variants = record["results"]["variants"]
    assert [v["feature_layers"] for v in variants.values()] == [[-1], [1, 2, -1]]
    for variant in variants.values():
        assert variant["training"]["steps"] > 0
        for domain, measured in variant["acceptance"].items():
            for depth in ("1", "2"):
                assert 0.0 <= measured[depth]["sum_min_t1"] <= 1.0 and measured[depth]["positions"] > 0
            assert 1.0 <= measured["expected_tokens_t1"]["2"] <= 3.0
