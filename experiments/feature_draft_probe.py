"""How well a draft that reads the target's hidden states accepts on SmolLM2, before building it into the engine.

The distilled pool's drafts read tokens only: two decoder layers distilled from SmolLM2 accept about 0.44-0.61
per token at T = 1 (Σ min(p, q), held-out text). A draft that also reads the target's last hidden state
(EAGLE's idea: the draft's input at position i is fc([embed(x_i), f_{i-1}]), f the target's final, normed
hidden state; its output is a predicted f̂_i whose head gives the next token; or, as in EAGLE-3, a linear map of
a low, a middle and the top layer's states, trained on the token loss alone, optionally also on its own
outputs fed back, `--ttt` depths deep: EAGLE-3's training-time test) starts from everything the
target knows about the context. This probe trains such a draft (one decoder layer, from the target's last,
embedding, norm and head the target's) for `--budget-s` seconds on the pool's corpora and measures, on held-out
windows, Σ min(p, q) at T = 1 and argmax agreement at depth 1 (true features in) and at depths 2..`--depth`
(the draft's own outputs in). `--regime exact` (the default) trains and measures the later depths as a real step
sees them, the context read with true states (`unroll`); the first runs used `pessimistic`, every position of a
later depth reading the draft's outputs, its context included.

    python experiments/feature_draft_probe.py --out results/feature_draft_probe_h200.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashspec import corpora, provenance, zoo  # noqa: E402
from flashspec.sampling import SamplingParams, warp_logits  # noqa: E402
from flashspec.zoo import distill, measure, training  # noqa: E402


class FeatureDraft(torch.nn.Module):
    """A decoder stack over fc([embed(token), g]); returns (its output hidden state, logits). g is the target's
    features reduced to the hidden size (`reduce`: identity for the final layer's alone, a linear map of several
    layers' normalised hidden states as in EAGLE-3) or, fed back, the draft's own output."""

    def __init__(self, teacher: torch.nn.Module, layers: tuple[int, ...], feature_layers: tuple[int, ...]) -> None:
        super().__init__()
        self.body = distill.draft_from_teacher(teacher, layers)
        hidden = teacher.config.hidden_size
        self.feature_layers = feature_layers
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.reduce = (torch.nn.Linear(len(feature_layers) * hidden, hidden, bias=False)
                       if len(feature_layers) > 1 else torch.nn.Identity())
        with torch.no_grad():
            self.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.eye(hidden)], 1))

    def forward(self, tokens: torch.Tensor, features: torch.Tensor,
                reduced: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        embedded = self.body.model.embed_tokens(tokens)
        g = features.to(embedded.dtype) if reduced else self.reduce(features.to(embedded.dtype))
        x = self.fc(torch.cat([embedded, g], -1))
        out = self.body.model(inputs_embeds=x).last_hidden_state
        return out, self.body.lm_head(out)


@torch.no_grad()
def teacher_outputs(teacher: torch.nn.Module, windows: torch.Tensor,
                    feature_layers: tuple[int, ...] = (-1,)) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, logits) of the teacher on [B, C] windows: the hidden states at `feature_layers` (indices of
    HF's hidden_states: 0 the embeddings, -1 the final normed state), each RMS-normalised, concatenated."""
    out = teacher.model(input_ids=windows, output_hidden_states=len(feature_layers) > 1 or feature_layers != (-1,))
    logits = teacher.lm_head(out.last_hidden_state)
    if feature_layers == (-1,):
        return out.last_hidden_state, logits
    states = [out.hidden_states[i] for i in feature_layers]
    states = [h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype) for h in states]
    return torch.cat(states, -1), logits


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
    """The draft at depths 1..`depth` over [B, C] windows: per depth k, (hidden states, logits) [B, C - k, ·],
    entry j predicting token j + k + 1 (the teacher's logits[:, k:] score the same tokens).

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
    embed, model = draft.body.model.embed_tokens, draft.body.model
    mask = depth_mask(depth, n, tokens.device)
    blocks = [draft.fc(torch.cat([embed(tokens[:, 1:]), draft.reduce(fed.to(embed.weight.dtype))], -1))]
    out = []
    for k in range(1, depth + 1):
        positions = torch.cat([torch.arange(n, device=tokens.device) + a + 1 for a in range(k)])
        hidden = model(inputs_embeds=torch.cat(blocks, 1), position_ids=positions[None].expand(batch, -1),
                       attention_mask=mask[:k * n, :k * n][None, None]).last_hidden_state[:, (k - 1) * n:]
        out.append((hidden[:, :n - k + 1], draft.body.lm_head(hidden[:, :n - k + 1])))
        if k < depth:  # depth k + 1's entry j: token j + k + 1 (padded past the window), fed depth k's output j
            following = torch.nn.functional.pad(tokens[:, k + 1:], (0, k))
            blocks.append(draft.fc(torch.cat([embed(following), hidden.to(embed.weight.dtype)], -1)))
    return out


def train(draft: FeatureDraft, teacher: torch.nn.Module, streams: list[torch.Tensor], budget_s: float,
          context: int, batch_size: int, lr: float, noise: float, device: torch.device, ttt: int = 1,
          regime: str = "exact", seed: int = 0) -> dict:
    """AdamW on KL(p_teacher || q_draft), summed over depths 1..`ttt` (`unroll` in `regime`: past depth 1 the
    draft reads its own outputs), + smooth-L1(f̂, f) for a final-feature draft, until `budget_s` seconds have
    passed."""
    draft.to(device).train()
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else torch.autocast("cpu", enabled=False))
    losses, started, step = [], time.perf_counter(), 0
    estimate = None
    while True:
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s:
            break
        if step == 20:
            estimate = int(budget_s / (elapsed / 20))
        total = estimate or 10 ** 6
        for group in optimizer.param_groups:
            group["lr"] = training.learning_rate(step, total, lr, 0.05)
        batch = training.sample_batch(streams, batch_size, context, generator).to(device)[:, :-1]
        with autocast:
            features, logits = teacher_outputs(teacher, batch, draft.feature_layers)
            # depth > 1: the draft's own outputs fed back (training-time test)
            depths = unroll(draft, batch, features, ttt, regime, noise)
            kl = sum(distill.forward_kl(logits[:, k:], out) for k, (_, out) in enumerate(depths, start=1))
            if draft.feature_layers == (-1,):  # the output imitates the final feature it is fed back as
                regression = torch.nn.functional.smooth_l1_loss(depths[0][0].float(), features[:, 1:].float())
            else:  # several layers' features: the token loss alone (EAGLE-3)
                regression = torch.zeros((), device=batch.device)
            loss = kl + regression
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 10 == 0:
            losses.append([step, float(kl.detach()), float(regression.detach())])
        step += 1
    draft.eval()
    return {"steps": step, "seconds": time.perf_counter() - started, "losses_every_10": losses}


@torch.no_grad()
def acceptance(draft: FeatureDraft, teacher: torch.nn.Module, ids: torch.Tensor, context: int, max_tokens: int,
               depth: int, device: torch.device, regime: str = "exact", batch_size: int = 16) -> dict:
    """Per depth 1..`depth` (`unroll` in `regime`): mean Σ min(p, q) at T = 1 and argmax agreement on held-out
    windows."""
    windows = measure.heldout_windows(ids, context, max_tokens)
    sums = {k: [0.0, 0.0, 0] for k in range(1, depth + 1)}
    params = SamplingParams(temperature=1.0)
    for start in range(0, windows.shape[0], batch_size):
        batch = windows[start:start + batch_size].to(device)
        features, logits = teacher_outputs(teacher, batch, draft.feature_layers)
        for k, (_, draft_logits) in enumerate(unroll(draft, batch, features, depth, regime), start=1):
            p = warp_logits(logits[:, k:].float(), params).exp()
            q = warp_logits(draft_logits.float(), params).exp()
            sums[k][0] += float(torch.minimum(p, q).sum(-1).sum())
            sums[k][1] += float((logits[:, k:].argmax(-1) == draft_logits.argmax(-1)).sum())
            sums[k][2] += p.shape[0] * p.shape[1]
    return {str(k): {"sum_min_t1": s / n, "argmax_agreement": a / n, "positions": n} for k, (s, a, n) in sums.items()}


def expected_tokens(rates: list[float], gamma: int) -> float:
    """1 + Σ_{j ≤ γ} Π_{i ≤ j} a_i: tokens per step if depth i accepts with probability a_i given the earlier."""
    total, run = 1.0, 1.0
    for rate in rates[:gamma]:
        run *= rate
        total += run
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--teacher", default="smollm2", choices=sorted(distill.TEACHERS))
    parser.add_argument("--size", default="smollm2")
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--variants", nargs="+", default=None,
                        help="drafts to train: the teacher layers each starts from, optionally ':' and the hidden "
                             "states it reads (indices of HF's hidden_states; default -1, the final normed one), "
                             "e.g. 29 28,29 29:3,15,-1")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--noise", type=float, default=0.2, help="uniform noise width on training features")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-tokens", type=int, default=16384)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--regime", default="exact", choices=REGIMES,
                        help="what depths past 1 see, in training and measurement (`unroll`); the first runs "
                             "used 'pessimistic'")
    parser.add_argument("--ttt", type=int, default=1,
                        help="training depths: past 1, the draft learns on its own outputs fed back (EAGLE-3)")
    parser.add_argument("--train-chars", type=int, default=None)
    parser.add_argument("--git-sha", default=None)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    config = zoo.get_config(args.size)
    started = time.perf_counter()
    teacher, tokenizer = distill.load_teacher(args.teacher, device)
    domain_corpora = corpora.assemble(args.train_chars or config.train_chars_per_domain, config.domains)
    train_ids = {d: training.encode_text(tokenizer, domain_corpora[d].train_text) for d in config.domains}
    heldout = {d: training.encode_text(tokenizer, domain_corpora[d].heldout_text) for d in config.domains}
    variants = {}
    for spec in args.variants or [str(teacher.config.num_hidden_layers - 1)]:
        init, _, fed = spec.partition(":")
        layers = tuple(int(x) for x in init.split(","))
        feature_layers = tuple(int(x) for x in fed.split(",")) if fed else (-1,)
        torch.manual_seed(0)
        draft = FeatureDraft(teacher, layers, feature_layers)
        trained = train(draft, teacher, [train_ids[d] for d in config.domains], args.budget_s, config.context,
                        args.batch_size, args.lr, args.noise, device, args.ttt, args.regime)
        print(f"layers {layers}: {trained['steps']} steps in {trained['seconds']:.0f} s; "
              f"last kl/reg {trained['losses_every_10'][-1]}")
        results = {}
        for domain in config.domains:
            results[domain] = acceptance(draft, teacher, heldout[domain], config.context, args.eval_tokens,
                                         args.depth, device, args.regime)
            rates = [results[domain][str(k)]["sum_min_t1"] for k in range(1, args.depth + 1)]
            results[domain]["expected_tokens_t1"] = {g: expected_tokens(rates, g) for g in (2, 4)}
            print(domain, json.dumps({k: round(v["sum_min_t1"], 3) for k, v in results[domain].items()
                                      if k.isdigit()}), results[domain]["expected_tokens_t1"])
        variants[spec] = {"layers": list(layers), "feature_layers": list(feature_layers), "training": trained, "acceptance": results,
                          "trainable_parameters": sum(p.numel() for p in draft.parameters() if p.requires_grad)}
    command = "python experiments/feature_draft_probe.py " + " ".join(sys.argv[1:] if argv is None else argv)
    provenance.write_result(args.out, provenance.record(command, args.git_sha),
                            {**vars(args), "context": config.context},
                            {"variants": variants, "wall_seconds": time.perf_counter() - started})


if __name__ == "__main__":
    main()
