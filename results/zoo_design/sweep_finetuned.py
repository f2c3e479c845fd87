"""Specialists fine-tuned from the generalist: exact margins + ppl on a cached zoo variant folder."""
import json, sys, time, dataclasses, os, copy
import torch
from flashspec import zoo, corpora

base = sys.argv[1]; name = sys.argv[2]
over = json.loads(sys.argv[3]); variants = json.loads(sys.argv[4])
torch.set_num_threads(2)
config = zoo.get_config(base)
for k in ("target", "draft"):
    if k in over: over[k] = zoo.ModelSpec(**{**dataclasses.asdict(getattr(config, k)), **over[k]})
config = config.with_overrides(**over)
device = zoo.pick_device(None)
root = os.environ.get("SWEEP_ROOT", "/work/exp/zoos")
path = f"{root}/{name}"
dc = corpora.assemble(config.train_chars_per_domain, config.domains)
if not os.path.exists(path + "/manifest.json"):
    zoo.build_zoo(config, path, device=str(device), progress=False, domain_corpora=dc)
z = zoo.load_zoo(config, device=str(device), dtype=torch.float32, path=path, progress=False)
tppl = {d: zoo.perplexity(z.target, z.heldout[d], config.context, config.eval_tokens) for d in config.domains}
print(json.dumps({"zoo": name, "target_ppl": {k: round(v, 2) for k, v in tppl.items()}}), flush=True)
train_ids = {d: zoo.encode_text(z.tokenizer, dc[d].train_text) for d in config.domains}
out = []
for v in variants:
    spec = zoo.ModelSpec(**{**dataclasses.asdict(config.draft), **v.get("draft", {})})
    cfg = config.with_overrides(draft=spec, batch_size=v.get("batch", config.batch_size))
    ftcfg = cfg.with_overrides(batch_size=v.get("ft_batch", cfg.batch_size), warmup_fraction=v.get("ft_warmup", 0.05))
    t0 = time.time()
    gen = zoo.make_model(spec, cfg, z.tokenizer, zoo.derive_seed(config.seed, "init:draft-general"))
    zoo.train_model(gen, [train_ids[d] for d in config.domains], v["steps"], cfg, v.get("lr", config.draft_lr),
                    zoo.derive_seed(config.seed, "batches:draft-general"), device, "g", progress=False)
    drafts = {}
    for dn in config.domains:
        m = copy.deepcopy(gen)
        zoo.train_model(m, [train_ids[dn]], v["ft_steps"], ftcfg, v["ft_lr"],
                        zoo.derive_seed(config.seed, "batches:draft-" + dn), device, dn, progress=False)
        drafts[dn] = m.float().eval()
    drafts["general"] = gen.float().eval()
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
              open(f"{path}-ft.json", "w"), indent=1)
