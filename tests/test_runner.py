"""LlamaRunner: static-cache logits equal HF's eager forward on each row's compact sequence, through
left-padded prefill, decode, verify steps and rolled-back speculative slots; greedy decoding equals
`generate`; the bucket does not change the result; unsupported models fail clearly."""
from __future__ import annotations

import pytest
import torch

from flashspec import models
from flashspec.runner import GraphedStep, LlamaRunner, bucket_for, check_supported, supports

VOCAB = 48
MAX_LEN = 40
TOL = 1e-5


def _seeded(build, seed: int = 0) -> torch.nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()


def llama(rope: dict | None = None, tied: bool = False, kv_heads: int | None = 2, **overrides) -> torch.nn.Module:
    config = models.llama_config(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=kv_heads,
                                 intermediate_size=64, max_positions=64, initializer_range=0.3, **overrides)
    if rope is not None:
        config.rope_parameters = {"rope_theta": 10000.0, **rope}
    config.tie_word_embeddings = tied
    return models.model_from_config(config, seed=3)


def qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         initializer_range=0.3, tie_word_embeddings=False)
    return _seeded(lambda: Qwen2ForCausalLM(config))


def mistral(window: int | None = 4096) -> torch.nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
                           initializer_range=0.3, sliding_window=window)
    return _seeded(lambda: MistralForCausalLM(config))


BUILDERS = {
    "gqa": lambda: llama(),
    "mha-tied": lambda: llama(tied=True, kv_heads=None),
    "llama3-rope": lambda: llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "linear-rope": lambda: llama({"rope_type": "linear", "factor": 2.0}),
    "dynamic-rope": lambda: llama({"rope_type": "dynamic", "factor": 2.0}),
    "yarn-rope": lambda: llama({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    "qwen2-bias": qwen2,
    "mistral": mistral,
}


@pytest.fixture(scope="module", params=list(BUILDERS))
def model(request):
    return BUILDERS[request.param]()


def hf_logits(model: torch.nn.Module, sequence: list[int]) -> torch.Tensor:
    """HF eager logits [len, V] of one compact (unpadded) sequence."""
    with torch.no_grad():
        device = next(model.parameters()).device
        return model(input_ids=torch.tensor([sequence], device=device)).logits[0]


def left_pad(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = torch.tensor(row)
        mask[r, width - len(row):] = 1
    return ids, mask


def random_rows(lengths: list[int], seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def max_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference, relative to the largest |b| (and absolute below 1): float32 GEMMs round differently
    with the CPU's kernels (AVX2 against AVX-512) and the number of rows, by a few ulps of the logits' scale."""
    return float((a.float() - b.float()).abs().max()) / max(1.0, float(b.float().abs().max()))


# ------------------------------------------------------------------------------------------ logits


def test_configurations_build_what_they_claim():
    tied = BUILDERS["mha-tied"]()
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert BUILDERS["llama3-rope"]().config.rope_parameters["rope_type"] == "llama3"
    assert BUILDERS["yarn-rope"]().model.rotary_emb.attention_scaling != 1.0
    assert BUILDERS["qwen2-bias"]().model.layers[0].self_attn.q_proj.bias is not None
    gqa = BUILDERS["gqa"]().config
    assert gqa.num_key_value_heads < gqa.num_attention_heads


def check_against_hf(model: torch.nn.Module, graphed: bool = False, tol: float = TOL, attention: str = "auto",
                     graphed_prefill: bool | None = None, **options) -> LlamaRunner:
    """Rows of different lengths; q=1 decode steps and q=4 verify steps that keep only part of what
    they wrote (the rest is stale until overwritten). Every step's logits equal HF on each row's
    compact sequence. `graphed` runs the steps through `GraphedStep`s (CUDA graphs on a GPU), and the
    prefill too unless `graphed_prefill` says otherwise: padded to its width bucket (9 -> 16), whose
    extra pad tokens write slots the steps later overwrite."""
    device = next(model.parameters()).device
    rows = random_rows([5, 9, 2], seed=1)
    runner = LlamaRunner(model, max_batch=3, max_len=MAX_LEN, attention=attention, **options)
    input_ids, mask = left_pad(rows)
    logits, lengths = runner.prefill(input_ids.to(device), mask.to(device),
                                     graphed=graphed if graphed_prefill is None else graphed_prefill)
    assert lengths.tolist() == [5, 9, 2]
    for r, row in enumerate(rows):
        assert max_error(logits[r], hf_logits(model, row)[-1]) <= tol
    generator = torch.Generator().manual_seed(2)
    schedule = [(1, [1, 1, 1]), (1, [1, 1, 1]), (4, [1, 3, 4]), (4, [2, 4, 1]), (1, [1, 1, 1]), (4, [4, 4, 4])]
    for q, keep in schedule:
        new = torch.randint(3, VOCAB, (3, q), generator=generator)
        starts = torch.tensor([len(row) for row in rows])
        positions = starts[:, None] + torch.arange(q)                  # [B, q]
        bucket = bucket_for(int(positions.max()) + 1, MAX_LEN)
        tokens, positions = new.to(device), positions.to(device)
        if graphed:
            out = runner.graphed(3, q, bucket)(tokens, positions)
        else:
            out = runner.forward(tokens, positions, bucket)
        assert out.shape == (3, q, VOCAB)
        for r, row in enumerate(rows):
            expected = hf_logits(model, row + new[r].tolist())[-q:]
            assert max_error(out[r], expected) <= tol, (q, keep, r)
            row.extend(new[r, : keep[r]].tolist())
    return runner


@pytest.mark.parametrize("graphed_prefill", [False, True])
def test_prefill_decode_verify_and_rollback_match_hf(model, graphed_prefill):
    """Eager, and with the prefill's padded graph shape (run eagerly off CUDA)."""
    check_against_hf(model, graphed_prefill=graphed_prefill)


def test_graphed_prefill_pads_to_its_bucket_and_is_memoised():
    model = BUILDERS["gqa"]()
    runner = LlamaRunner(model, max_batch=2, max_len=MAX_LEN)
    rows = random_rows([3, 7], seed=11)
    eager, lengths = runner.prefill(*left_pad(rows))
    graphed, graphed_lengths = runner.prefill(*left_pad(rows), graphed=True)
    assert torch.equal(lengths, graphed_lengths) and runner.captures == 1
    assert max_error(graphed, eager) <= 1e-5
    step = runner.prefill_graph(2, bucket_for(7, MAX_LEN))
    assert step.tokens.shape == (2, 16) and runner.captures == 1    # the same graph, not a second one
    assert step.tokens[0, 3:].eq(0).all() and step.tokens[1, 7:].eq(0).all()  # pads after each row's tokens
    assert step.index[:, 0].tolist() == [2, 6]                        # the head reads each row's last token
    runner.prefill(*left_pad(random_rows([5, 12], seed=12)), graphed=True)   # width 12: the same bucket
    assert runner.captures == 1
    runner.prefill(*left_pad(random_rows([20, 3], seed=13)), graphed=True)   # width 20: a new one
    assert runner.captures == 2
    with pytest.raises(ValueError, match="logits_index"):
        step(step.tokens, step.positions)


def test_whole_forward_compile_matches_hf():
    """compile_scope="forward" (the default scope): the q=1 decode and q=4 verify forwards each compiled as
    one graph over the whole cache, q/k/v (with Qwen2's biases) and gate/up each one matmul: every step still
    equals HF, and HF's own forward reads the stacked weights through views (no second copy)."""
    from torch._dynamo.utils import counters

    model = BUILDERS["qwen2-bias"]()
    before = {name: parameter.clone() for name, parameter in model.named_parameters()}
    graphs = counters["stats"]["unique_graphs"]
    runner = check_against_hf(model, compile=True, compile_lengths=(1, 4))
    assert counters["stats"]["unique_graphs"] - graphs == 2, "one graph per compiled query length"
    attn, mlp, fused = model.model.layers[1].self_attn, model.model.layers[1].mlp, runner.fused[1]
    assert all(fused is not None for fused in runner.fused)
    assert attn.k_proj.weight.data_ptr() == fused.qkv[attn.q_proj.weight.shape[0]:].data_ptr()
    assert attn.v_proj.bias.data_ptr() == fused.qkv_bias[-attn.v_proj.bias.shape[0]:].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == fused.gate_up[mlp.gate_proj.weight.shape[0]:].data_ptr()
    assert all(torch.equal(parameter, before[name]) for name, parameter in model.named_parameters())
    with pytest.raises(ValueError, match="compile_scope must be one of"):
        LlamaRunner(model, max_batch=1, max_len=MAX_LEN, compile=True, compile_scope="model")


@pytest.mark.parametrize("attention", ["fold", "gqa"])
@pytest.mark.parametrize("name", ["gqa", "qwen2-bias"])
def test_both_attention_modes_match_hf(name, attention):
    """GQA folded into the query length, and SDPA's enable_gqa ("auto" picks per call shape)."""
    check_against_hf(BUILDERS[name](), attention=attention)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("attention", ["fold", "gqa"])
@pytest.mark.parametrize("name", ["gqa", "llama3-rope", "qwen2-bias"])
def test_cuda_graph_steps_match_hf(name, attention):
    """The same steps replayed from CUDA graphs (fp32 on the GPU; TF32 is off by default)."""
    check_against_hf(BUILDERS[name]().cuda(), graphed=True, tol=1e-4, attention=attention)


def test_bucket_does_not_change_logits():
    model = BUILDERS["gqa"]()
    runner = LlamaRunner(model, max_batch=2, max_len=MAX_LEN)
    rows = random_rows([3, 7], seed=4)
    _, lengths = runner.prefill(*left_pad(rows))
    tokens = torch.randint(3, VOCAB, (2, 4), generator=torch.Generator().manual_seed(5))
    positions = lengths[:, None] + torch.arange(4)
    smallest = bucket_for(int(positions.max()) + 1, MAX_LEN)
    results = [runner.forward(tokens, positions, bucket) for bucket in (smallest, 24, 32, MAX_LEN)]
    assert smallest == 16
    for other in results[1:]:
        assert max_error(results[0], other) <= 1e-6


def test_logits_index_and_dtype():
    model = BUILDERS["gqa"]()
    runner = LlamaRunner(model, max_batch=2, max_len=MAX_LEN, logits_dtype=torch.float64)
    tokens = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(6))
    positions = torch.arange(6).expand(2, 6)
    full = runner.forward(tokens, positions, 16)
    picked = runner.forward(tokens, positions, 16, logits_index=torch.tensor([[5], [2]]))
    assert full.dtype == picked.dtype == torch.float64
    assert max_error(picked[:, 0], torch.stack([full[0, 5], full[1, 2]])) <= 1e-6


def test_fewer_rows_than_the_cache():
    model = BUILDERS["gqa"]()
    runner = LlamaRunner(model, max_batch=4, max_len=MAX_LEN)
    row = random_rows([6], seed=7)[0]
    logits, _ = runner.prefill(torch.tensor([row]))
    assert max_error(logits[0], hf_logits(model, row)[-1]) <= TOL


def test_graphed_step_equals_forward_off_cuda():
    model = BUILDERS["gqa"]()
    runner = LlamaRunner(model, max_batch=2, max_len=MAX_LEN)
    rows = random_rows([4, 6], seed=8)
    _, lengths = runner.prefill(*left_pad(rows))
    step = runner.graphed(2, 3, 16)
    assert isinstance(step, GraphedStep) and runner.graphed(2, 3, 16) is step
    tokens = torch.randint(3, VOCAB, (2, 3), generator=torch.Generator().manual_seed(9))
    positions = lengths[:, None] + torch.arange(3)
    out = step(tokens, positions)
    for r, row in enumerate(rows):
        assert max_error(out[r], hf_logits(model, row + tokens[r].tolist())[-3:]) <= TOL


# ------------------------------------------------------------------------------------------ greedy


def test_greedy_loop_equals_generate():
    model = BUILDERS["gqa"]()
    rows = random_rows([5, 8, 3], seed=10)
    new_tokens = 12
    runner = LlamaRunner(model, max_batch=3, max_len=MAX_LEN)
    logits, lengths = runner.prefill(*left_pad(rows))
    token = logits.argmax(-1)                                          # [B]
    generated = [token]
    for step in range(new_tokens - 1):
        positions = (lengths + step)[:, None]                          # [B, 1]
        bucket = bucket_for(int(lengths.max()) + step + 1, MAX_LEN)
        token = runner.forward(token[:, None], positions, bucket)[:, -1].argmax(-1)
        generated.append(token)
    ours = torch.stack(generated, 1)
    for r, row in enumerate(rows):
        prompt = torch.tensor([row])
        reference = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ours[r].tolist() == reference[0, len(row):].tolist()


# ---------------------------------------------------------------------------------- buckets, errors


def test_bucket_for():
    assert [bucket_for(n, 2048) for n in (1, 16, 17, 100, 256, 257, 700, 2048)] == [16, 16, 32, 128, 256, 512, 768, 2048]
    assert bucket_for(18, 20) == 20
    with pytest.raises(ValueError, match="exceeds"):
        bucket_for(21, 20)


def test_unsupported_models_raise_clear_errors():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    assert not supports(gpt2)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        LlamaRunner(gpt2, 1, 16)
    with pytest.raises(ValueError, match="sliding-window"):
        LlamaRunner(mistral(window=8), 1, MAX_LEN)
    assert supports(mistral(window=8), max_len=8)
    with pytest.raises(ValueError, match="dynamic"):
        check_supported(llama({"rope_type": "dynamic", "factor": 2.0}), max_len=100)
    with pytest.raises(ValueError, match="attention must be one of"):
        LlamaRunner(BUILDERS["gqa"](), 1, MAX_LEN, attention="flash")


def test_prefill_rejects_right_padding():
    runner = LlamaRunner(BUILDERS["gqa"](), max_batch=2, max_len=MAX_LEN)
    ids = torch.tensor([[5, 6, 0], [7, 8, 9]])
    with pytest.raises(ValueError, match="left padding"):
        runner.prefill(ids, torch.tensor([[1, 1, 0], [1, 1, 1]]))


def test_bench_script_smoke(tmp_path):
    """experiments/bench_runner.py --smoke runs here and writes its JSON."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "experiments" / "bench_runner.py"
    spec = importlib.util.spec_from_file_location("bench_runner", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "smoke.json"
    assert bench.main(["--smoke", "--queries", "1", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    cells = result["results"]["cells"]["smoke"]["results"]
    assert [cell["q"] for cell in cells] == [1, 3]
    assert all(cell["check_eager_vs_hf"]["max_abs_error"] <= TOL for cell in cells)
    assert result["provenance"]["git_sha"] and result["provenance"]["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]


def test_capture_pauses_the_garbage_collector_and_restores_it(monkeypatch):
    """A collection inside a capture can free another (unreachable) graph, which invalidates the capture: the
    collector is off through the warm-up runs and the capture, and back on after, also when `fn` raises.
    CUDA's graph objects are stood in for, so this runs without a GPU."""
    import contextlib
    import gc

    from flashspec import runner

    class FakeStream:
        def wait_stream(self, other):
            pass

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: contextlib.nullcontext())
    seen = []
    graph, out = runner.capture(lambda: seen.append(gc.isenabled()) or len(seen), warmup=2)
    assert seen == [False, False, False] and out == 3 and gc.isenabled()

    def failing():
        raise RuntimeError("capture invalidated")

    with pytest.raises(RuntimeError, match="capture invalidated"):
        runner.capture(failing)
    assert gc.isenabled()
    gc.disable()
    try:
        runner.capture(lambda: None)
        assert not gc.isenabled()  # a collector the caller had off stays off
    finally:
        gc.enable()


# ------------------------------------------------------------------------------------------ token trees


@pytest.mark.parametrize("attention", ["fold", "gqa"])
def test_tree_forward_gives_each_paths_chain_logits_and_keep_path_leaves_its_cache(attention):
    """Two paths sharing their first drafted token (nodes 0-1-2-3 and 0-1-4-5, node 0 the pending token at
    position 6) in one forward: every node's logits are those of a chain forward of its path from the root, and
    after `keep_path` of the second path the cache holds what that path's chain forward wrote, so the next
    token's logits agree too, and so do the hidden states it keeps for drafts that read them. Two rows, a GQA
    model (both attention layouts)."""
    from flashspec.runner import TokenTree

    model = llama()
    rows = random_rows([6, 6], seed=4)
    ids, mask = left_pad(rows)
    tree = TokenTree([-1, 0, 1, 2, 1, 4])
    tokens = torch.randint(3, VOCAB, (2, len(tree)), generator=torch.Generator().manual_seed(5))
    root, bucket = torch.full((2,), 6), 16
    runner = LlamaRunner(model, max_batch=2, max_len=32, attention=attention, state_layers=(1, -1))
    runner.prefill(ids, mask)
    chains = {}
    for leaf in (3, 5):
        path = tree.path(leaf)
        positions = (root[:, None] + torch.arange(len(path))).long()
        chains[leaf] = runner.forward(tokens[:, path], positions, bucket)       # [2, 4, V]
    # what the second path's chain forward (the last one) left in slots 6..9
    saved = [(k[:2, :, 6:10].clone(), v[:2, :, 6:10].clone()) for k, v in zip(runner.cache.k, runner.cache.v)]
    saved_states = runner.states[:2, 6:10].clone()
    logits = runner.tree_forward(tokens, root, tree, bucket)                    # [2, 6, V]
    for leaf in (3, 5):
        assert max_error(logits[:, tree.path(leaf)], chains[leaf]) < 1e-5
    # the tree wrote node i's states at slot 6 + i: slots 8 and 9 now hold the first path's (nodes 2 and 3)
    assert max_error(runner.states[:2, 8:10], saved_states[:, 2:]) > 1e-3
    runner.keep_path(root, torch.tensor([tree.path(5)] * 2))
    for (k, v), (saved_k, saved_v) in zip(zip(runner.cache.k, runner.cache.v), saved):
        assert max_error(k[:2, :, 6:10], saved_k) < 1e-5 and max_error(v[:2, :, 6:10], saved_v) < 1e-5
    assert max_error(runner.states[:2, 6:10], saved_states) < 1e-5
    following = torch.full((2, 1), 7)
    kept = runner.forward(following, torch.full((2, 1), 10), bucket)
    chained = LlamaRunner(model, max_batch=2, max_len=32, attention=attention)
    chained.prefill(ids, mask)
    chained.forward(tokens[:, tree.path(5)], (root[:, None] + torch.arange(4)).long(), bucket)
    assert max_error(kept, chained.forward(following, torch.full((2, 1), 10), bucket)) < 1e-5


def test_a_tree_node_sees_its_ancestors_only():
    """Changing the tokens of one path leaves the other path's logits alone (siblings do not see each other) and
    changes that path's own deeper logits; the shapes of a tree are checked where it is built."""
    from flashspec.runner import TokenTree

    model = llama()
    ids, mask = left_pad(random_rows([5], seed=6))
    tree = TokenTree.chains(2, 3)                                                # 0-1-2-3 and 0-4-5-6
    runner = LlamaRunner(model, max_batch=1, max_len=32)
    runner.prefill(ids, mask)
    tokens = torch.randint(3, VOCAB, (1, len(tree)), generator=torch.Generator().manual_seed(7))
    first = runner.tree_forward(tokens, torch.tensor([5]), tree, 16)
    changed = tokens.clone()
    changed[0, 4] = (tokens[0, 4] + 1 - 3) % (VOCAB - 3) + 3                     # the second path's first token
    second = runner.tree_forward(changed, torch.tensor([5]), tree, 16)
    assert max_error(first[:, :4], second[:, :4]) < 1e-6                         # the root and the first path
    assert max_error(first[:, 4:], second[:, 4:]) > 1e-3
    for parents in ([0, 0], [-1, 1], [-1, 0, 3], []):
        with pytest.raises(ValueError, match="parents must start with -1"):
            TokenTree(parents)
    with pytest.raises(ValueError, match="nodes per row but the tree"):
        runner.tree_forward(tokens[:, :3], torch.tensor([5]), tree, 16)


def tree_decode(target: torch.nn.Module, drafts: list, params, rows: int, seed: int, gamma: int = 2,
                keep_chosen: bool = True) -> torch.Tensor:
    """`test_engine_exact.LENGTH` tokens after its PROMPT for `rows` rows, each step one `tree_forward` of the target
    over one chain per draft (`TokenTree.chains`), `flashspec.paths.verify_paths` on them, and `keep_path` of the
    path it kept (`keep_chosen=False`: the other path's, a cache that does not hold the emitted text). Drafts sample
    with HF forwards."""
    from test_engine_exact import LENGTH, PROMPT
    from test_engine_exact import VOCAB as EXACT_VOCAB

    from flashspec.paths import verify_paths
    from flashspec.runner import TokenTree
    from flashspec.sampling import warp_logits

    generator = torch.Generator().manual_seed(seed)
    tree = TokenTree.chains(len(drafts), gamma)
    runner = LlamaRunner(target, max_batch=rows, max_len=len(PROMPT) + LENGTH + len(tree) + 1)
    runner.prefill(PROMPT.expand(rows, -1), torch.ones(rows, len(PROMPT), dtype=torch.long))
    seqs = [PROMPT.tolist() for _ in range(rows)]
    step = 0
    while min(len(s) for s in seqs) < len(PROMPT) + LENGTH:
        chains, chain_logits = [], []
        for draft in drafts:  # each draft's chain of γ from each row's own sequence, rows grouped by length
            tokens, logits = torch.zeros(rows, gamma, dtype=torch.long), torch.zeros(rows, gamma, EXACT_VOCAB)
            for length in sorted({len(s) for s in seqs}):
                group = [r for r, s in enumerate(seqs) if len(s) == length]
                context = torch.tensor([seqs[r] for r in group])
                for d in range(gamma):
                    with torch.no_grad():
                        out = draft(context).logits[:, -1]
                    drawn = torch.multinomial(warp_logits(out, params).exp(), 1, generator=generator)
                    tokens[group, d], logits[group, d] = drawn[:, 0], out
                    context = torch.cat([context, drawn], 1)
            chains.append(tokens)
            chain_logits.append(logits)
        root = torch.tensor([len(s) - 1 for s in seqs])
        nodes = torch.cat([torch.tensor([s[-1] for s in seqs])[:, None], *chains], 1)   # [B, 1 + K·γ]
        logits = runner.tree_forward(nodes, root, tree, bucket=runner.max_len)
        along = torch.stack([logits[:, tree.path(1 + k * gamma + gamma - 1)] for k in range(len(drafts))], 1)
        out = verify_paths(along, torch.stack(chain_logits, 1), torch.stack(chains, 1), params,
                           generator=seed * 1000 + step, backend="torch")
        kept = out.path if keep_chosen else (out.path + 1) % len(drafts)
        runner.keep_path(root, torch.tensor([tree.path(1 + int(k) * gamma + gamma - 1) for k in kept]))
        for r in range(rows):
            seqs[r] += out.tokens[r, : int(out.num_accepted[r]) + 1].tolist()
        step += 1
    return torch.tensor([s[len(PROMPT): len(PROMPT) + LENGTH] for s in seqs])


@pytest.mark.slow
@pytest.mark.parametrize("keep_chosen", [True, False], ids=["kept-path", "control-other-path-kept"])
def test_tree_decoding_has_the_targets_joint_law(keep_chosen):
    """Tree forwards, multi-path verification and keep_path together, three tokens at T = 1 over several steps
    (two drafts, γ = 2): the χ² family of `test_engine_exact` accepts the target's law; keeping the other path's
    keys and values (a cache that no longer holds the emitted text) must fail it."""
    from test_engine_exact import exact_continuations, fit_p_values, passes, peaked_trio

    import flashspec as fs

    # peaked, context-dependent distributions: a wrong cache shows in the law
    target, far, near = peaked_trio()  # a perturbed draft and one equal to the target (long accepts)
    params = fs.SamplingParams(1.0)
    # the perturbed draft's path first, so the target's copy is the kept path often; γ = 1: three tokens take two
    # steps or more, the later ones reading what the first one kept
    samples = torch.cat([tree_decode(target, [far, near], params, rows=1024, seed=seed, gamma=1,
                                     keep_chosen=keep_chosen) for seed in range(16)])
    p_values = fit_p_values(samples, exact_continuations(target, params))
    assert passes(p_values) == keep_chosen, p_values
