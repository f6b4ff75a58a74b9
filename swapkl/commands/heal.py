"""``python -m swapkl heal MODEL (--removed 13,14,17 | --method interchange --n 3)``: heal the pruned model with a
short LoRA fine-tune and measure it against the same fine-tune of the unpruned base (docs/healing.md)."""
from __future__ import annotations

import sys
import time

from swapkl.commands import heal_tasks
from swapkl.commands.common import (add_selection_args, selection_fields, add_fit_args, add_form_arg, add_model_args, bridge_settings_of, check_outputs, emit,
                                   evaluator_and_corpus, load_from_args, model_inputs)
from swapkl.errors import SwapklError, require_extra
from swapkl.healing.recipe import Recipe
from swapkl.removal.plan import RemovalPlan, RunHooks
from swapkl.repair import forms
from swapkl.scoring import corpora

# Deferred imports: torch, transformers, peft and the torch-based swapkl modules are imported by run(): the CLI's
# --help must not load them.


def register(sub) -> None:
    p = sub.add_parser("heal", help="LoRA-heal a pruned model and measure what it recovers against a fine-tuned base")
    add_model_args(p)
    g = p.add_argument_group("the removed set (one of)")
    g.add_argument("--removed", default=None, metavar="LAYERS", help="comma-separated layer indices, e.g. 13,14,17")
    g.add_argument("--method", default=None, help="or the set a removal method picks (interchange, replacement, bi, sleb, ...), "
                   "with --n; several methods (interchange,replacement) with several n (2,4 or 1-4): healed curves, "
                   "one recipe, one control, and the paired comparison of the first two methods per n")
    g.add_argument("--n", default=None, help="how many layers --method removes (one number, or 2,4 / 1-4)")
    g.add_argument("--spacing", type=int, default=1, help="the selection rule's Δ for --method (default 1)")
    add_selection_args(g)
    r = p.add_argument_group("the recipe")
    d = Recipe()
    r.add_argument("--steps", type=int, default=d.steps, help="optimizer updates (default %(default)s)")
    r.add_argument("--lora-rank", type=int, default=d.rank, help="LoRA rank (default %(default)s)")
    r.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 × rank)")
    r.add_argument("--lr", type=float, default=d.lr, help="AdamW learning rate (default %(default)s)")
    r.add_argument("--warmup", type=int, default=d.warmup, help="linear warm-up steps (default %(default)s)")
    r.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per training sequence (default %(default)s)")
    r.add_argument("--batch", type=int, default=d.batch, help="sequences per update (default %(default)s)")
    r.add_argument("--seed", type=int, default=d.seed, help="LoRA init, batch order, dropout (default %(default)s)")
    r.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help="resumable checkpoint every k updates (default %(default)s)")
    r.add_argument("--qlora", action="store_true", help="4-bit base weights through bitsandbytes (CUDA only)")
    r.add_argument("--objective", default=d.objective, choices=["lm", "kd", "kd+lm"],
                   help="the loss: lm (next-token), kd (forward KL from the unpruned model at every position), or "
                        "kd+lm (default %(default)s)")
    r.add_argument("--temperature", type=float, default=d.temperature, help="KD temperature T (default %(default)s)")
    r.add_argument("--kd-weight", type=float, default=d.kd_weight,
                   help="kd+lm: the KD term's weight w, loss = w KD + (1 - w) LM (default %(default)s)")
    r.add_argument("--top-k", type=int, default=d.top_k,
                   help="teacher tokens kept per position, the rest as one tail bucket (default %(default)s)")
    r.add_argument("--train", default=d.part, dest="part", metavar="{lora,last-k,bridge}",
                   help="what is trained: lora, last-k (the last --k kept blocks and lm_head in full), or bridge "
                        "(LoRA and the bridge matrices, from their least-squares fit; needs --repair bridge) "
                        "(default %(default)s)")
    r.add_argument("--k", type=int, default=d.last_k, dest="last_k", metavar="K",
                   help="--train last-k: how many of the last kept blocks (default %(default)s)")
    _add_repair_args(p)
    p.add_argument("--train-text", default=None, metavar="FILE",
                   help="training text (default: the training region of the evaluation corpus); refused when it "
                        "overlaps the evaluation text or the scoring corpus")
    p.add_argument("--eval-text", default=None, metavar="FILE",
                   help="evaluation text (its evaluation region; default WikiText-2 test, hub or local copy)")
    p.add_argument("--heldout-text", default=None, metavar="FILE",
                   help="a second text domain no run trains on (e.g. tests/fixtures/data/heldout/): the four models' "
                        "perplexity there too, and the gate reads it")
    p.add_argument("--evaluator", default="matched", choices=["matched", "standard"])
    p.add_argument("--max-words", type=int, default=None, help="override the evaluator's word count (labelled)")
    s = p.add_argument_group("the scores behind --method (swap-KL contract)")
    s.add_argument("--pairs", default="adjacent")
    s.add_argument("--prompts", type=int, default=16)
    s.add_argument("--tokens", type=int, default=64)
    s.add_argument("--prompt-seed", type=int, default=0)
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write the merged healed model here (HF folder) and the adapter in DIR/adapter/")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out, and export a heal measured "
                   "worse than the pruned model")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write cached evaluations and adapters")
    p.add_argument("--json", default=None, metavar="OUT", help="write the result JSON here")
    heal_tasks.register_args(p)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def _add_repair_args(p) -> None:
    g = p.add_argument_group("repair before healing (--repair bridge)")
    g.add_argument("--repair", default="none", choices=["none", "bridge"],
                   help="bridge: the heal starts from the bridged model (each removed span replaced by a linear map "
                        "fitted on calibration text kept out of the training text) (default %(default)s)")
    add_form_arg(g, forms.DEFAULT, "the bridge form (default folded: exports as an ordinary checkpoint; residual "
                                   "refuses --out)")
    g.add_argument("--calib-tokens", type=int, default=None, help="calibration tokens of the bridge fit (default 8192)")
    add_fit_args(g)


def bridge_from_args(a):
    """The :class:`~swapkl.repair.settings.BridgeSettings` of the flags (one line for a bad setting); None without a
    repair.
    Refuses bridge flags without ``--repair bridge`` and ``--train bridge`` without it."""
    given = {k: v for k, v in (("calib_tokens", a.calib_tokens), ("calib_window", a.calib_window),
                               ("ridge", a.ridge)) if v is not None}
    if a.repair == "none":
        if a.part == "bridge":
            raise SwapklError("--train bridge trains the bridge matrices: it needs --repair bridge")
        if given or a.form != forms.DEFAULT or a.calib_seed != 0:
            raise SwapklError("--form, --calib-tokens, --calib-window, --calib-seed and --ridge go with --repair bridge")
        return None
    if a.out and not forms.get(a.form).exports:
        raise SwapklError(f"a {a.form} bridge is no ordinary checkpoint: --out needs --form {forms.DEFAULT}")
    return bridge_settings_of(a)


def parse_removed(s: str) -> list[int]:
    try:
        out = [int(x) for x in str(s).replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise SwapklError(f"--removed wants comma-separated layer indices such as 13,14,17 (got '{s}')") from None
    if not out:
        raise SwapklError("--removed needs at least one layer index")
    return out


def recipe_from_args(a) -> Recipe:
    alpha = a.lora_alpha if a.lora_alpha is not None else 2.0 * a.lora_rank
    return Recipe(steps=a.steps, rank=a.lora_rank, alpha=alpha, lr=a.lr, warmup=a.warmup, seq_len=a.seq_len,
                  batch=a.batch, seed=a.seed, qlora=a.qlora, checkpoint_every=a.checkpoint_every,
                  objective=a.objective, temperature=a.temperature, kd_weight=a.kd_weight, top_k=a.top_k,
                  part=a.part, last_k=a.last_k).validate()


def _check_args(a):
    """Every check that needs no model: the set, the recipe, the texts (and their disjointness), the outputs."""
    from swapkl.healing import text as T  # deferred: pulls torch
    from swapkl.removal import methods as M
    from swapkl.surgery.outputs import check_output_dir

    if (a.removed is None) == (a.method is None):
        raise SwapklError("give the removed set: --removed LAYERS or --method NAME --n N (one of them)")
    removed = parse_removed(a.removed) if a.removed is not None else None
    if a.spacing < 0:
        raise SwapklError(f"--spacing must be >= 0 (got {a.spacing})")
    a.methods, a.ns = [], []
    if a.method is not None:
        a.methods = list(dict.fromkeys(m.strip() for m in a.method.split(",") if m.strip()))
        if not a.methods:
            raise SwapklError("--method needs a method name")
        for m in a.methods:
            M.get(m)  # an unknown name fails here
        if a.n is None:
            raise SwapklError("--method needs --n N (N >= 1 layers to remove)")
        from swapkl.healing.multi import parse_ns

        try:
            a.ns = parse_ns(a.n)
        except SwapklError as e:
            raise SwapklError(f"--n: {e}") from None
        if len(a.methods) * len(a.ns) > 1 and a.out:
            raise SwapklError("--out exports one healed set: give one method and one n (or --removed)")
    recipe = recipe_from_args(a)
    a.bridge = bridge_from_args(a)
    heal_tasks.check_args(a)
    check_outputs(a, {"--json": a.json}, inputs=[a.train_text, a.eval_text, a.heldout_text])
    if a.out:
        check_output_dir(a.out, "--out", force=a.force, protected=model_inputs(a), force_hint="--force")
    ev, corpus = evaluator_and_corpus(a)
    others = [("evaluation text", corpus)]
    if a.train_text:
        others.append(("training text", corpora.from_file(a.train_text)))
        T.check_file_disjoint(others[-1][1], others[:1])
    a.heldout = None
    if a.heldout_text:
        a.heldout = corpora.from_file(a.heldout_text)
        T.check_file_disjoint(a.heldout, others, flag="--heldout-text")
    return removed, recipe, ev, corpus


def run(a) -> int:
    from swapkl.healing.heal import check_qlora  # pulls torch

    require_extra("heal", "swapkl heal")  # before the model is loaded
    removed, recipe, ev, corpus = _check_args(a)
    check_qlora(recipe)
    with heal_tasks.loaded_once(a):
        heal_tasks.check_disjoint(a, ev, corpus)  # a task built from text the heal reads: one line, nothing trained
        return _run(a, removed, recipe, ev, corpus)


def _run(a, removed, recipe, ev, corpus) -> int:
    from swapkl.healing.heal import WorseHealError, check_gate, export_healed, heal  # pulls torch

    ck = load_from_args(a)
    if len(a.methods) * len(a.ns) > 1:
        return _curves(a, ck, recipe, corpus, ev)
    selection = None
    if a.method is not None:
        removed, selection = _select(a, ck, corpus, ev)
    states, shared = {}, {}
    result = heal(ck.model, ck.tokenizer, removed, recipe, _setup(a, ck, corpus, ev), RunHooks(progress=_Progress(a.quiet)),
                  plan=_plan(a, ev, max(1, len(removed))), selection=selection, keep_states=states, shared=shared)
    if result.gate_line() and not (a.out and not a.force):  # refused below: the error line says it
        result.notes.append(result.gate_line() + ("; exported anyway (--force)" if a.out else ""))
    if a.out:
        try:
            check_gate(result, a.force)
        except WorseHealError:
            emit(a, result, render)  # the measurement that explains the refusal; no model is written
            raise
        out = export_healed(ck.model, result.removed, recipe, states["healed"], a.out, ck.tokenizer, ck.identity,
                            force=a.force, record={"ppl": result.ppl, "recovered": result.recovered,
                                                   "contract": result.contract}, result=result)
        where = f", adapter to {out}/adapter" if recipe.part == "lora" else ""
        result.notes.append(f"merged healed model written to {out}{where}")
    if a.task_names:
        from swapkl.healing.curves import HealCurves

        sel = result.selection or {}
        one = HealCurves.from_heals([(sel.get("method") or "given", sel.get("n") or len(result.removed), result)])
        result.tasks = heal_tasks.evaluate(a, ck, one, recipe, shared)
    return emit(a, result, render)


def _scores(a, ck) -> dict | None:
    """The swap-KL matrices of the ``--pairs/--prompts/--tokens`` contract when a method needs them (cached)."""
    from swapkl.contract import Contract
    from swapkl.removal import methods as M

    if not any(M.get(m).needs for m in a.methods):
        return None
    from swapkl.scoring.score import score  # deferred: pulls torch

    contract = Contract.preset("canonical", pairs=a.pairs, prompts=a.prompts, tokens=a.tokens,
                               corpus=a.eval_text, seed=a.prompt_seed, dtype=a.dtype, device=a.device)
    res = score(ck, contract, use_cache=not a.no_cache)
    return res.protocol_scores()


def _curves(a, ck, recipe, corpus, ev) -> int:
    """Several methods and/or several n: healed curves (:func:`swapkl.healing.multi.heal_curves`)."""
    from swapkl.healing.multi import heal_curves

    shared: dict = {}
    plan = _plan(a, ev, max(a.ns), a.methods)
    hc = heal_curves(ck.model, ck.tokenizer, _scores(a, ck), plan, a.ns, recipe, _setup(a, ck, corpus, ev),
                     RunHooks(progress=_Progress(a.quiet)), shared=shared)
    if a.task_names:
        hc.tasks = heal_tasks.evaluate(a, ck, hc, recipe, shared)
    return emit(a, hc, render_curves)


def _setup(a, ck, corpus, ev):
    """The heal's texts, evaluator, identity and cache use (:class:`~swapkl.healing.heal.HealSetup`) from the flags."""
    from swapkl.healing.heal import HealSetup

    return HealSetup(corpus=corpus, evaluator=ev, train_path=a.train_text, prompts=a.prompts, tokens=a.tokens,
                     prompt_seed=a.prompt_seed, identity=ck.identity, use_cache=not a.no_cache,
                     heldout=getattr(a, "heldout", None))


def _plan(a, ev, budget: int, methods=()):
    """The removal plan of a heal: the budget, methods, spacing, candidates, partners and evaluator, and the repair its heals start from
    (``--repair`` with the :class:`~swapkl.repair.settings.BridgeSettings` of the flags)."""
    return RemovalPlan(budget=budget, methods=tuple(methods), spacing=a.spacing, evaluator=ev, repair=a.repair,
                       bridge=getattr(a, "bridge", None) or {}, **selection_fields(a))


def _select(a, ck, corpus, ev):
    from swapkl.healing.heal import chosen_set

    scores = _scores(a, ck)
    (method,), (n,) = a.methods, a.ns
    removed, sel = chosen_set(ck.model, ck.tokenizer, method, n, scores, _plan(a, ev, n, (method,)), corpus)
    if scores is not None:
        sel["scores"] = {"pairs": a.pairs, "prompts": a.prompts, "tokens": a.tokens, "seed": a.prompt_seed}
    return removed, sel


class _Progress:
    """``step k/N · elapsed · ETA`` on stderr (a terminal: one updating line; else only the last line)."""

    def __init__(self, quiet: bool):
        self.quiet, self.tty, self.t0, self.last = quiet, sys.stderr.isatty(), time.perf_counter(), 0.0

    def __call__(self, done: int, total: int, msg: str) -> None:
        now = time.perf_counter()
        if self.quiet or (not self.tty and done != total) or (now - self.last < 0.2 and done != total):
            return
        self.last = now
        el = now - self.t0
        eta = el / done * (total - done) if done else float("nan")
        print(f"  {done}/{total}  {el:6.1f}s elapsed  ETA {eta:6.1f}s  {msg:<40}", end="\n" if done == total else
              "\r", file=sys.stderr, flush=True)


def render(r) -> str:
    from swapkl.views.captions import contract_caption

    d, p = r.delta_pct, r.ppl
    lines = [f"removed layers {r.removed}" + (f" (chosen by {r.selection['method']}, n = {r.selection['n']})"
                                               if r.selection.get("method") else ""),
             f"recipe: {r.contract['recipe_line']} ({r.recipe['tokens_seen']} tokens)",
             "PPL: " + "  ".join(f"{k} {p[k]:.4g}" for k in ("base", "pruned", "healed", "base_finetuned"))]
    for key, what in (("pruned_vs_base", "pruned vs base"), ("healed_vs_base", "healed vs base"),
                      ("base_finetuned_vs_base", "fine-tuned base vs base"),
                      ("healed_vs_base_finetuned", "healed vs fine-tuned base"), ("healed_vs_pruned", "healed vs pruned")):
        if key not in d:
            continue
        x = d[key]
        lines.append(f"  ΔPPL {what:<27} {x['value']:+8.1f} % [{x['ci'][0]:+.1f}, {x['ci'][1]:+.1f}]"
                     + ("  tie" if x["tie"] else ""))
    lines.append(r.headline())
    lines.extend(_bridge_lines(r.repair))
    lines.extend(_held_out_lines(r.held_out))
    parts = []
    for k, v in r.training.items():
        if v.get("identity"):
            parts.append(f"{k}: the base itself (a distillation of the base toward itself is the identity)")
            continue
        when = "cached" if v.get("cached") else f"{v['seconds']:.1f}s"
        parts.append(f"{k} {when}, loss {v.get('loss_first') or 0:.3f} → {v.get('loss_last') or 0:.3f}, "
                     f"{v.get('trainable_params') or 0:,} trainable parameters")
    lines.append("training: " + "; ".join(parts))
    chk = r.training.get("healed", {}).get("kd_topk_check")
    if chk:
        lines.append(f"teacher top-{chk['k']}: KD {chk['kl_topk']:.4g} vs full KL {chk['kl_full']:.4g} on "
                     f"{chk['positions']} positions (gap {chk['gap']:.2g}, tail mass mean {chk['tail_mass_mean']:.2g})")
    lines.append(f"contract: {contract_caption(r.provenance())}")
    lines.extend(f"note: {n}" for n in r.notes)
    if r.tasks:
        lines.append(heal_tasks.render(r.tasks))
    return "\n".join(lines)


def _bridge_lines(rep: dict) -> list[str]:
    """A heal after a bridge: ΔPPL vs base of the raw cut, the bridged model (before training) and the healed model,
    per text, and the bridge's recovered share (none without a repair)."""
    if not rep:
        return []
    s = rep["settings"]
    out = [f"bridge ({s['form']}, {rep['calibration'].get('tokens')} calibration tokens, seed {s['calib_seed']}"
           + (f", {rep['trainable_bridge_params']:,} trained bridge parameters" if rep.get("trainable_bridge_params")
              else "") + "):"]
    for name, what in (("eval", "evaluation"), ("held_out", "held-out")):
        if name not in rep:
            continue
        for row, label in (("raw", "raw cut"), ("bridged", "bridged (before training)"), ("healed", "healed")):
            x = rep[name]["rows"][row]["delta_pct"]
            out.append(f"  ΔPPL {label:<26} vs base ({what}) {x['value']:+8.1f} % [{x['ci'][0]:+.1f}, "
                       f"{x['ci'][1]:+.1f}]  PPL {rep[name]['rows'][row]['ppl']:.4g}")
        rb, ci = rep[name]["recovered_by_bridge"], rep[name]["recovered_by_bridge_ci"]
        if rb is not None and ci:
            out.append(f"  the bridge alone recovers {100 * rb:.0f} % [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}] of the "
                       f"removal damage ({what})")
    return out


def _held_out_lines(h: dict) -> list[str]:
    """The held-out domain's PPLs and healed-vs-pruned ΔPPL, two lines (none without a held-out text)."""
    if not h:
        return []
    x = h["delta_pct"]["healed_vs_pruned"]
    return [f"held-out text ({h['label']}): PPL " + "  ".join(f"{k} {h['ppl'][k]:.4g}" for k in
                                                              ("base", "pruned", "healed", "base_finetuned")),
            f"  ΔPPL healed vs pruned (held-out)   {x['value']:+8.1f} % [{x['ci'][0]:+.1f}, {x['ci'][1]:+.1f}]"
            + ("  tie" if x["tie"] else "")]


def render_curves(hc) -> str:
    """Healed curves as text: one line per method and n, the paired comparison per n, the headline, the contract."""
    from swapkl.healing.figures import caption

    def ci(x):
        return f"{x['value']:+.1f} [{x['ci'][0]:+.1f}, {x['ci'][1]:+.1f}]"

    lines = [f"recipe: {hc.recipe_line()} ({hc.recipe.get('tokens_seen')} tokens per set and for the control)",
             f"PPL base {hc.base_ppl:.4g}, fine-tuned base (the control) {hc.finetuned_ppl:.4g}"]
    for m, entries in hc.methods.items():
        for e in entries:
            d = e["delta_pct"]
            lines.append(f"  {m:<12} n={e['n']} {e['removed']}: ΔPPL before {ci(d['pruned_vs_base'])} %, healed vs "
                         f"base {ci(d['healed_vs_base'])} %, vs fine-tuned base {ci(d['healed_vs_base_finetuned'])} %")
            if e.get("bridged"):
                lines.append(f"  {'':<12} bridged before training {ci(e['bridged']['delta_pct'])} % vs base")
            if e.get("held_out"):
                h = e["held_out"]
                lines.append(f"  {'':<12} held-out ({h['label']}): raw {ci(h['raw']['delta_pct'])} %"
                             + (f", bridged {ci(h['bridged']['delta_pct'])} %" if h.get("bridged") else "")
                             + f", healed {ci(h['healed']['delta_pct'])} % vs base")
    for c in hc.comparisons:
        lines.append(f"  n={c['n']}: {c['sentence']}")
    if hc.headline:
        lines.append(f"headline: {hc.headline}")
    lines.append(f"contract: {caption(hc)}")
    lines.extend(f"note: {n}" for n in hc.notes)
    if hc.tasks:
        lines.append(heal_tasks.render(hc.tasks))
    return "\n".join(lines)
