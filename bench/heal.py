"""Healing after removal, per protocol, against the honest control (docs/healing.md).

    HF_HUB_OFFLINE=1 python bench/heal.py ../shared/models/stories260K --n 2,3 --spacing 0 --steps 100
    HF_HUB_OFFLINE=1 SWAPKL_CACHE=/tmp/vcache-heal python bench/heal.py default --n 2,4 --steps 60

For interchange- and replacement-guided removal at each n: ΔPPL before healing (pruned vs base), after healing
against the base and against the base fine-tuned with the same recipe on the same text, the share of the damage
recovered (paired bootstrap CI over the shared evaluation windows), steps, tokens and wall time.  Then the training
speed of swapkl's loop against a plain transformers + peft loop with the same recipe (same model, LoRA targets,
optimizer, batches), interleaved in this run, as a ratio (> 1: swapkl is faster).  Prints a markdown table.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
    ap.add_argument("--n", default="2,4", help="set sizes, comma-separated")
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
    a = ap.parse_args()
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from swapkl.contract import Contract
    from swapkl.healing.heal import chosen_set, heal, training_text
    from swapkl.healing.recipe import Recipe
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.removal.evaluate import Evaluator, get_evaluator
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
    rows = []
    for n in [int(x) for x in a.n.split(",")]:
        for method in a.methods.split(","):
            removed, _ = chosen_set(ck.model, ck.tokenizer, method, n, scores, corpus, ev, spacing=a.spacing)
            t = time.perf_counter()
            r = heal(ck.model, ck.tokenizer, removed, recipe, corpus=corpus, evaluator=ev, identity=ck.identity,
                     prompts=a.prompts, tokens=a.tokens, selection={"method": method, "n": n})
            wall = time.perf_counter() - t
            rows.append((method, n, r, wall))
            d = r.delta_pct
            print(f"  {method} n={n} {removed}: pruned {d['pruned_vs_base']['value']:+.1f} %, healed vs base "
                  f"{d['healed_vs_base']['value']:+.1f} %, vs fine-tuned {d['healed_vs_base_finetuned']['value']:+.1f}"
                  f" %, recovered {r.recovered}  ({wall:.0f} s)", flush=True)
    print()
    print(table(rows, recipe))
    if a.speed_steps:
        tt = training_text(ck.model, ck.tokenizer, corpus, recipe, prompts=a.prompts, tokens=a.tokens)
        sr = Recipe(**{**recipe.__dict__, "steps": a.speed_steps, "checkpoint_every": 10})  # one write included
        s = speed(ck.model, rows[0][2].removed, tt.chunks, sr)
        print(f"\ntraining speed ({s['steps']} updates × {sr.batch} × {sr.seq_len} tokens each, in lockstep, "
              f"checkpoint every 10): swapkl {s['swapkl_tok_s']:.0f} tok/s, plain transformers + peft "
              f"{s['plain_tok_s']:.0f} tok/s; ratio {s['ratio']:.2f} (median per-update ratio "
              f"{s['median_step_ratio']:.2f}; > 1: swapkl faster)")
    return 0


def _ci(x: dict) -> str:
    return f"{x['value']:+.1f} [{x['ci'][0]:+.1f}, {x['ci'][1]:+.1f}]"


def table(rows, recipe) -> str:
    out = ["| method | n | removed | ΔPPL % before healing | healed vs base | healed vs fine-tuned base | recovered "
           "| steps | tokens | wall s (healed / control) |", "|" + "---|" * 10]
    for method, n, r, wall in rows:
        d = r.delta_pct
        rec = "–" if r.recovered is None else (f"{100 * r.recovered:.0f} % [{100 * r.recovered_ci[0]:.0f}, "
                                                 f"{100 * r.recovered_ci[1]:.0f}]")
        tr = r.training
        w = " / ".join("cached" if tr[k].get("cached") else f"{tr[k]['seconds']:.0f}"
                       for k in ("healed", "base_finetuned"))
        out.append(f"| {method} | {n} | {r.removed} | {_ci(d['pruned_vs_base'])} | {_ci(d['healed_vs_base'])} | "
                   f"{_ci(d['healed_vs_base_finetuned'])} | {rec} | {recipe.steps} | {recipe.tokens_seen} | "
                   f"{w} (run {wall:.0f}) |")
    base = rows[0][2]
    out.append("")
    out.append(f"PPL base {base.ppl['base']:.4g}, fine-tuned base {base.ppl['base_finetuned']:.4g} "
               f"({_ci(base.delta_pct['base_finetuned_vs_base'])} %): the control every healed model is held to.")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
