"""Drafts that read the target's hidden states (EAGLE-3's design), and their fast-path runner.

A token-only draft must rebuild from the tokens what the target already computed about the context. A
feature draft is also fed the target's hidden states: at position i its input is
``fc([embed(x_i), g_{i-1}])``, where g is a linear map (`reduce`) of the target's states at a few layers
(e.g. a low, a middle and the final one, each RMS-normalised) at the previous position, and a small decoder
stack (one layer) plus the target's norm and head turn it into the next token's distribution. Past its first
drafted token a step has no target states for the draft's own tokens, so the draft reads its own output
(its final normed hidden state) in their place, and must be trained to (`unroll`: EAGLE-3's training-time test).

The draft is just another draft to the verifier: it proposes tokens with the distribution it samples them
from, so the output stays exactly the target's (Theorem 1).

On the fast path the target's runner writes the states raw at every position it processes (`LlamaRunner(...,
state_layers=...)`), the verify forward included, and a `FeatureRunner` reads them at the positions before
its window, normalising them as it reads: every position a step's draft reads holds the state of a committed token.
"""
from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import torch

from flashspec import models, runner

FEATURES_FILE = "feature_draft.json"
WEIGHTS_FILE = "feature_draft.safetensors"


class FeatureDraft(torch.nn.Module):
    """A draft fed the target's hidden states: `body` (a Llama causal LM whose embedding, norm and head are the
    target's) over ``fc([embed(token), reduce(states)])``. `feature_layers` are the target's hidden-state
    indices it reads (HF's `hidden_states` numbering, -1 the final normed state)."""

    def __init__(self, body: torch.nn.Module, feature_layers: tuple[int, ...]) -> None:
        super().__init__()
        if not feature_layers:
            raise ValueError("feature_layers must name at least one of the target's hidden states, e.g. (-1,)")
        self.body = body
        self.feature_layers = tuple(int(i) for i in feature_layers)
        hidden = body.config.hidden_size
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.reduce = (torch.nn.Linear(len(self.feature_layers) * hidden, hidden, bias=False)
                       if len(self.feature_layers) > 1 else torch.nn.Identity())
        with torch.no_grad():  # start as embedding + state
            self.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.eye(hidden)], 1))

    @classmethod
    def from_target(cls, target: torch.nn.Module, layers: tuple[int, ...],
                    feature_layers: tuple[int, ...]) -> "FeatureDraft":
        """A feature draft whose decoder layers start as copies of the target's `layers` (its embedding, norm
        and head copied, the embedding frozen: `flashspec.models.draft_from_teacher`), in float32 on the CPU.

        layers: indices of the target's decoder layers (0-based, negative from the end; one may repeat).
        feature_layers: distinct hidden-state indices of the target (see `check_feature_layers`).
        """
        depth = int(target.config.num_hidden_layers)
        layers = check_layers(layers, depth)
        feature_layers = check_feature_layers(feature_layers, depth)
        return cls(models.draft_from_teacher(target, layers), feature_layers).to(torch.float32)

    @property
    def config(self) -> Any:
        """The decoder body's config (vocabulary, special tokens, positions)."""
        return self.body.config

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.body.lm_head

    def forward(self, tokens: torch.Tensor, features: torch.Tensor,
                reduced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(final normed hidden states, logits) of `tokens` [B, q] fed `features`: the target's states at the
        previous positions [B, q, len(feature_layers) * hidden] or, with `reduced`, already-reduced inputs
        [B, q, hidden] (the draft's own outputs). Attention is causal over the call's q positions."""
        hidden = self.body.model(inputs_embeds=self.inputs(tokens, features, reduced)).last_hidden_state
        return hidden, self.body.lm_head(hidden)

    def inputs(self, tokens: torch.Tensor, features: torch.Tensor, reduced: bool = False) -> torch.Tensor:
        """The decoder's input ``fc([embed(tokens), g])``, g = reduce(`features`) or, with `reduced`, `features`."""
        embedded = self.body.model.embed_tokens(tokens)
        fed = features.to(embedded.dtype)
        return self.fc(torch.cat([embedded, fed if reduced else self.reduce(fed)], -1))

    def save_pretrained(self, folder: str | Path) -> None:
        """The body as an HF model folder, plus `fc`/`reduce` and the feature layers beside it."""
        from safetensors.torch import save_file

        folder = Path(folder)
        self.body.save_pretrained(folder)
        extra = {f"fc.{k}": v for k, v in self.fc.state_dict().items()}
        extra.update({f"reduce.{k}": v for k, v in self.reduce.state_dict().items()})
        save_file({k: v.contiguous() for k, v in extra.items()}, str(folder / WEIGHTS_FILE))
        (folder / FEATURES_FILE).write_text(json.dumps({"feature_layers": list(self.feature_layers)}))

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32) -> "FeatureDraft":
        """A draft saved by `save_pretrained`."""
        from safetensors.torch import load_file
        from transformers import AutoModelForCausalLM

        folder = Path(folder)
        if not (folder / FEATURES_FILE).is_file():
            raise ValueError(f"{folder} holds no feature draft ({FEATURES_FILE} missing): save one with "
                             "FeatureDraft.save_pretrained")
        layers = tuple(json.loads((folder / FEATURES_FILE).read_text())["feature_layers"])
        draft = cls(AutoModelForCausalLM.from_pretrained(folder, dtype=dtype), layers)
        extra = load_file(str(folder / WEIGHTS_FILE))
        draft.fc.load_state_dict({k.removeprefix("fc."): v for k, v in extra.items() if k.startswith("fc.")})
        draft.reduce.load_state_dict({k.removeprefix("reduce."): v for k, v in extra.items()
                                      if k.startswith("reduce.")})
        return draft.to(dtype).eval()


def _int_tuple(name: str, value: Any, example: tuple[int, ...]) -> tuple[int, ...]:
    """`value` as a tuple of ints (a list or tuple of them; bools refused), else a ValueError naming `name`."""
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(index, numbers.Integral) and not isinstance(index, bool) for index in value):
        raise ValueError(f"{name} must be a tuple of ints, got {value!r}; e.g. {name}={example}")
    return tuple(int(index) for index in value)


def check_layers(layers: Any, depth: int) -> tuple[int, ...]:
    """`layers` as decoder-layer indices of a `depth`-layer target: 0..depth-1, or -depth..-1 from the end;
    at least one. A layer may be named twice (each copy is a separate layer of the draft)."""
    example = (depth - 1,)
    layers = _int_tuple("layers", layers, example)
    if not layers:
        raise ValueError(f"layers must name at least one decoder layer of the target (it has {depth}: "
                         f"0..{depth - 1}), got (); e.g. layers={example}")
    if not all(-depth <= index < depth for index in layers):
        raise ValueError(f"layers must name decoder layers of the target, which has {depth}: 0..{depth - 1} "
                         f"(or -{depth}..-1 from the end), got {layers}; e.g. layers={example}")
    return layers


def check_feature_layers(feature_layers: Any, depth: int) -> tuple[int, ...]:
    """`feature_layers` as hidden-state indices of a `depth`-layer target, HF's `hidden_states` numbering: 0 the
    embeddings, i the output of decoder layer i, depth (or -1) the final normed state. Distinct: the target's
    runner writes each state once, so a state named twice would be read as zeros in its second slot."""
    example = tuple(sorted({1, depth // 2} & set(range(1, depth)))) + (-1,)
    feature_layers = _int_tuple("feature_layers", feature_layers, example)
    states = f"0..{depth} (0 the embeddings, i the output of decoder layer i, {depth} or -1 the final normed state)"
    if not feature_layers:
        raise ValueError(f"feature_layers must name at least one hidden state of the target, in {states}, "
                         f"got (); e.g. feature_layers={example}")
    if not all(0 <= index <= depth or index == -1 for index in feature_layers):
        raise ValueError(f"feature_layers must be distinct hidden-state indices of the target in {states}, "
                         f"got {feature_layers}; e.g. feature_layers={example}")
    seen: set[int] = set()
    for index in runner.state_indices(feature_layers, depth):
        if index in seen:
            alias = f" (-1 is {depth} here)" if index == depth and -1 in feature_layers else ""
            raise ValueError(f"feature_layers names hidden state {index} twice{alias}, got {feature_layers}; "
                             f"e.g. feature_layers={example}")
        seen.add(index)
    return feature_layers


@torch.no_grad()
def target_states(target: torch.nn.Module, tokens: torch.Tensor,
                  feature_layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(states [B, C, len(feature_layers) * hidden], logits [B, C, V]) of an HF target on [B, C] tokens: its
    hidden states at `feature_layers`, each RMS-normalised, concatenated (what a draft reads of `LlamaRunner`'s
    states: `LlamaRunner.read_states`)."""
    out = target.model(input_ids=tokens, output_hidden_states=True)
    states = [runner.rms_normalise(out.hidden_states[i]) for i in feature_layers]
    return torch.cat(states, -1), target.lm_head(out.last_hidden_state)


def previous_states(states: torch.Tensor) -> torch.Tensor:
    """[B, C, ·] states shifted one position on: what each position's draft input reads (zeros at the first)."""
    return torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1]], 1)


REGIMES = ("exact", "pessimistic")


def depth_mask(depth: int, n: int, device: torch.device) -> torch.Tensor:
    """[depth·n, depth·n] bool attention mask of `unroll`'s exact regime (True: attend): block a's entry j (the
    depth-(a+1) draft token of the step whose first drafted position is j + 1) sees block 0 up to j (the
    context, read with the target's true states) and blocks 1..a at j (the step's earlier drafted tokens)."""
    index = torch.arange(n, device=device).repeat(depth)
    block = torch.arange(depth, device=device).repeat_interleave(n)
    context = (block[None] == 0) & (index[None] <= index[:, None])
    same_step = (block[None] >= 1) & (block[None] <= block[:, None]) & (index[None] == index[:, None])
    return context | same_step


def unroll(draft: FeatureDraft, tokens: torch.Tensor, features: torch.Tensor, depth: int, regime: str = "exact",
           noise: float = 0.0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The draft at depths 1..`depth` over [B, C] windows with the target's `features` [B, C, ·]: per depth k,
    (hidden states, logits) [B, C - k, ·], entry j predicting token j + k + 1 (the target's logits[:, k:]
    score the same tokens). `noise`: uniform noise of that width on the states fed at depth 1 (training).

    Depth 1 reads the target's true states; depth k > 1 reads the draft's own depth k - 1 output. "exact": as in
    a real step, whose context before its first drafted position was read with true states: every depth's
    entries see the true-state context and their own step's earlier depths (`depth_mask`, one forward per
    depth over the blocks so far). "pessimistic": every position of depth k reads depth k - 1's outputs, its
    context included."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
    fed = features[:, :-1] + noise * (torch.rand_like(features[:, :-1]) - 0.5) if noise else features[:, :-1]
    if regime == "pessimistic":
        out = []
        for k in range(1, depth + 1):
            hidden, logits = draft(tokens[:, k:], fed, reduced=k > 1)
            out.append((hidden, logits))
            fed = hidden[:, :-1]
        return out
    batch, n = tokens.shape[0], tokens.shape[1] - 1
    model = draft.body.model
    mask = depth_mask(depth, n, tokens.device)
    blocks = [draft.inputs(tokens[:, 1:], fed)]
    out = []
    for k in range(1, depth + 1):
        positions = torch.cat([torch.arange(n, device=tokens.device) + a + 1 for a in range(k)])
        hidden = model(inputs_embeds=torch.cat(blocks, 1), position_ids=positions[None].expand(batch, -1),
                       attention_mask=mask[:k * n, :k * n][None, None]).last_hidden_state[:, (k - 1) * n:]
        out.append((hidden[:, :n - k + 1], draft.body.lm_head(hidden[:, :n - k + 1])))
        if k < depth:  # depth k + 1's entry j: token j + k + 1 (padded past the window), fed depth k's output j
            following = torch.nn.functional.pad(tokens[:, k + 1:], (0, k))
            blocks.append(draft.inputs(following, hidden, reduced=True))
    return out


def window_inputs(draft: FeatureDraft, tokens: torch.Tensor, positions: torch.Tensor, states: torch.Tensor,
                  rows: torch.Tensor, final: int | None, norm: torch.nn.Module) -> torch.Tensor:
    """`draft`'s input for `tokens` at `positions` of `rows` [B, 1], each fed the target's reduced states at
    the position before, read from the [B, S, k·hidden] buffer `states` of raw states, normalised as
    `runner.normalised_states` (`final`, `norm`: the target runner's `final_state_slot` and final norm; zeros
    before position 0)."""
    raw = states[rows, (positions - 1).clamp(min=0)]                                 # [B, q, k·hidden]
    before = runner.normalised_states(raw, len(draft.feature_layers), final, norm)
    before = torch.where((positions > 0)[..., None], before, torch.zeros_like(before))
    return draft.inputs(tokens, before)


def fed_inputs(draft: FeatureDraft, tokens: torch.Tensor, fed: torch.Tensor) -> torch.Tensor:
    """`draft`'s input for `tokens` fed its own previous output `fed` [B, q, hidden]."""
    return draft.inputs(tokens, fed, reduced=True)


def hidden_and_logits(norm: torch.nn.Module, lm_head: torch.nn.Module, x: torch.Tensor,
                      logits_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The final normed hidden state of the last layer's output `x` and its logits (in `logits_dtype`)."""
    hidden = norm(x)
    logits = lm_head(hidden)
    return hidden, logits if logits_dtype is None else logits.to(logits_dtype)


FEATURE_REGIONS = (window_inputs, fed_inputs, hidden_and_logits)


class FeatureRunner(runner.LlamaRunner):
    """A `FeatureDraft` on the fast path: a static-cache runner over its decoder body whose input at each
    position is ``fc([embed(token), g])``, g the reduced target states at the position before (read from
    `source.states`, the target runner's buffer; zeros before position 0) or, when `fed` is set, `fed`
    itself (the draft's own output past its first drafted token). Each forward keeps its output's final
    normed hidden state at the logits' columns in `last_hidden`, for the next drafted token."""

    def __init__(self, draft: FeatureDraft, source: runner.LlamaRunner, max_batch: int, max_len: int,
                 **kwargs: Any) -> None:
        if source.states is None or source.state_layers != runner.state_indices(draft.feature_layers,
                                                                                 len(source.layers)):
            raise ValueError(f"the target's runner must write the states this draft reads "
                             f"(state_layers={draft.feature_layers})")
        # regions, not the whole forward: `fed` and `last_hidden` pass between forwards outside the graph
        super().__init__(draft.body, max_batch, max_len, **{**kwargs, "compile_scope": "regions"})
        self.draft = draft
        self.source = source
        self.fed: torch.Tensor | None = None
        self.last_hidden: torch.Tensor | None = None
        # its own small pieces compiled like the body's regions (the same lengths): a few kernels each
        # instead of a dozen, at every drafted token
        mode = kwargs.get("compile", False)
        self._feature_regions = {False: FEATURE_REGIONS, True: FEATURE_REGIONS if mode is False else tuple(
            runner.compile_region(fn, "default" if mode is True else mode) for fn in FEATURE_REGIONS)}

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, bucket: int,
                logits_index: torch.Tensor | None = None, fed: torch.Tensor | None = None) -> torch.Tensor:
        """`LlamaRunner.forward`, the inputs built from the target's states (or `fed` [B, q, hidden])."""
        self.fed = fed
        try:
            return super().forward(tokens, positions, bucket, logits_index)
        finally:
            self.fed = None

    def inputs(self, tokens: torch.Tensor, positions: torch.Tensor, compiled: bool = False) -> torch.Tensor:
        window, fed, _ = self._feature_regions[compiled]
        if self.fed is not None:
            return fed(self.draft, tokens, self.fed)
        source = self.source
        return window(self.draft, tokens, positions, source.states, source.rows[:tokens.shape[0], None],
                      source.final_state_slot, source.norm)

    def output(self, head: Any, x: torch.Tensor, compiled: bool = False) -> torch.Tensor:
        self.last_hidden, logits = self._feature_regions[compiled][2](self.norm, self.lm_head, x, self.logits_dtype)
        return logits

    def next_draft(self, tokens: torch.Tensor, positions: torch.Tensor, bucket: int) -> torch.Tensor:
        """The next drafted token's logits: `tokens` [B, 1] fed the previous forward's output."""
        return self.forward(tokens, positions, bucket, fed=self.last_hidden)
