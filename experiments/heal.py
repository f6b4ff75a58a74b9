"""Healing after removal, per protocol, against the honest control (docs/healing.md).

    HF_HUB_OFFLINE=1 python -m experiments run heal ../shared/models/stories260K --n 2,3 --spacing 0 --steps 100
    HF_HUB_OFFLINE=1 SWAPKL_CACHE=/tmp/vcache-heal python -m experiments run heal default --n 2,4 --steps 60

For interchange- and replacement-guided removal at each n: ΔPPL before healing (pruned vs base), after healing
against the base and against the base fine-tuned with the same recipe on the same text, the share of the damage
recovered (paired bootstrap CI over the shared evaluation windows), steps, tokens and wall time; every set healed in
one run with one recipe and one control (swapkl.healing.multi.heal_curves), then the paired comparison of the
two methods at each n (A − B, same windows) and the headline; --json writes the healed curves.  Then the training
speed of swapkl's loop against a plain transformers + peft loop with the same recipe (same model, LoRA targets,
optimizer, batches), interleaved in this run, as a ratio (> 1: swapkl is faster).  Prints a markdown table.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path



#: the configuration of the run the docs quote: the runner (python -m experiments run heal) passes each as --key value unless the command line gives it
CONFIG = {
    'methods': 'interchange,replacement',
    'n': '2,4',
    'spacing': 1,
    'steps': 100,
    'rank': 8,
    'lr': 0.002,
    'seq_len': 128,
    'batch': 8,
    'evaluator': 'matched',
    'speed_steps': 30,
    'prompts': 16,
    'tokens': 64,
}


def plain_stepper(model, removed, chunks, recipe):
    """The textbook transformers + peft loop with the recipe, one update per call."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from swapkl.healing.train import lora_targets
    from swapkl.surgery.blocks import pruned_copy

    m = copy.deepcopy(pruned_copy(model, removed))
    names, conv = lora_targets(m)
    torch.manual_seed(recipe.seed)
    pm = get_peft_model(m, LoraConfig(r=recipe.rank, lora_alpha=recipe.alpha, lora_dropout=recipe.dropout,
                                      target_modules=names, fan_in_fan_out=conv, task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in pm.parameters() if p.requires_grad], lr=recipe.lr)
    g = torch.Generator().manual_seed(recipe.seed)
    pm.train()

    def step():
        x = chunks[torch.randint(0, len(chunks), (recipe.batch,), generator=g)]
        loss = pm(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def speed(model, removed, chunks, recipe) -> dict:
    """tokens/s of swapkl's loop (checkpoints on, into a temporary folder) and of the plain loop, in lockstep: after
    each of swapkl's updates (timed from the end of the previous callback: its whole loop body, checkpoint writes
    included) one plain update runs and is timed, so every pair of updates shares the machine's load of that
    moment (the CPU is shared).  The first pair (warm-up) is dropped."""
    from swapkl.healing import train as TR

    plain = plain_stepper(model, removed, chunks, recipe)
    ours, theirs = [], []
    mark = [time.perf_counter()]

    def progress(step, steps, msg):
        ours.append(time.perf_counter() - mark[0])
        t = time.perf_counter()
        plain()
        theirs.append(time.perf_counter() - t)
        mark[0] = time.perf_counter()

    with tempfile.TemporaryDirectory() as tmp:
        TR.train(model, removed, chunks, recipe, Path(tmp), progress=progress)
    ours, theirs = ours[1:], theirs[1:]
    tok = recipe.batch * recipe.seq_len
    per_step = sorted(p / o for o, p in zip(ours, theirs))
    return {"swapkl_tok_s": tok * len(ours) / sum(ours), "plain_tok_s": tok * len(theirs) / sum(theirs),
            "ratio": sum(theirs) / sum(ours), "median_step_ratio": statistics.median(per_step),
            "steps": len(ours)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="default")
    ap.add_argument("--methods", default="interchange,replacement")
    ap.add_argument("--n", default="2,4", help="set sizes: 2,4 or 1-4 (every n healed for every method, one run)")
    ap.add_argument("--spacing", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--evaluator", default="matched")
    ap.add_argument("--max-words", type=int, default=None)
    ap.add_argument("--speed-steps", type=int, default=30, help="updates of the lockstep speed check (0: skip)")
    ap.add_argument("--prompts", type=int, default=16, help="the scoring contract's prompts (P)")
    ap.add_argument("--tokens", type=int, default=64, help="... and tokens per prompt (T)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, metavar="OUT", help="write the healed curves (swapkl report --heal reads it)")
    a = ap.parse_args()
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from swapkl.contract import Contract
    from swapkl.healing.heal import training_text
    from swapkl.healing.heal import HealSetup
    from swapkl.healing.multi import heal_curves, parse_ns
    from swapkl.removal.plan import RemovalPlan, RunHooks
    from swapkl.healing.recipe import Recipe
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.measure.evaluate import Evaluator, get_evaluator
    from swapkl.scoring.corpora import load_corpus
    from swapkl.scoring.score import score

    ck = load_checkpoint(a.model)
    corpus = load_corpus()
    ev = get_evaluator(a.evaluator)
    if a.max_words:
        ev = Evaluator(f"{ev.name}@{a.max_words}w", a.max_words, ev.window, ev.stride)
    recipe = Recipe(steps=a.steps, rank=a.rank, alpha=2.0 * a.rank, lr=a.lr, seq_len=a.seq_len, batch=a.batch)
    res = score(ck, Contract(corpus=None, prompts=a.prompts, tokens=a.tokens))
    scores = {"replacement": res.replacement(), "interchange": res.interchange()}
    print(f"model {ck.identity.get('display')} ({ck.num_layers} layers), corpus {corpus.label}, evaluator "
          f"{ev.name} ({ev.max_words} words, {ev.window}/{ev.stride}); recipe {recipe.describe()}; "
          f"threads {torch.get_num_threads()}", flush=True)

    def progress(done, total, msg):
        if "PPL" in msg or done == total:
            print(f"  [{done}/{total}] {msg}", flush=True)

    t = time.perf_counter()
    ns = parse_ns(a.n)
    plan = RemovalPlan(max(ns), tuple(m for m in a.methods.split(",") if m), spacing=a.spacing, evaluator=ev)
    hc = heal_curves(ck.model, ck.tokenizer, scores, plan, ns, recipe,
                     HealSetup(corpus=corpus, identity=ck.identity, prompts=a.prompts, tokens=a.tokens),
                     RunHooks(progress=progress))
    wall = time.perf_counter() - t
    print()
    print(table(hc, recipe))
    print()
    print(comparison(hc))
    print(f"\nwall {wall:.0f} s for the whole run (one control, {len(hc.windows['sets'])} distinct sets)")
    if a.json:
        hc.to_json(a.json)
        print(f"wrote {a.json} (python -m swapkl report --heal {a.json} --out heal.html)")
    if a.speed_steps:
        tt = training_text(ck.model, ck.tokenizer, corpus, recipe, prompts=a.prompts, tokens=a.tokens)
        sr = Recipe(**{**recipe.__dict__, "steps": a.speed_steps, "checkpoint_every": 10})  # one write included
        s = speed(ck.model, next(iter(hc.methods.values()))[0]["removed"], tt.chunks, sr)
        print(f"\ntraining speed ({s['steps']} updates × {sr.batch} × {sr.seq_len} tokens each, in lockstep, "
              f"checkpoint every 10): swapkl {s['swapkl_tok_s']:.0f} tok/s, plain transformers + peft "
              f"{s['plain_tok_s']:.0f} tok/s; ratio {s['ratio']:.2f} (median per-update ratio "
              f"{s['median_step_ratio']:.2f}; > 1: swapkl faster)")
    return 0


def _ci(x: dict) -> str:
    return f"{x['value']:+.1f} [{x['ci'][0]:+.1f}, {x['ci'][1]:+.1f}]"


def table(hc, recipe) -> str:
    out = ["| method | n | removed | ΔPPL % before healing | healed vs base | healed vs fine-tuned base | recovered "
           "| steps | tokens | wall s (healed / control) |", "|" + "---|" * 10]
    seen: dict = {}
    for method, entries in hc.methods.items():
        for e in entries:
            d = e["delta_pct"]
            first = seen.setdefault(tuple(e["removed"]), method)
            rec = "–" if e["recovered"] is None else (f"{100 * e['recovered']:.0f} % [{100 * e['recovered_ci'][0]:.0f}, "
                                                      f"{100 * e['recovered_ci'][1]:.0f}]")
            tr = e["training"]
            w = " / ".join("cached" if tr[k].get("cached") else f"{tr[k]['seconds']:.0f}"
                           for k in ("healed", "base_finetuned")) + f" (run {e.get('seconds') or 0:.0f})"
            if first != method:
                w = f"the {first} row's heal (same set)"
            out.append(f"| {method} | {e['n']} | {e['removed']} | {_ci(d['pruned_vs_base'])} | "
                       f"{_ci(d['healed_vs_base'])} | {_ci(d['healed_vs_base_finetuned'])} | {rec} | {recipe.steps} | "
                       f"{recipe.tokens_seen} | {w} |")
    e0 = next(iter(hc.methods.values()))[0]
    out.append("")
    out.append(f"PPL base {e0['ppl']['base']:.4g}, fine-tuned base {e0['ppl']['base_finetuned']:.4g} "
               f"({_ci(e0['delta_pct']['base_finetuned_vs_base'])} %): the control every healed model is held to.")
    return "\n".join(out)


def comparison(hc) -> str:
    """The paired comparison per n (A − B, percentage points of the base PPL, same windows) and the headline."""
    if not hc.comparisons:
        return "(one method: no paired comparison)"
    out = ["| n | A − B before healing (pp) | | healed, vs base (pp) | | healed, vs fine-tuned base (pp) | |",
           "|" + "---|" * 7]
    for c in hc.comparisons:
        d = c["diff"]
        out.append(f"| {c['n']} | {_ci(d['before'])} | {d['before']['word']} | {_ci(d['healed'])} | "
                   f"{d['healed']['word']} | {_ci(d['healed_vs_finetuned'])} | {d['healed_vs_finetuned']['word']} |")
    out.append("")
    out += [f"* {c['sentence']}" for c in hc.comparisons]
    out.append(f"\nheadline: {hc.headline}")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
