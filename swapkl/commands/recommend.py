"""``python -m swapkl recommend MODEL --budget N``: which n layers to remove (n = 1..N), chosen on calibration text
by a beam search seeded by every method, with the held-out ΔPPL and one sentence of evidence per n."""
from __future__ import annotations

import sys

from swapkl.commands.common import (add_unit_arg, evaluator_and_corpus, ProgressPrinter, add_bridge_args,
                                    add_contract_args, add_model_args, bridge_fields, check_outputs, emit,
                                    load_from_args)
from swapkl.errors import SwapklError
from swapkl.removal import methods as M
from swapkl.commands.curves import load_scores, repaired_lines, scores_for, scoring_contract, _unit as scores_unit
from swapkl.removal.plan import RunHooks
from swapkl.removal.recommend import (DEFAULT_CALIB_TOKENS, DEFAULT_CALIB_WINDOWS, DEFAULT_WIDTH, recommend,
                                      recommend_plan, search_params, SEED_METHODS)
from swapkl.removal.selection import check_budget, default_candidates
from swapkl.removal.checks import check_evaluator_context
from swapkl.measure.memo import EvalMemo


def register(sub) -> None:
    p = sub.add_parser("recommend", help="which n layers to remove: beam search on calibration text, seeded by "
                                         "every method, with held-out ΔPPL and the evidence")
    add_model_args(p)
    p.add_argument("--budget", type=int, required=True, help="largest number of removed layers N (answers 1..N)")
    p.add_argument("--scores", default=None, metavar="SCORES.json",
                   help="a 'swapkl score --json' file (default: compute the scores with the engine and its cache)")
    p.add_argument("--eval-text", default=None, metavar="PATH",
                   help="text file: held-out perplexity on its evaluation region, calibration on the rest")
    p.add_argument("--evaluator", default="matched", choices=["matched", "standard"])
    p.add_argument("--max-words", type=int, default=None, help="override the evaluator's word count (labelled)")
    p.add_argument("--width", type=int, default=DEFAULT_WIDTH, help="beam width (default %(default)s)")
    p.add_argument("--top-k", type=int, default=None,
                   help="best layers taken from each protocol as candidates (default max(3, ceil(L/5)))")
    p.add_argument("--calib-tokens", type=int, default=None,
                   help=f"calibration tokens from the corpus's prompt region, for the search and every seed or "
                        f"compared method that reads calibration text (default: each method's own; the search's "
                        f"{DEFAULT_CALIB_TOKENS})")
    p.add_argument("--calib-windows", default=DEFAULT_CALIB_WINDOWS, choices=["evaluator", "disjoint"],
                   help="calibration windows: the held-out evaluator's window and stride (default) or "
                        "non-overlapping windows (SLEB's)")
    p.add_argument("--max-evals", default="sleb",
                   help="calibration evaluations allowed: sleb (what SLEB-iterative spends, default), an integer, "
                        "or none (no cap)")
    p.add_argument("--seeds-from", default=",".join(SEED_METHODS),
                   help="methods whose sets seed the beam (default %(default)s)")
    p.add_argument("--compare", default="replacement,interchange,bi",
                   help="methods run on the same held-out windows for the paired comparison at each n "
                        "(default %(default)s; 'none' for none)")
    p.add_argument("--rule", default="confirmed", choices=["confirmed", "calibration"],
                   help="confirmed (default): the protocol rule's set unless the search's set wins on every "
                        "calibration region (docs/recommend-rule.md); calibration: the best calibration PPL")
    p.add_argument("--calib-regions", type=int, default=3,
                   help="disjoint calibration regions the confirmed rule checks (default %(default)s)")
    p.add_argument("--constrained", action="store_true",
                   help="use the guided methods' candidates (no first/last layer) and spacing --spacing")
    p.add_argument("--spacing", type=int, default=1, help="Δ for the guided seeds (and with --constrained)")
    p.add_argument("--no-kl", action="store_true", help="skip the KL of each chosen model to the base model")
    p.add_argument("--json", default=None, metavar="OUT", help="write the recommendation JSON here")
    p.add_argument("--quiet", action="store_true")
    add_contract_args(p)
    add_unit_arg(p)
    add_bridge_args(p)
    p.set_defaults(func=run)


def parse_max_evals(s: str):
    """``sleb`` | ``none`` | a positive integer; a clear error for anything else."""
    v = str(s).strip().lower()
    if v in ("sleb", "none"):
        return None if v == "none" else "sleb"
    try:
        n = int(v)
    except ValueError:
        raise SwapklError(f"--max-evals must be sleb, none or a positive integer (got '{s}')") from None
    if n < 1:
        raise SwapklError(f"--max-evals must be positive (got {n})")
    return n


def run(a) -> int:
    if a.budget < 1:
        raise SwapklError(f"--budget must be at least 1 (got {a.budget})")
    for flag, v, lo in (("--width", a.width, 1), ("--spacing", a.spacing, 0)):
        if v < lo:
            raise SwapklError(f"{flag} must be at least {lo} (got {v})")
    if a.top_k is not None and a.top_k < 1:
        raise SwapklError(f"--top-k must be at least 1 (got {a.top_k})")
    max_evals = parse_max_evals(a.max_evals)
    seeds = [m.strip() for m in a.seeds_from.split(",") if m.strip()]
    for m in seeds:
        if m == "recommend":
            raise SwapklError("--seeds-from cannot name recommend itself")
        M.get(m)  # unknown names fail before loading anything
    compare = [] if a.compare.strip().lower() == "none" else [m.strip() for m in a.compare.split(",") if m.strip()]
    calib = M.calibration_params(a.calib_tokens, ["recommend", *seeds, *compare])
    for m in compare:
        M.get(m)  # unknown names fail before loading anything
    if a.calib_regions < 1:
        raise SwapklError(f"--calib-regions must be at least 1 (got {a.calib_regions})")
    check_outputs(a, {"--json": a.json}, inputs=[a.scores, a.eval_text])
    ev, corpus = evaluator_and_corpus(a)
    ev_words = ev.max_words
    if ev_words > corpus.split_point:
        raise SwapklError(f"the evaluation text is too short: corpus '{corpus.name}' has {corpus.split_point} words "
                          f"of evaluation text, the evaluator needs {ev_words} (use --max-words)")
    loaded = load_scores(a.scores) if a.scores else None
    unit = scores_unit(a, loaded)  # --unit, else the scores file's unit; a mismatch refused in one line
    if unit != "block":
        explicit = seeds if a.seeds_from != ",".join(SEED_METHODS) else []  # the default's block seeds: dropped, noted
        M.refuse_other_units(explicit + compare, unit, [m for m in M.unit_methods(unit) if m != "recommend"])
    search = search_params(width=a.width, top_k=a.top_k, calib_tokens=calib["recommend"]["calib_tokens"],
                           calib_windows=a.calib_windows, max_evals=max_evals, seeds=seeds,
                           constrained=a.constrained) | {"rule": a.rule, "calib_regions": a.calib_regions}
    plan = recommend_plan(a.budget, search, compare, spacing=a.spacing, kl=not a.no_kl, unit=unit,
                          calib_tokens=a.calib_tokens, **bridge_fields(a))
    ck = load_from_args(a)
    check_evaluator_context(ck.model, ev, name=ck.identity.get("display"))
    # the budget against the candidates the search uses (every layer, keep one; or the rule's with --constrained),
    # before the scores are computed; the plan's own check runs in the curves runner
    L = ck.num_layers
    if a.constrained:
        check_budget(a.budget, default_candidates(L), a.spacing)
    else:
        check_budget(a.budget, list(range(L - 1)), 0)
    progress = ProgressPrinter(a.quiet)
    scores, _ = scores_for(a, ck, loaded, unit, progress)

    def prog(done, total, msg):
        if not a.quiet:
            print(f"  {msg}", file=sys.stderr, flush=True)

    rec = recommend(ck.model, ck.tokenizer, scores, plan.with_(evaluator=ev),
                    RunHooks(progress=prog, identity=ck.identity, corpus=corpus,
                             memo=EvalMemo() if a.no_cache else None, contract=scoring_contract(a, loaded)))
    return emit(a, rec, render)


def render(rec) -> str:
    ev = rec.evaluator
    lo_hi = rec.baseline_ppl_ci or [float("nan")] * 2
    lines = [f"model: {rec.model.get('display') or rec.model.get('id') or rec.model.get('name_or_path')}"
             + (f"  unit: {rec.unit} (removed sublayers skipped)" if rec.unit != "block" else ""),
             f"held-out: {ev.get('name')} ({ev.get('max_words')} words, window {ev.get('window')}, stride "
             f"{ev.get('stride')}) on {rec.corpus.get('label')}; baseline PPL {rec.baseline_ppl:.4g} "
             f"[{lo_hi[0]:.4g}, {lo_hi[1]:.4g}]",
             f"{rec.calibration_caption()}; baseline PPL "
             f"{rec.calib_base_ppl:.4g}; candidates {rec.candidates}; width {rec.settings.get('width')}; "
             f"{rec.stats.get('evaluations')} calibration evaluations (SLEB-iterative: "
             f"{rec.stats.get('sleb_evaluations')})",
             f"{'n':>3}  {'removed':<20} {'calib PPL':>10} {'held-out ΔPPL % [CI]':>28}  evals"]
    for e in rec.entries:
        ci = e.get("delta_pct_ci") or [float("nan")] * 2
        held = f"{e['delta_pct']:+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}]" if e.get("delta_pct") is not None else "-"
        lines.append(f"{e['n']:>3}  {str(e['removed']):<20} {e['calib_ppl']:>10.4g} {held:>28}  {e['evaluations']}")
    for e in rec.entries:
        lines.append(rec.explain(e["n"]))
    lines.extend(paired_lines(rec))
    lines.extend(repaired_lines(rec.repaired, {"recommend": rec.entries}, rec.repair))
    for n in rec.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def paired_lines(rec) -> list[str]:
    """The held-out paired comparison table: per n and method, ΔPPL(recommend) − ΔPPL(method) in points [CI] and
    better / tie / worse; zero-evaluation methods marked ``*``."""
    if not rec.paired:
        return []
    out = ["held-out, paired over the same windows: ΔPPL %(recommend) − ΔPPL %(method), points [95 % CI] "
           "(* zero-evaluation)"]
    for row in rec.paired:
        cells = [f"{c['method']}{'*' if c['zero_eval'] else ''} {c['diff']:+.1f} [{c['ci'][0]:+.1f}, "
                 f"{c['ci'][1]:+.1f}] {c['word']}" for c in row["comparisons"]]
        best = row.get("best_zero_eval")
        tail = f"  (vs best zero-evaluation {best}: {row['vs_best_zero_eval']})" if best else ""
        out.append(f"  n={row['n']}: " + "; ".join(cells) + tail)
    return out
