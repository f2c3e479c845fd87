"""Model helpers: KV-cache cropping, the cache keyword, tokenizer checks, loading (flashspec.models)."""
from __future__ import annotations

import copy
import inspect

import pytest
import torch

from flashspec import models


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
    assert models.cache_keyword(target) in inspect.signature(target.forward).parameters

    class OldStyle(torch.nn.Module):
        def forward(self, input_ids=None, past_key_values=None, **kwargs):
            return input_ids

    assert models.cache_keyword(OldStyle()) == "past_key_values"


def test_tokenizer_mismatch_is_rejected(target):
    tokenizer = models.char_tokenizer()
    different = copy.deepcopy(tokenizer)
    different.add_tokens(["<extra>"])
    models.check_compatible(target, target, tokenizer, tokenizer)
    with pytest.raises(ValueError, match="tokenizer vocabulary differs"):
        models.check_compatible(target, target, tokenizer, different)


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


def test_load_model_onto_a_device_this_torch_lacks_fails_before_reading(tmp_path, draft, monkeypatch):
    """A CPU-only torch asked for CUDA: one ValueError naming `device`, what there is and the fix, raised before
    the checkpoint is read (not transformers' AssertionError after loading it)."""
    import transformers

    draft.save_pretrained(tmp_path / "draft")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *args, **kwargs: pytest.fail("the checkpoint was read"))
    with pytest.raises(ValueError) as caught:
        models.load_model(str(tmp_path / "draft"), device="cuda")
    message = str(caught.value)
    assert message.startswith("device='cuda' is not available") and "no CUDA" in message
    assert "this machine has: cpu" in message and "device='cpu'" in message


@pytest.mark.parametrize("device, expected", [
    ("cuda:1", r"device='cuda:1' is not available: only 1 CUDA device is visible.*cuda:0.*device='cuda:0'"),
    ("gpu", r"device='gpu' is not a torch device.*'cpu', 'cuda' or 'cuda:0'"),
    (3.5, r"device=3.5 is not a torch device"),
])
def test_resolve_device_names_the_argument_and_the_fix(monkeypatch, device, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=expected):
        models.resolve_device(device)


def test_resolve_device_defaults_to_cuda_where_there_is_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert models.resolve_device(None) == torch.device("cpu")
    assert models.resolve_device("cpu") == models.resolve_device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert models.resolve_device(None) == torch.device("cuda")
    assert models.resolve_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize("capability, expected", [((7, 5), torch.float16), ((7, 0), torch.float16),
                                                  ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_half_precision_is_fp16_where_bf16_would_be_emulated(monkeypatch, capability, expected):
    """A T4 (compute capability 7.5) emulates bf16, and `torch.cuda.is_bf16_supported()` says True there (it
    counts emulation): the capability decides, for the NF4 compute dtype too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)  # what a T4 answers
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert models.half_dtype() == expected
    assert models.half_dtype("cuda:0") == expected
    assert models.nf4_compute_dtype() == expected
    assert models.half_dtype("cpu") == torch.bfloat16
