"""An NF4 target (bitsandbytes 4-bit weights in the decoder layers) on the fast path: `LlamaRunner`
logits equal the quantized model's own HF logits through left-padded prefill, decode and verify
calls, and fast plain and fast speculative greedy decoding equal its HF greedy `generate` token for
token. On the CPU this runs bitsandbytes' CPU 4-bit backend (skipped where it has none); on a GPU the
same steps are captured in CUDA graphs, which only the GPU test exercises."""
from __future__ import annotations

import pytest
import torch

import flashspec as fs
from flashspec import models
from flashspec.drafters import PromptLookupDrafter
from flashspec.fast import FastPlainDecoder, FastSpeculativeDecoder
from flashspec.runner import LlamaRunner, bucket_for

pytest.importorskip("bitsandbytes", reason="NF4 needs bitsandbytes (`pip install flashspec[nf4]`)")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
UNAVAILABLE = models.nf4_unavailable_reason(DEVICE)
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"NF4 unavailable on {DEVICE}: {UNAVAILABLE}")

VOCAB = 64
MAX_LEN = 40
PROMPTS = torch.tensor([[0, 0, 5, 6, 7, 9], [0, 3, 7, 3, 9, 11], [4, 8, 15, 16, 23, 42]])
MASK = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])


@pytest.fixture(scope="module")
def nf4_target() -> torch.nn.Module:
    """A tiny GQA Llama (hidden 64: one bitsandbytes block per row) reloaded with NF4 weights and fp32
    compute (on a GPU too), so the runner and HF differ only in summation order, not in bf16 rounding."""
    config = models.llama_config(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                 intermediate_size=128, max_positions=64, initializer_range=0.3)
    dense = models.model_from_config(config, seed=3)
    quantized = models.quantize_nf4(dense, device=DEVICE, compute_dtype=torch.float32)
    assert models.is_nf4(quantized) and not models.is_nf4(dense)
    return quantized


def hf_logits(model: torch.nn.Module, sequence: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([sequence], device=DEVICE)).logits[0].float()


def test_runner_logits_equal_the_quantized_models_own(nf4_target):
    """Prefill (left-padded, 3 rows), one decode step and one 3-token verify call: each row's logits
    equal HF's on its compact sequence (fp32 compute; a GPU's attention kernels sum in another order)."""
    tol = 1e-4 if DEVICE == "cpu" else 1e-3
    runner = LlamaRunner(nf4_target, max_batch=3, max_len=MAX_LEN, logits_dtype=torch.float32)
    last, lengths = runner.prefill(PROMPTS.to(DEVICE), MASK.to(DEVICE))
    rows = [row[mask.bool()].tolist() for row, mask in zip(PROMPTS, MASK)]
    for r, row in enumerate(rows):
        torch.testing.assert_close(last[r], hf_logits(nf4_target, row)[-1], atol=tol, rtol=0)
    extra = torch.tensor([[10, 12, 14], [20, 22, 24], [30, 32, 34]], device=DEVICE)
    positions = lengths[:, None] + torch.arange(3, device=DEVICE)
    decode = runner.forward(extra[:, :1], positions[:, :1], bucket_for(int(positions.max()) + 1, MAX_LEN))
    verify = runner.forward(extra, positions, bucket_for(int(positions.max()) + 1, MAX_LEN))
    for r, row in enumerate(rows):
        expected = hf_logits(nf4_target, row + extra[r].tolist())[-3:]
        torch.testing.assert_close(decode[r, 0], expected[0], atol=tol, rtol=0)
        torch.testing.assert_close(verify[r], expected, atol=tol, rtol=0)


def test_fast_plain_and_speculative_greedy_equal_generate(nf4_target):
    """Greedy fast plain decoding and greedy speculative decoding (an unquantized draft + prompt
    lookup) emit exactly the NF4 target's own greedy tokens (graphs on a GPU, eager steps on the CPU)."""
    dtype = next(nf4_target.model.embed_tokens.parameters()).dtype
    draft = models.tiny_llama(vocab_size=VOCAB, hidden_size=16, num_layers=1, initializer_range=0.3, seed=2,
                              dtype=dtype, device=DEVICE)
    prompts, mask = PROMPTS.to(DEVICE), MASK.to(DEVICE)
    expected = nf4_target.generate(prompts, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                   eos_token_id=2, pad_token_id=2)
    greedy = fs.SamplingParams(0.0)
    plain = FastPlainDecoder(nf4_target).generate(prompts, attention_mask=mask, max_new_tokens=12, sampling=greedy)
    assert torch.equal(plain.sequences, expected.cpu())
    speculative = FastSpeculativeDecoder(nf4_target, [draft, PromptLookupDrafter()], policy="exp3", gamma=3)
    result = speculative.generate(prompts, attention_mask=mask, max_new_tokens=12, sampling=greedy)
    assert torch.equal(result.sequences, expected.cpu())
    sampled = speculative.generate(prompts, attention_mask=mask, max_new_tokens=12, seed=1, ignore_eos=True)
    assert sampled.num_generated.tolist() == [12, 12, 12]


def test_graphs_false_runs_the_same_steps_eagerly(nf4_target):
    """graphs=False (the fallback when a kernel cannot be captured) is accepted on any device and
    gives the same greedy tokens."""
    prompts, mask = PROMPTS.to(DEVICE), MASK.to(DEVICE)
    greedy = fs.SamplingParams(0.0)
    graphs = FastPlainDecoder(nf4_target).generate(prompts, attention_mask=mask, max_new_tokens=6, sampling=greedy)
    eager = FastPlainDecoder(nf4_target, graphs=False).generate(prompts, attention_mask=mask, max_new_tokens=6,
                                                                sampling=greedy)
    assert torch.equal(graphs.sequences, eager.sequences)


def test_a_quantized_embedding_is_refused_with_a_reason(nf4_target):
    """The runner takes the cache's dtype from the embedding: a non-float embedding is refused up front."""
    import copy

    from flashspec.runner import unsupported_reason

    assert unsupported_reason(nf4_target) is None
    packed = copy.deepcopy(nf4_target)
    weight = packed.model.embed_tokens.weight
    packed.model.embed_tokens.weight = torch.nn.Parameter(weight.detach().to(torch.uint8), requires_grad=False)
    assert "embedding" in unsupported_reason(packed)
    with pytest.raises(ValueError, match="embedding"):
        FastPlainDecoder(packed)


def test_bench_fast_nf4_smoke_writes_fast_methods_with_step_traces(tmp_path):
    """`bench_fast.py --smoke --quantization nf4` (the fast methods only) records the NF4 target, tok/s,
    step p50/p99 and cold/warm latency traces."""
    import json

    from experiments import bench_fast

    out = tmp_path / "nf4.json"
    skip = ["hf_plain", "hf_assisted", "flashspec_eager", "fast_speculative_sync_all", "fast_speculative_one_draft"]
    assert bench_fast.main(["--smoke", "--quantization", "nf4", "--skip", *skip, "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert results["quantization"]["scheme"] == "nf4" and results["quantization"]["linear4bit_layers"] > 0
    methods = results["cells"][0]["methods"]
    assert set(methods) == {"fast_plain", "fast_speculative"}
    for entry in methods.values():
        assert entry["tok_s_median"] > 0 and entry["p99_step_ms"] >= entry["p50_step_ms"] > 0
        assert set(entry["latency_trace"]) == {"cold", "warm"} and entry["latency_trace"]["warm"]["slowest"]
