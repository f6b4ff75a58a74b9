"""Healing with and without a linear bridge on stories260K (docs/healing.md, "Healing after a bridge"): layer 2
removed, the recipe of experiments/heal_objectives.py's LoRA/lm row (30 updates × 4 × 64 tokens, lr 3e-3), measured on the
same windows and the shipped held-out text: no repair; --repair bridge (LoRA from the bridged model); --repair bridge
--train bridge (LoRA and the bridge's W), for both bridge forms.

    python3 -m experiments run heal_bridge      (from the checkout's root; CPU, a few minutes)
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

#: the configuration of the run the docs quote (python -m experiments run heal_bridge): its defaults
CONFIG: dict = {}

ck = load_checkpoint("tests/fixtures/models/stories260K", device="cpu")
corpus = from_text(" ".join(from_file("tests/fixtures/data/wikitext-2-raw/wiki.test.raw").words[:40_000]), name="wiki40k")
heldout = from_file("tests/fixtures/data/heldout/american-speeches.txt")
ev = Evaluator("cmp", 1200, 256, 128)
for repair, form, part in (("none", None, "lora"), ("bridge", "folded", "lora"), ("bridge", "folded", "bridge"),
                           ("bridge", "residual", "lora"), ("bridge", "residual", "bridge")):
    r = Recipe(steps=30, rank=8, seq_len=64, batch=4, lr=3e-3, warmup=5, part=part)
    t = time.time()
    setup = HealSetup(corpus=corpus, evaluator=ev, identity=ck.identity, heldout=heldout, repair=repair,
                      bridge={"form": form} if form else None)
    res = heal(ck.model, ck.tokenizer, [2], r, setup)
    rows = []
    for name, h in (("eval", res), ("held-out", None)):
        p = res.ppl if h is not None else res.held_out["ppl"]
        rep = res.repair.get("eval" if h is not None else "held_out") if res.repair else None
        bridged = f"{rep['rows']['bridged']['ppl']:.1f}" if rep else "-"
        rows.append(f"{name}: base {p['base']:.1f} raw {p['pruned']:.1f} bridged {bridged} healed {p['healed']:.1f} "
                    f"ctrl {p['base_finetuned']:.1f}")
    rc = res.recovered_ci or [float("nan")] * 2
    print(f"{repair:6} {form or '-':8} train {part:6} params {res.training['healed']['trainable_params']:>7,}  "
          + "  |  ".join(rows) + f"  recovered {res.recovered:+.2f} [{rc[0]:+.2f}, {rc[1]:+.2f}]  "
          f"gate {'REFUSE' if res.gate_line() else 'ok'}  {time.time() - t:.0f}s", flush=True)
