"""Draft-config sweep on a cached zoo: same tokenizer + target, variant drafts, exact alpha margins."""
import json, sys, time, dataclasses
import torch
from flashspec import zoo, corpora

size = sys.argv[1]
variants = json.loads(sys.argv[2])  # list of dicts: name, draft (ModelSpec kwargs), steps, lr, batch
device = zoo.pick_device(None)
config = zoo.get_config(size)
z = zoo.load_zoo(size, device=str(device), progress=False, dtype=torch.float32)
dc = corpora.assemble(config.train_chars_per_domain, config.domains)
train_ids = {d: zoo.encode_text(z.tokenizer, dc[d].train_text) for d in config.domains}
out = []
for v in variants:
    spec = zoo.ModelSpec(**{**dataclasses.asdict(config.draft), **v.get("draft", {})})
    cfg = config.with_overrides(draft=spec, batch_size=v.get("batch", config.batch_size),
                                weight_decay=v.get("wd", config.weight_decay))
    t0 = time.time()
    drafts = {}
    for name in [*config.domains, "general"]:
        doms = [name] if name != "general" else list(config.domains)
        m = zoo.make_model(spec, cfg, z.tokenizer, zoo.derive_seed(v.get("seed", 0), "init:draft-" + name))
        zoo.train_model(m, [train_ids[d] for d in doms], v["steps"], cfg, v["lr"],
                        zoo.derive_seed(v.get("seed", 0), "batches:draft-" + name), device, name, progress=False)
        drafts[name] = m.float().eval()
    t1 = time.time()
    acc = {n: {d: zoo.expected_acceptance(z.target, m, z.heldout[d], config.context, config.eval_tokens)
               for d in config.domains} for n, m in drafts.items()}
    ppl = {n: {d: zoo.perplexity(m, z.heldout[d], config.context, config.eval_tokens) for d in config.domains}
           for n, m in drafts.items()}
    marg = zoo.specialisation_margins(acc, config.domains)
    rec = {"variant": v, "train_s": t1 - t0, "acc": acc, "ppl": ppl, "margins": marg["margins"],
           "params": zoo.count_parameters(drafts["general"])}
    out.append(rec)
    print(json.dumps({"v": v["name"], "train_s": round(t1 - t0, 1), "margins": {k: round(x, 3) for k, x in marg["margins"].items()},
                      "diag": {d: round(acc[d][d], 3) for d in config.domains},
                      "gen": {d: round(acc["general"][d], 3) for d in config.domains}}), flush=True)
json.dump(out, open(sys.argv[3], "w"), indent=1)
