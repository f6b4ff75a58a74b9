"""Every healing objective × trained part on stories260K (docs/healing.md, "A first comparison"): the same removal
set (layer 2), training tokens, steps and evaluation windows, and the shipped held-out text.

    python3 -m experiments run heal_objectives      (from the checkout's root; CPU, a few minutes)
"""
import os
import tempfile
import time
os.environ["SWAPKL_CACHE"] = tempfile.mkdtemp()
from swapkl.model.checkpoints import load_checkpoint
from swapkl.healing.heal import HealSetup, heal
from swapkl.healing.recipe import Recipe
from swapkl.measure.evaluate import Evaluator
from swapkl.scoring.corpora import from_file, from_text

#: the configuration of the run the docs quote (python -m experiments run heal_objectives): its defaults
CONFIG: dict = {}

ck = load_checkpoint("tests/fixtures/models/stories260K", device="cpu")
corpus = from_text(" ".join(from_file("tests/fixtures/data/wikitext-2-raw/wiki.test.raw").words[:40_000]), name="wiki40k")
heldout = from_file("tests/fixtures/data/heldout/american-speeches.txt")
ev = Evaluator("cmp", 1200, 256, 128)
for part, lr in (("lora", 3e-3), ("last-k", 3e-4)):
    for obj in ("lm", "kd", "kd+lm"):
        r = Recipe(steps=30, rank=8, seq_len=64, batch=4, lr=lr, warmup=5, objective=obj, part=part, last_k=2, top_k=32, temperature=1.0)
        t = time.time()
        res = heal(ck.model, ck.tokenizer, [2], r, HealSetup(corpus=corpus, evaluator=ev, identity=ck.identity, heldout=heldout))
        d, h = res.delta_pct, res.held_out
        rc = res.recovered_ci or [float("nan")] * 2
        hv = h["delta_pct"]["healed_vs_pruned"]
        print(f"{part:6} {obj:5} params {res.training['healed']['trainable_params']:>7,}  PPL base {res.ppl['base']:.1f} pruned {res.ppl['pruned']:.1f} "
              f"healed {res.ppl['healed']:.1f} ctrl {res.ppl['base_finetuned']:.1f}  recovered {res.recovered:+.2f} [{rc[0]:+.2f}, {rc[1]:+.2f}]  "
              f"held-out pruned {h['ppl']['pruned']:.1f} healed {h['ppl']['healed']:.1f} ({hv['value']:+.1f} % [{hv['ci'][0]:+.1f}, {hv['ci'][1]:+.1f}])  "
              f"gate {'REFUSE' if res.gate_line() else 'ok'}  {time.time()-t:.0f}s", flush=True)
        if obj != "lm":
            c = res.training["healed"]["kd_topk_check"]
            print(f"        top-{c['k']} check: KL full {c['kl_full']:.4f} top-k {c['kl_topk']:.4f} gap {c['gap']:.2e} tail mean {c['tail_mass_mean']:.3f}", flush=True)
