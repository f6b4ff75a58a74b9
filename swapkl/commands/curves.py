"""``python -m swapkl curves MODEL --budget N``: removal curves (PPL and ΔPPL % vs number of removed layers) for
swap-KL-guided selection and baselines, the ΔPPL ratio and the regime verdict."""
from __future__ import annotations

import sys

from swapkl import schema
from swapkl.removal import methods as M
from swapkl.removal import curves as C
from swapkl.removal.checks import check_evaluator_context, check_scores
from swapkl.removal.curves import EvalMemo
from swapkl.removal.plan import RunHooks
from swapkl.commands.common import (add_selection_args, selection_fields, evaluator_and_corpus, ProgressPrinter, add_bridge_args, add_contract_args,
                                    add_model_args, check_outputs, add_unit_arg, contract_from_args, emit,
                                    load_from_args, removal_plan)
from swapkl.contract import check_unit
from swapkl.errors import SwapklError
from swapkl.scoring.results import SwapResult

def register(sub) -> None:
    p = sub.add_parser("curves", help="removal curves: guided (replacement / interchange) vs baselines")
    add_model_args(p)
    p.add_argument("--budget", type=int, required=True, help="largest number of removed layers N (curves for 1..N)")
    p.add_argument("--scores", default=None, metavar="SCORES.json",
                   help="a 'swapkl score --json' file (default: compute the scores with the engine and its cache)")
    p.add_argument("--methods", default=",".join(M.default_set("cli")),
                   help="comma-separated: replacement, interchange, anti (both protocols), anti-replacement, "
                        "anti-interchange, random, bi, sleb, ... (default: %(default)s)")
    p.add_argument("--eval-text", default=None, metavar="PATH",
                   help="text file for perplexity (its evaluation region) and calibration (the rest); default: "
                        "WikiText-2 test (hub, else local copy)")
    p.add_argument("--evaluator", default="matched", choices=["matched", "standard"],
                   help="matched: 5,000 words, window 512, stride 256; standard: 20,000 words, 1024/512")
    p.add_argument("--max-words", type=int, default=None,
                   help="override the evaluator's word count (a labelled, non-standard contract; for quick runs)")
    p.add_argument("--drop-first-target", action="store_true",
                   help="paper-compatibility: never score the first new token of each later window")
    p.add_argument("--spacing", type=int, default=1, help="Δ: never remove two layers within Δ slots (default 1)")
    add_selection_args(p)
    p.add_argument("--seeds", type=int, default=M.DEFAULT_RUNS, help="random baseline seeds (>= 5)")
    p.add_argument("--calib-tokens", type=int, default=None,
                   help=f"calibration tokens for every method that reads calibration text "
                        f"({', '.join(M.calibration_methods())}; default: each method's own)")
    p.add_argument("--no-kl", action="store_true", help="skip the KL of each pruned model to the base model")
    p.add_argument("--json", default=None, metavar="OUT", help="write the curves JSON here")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--gains", action="store_true",
                   help="also measure what each removal set gains (parameters, prefill/decode tokens/s, memory with "
                        "the KV cache), base vs pruned in one run with swapkl's skipping runtime")
    p.add_argument("--gains-context", type=int, default=512, help="context length (tokens) for --gains")
    p.add_argument("--with", dest="with_curves", action="append", default=[], metavar="CURVES.json",
                   help="curves of other units of the same model (repeatable): adds the common-axis table (ΔPPL "
                        "against non-embedding parameters removed, and speed-up when measured)")
    p.add_argument("--figure", default=None, metavar="OUT.html",
                   help="write the common-axis figure (this run and every --with) as a self-contained HTML page")
    add_contract_args(p)
    add_unit_arg(p)
    add_bridge_args(p)
    p.set_defaults(func=run)


def load_scores(path: str) -> tuple[dict, dict, dict]:
    """(scores {"replacement", "interchange"} as L×L arrays, model identity, contract) from a ``score --json``
    file, or from a plain ``{"replacement": [[...]], "interchange": [[...]]}`` JSON (NaN as null).  Both are
    validated (:mod:`swapkl.schema`) before anything is built from them."""

    d = schema.read_json_file(path, "scores file", keep_constants=True)
    what = f"scores file {path}"
    if isinstance(d, dict) and "per_prompt" in d:
        res = SwapResult.from_json(d, what)
        return (res.protocol_scores(), res.identity,
                getattr(res, "contract", None))
    return schema.score_matrices(d, what)


def run(a) -> int:
    check_outputs(a, {"--json": a.json, "--figure": a.figure}, inputs=[a.scores, a.eval_text, *a.with_curves])
    others = [C.CurvesResult.from_json(f, "--with file") for f in a.with_curves]  # bad files fail first
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    # unknown methods, a bad budget and a too-small --calib-tokens fail before anything loads; the plan gives
    # --calib-tokens to every calibration method
    plan = removal_plan(a, methods, **selection_fields(a),
                        seeds=tuple(range(a.seeds)), kl=not a.no_kl, calib_tokens=a.calib_tokens)
    ev, corpus = evaluator_and_corpus(a, a.drop_first_target or None)
    loaded = load_scores(a.scores) if a.scores else None  # a bad file fails before the model is loaded
    plan = plan.with_(unit=_unit(a, loaded), evaluator=ev)
    ck = load_from_args(a)
    check_evaluator_context(ck.model, ev, name=ck.identity.get("display"))  # before the scores are computed
    progress = ProgressPrinter(a.quiet)
    scores, src = scores_for(a, ck, loaded, plan.unit, progress)

    def prog(done, total, msg):
        if not a.quiet:
            print(f"  [{done}/{total}] {msg}", file=sys.stderr, flush=True)

    result = C.removal_curves(ck.model, ck.tokenizer, scores, plan,
                              RunHooks(progress=prog, identity=ck.identity, corpus=corpus,
                                       memo=EvalMemo() if a.no_cache else None,
                                       contract=scoring_contract(a, loaded)))
    result.notes.insert(0, src)
    if a.gains:
        from swapkl.measure.gains import curve_gains

        result.gains = curve_gains(ck.model, result, context=a.gains_context)
    if others or a.figure:
        from swapkl.commands.units_table import common_axis_output

        for o in others:
            check_scores({}, ck.num_layers, o.model, ck.identity, "a --with curves file is for a different model")
        table = common_axis_output([result, *others], a.figure)
        rc = emit(a, result, render)
        if not a.quiet:
            print(table)
        return rc
    return emit(a, result, render)


def scores_for(a, ck, loaded, unit: str, progress) -> tuple[dict, str]:
    """The swap-KL matrices ``{"replacement", "interchange"}`` (L×L) a removal command works from, and a line
    saying where they came from: the ``--scores`` file ``loaded`` (:func:`load_scores`), checked to be of ``ck``'s
    model, else computed for the command's contract at ``unit`` (engine and cache)."""
    if loaded is not None:
        scores, ident, _ = loaded
        check_scores(scores, ck.num_layers, ident, ck.identity)
        return scores, f"scores from {a.scores}"
    import dataclasses

    from swapkl.scoring.score import score  # deferred: pulls torch; the CLI's --help must not

    contract = contract_from_args(a)
    if getattr(contract, "unit", "block") != unit:
        contract = dataclasses.replace(contract, unit=unit)
    res = score(ck, contract, progress=progress, use_cache=not a.no_cache)
    return (res.protocol_scores(),
            f"scores computed (pairs={contract.pairs}, prompts={contract.prompts}x{contract.tokens})")


def scoring_contract(a, loaded):
    """The run's scoring contract: the prompts a bridge's calibration text avoids (``--repair bridge``) and a
    bridge-guided method scores its sets on; the scores file's, else the one the flags describe."""
    from swapkl.contract import Contract

    got = loaded[2] if loaded is not None else None
    if isinstance(got, Contract):
        return got
    if isinstance(got, dict):
        try:
            return Contract.from_dict(got)
        except (SwapklError, TypeError, ValueError):
            pass
    return contract_from_args(a)


def repaired_lines(repaired: dict, methods: dict | None = None, repair: dict | None = None) -> list[str]:
    """The raw and bridged ΔPPL % of every set side by side, with the paired difference (bridged − raw, points,
    95 % CI over the same windows) and better / tie / worse (tie: the CI includes 0).  ``methods``: the raw curves
    (else the raw ΔPPL is the bridged one minus the paired difference, the same formula)."""
    if not repaired:
        return []
    from swapkl.removal.recommend.paired import word

    st = (repair or {}).get("settings") or {}
    out = [f"raw vs bridged (--repair bridge, {st.get('form', 'folded')} form, {st.get('calib_tokens', '?')} "
           "calibration tokens); paired over the same windows: bridged − raw, points [95 % CI]",
           f"  {'method':<16} {'n':>3}  {'removed':<16} {'raw ΔPPL %':>11} {'bridged ΔPPL %':>15}  "
           f"{'bridged − raw [CI]':<28} verdict"]
    for name, entries in repaired.items():
        raw = {e["n"]: e for e in (methods or {}).get(name, [])}
        for e in entries:
            r = raw[e["n"]]["delta_pct"] if e["n"] in raw else e["delta_pct"] - e["paired_delta_pct"]
            ci = e.get("paired_ci")
            diff = f"{e['paired_delta_pct']:+.1f}" + (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else " (mean of seeds)")
            rem = e["removed"] if e.get("removed") is not None else "mean of seeds"
            out.append(f"  {name:<16} {e['n']:>3}  {str(rem):<16} {r:>+11.1f} {e['delta_pct']:>+15.1f}  "
                       f"{diff:<28} {word(ci) if ci else '-'}")
    return out


def _unit(a, loaded) -> str:
    """``--unit``, else the scores file's contract unit, else ``block``; a mismatch is refused in one line."""
    if a.unit is not None:
        check_unit(a.unit)
    contract = loaded[2] if loaded is not None else None
    # a plain matrices file without a contract claims no unit: --unit says what its matrices score
    got = contract.get("unit") if isinstance(contract, dict) else getattr(contract, "unit", None)
    if a.unit is not None and loaded is not None and got is not None and a.unit != got:
        raise SwapklError(f"--unit {a.unit} but the scores file {a.scores} scores the {got} unit")
    return a.unit or got or "block"


def render(r) -> str:
    ev = r.evaluator
    lo, hi = r.baseline_ppl_ci
    from swapkl.measure.gains import gains_line, point_gains

    lines = [f"model: {r.model.get('display') or r.model.get('id') or r.model.get('name_or_path')}  "
             f"layers: {r.model.get('num_layers')}" + (f"  unit: {r.unit} (removed sublayers skipped)"
                                                      if r.unit != "block" else ""),
             f"evaluator: {ev['name']} ({ev['max_words']} words, window {ev['window']}, stride {ev['stride']}) "
             f"on {r.corpus.get('label')}",
             f"baseline PPL {r.baseline_ppl:.4g} [{lo:.4g}, {hi:.4g}]"]
    for name, entries in r.methods.items():
        lines.append(f"{name}:")
        for e in entries:
            rem = e["removed"] if e["removed"] is not None else e.get("removal") or "mean of seeds"
            kl = f"  KL {e['kl_to_base']:.3f}" if e.get("kl_to_base") is not None else ""
            spread = (f" [min {e['delta_pct_min']:+.1f}, max {e['delta_pct_max']:+.1f}]" if "delta_pct_min" in e
                      else (f" [{e['delta_pct_ci'][0]:+.1f}, {e['delta_pct_ci'][1]:+.1f}]" if e.get("delta_pct_ci")
                            else ""))
            g = point_gains(r, name, e["n"])
            gain = f"  | {gains_line(g)}" if g else ""
            lines.append(f"  n={e['n']:<3} {str(rem):<18} PPL {e['ppl']:9.4g}  ΔPPL {e['delta_pct']:+7.1f} %{spread}{kl}"
                         f"{gain}")
    if r.delta_ratio:
        lines.append("ΔPPL ratio interchange/replacement: " + ", ".join(
            f"n={x['n']}: {x['ratio']:.3f}" if x["ratio"] is not None else f"n={x['n']}: -" for x in r.delta_ratio))
    if r.verdict:
        lines.append(r.verdict["sentence"])
    lines.extend(repaired_lines(r.repaired, r.methods, r.repair))
    if r.gains:
        st = r.gains.get("settings", {})
        lines.append(f"gains measured on {st.get('device')} ({st.get('dtype')}), context {st.get('context')} tokens + "
                     f"{st.get('decode_tokens')} decoded, {st.get('runtime')}")
    for n in r.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
