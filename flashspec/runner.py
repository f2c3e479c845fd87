"""A static-KV-cache forward for Llama-family Hugging Face models that CUDA graphs can capture.

`LlamaRunner` calls the model's own modules (embeddings, norms, q/k/v/o projections, MLP, final
norm, head) so weights are shared, not copied, and tied embeddings or biases need nothing special;
quantized linear layers (bitsandbytes NF4 `Linear4bit`, whose packed weights are uint8) run as they
are, while the cache and RoPE take the embedding's float dtype.
RoPE cos/sin come from the model's own `rotary_emb`, evaluated once for every position into a
table, so every RoPE variant HF implements (llama3, linear, yarn, `attention_scaling`) is HF's.
Only the KV cache and attention belong to the runner.

Cache layout: slot == position. Row r's token at position t lives in cache slot t, so padding never
enters the cache, a query at position t sees exactly the slots s <= t, and rejected speculative
slots need no rollback: the next step writes the same positions again before reading them.
Nothing in `forward` turns a device value into a host int, so it replays inside a CUDA graph.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from flashspec.fuse import Fused, fuse_layer

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
# RoPE types whose frequencies depend on the current sequence length: exact only while the cache
# stays inside the length they were built for.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
BUCKET_GRANULE = 256
MIN_BUCKET = 16


# ------------------------------------------------------------------------------------------ support


def _rope_type(config: Any) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def unsupported_reason(model: torch.nn.Module, max_len: int | None = None) -> str | None:
    """Why `LlamaRunner` cannot run `model` (with a cache of `max_len` positions), or None."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {SUPPORTED_MODEL_TYPES}"
    body = getattr(model, "model", None)
    for owner, names in ((body, ("embed_tokens", "layers", "norm", "rotary_emb")), (model, ("lm_head",))):
        missing = [name for name in names if not hasattr(owner, name)]
        if missing:
            return f"the model has no {', '.join(missing)} (expected a *ForCausalLM with .model.{names[0]})"
    embedding = getattr(body.embed_tokens, "weight", None)
    if not isinstance(embedding, torch.Tensor) or not torch.is_floating_point(embedding):
        return ("the input embedding's weight is not a float tensor (the cache and RoPE take its dtype); "
                "quantize the decoder layers only, as transformers' bitsandbytes NF4 loading does")
    layer = body.layers[0]
    attn = getattr(layer, "self_attn", None)
    wanted = ("q_proj", "k_proj", "v_proj", "o_proj")
    if attn is None or not all(hasattr(attn, name) for name in wanted) or not all(
        hasattr(layer, name) for name in ("input_layernorm", "post_attention_layernorm", "mlp")
    ):
        return "decoder layers do not have the Llama layout (self_attn.q/k/v/o_proj, input/post norms, mlp)"
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return "attention has q_norm/k_norm (Qwen3-style), which the runner does not apply"
    if config.num_attention_heads % config.num_key_value_heads:
        return "num_attention_heads is not a multiple of num_key_value_heads"
    window = getattr(config, "sliding_window", None)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if window is not None and (max_len is None or max_len > window):
        if model_type == "mistral" or "sliding_attention" in layer_types:
            return (f"sliding-window attention (window {window}) is not implemented; it is exact only when "
                    f"max_len <= {window} (max_len={max_len})")
    if layer_types - {"full_attention", "sliding_attention"}:
        return f"layer types {sorted(layer_types)} are not supported"
    rope = _rope_type(config)
    if any(kind in rope for kind in LENGTH_DEPENDENT_ROPE):
        params = getattr(config, "rope_parameters", None) or {}
        limit = min(config.max_position_embeddings,
                    params.get("original_max_position_embeddings") or config.max_position_embeddings)
        if max_len is None or max_len + 1 > limit:
            return (f"rope_type {rope!r} changes its frequencies with the sequence length; exact only for "
                    f"max_len < {limit} (max_len={max_len})")
    return None


def supports(model: torch.nn.Module, max_len: int | None = None) -> bool:
    """True when `LlamaRunner(model, ..., max_len)` reproduces the model's forward exactly."""
    return unsupported_reason(model, max_len) is None


def check_supported(model: torch.nn.Module, max_len: int | None = None) -> None:
    reason = unsupported_reason(model, max_len)
    if reason is not None:
        raise ValueError(f"LlamaRunner cannot run {type(model).__name__}: {reason}")


def bucket_for(length: int, max_len: int, granule: int = BUCKET_GRANULE) -> int:
    """The attention length for `length` filled slots: a power of two (at least MIN_BUCKET) up to
    `granule`, then a multiple of `granule`, capped at `max_len`. Few distinct values (one CUDA graph
    each) while attention reads at most about twice the filled part."""
    if length > max_len:
        raise ValueError(f"length {length} exceeds the cache's max_len {max_len}")
    if length <= granule:
        bucket = max(MIN_BUCKET, 1 << max(0, length - 1).bit_length())
    else:
        bucket = -(-length // granule) * granule
    return min(bucket, max_len)


# -------------------------------------------------------------------------------------------- cache


class StaticCache:
    """Preallocated K/V per layer, each [batch, n_kv_heads, max_len + 1, head_dim].

    Slot `max_len` is scratch: graph warm-ups write there, so capturing never touches real slots.
    """

    def __init__(self, num_layers: int, batch: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (batch, num_kv_heads, max_len + 1, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len

    def write(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Store k, v [B, q, n_kv_heads, head_dim] at slots `positions` [B, q] of `rows` [B, 1].
        Advanced-index assignment (index_put_): no host sync, so graph-safe."""
        self.k[layer][rows, :, positions] = k
        self.v[layer][rows, :, positions] = v

    def read(self, layer: int, batch: int, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of slots [0, bucket) of the first `batch` rows: [batch, n_kv_heads, bucket, head_dim]."""
        return self.k[layer][:batch, :, :bucket], self.v[layer][:batch, :, :bucket]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


# -------------------------------------------------------------------------------------------- model


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's RoPE (x * cos + rotate_half(x) * sin) on x [B, q, heads, head_dim], cos/sin [B, q, 1, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


HAS_ENABLE_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)
ATTENTION_MODES = ("auto", "fold", "gqa")
# "auto" folds decode/verify calls (q <= FOLD_MAX_Q) with more than FOLD_ABOVE queries (B * q);
# below that SDPA's enable_gqa keeps more heads in flight. Measured on an H200 (TinyLlama shape,
# 512 slots, all 22 layers): gqa 0.24 ms vs fold 0.37 ms at B*q = 1 and 8, fold 0.49 ms vs gqa
# 0.58 ms at B*q = 40. Prefill-sized calls use enable_gqa: a folded mask is G times larger.
FOLD_ABOVE = 16
FOLD_MAX_Q = 16


def fold_mask(visible: torch.Tensor, groups: int) -> torch.Tensor:
    """[B, 1, T, S] -> [B, 1, G*T, S]: the mask for queries folded by `attend(fold=True)`."""
    batch, _, length, slots = visible.shape
    return visible.unsqueeze(2).expand(batch, 1, groups, length, slots).reshape(batch, 1, groups * length, slots)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
           fold: bool) -> torch.Tensor:
    """Grouped-query attention of q [B, T, Hq, D] over k, v [B, Hkv, S, D] -> [B, T, Hq * D].

    Query head h reads KV head h // G (G = Hq / Hkv, HF's repeat_kv order). With `fold`, the G query
    heads of one KV head are folded into the query length ([B, Hkv, G*T, D]) so SDPA sees plain
    multi-head attention (K/V read once per KV head, any backend that takes a mask); `mask` is then
    `fold_mask(visible, G)`. Otherwise SDPA's enable_gqa groups the heads (torch >= 2.5) and `mask`
    is `visible` [B, 1, T, S]. True marks a visible key.
    """
    batch, length, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    groups = q_heads // kv_heads
    if groups == 1 or not fold:
        extra = {"enable_gqa": True} if groups > 1 else {}
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, scale=scale, **extra)
        return out.transpose(1, 2).reshape(batch, length, q_heads * head_dim)
    folded = q.view(batch, length, kv_heads, groups, head_dim).permute(0, 2, 3, 1, 4)
    folded = folded.reshape(batch, kv_heads, groups * length, head_dim)          # [B, Hkv, G*T, D]
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=scale)
    out = out.view(batch, kv_heads, groups, length, head_dim).permute(0, 3, 1, 2, 4)  # [B, T, Hkv, G, D]
    return out.reshape(batch, length, q_heads * head_dim)


def state_indices(layers: tuple[int, ...], depth: int) -> tuple[int, ...]:
    """Hidden-state indices of a `depth`-layer model with -1 (the final normed state) written as `depth`."""
    return tuple(depth if index == -1 else index for index in layers)


def rms_normalise(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x scaled to unit root-mean-square over its last dimension (no weight), computed in float32."""
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)


def normalised_states(raw: torch.Tensor, count: int, final: int | None, norm: torch.nn.Module) -> torch.Tensor:
    """What a draft reads of `count` hidden states concatenated raw in `raw` [..., count·hidden] (as a runner's
    `states` buffer keeps them): each one `rms_normalise`d, state `final` (the one past the last layer, if
    any) after the final `norm` first. Reads normalise, not writes: a write is then one copy per state at every
    target forward, plain steps included, and the normalisation runs once per drafting step that reads."""
    if final is None:
        return rms_normalise(raw.unflatten(-1, (count, -1))).flatten(-2)
    parts = list(raw.chunk(count, dim=-1))
    parts[final] = norm(parts[final])
    return rms_normalise(torch.stack(parts, dim=-2)).flatten(-2)


def project_qkv(layer: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                heads: tuple[int, int, int], fused: Fused | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoder layer up to attention: input norm, q/k/v projections (one matmul with `fused`),
    RoPE on q and k. x [B, q, hidden] -> q [B, q, Hq, D], k and v [B, q, Hkv, D]; `heads` = (Hq, Hkv, D)."""
    num_heads, num_kv_heads, head_dim = heads
    batch, length = x.shape[:2]
    attn = layer.self_attn
    h = layer.input_layernorm(x)
    if fused is None:
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    else:
        sizes = (num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim)
        q, k, v = F.linear(h, fused.qkv, fused.qkv_bias).split(sizes, dim=-1)
    q = rotate(q.reshape(batch, length, num_heads, head_dim), cos, sin)
    k = rotate(k.reshape(batch, length, num_kv_heads, head_dim), cos, sin)
    return q, k, v.reshape(batch, length, num_kv_heads, head_dim)


def finish_layer(layer: torch.nn.Module, x: torch.Tensor, attended: torch.Tensor,
                 fused: Fused | None = None) -> torch.Tensor:
    """One decoder layer after attention: output projection and residual, post norm, MLP (gate and
    up in one matmul with `fused`) and residual."""
    x = x + layer.self_attn.o_proj(attended)
    h = layer.post_attention_layernorm(x)
    if fused is None:
        return x + layer.mlp(h)
    gate, up = F.linear(h, fused.gate_up).chunk(2, dim=-1)
    return x + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)


def project_logits(norm: torch.nn.Module, lm_head: torch.nn.Module, x: torch.Tensor,
                   logits_dtype: torch.dtype | None) -> torch.Tensor:
    """Final norm and LM head; logits in `logits_dtype` (None keeps the head's dtype, as HF)."""
    logits = lm_head(norm(x))
    return logits if logits_dtype is None else logits.to(logits_dtype)


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# What `LlamaRunner(compile=...)` compiles: "forward", the whole forward of a compiled query length as one
# graph (every layer, attention over the whole cache, q/k/v and gate/up fused: the fewest kernels per
# step, one compile per model and (B, q)); "regions", each layer's dense work around an eager attention
# over the step's bucket (one compile per model width and (B, q), shared by every layer: faster to compile).
COMPILE_SCOPES = ("forward", "regions")
# Inductor settings of a whole-forward compile: coordinate-descent tuning of the generated kernels' launch
# parameters (small reductions and pointwise kernels are most of a decode step's kernels).
FORWARD_OPTIONS = {"coordinate_descent_tuning": True}
# Distinct static shapes one compiled region may see in a process: (model width) x (q) x (batch)
# across runners. Dynamo's default (8) would silently fall back to eager past it.
RECOMPILE_LIMIT = 128


def compile_regions(mode: str = "default") -> tuple[Any, Any, Any]:
    """`project_qkv`, `finish_layer`, `project_logits` through torch.compile (static shapes).

    Regional compilation: attention stays outside (SDPA over the host-chosen bucket, whose length
    would otherwise recompile the model per bucket), and the per-layer regions are compiled once per
    (model width, B, q) and reused by every layer, since Dynamo treats a layer's parameters as
    inputs rather than constants (torch >= 2.5). Fusion removes most of the small kernels (norms,
    RoPE, SiLU, residuals) that dominate a graph-replayed decode step.
    """
    return tuple(compile_region(fn, mode) for fn in (project_qkv, finish_layer, project_logits))


def compile_region(fn: Any, mode: str = "default", options: dict[str, Any] | None = None) -> Any:
    """`fn` through torch.compile as every region is compiled here: whole graph, static shapes, `mode`
    (plus inductor `options`, e.g. `FORWARD_OPTIONS`), Dynamo's recompile limit raised to `RECOMPILE_LIMIT`."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < RECOMPILE_LIMIT:
            setattr(config, name, RECOMPILE_LIMIT)
    if not options:
        return torch.compile(fn, fullgraph=True, dynamic=False, mode=mode)
    # torch.compile takes a mode or options, not both: a mode is its inductor settings
    settings = {"max_autotune": True, "triton.cudagraphs": False} if mode == "max-autotune-no-cudagraphs" else {}
    return torch.compile(fn, fullgraph=True, dynamic=False, options={**settings, **options})


class TokenTree:
    """The shape of a token tree, shared by every row of a `LlamaRunner.tree_forward`: `parents[i]` is node i's
    parent (-1 for the root, node 0; every parent comes before its children). Depth and ancestry follow."""

    def __init__(self, parents: Sequence[int]) -> None:
        parents = tuple(int(parent) for parent in parents)
        if not parents or parents[0] != -1 or any(not 0 <= parent < node for node, parent in
                                                   enumerate(parents) if node):
            raise ValueError(f"parents must start with -1 (the root) and name an earlier node for every other node, "
                             f"got {parents}")
        self.parents = parents
        self.depth = [0] * len(parents)
        for node in range(1, len(parents)):
            self.depth[node] = self.depth[parents[node]] + 1
        self._tensors: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def chains(cls, paths: int, gamma: int) -> TokenTree:
        """`paths` chains of `gamma` nodes under one root (paths k's node d at 1 + k·γ + d - 1)."""
        if paths < 1 or gamma < 1:
            raise ValueError(f"paths and gamma must be >= 1, got {paths} and {gamma}")
        return cls([-1] + [0 if d == 0 else 1 + k * gamma + d - 1 for k in range(paths) for d in range(gamma)])

    def __len__(self) -> int:
        return len(self.parents)

    def path(self, node: int) -> list[int]:
        """The nodes from the root to `node`, in depth order."""
        nodes = [node]
        while self.parents[nodes[-1]] >= 0:
            nodes.append(self.parents[nodes[-1]])
        return nodes[::-1]

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(depth [N] long, ancestors [N, N] bool: ancestors[i, j] when j is i or an ancestor of i) on `device`."""
        if device not in self._tensors:
            ancestors = torch.zeros(len(self), len(self), dtype=torch.bool)
            for node in range(len(self)):
                ancestors[node, self.path(node)] = True
            self._tensors[device] = (torch.tensor(self.depth, device=device), ancestors.to(device))
        return self._tensors[device]


class LlamaRunner:
    """Static-cache forward of a Llama-family HF causal LM (llama, qwen2, mistral within its window).

    Args:
        model: a `LlamaForCausalLM`-like model in eval mode; its modules are called, never copied.
        max_batch: rows of the cache; a forward may use the first B <= max_batch rows.
        max_len: positions per row (prompt + max_new_tokens + γ + 1 slack); positions must be < max_len.
        logits_dtype: dtype of the returned logits; None keeps the head's (the model dtype, as HF).
        attention: "fold" (GQA folded into the query length), "gqa" (SDPA enable_gqa, torch >= 2.5)
            or "auto" (fold for decode/verify calls with B*q > FOLD_ABOVE or where enable_gqa is
            missing, else gqa); chosen per call shape, so each graph has one.
        compile: torch.compile the forwards of `compile_lengths` (True or a mode in COMPILE_MODES).
            Compiling happens on the first call of each shape (seconds to minutes); capture graphs after it.
        compile_scope: what is compiled (COMPILE_SCOPES): "forward" (default), the whole forward as
            one graph: attention over all max_len + 1 slots whatever the bucket, and each layer's
            q/k/v and gate/up projections fused (`fuse_layer`: the model's weights become views of
            the stacked ones); "regions", the per-layer dense regions (`compile_regions`) around an
            eager attention over the bucket.
        compile_lengths: the query lengths q that run compiled (the decode and verify shapes);
            other calls (prefill, draft catch-up) run the same code eagerly.
        state_layers: hidden states every forward also writes, raw and concatenated, into `states`
            [max_batch, max_len + 1, len(state_layers) * hidden] at the call's positions, for drafts that read
            the target's states (`flashspec.features`), RMS-normalised as they read them (`read_states`).
            Indices as in HF's `hidden_states`: 0 the embeddings, i the output of decoder layer i (1-based),
            -1 (or the layer count) the final normed state. Empty (default): no buffer, nothing written.
    """

    def __init__(self, model: torch.nn.Module, max_batch: int, max_len: int,
                 logits_dtype: torch.dtype | None = None, attention: str = "auto",
                 compile: bool | str = False, compile_lengths: tuple[int, ...] = (1,),
                 state_layers: tuple[int, ...] = (), compile_scope: str = "forward") -> None:
        check_supported(model, max_len)
        if attention not in ATTENTION_MODES or (attention == "gqa" and not HAS_ENABLE_GQA):
            raise ValueError(f"attention must be one of {ATTENTION_MODES} ('gqa' needs torch >= 2.5), "
                             f"got {attention!r}")
        self.attention = attention
        config = model.config
        body = model.model
        self.model = model
        self.embed_tokens = body.embed_tokens
        self.layers = list(body.layers[: config.num_hidden_layers])
        self.norm = body.norm
        self.lm_head = model.lm_head
        self.max_batch = max_batch
        self.max_len = max_len
        self.logits_dtype = logits_dtype
        attn = self.layers[0].self_attn
        self.head_dim = int(getattr(attn, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        # a target sharded by `flashspec.tp.shard_target` projects this rank's heads only: 1/tp of each
        tp = int(getattr(model, "flashspec_tp_size", 1))
        self.num_heads = config.num_attention_heads // tp
        self.num_kv_heads = config.num_key_value_heads // tp
        self.scale = float(getattr(attn, "scaling", self.head_dim ** -0.5))
        weight = self.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.cache = StaticCache(len(self.layers), max_batch, self.num_kv_heads, max_len, self.head_dim,
                                 self.dtype, self.device)
        self.cos, self.sin = self._rope_table(body.rotary_emb, max_len + 1)  # [max_len + 1, head_dim]
        self.slots = torch.arange(max_len + 1, device=self.device)             # [max_len + 1]
        self.rows = torch.arange(max_batch, device=self.device)                # [max_batch]
        self.scratch_position = max_len
        self._graphs: dict[tuple[int, int, int, bool, bool], GraphedStep] = {}
        self.captures = 0  # GraphedSteps built (each a CUDA graph capture on a GPU)
        if not isinstance(compile, bool) and compile not in COMPILE_MODES:
            raise ValueError(f"compile must be True, False or one of {COMPILE_MODES}, got {compile!r}")
        if compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope must be one of {COMPILE_SCOPES}, got {compile_scope!r}")
        self.compile_lengths = tuple(compile_lengths)
        mode = "default" if compile is True else compile
        self._compiled = None  # the compiled regions (scope "regions")
        self._whole = None     # the compiled forward (scope "forward")
        self.fused: list[Fused | None] = [None] * len(self.layers)
        if compile is not False and compile_scope == "regions":
            self._compiled = compile_regions(mode)
        elif compile is not False:
            if tp == 1:
                self.fused = [fuse_layer(layer) for layer in self.layers]
            self._whole = compile_region(self._layers, mode, FORWARD_OPTIONS)
        depth = len(self.layers)
        self.state_layers = state_indices(state_layers, depth)
        if not all(0 <= index <= depth for index in self.state_layers):
            raise ValueError(f"state_layers must be hidden-state indices in 0..{depth} or -1, got {state_layers}")
        # which of `states`' slots holds the state past the last layer (read after the final norm), if any
        self.final_state_slot = self.state_layers.index(depth) if depth in self.state_layers else None
        self.states = None if not state_layers else torch.zeros(
            (max_batch, max_len + 1, len(state_layers) * config.hidden_size), dtype=self.dtype, device=self.device)

    @torch.no_grad()
    def _rope_table(self, rotary_emb: torch.nn.Module, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for positions 0..length-1 from the model's own rotary embedding (model dtype)."""
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        positions = torch.arange(length, device=self.device)[None]
        cos, sin = rotary_emb(probe, positions)
        if cos.shape[-1] != self.head_dim:
            raise ValueError(f"rotary embedding covers {cos.shape[-1]} of {self.head_dim} head dims "
                             "(partial RoPE is not supported)")
        return cos[0].contiguous(), sin[0].contiguous()

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, bucket: int,
                logits_index: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of `tokens` [B, q] at `positions` [B, q] (each row's own), after writing their K/V.

        Each query attends to cache slots [0, bucket) that are <= its position; `bucket` is a host
        int >= 1 + the largest position in the call (see `bucket_for`). `logits_index` [B, k] (device
        ints in [0, q)) computes the head only at those columns (e.g. each row's last prompt token).
        Returns logits [B, q or k, V] in `logits_dtype` (default: the model dtype).
        """
        length = tokens.shape[1]
        if self._whole is not None and length in self.compile_lengths:
            return self._whole(tokens, positions, self.max_len + 1, logits_index)
        compiled = self._compiled is not None and length in self.compile_lengths
        return self._layers(tokens, positions, bucket, logits_index, compiled)

    def _layers(self, tokens: torch.Tensor, positions: torch.Tensor, bucket: int,
                logits_index: torch.Tensor | None = None, compiled: bool = False, *,
                write_slots: torch.Tensor | None = None, visible: torch.Tensor | None = None) -> torch.Tensor:
        """`forward`'s work, through the compiled regions when `compiled` (also what scope "forward" compiles).
        `tree_forward` passes the slots the K/V go to ([B, q], default: `positions`) and the mask ([B, 1, q,
        bucket], default: each query sees the slots up to its position)."""
        batch, length = tokens.shape
        fold = self.attention == "fold" or (self.attention == "auto" and (
            not HAS_ENABLE_GQA or (batch * length > FOLD_ABOVE and length <= FOLD_MAX_Q)))
        x = self.inputs(tokens, positions, compiled)                    # [B, q, hidden]
        cos = self.cos[positions].unsqueeze(2)                          # [B, q, 1, D]
        sin = self.sin[positions].unsqueeze(2)
        if visible is None:
            visible = (self.slots[:bucket] <= positions.unsqueeze(-1)).unsqueeze(1)  # [B, 1, q, S]
        if write_slots is None:
            write_slots = positions
        groups = self.num_heads // self.num_kv_heads
        mask = fold_mask(visible, groups) if fold and groups > 1 else visible
        rows = self.rows[:batch, None]                                  # [B, 1]
        qkv, finish, head = self._compiled if compiled else (project_qkv, finish_layer, project_logits)
        heads = (self.num_heads, self.num_kv_heads, self.head_dim)
        self._write_state(0, x, rows, write_slots)
        for index, (layer, fused) in enumerate(zip(self.layers, self.fused)):
            q, k, v = qkv(layer, x, cos, sin, heads, fused)
            self.cache.write(index, rows, write_slots, k, v)
            keys, values = self.cache.read(index, batch, bucket)
            x = finish(layer, x, attend(q, keys, values, mask, self.scale, fold), fused)
            if index + 1 < len(self.layers):
                self._write_state(index + 1, x, rows, write_slots)
        self._write_state(len(self.layers), x, rows, write_slots)
        if logits_index is not None:
            x = x.gather(1, logits_index.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # [B, k, hidden]
        return self.output(head, x, compiled)                            # [B, q or k, V]

    @torch.no_grad()
    def tree_forward(self, tokens: torch.Tensor, root: torch.Tensor, tree: TokenTree, bucket: int) -> torch.Tensor:
        """Logits [B, N, V] of a token tree in one forward: node i of `tree` (shared by the rows) holds `tokens`
        [B, N], sits at position root + depth(i) (`root` [B]: each row's root position, the pending token's) and
        attends to the slots before `root` and to its ancestors and itself, each of which this call writes at
        slot root + i (its K/V, and its hidden states when the runner keeps `state_layers`). Node i's logits are
        those of a chain forward of its path from the root; `keep_path` then moves one path's K/V and states to
        the slots of its positions. The slots root .. root + N - 1 must lie in the cache and in the first
        `bucket`. Compiled as `forward` is when the runner compiles and N is one of `compile_lengths` (the whole
        forward then attends over every slot, whatever `bucket`), else eager."""
        batch, nodes = tokens.shape
        if nodes != len(tree):
            raise ValueError(f"tokens has {nodes} nodes per row but the tree {len(tree)}")
        whole = self._whole is not None and nodes in self.compile_lengths
        if whole:
            bucket = self.max_len + 1
        depth, ancestors = tree.tensors(self.device)
        root = root.to(self.device).view(batch, 1)
        positions = root + depth                                                  # [B, N]
        write_slots = root + torch.arange(nodes, device=self.device)              # [B, N]
        before = self.slots[:bucket] < root.unsqueeze(-1)                         # [B, 1, S]
        # node i sees slot s when s holds one of its ancestors (or itself): any over j of ancestors[i, j] and
        # write_slots[j] == s
        holds = write_slots[:, None, :, None] == self.slots[:bucket]              # [B, 1, N, S]
        in_tree = (ancestors[None, :, :, None] & holds).any(2)                    # [B, N, S]
        visible = (before | in_tree).unsqueeze(1)                                 # [B, 1, N, S]
        if whole:
            return self._whole(tokens, positions, bucket, None, write_slots=write_slots, visible=visible)
        compiled = self._compiled is not None and nodes in self.compile_lengths
        return self._layers(tokens, positions, bucket, None, compiled, write_slots=write_slots, visible=visible)

    @torch.no_grad()
    def keep_path(self, root: torch.Tensor, path_nodes: torch.Tensor) -> None:
        """After `tree_forward`: copy the K/V (and hidden states, when kept) of nodes `path_nodes` [B, L] (a
        root-to-node path, node indices in depth order) from their tree slots root + node to the slots of their
        positions root + depth, so the cache holds that path as a chain forward would have left it (slot ==
        position again)."""
        batch, length = path_nodes.shape
        root = root.to(self.device).view(batch, 1)
        source = root + path_nodes.to(self.device)
        target = root + torch.arange(length, device=self.device)
        rows = self.rows[:batch, None]
        for layer in range(len(self.layers)):
            for store in (self.cache.k, self.cache.v):
                store[layer][rows, :, target] = store[layer][rows, :, source]  # the right side is a copy
        if self.states is not None:
            self.states[rows, target] = self.states[rows, source]

    def next_draft(self, tokens: torch.Tensor, positions: torch.Tensor, bucket: int) -> torch.Tensor:
        """A draft's next drafted token's logits, `tokens` [B, 1] the one it drafted last: a plain forward."""
        return self.forward(tokens, positions, bucket)

    def inputs(self, tokens: torch.Tensor, positions: torch.Tensor, compiled: bool = False) -> torch.Tensor:
        """The first layer's input for `tokens` at `positions`: their embeddings (`compiled`: whether this
        forward runs the compiled regions, for subclasses with regions of their own). A draft whose embedding has
        fewer rows than the target's vocabulary reads an id past its rows as its last row (what it proposes is
        only a proposal: the target's verdict keeps the output exact)."""
        return self.embed_tokens(tokens.clamp(max=self.embed_tokens.num_embeddings - 1))

    def output(self, head: Any, x: torch.Tensor, compiled: bool = False) -> torch.Tensor:
        """Logits of the last layer's output `x` through `head` (`project_logits`, compiled or not)."""
        return head(self.norm, self.lm_head, x, self.logits_dtype)

    def _write_state(self, index: int, x: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Store hidden state `index` (`state_layers`) of the layers' output `x` at `slots` of `rows` in
        `states` (a forward's positions; a tree's node slots), raw (`read_states` normalises what a draft
        reads)."""
        if index not in self.state_layers:
            return
        width = x.shape[-1]
        slot = self.state_layers.index(index)
        self.states[:, :, slot * width:(slot + 1) * width][rows, slots] = x.to(self.dtype)

    def read_states(self, raw: torch.Tensor) -> torch.Tensor:
        """The states a draft reads from `raw` [..., k·hidden], read from `states` (`normalised_states`): what HF's
        `hidden_states` at `state_layers` give, each RMS-normalised."""
        return normalised_states(raw, len(self.state_layers), self.final_state_slot, self.norm)

    __call__ = forward

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                graphed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the cache from left-padded prompts [B, T]; return (last-token logits [B, V], lengths [B]).

        Each row is rotated so its real tokens sit at positions 0..len-1 (slot == position); its pad
        tokens land at positions >= len, where the row's next tokens overwrite them before any query
        can see them. One host sync checks that `attention_mask` is left padding (once per request).

        `graphed`: run the forward as a CUDA graph (`prefill_graph`) at the width `bucket_for(T)`, with
        more pad tokens after each row's own: an eager prefill launches a few dozen kernels per layer
        from Python, which takes far longer than the arithmetic. Off CUDA the same padded forward runs
        eagerly. The first prefill of a (B, width bucket) captures its graph (`captures` counts them).
        """
        batch, width = input_ids.shape
        if batch > self.max_batch or width > self.max_len:
            raise ValueError(f"prompts [{batch}, {width}] exceed the cache [{self.max_batch}, {self.max_len}]")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        mask = attention_mask.to(self.device).bool()
        lengths = mask.sum(1)                                           # [B]
        columns = torch.arange(width, device=self.device)
        pads = width - lengths
        if not torch.equal(mask, columns >= pads[:, None]) or bool((lengths == 0).any()):
            raise ValueError("attention_mask must be left padding with at least one real token per row")
        source = (columns + pads[:, None]) % width                      # [B, T]: real tokens first
        tokens = input_ids.to(self.device).gather(1, source)
        last = (lengths - 1)[:, None]                                   # [B, 1]
        if not graphed:
            positions = columns.expand(batch, width)
            logits = self.forward(tokens, positions, bucket_for(width, self.max_len), last)
            return logits[:, 0], lengths
        padded = bucket_for(width, self.max_len)
        tokens = torch.nn.functional.pad(tokens, (0, padded - width), value=0)  # positions >= len, as above
        positions = self.slots[:padded].expand(batch, padded)
        logits = self.prefill_graph(batch, padded)(tokens, positions, last)
        return logits[:, 0].clone(), lengths                            # the graph's output is reused

    def release_graphs(self) -> None:
        """Forget the prefill graphs (`prefill_graph`); later prefills capture again."""
        self._graphs.clear()

    def prefill_graph(self, batch: int, width: int) -> GraphedStep:
        """The memoised `GraphedStep` of a prefill of `width` (a `bucket_for` value) with the head at one
        column per row."""
        return self.graphed(batch, width, width, last_only=True)

    def graphed(self, batch: int, length: int, bucket: int, compile: bool = False,
                last_only: bool = False) -> GraphedStep:
        """The memoised `GraphedStep` for (batch, q=length, bucket); `captures` counts the ones built."""
        key = (batch, length, bucket, compile, last_only)
        if key not in self._graphs:
            self._graphs[key] = GraphedStep(self, batch, length, bucket, compile=compile, last_only=last_only)
            self.captures += 1
        return self._graphs[key]


# ------------------------------------------------------------------------------------------- graphs


class GraphedStep:
    """`runner.forward` for a fixed (batch, q, bucket), captured as one CUDA graph.

    Holds static `tokens` / `positions` [batch, q] and the output `logits` [batch, q, V]; calling it
    copies the inputs in and replays. The returned tensor is the static output, overwritten by the
    next replay. Off CUDA it runs the forward eagerly. `compile=True` first wraps the forward in
    torch.compile(mode="max-autotune-no-cudagraphs", fullgraph=True): minutes per shape.
    `last_only=True` adds a static `logits_index` [batch, 1] (the call's third argument) and computes
    the head at that column only: the prefill's shape, whose full [batch, q, V] logits nobody reads.
    Warm-up runs write only the cache's scratch slot, so capturing mid-generation is safe.
    """

    def __init__(self, runner: LlamaRunner, batch: int, length: int, bucket: int, compile: bool = False,
                 warmup: int = 3, last_only: bool = False) -> None:
        self.runner, self.bucket = runner, bucket
        self.tokens = torch.zeros(batch, length, dtype=torch.long, device=runner.device)
        self.positions = torch.full((batch, length), runner.scratch_position, dtype=torch.long,
                                    device=runner.device)
        self.index = torch.zeros(batch, 1, dtype=torch.long, device=runner.device) if last_only else None
        self.fn = runner.forward
        if compile:
            self.fn = torch.compile(runner.forward, mode="max-autotune-no-cudagraphs", fullgraph=True)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        if runner.device.type == "cuda":
            self.graph, self.logits = capture(lambda: self.fn(self.tokens, self.positions, bucket, self.index),
                                              warmup)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor,
                 logits_index: torch.Tensor | None = None) -> torch.Tensor:
        if (logits_index is None) != (self.index is None):
            raise ValueError("pass logits_index exactly when the step was built with last_only=True")
        self.tokens.copy_(tokens)
        self.positions.copy_(positions)
        if self.index is not None:
            self.index.copy_(logits_index)
        if self.graph is None:
            return self.fn(self.tokens, self.positions, self.bucket, self.index)
        self.graph.replay()
        return self.logits


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block (restored after, also on an error).

    A collection during a CUDA graph capture may free unreachable objects that hold another graph (a
    replaced session's runners: a runner and its `GraphedStep`s refer to each other); destroying a graph is
    illegal while a stream captures, and it invalidates the capture (cudaErrorStreamCaptureInvalidated).
    `torch.cuda.graph` collects before capturing only under `torch.compiler.config.force_cudagraph_gc`."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def capture(fn: Any, warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Warm `fn` up on a side stream (lazy init, cuBLAS workspaces, autotuning), then capture it, with
    the garbage collector paused throughout (`no_collection`). Returns the graph and `fn`'s output, which
    each replay rewrites."""
    with no_collection():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
    return graph, out
