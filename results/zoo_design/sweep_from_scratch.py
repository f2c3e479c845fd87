"""Build a zoo variant (target + default drafts) with overrides, then draft variants on it; exact margins + ppl."""
import json, sys, time, dataclasses, os
import torch
from flashspec import zoo, corpora

base = sys.argv[1]; name = sys.argv[2]
over = json.loads(sys.argv[3]); draft_variants = json.loads(sys.argv[4])
torch.set_num_threads(2)
config = zoo.get_config(base)
for k in ("target", "draft"):
    if k in over: over[k] = zoo.ModelSpec(**{**dataclasses.asdict(getattr(config, k)), **over[k]})
config = config.with_overrides(**over)
device = zoo.pick_device(None)
root = os.environ.get("SWEEP_ROOT", "/work/exp/zoos")
path = f"{root}/{name}"
t = time.time()
dc = corpora.assemble(config.train_chars_per_domain, config.domains)
if not os.path.exists(path + "/manifest.json"):
    zoo.build_zoo(config, path, device=str(device), progress=False, domain_corpora=dc)
build_s = time.time() - t
z = zoo.load_zoo(config, device=str(device), dtype=torch.float32, path=path, progress=False)
tok = {d: v["train"] for d, v in z.manifest["tokens"].items()}
tppl = {d: zoo.perplexity(z.target, z.heldout[d], config.context, config.eval_tokens) for d in config.domains}
print(json.dumps({"zoo": name, "build_s": round(build_s, 1), "timings": {k: round(v, 1) for k, v in z.manifest["timings"].items()}, "tokens": tok, "target_ppl": {k: round(v, 2) for k, v in tppl.items()}}), flush=True)
train_ids = {d: zoo.encode_text(z.tokenizer, dc[d].train_text) for d in config.domains}
out = []
for v in [{"name": "default"}] + draft_variants:
    spec = zoo.ModelSpec(**{**dataclasses.asdict(config.draft), **v.get("draft", {})})
    cfg = config.with_overrides(draft=spec, batch_size=v.get("batch", config.batch_size))
    steps = v.get("steps", config.draft_steps); lr = v.get("lr", config.draft_lr)
    t0 = time.time()
    if v["name"] == "default":
        drafts = z.drafts
    else:
        drafts = {}
        for dn in [*config.domains, "general"]:
            doms = [dn] if dn != "general" else list(config.domains)
            m = zoo.make_model(spec, cfg, z.tokenizer, zoo.derive_seed(config.seed, "init:draft-" + dn))
            zoo.train_model(m, [train_ids[d] for d in doms], steps, cfg, lr,
                            zoo.derive_seed(config.seed, "batches:draft-" + dn), device, dn, progress=False)
            drafts[dn] = m.float().eval()
    t1 = time.time()
    acc = {n: {d: zoo.expected_acceptance(z.target, m, z.heldout[d], config.context, config.eval_tokens)
               for d in config.domains} for n, m in drafts.items()}
    ppl = {n: {d: zoo.perplexity(m, z.heldout[d], config.context, config.eval_tokens) for d in config.domains}
           for n, m in drafts.items()}
    marg = zoo.specialisation_margins(acc, config.domains)
    out.append({"variant": v, "train_s": t1 - t0, "acc": acc, "ppl": ppl, "margins": marg["margins"]})
    print(json.dumps({"v": v["name"], "train_s": round(t1 - t0, 1), "margins": {k: round(x, 3) for k, x in marg["margins"].items()},
                      "diag": {d: round(acc[d][d], 3) for d in config.domains},
                      "gen": {d: round(acc["general"][d], 3) for d in config.domains},
                      "ppl_spec": {d: round(ppl[d][d], 1) for d in config.domains},
                      "ppl_gen": {d: round(ppl["general"][d], 1) for d in config.domains}}), flush=True)
json.dump({"zoo": name, "config": dataclasses.asdict(config), "target_ppl": tppl, "variants": out},
          open(f"{path}.json", "w"), indent=1)
