"""``python -m swapkl compare A B``: two checkpoints side by side -- the rank agreement of their swap-KL per
protocol, each one's regime verdict, and (``--budget N``) the transfer of the pruning decision from A to B."""
from __future__ import annotations

import sys

from swapkl.commands.common import add_contract_args, check_outputs, contract_from_args, emit, evaluator_and_corpus
from swapkl.errors import SwapklError


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare two checkpoints: rank agreement and transfer of the decision")
    p.add_argument("a", metavar="A", help="model spec (hub id, folder, .gguf, 'default') or a 'score --json' file")
    p.add_argument("b", metavar="B", help="the same for model B (the model the decision is transferred to)")
    p.add_argument("--budget", type=int, default=0,
                   help="transfer table for n = 1..N removed layers (0: agreement only; loads B)")
    p.add_argument("--evaluator", default="matched", choices=["matched", "standard"], help="held-out evaluator")
    p.add_argument("--max-words", type=int, default=None, help="override the evaluator's word count (labelled)")
    p.add_argument("--eval-text", default=None, metavar="PATH", help="text file for perplexity (its evaluation region)")
    p.add_argument("--spacing", type=int, default=1, help="Δ of the selection rule (default 1)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model (off by default)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the comparison JSON here")
    p.add_argument("--quiet", action="store_true")
    add_contract_args(p)
    p.set_defaults(func=run)


def _load(spec: str, a):
    from swapkl.model.checkpoints import load_checkpoint

    return load_checkpoint(spec, dtype=a.dtype, device=a.device, trust_remote_code=a.trust_remote_code)


def _side(arg: str, contract, a):
    """(SwapResult, checkpoint or None, source label) of one side."""
    from swapkl.scoring.results import SwapResult
    from swapkl.scoring.score import score

    from swapkl.compare.sources import is_scores_file

    if is_scores_file(arg):
        return SwapResult.load(arg), None, f"scores file {arg}"
    ck = _load(arg, a)
    return score(ck, contract, use_cache=not a.no_cache), ck, "scored here"


def run(a) -> int:
    from swapkl.compare.result import compare
    from swapkl.compare.sources import contract_of, is_scores_file, spec_of
    from swapkl.scoring.results import SwapResult

    if a.budget < 0:
        raise SwapklError(f"--budget must be 0 or more (got {a.budget})")
    if a.n_boot < 10:
        raise SwapklError(f"--n-boot must be at least 10 (got {a.n_boot})")
    files = [x for x in (a.a, a.b) if is_scores_file(x)]
    check_outputs(a, {"--json": a.json}, inputs=[*files, a.eval_text])
    ev, corpus = evaluator_and_corpus(a) if a.budget else (None, None)
    contract = contract_from_args(a)
    # a side given as a file fixes the contract the other side is scored under
    first_file = next((SwapResult.load(x) for x in (a.a, a.b) if is_scores_file(x)), None)
    if first_file is not None:
        contract = contract_of(first_file, a.device)
    res_a, _, src_a = _side(a.a, contract, a)
    res_b, ck_b, src_b = _side(a.b, contract, a)
    if a.budget and ck_b is None:
        ck_b = _load(spec_of(res_b.identity), a)

    def prog(done, total, msg):
        if not a.quiet:
            print(f"  [{done}/{total}] {msg}", file=sys.stderr, flush=True)

    result = compare(res_a, res_b, source_a=src_a, source_b=src_b, ck_b=ck_b, budget=a.budget, evaluator=ev,
                     corpus=corpus, spacing=a.spacing, n_boot=a.n_boot, progress=prog)
    return emit(a, result, render)


def _ci(c) -> str:
    lo, hi = c["ci"]
    return f"{c['value']:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None and c["value"] is not None else "-"


def render(r) -> str:
    from swapkl.views.captions import contract_caption

    ag = r.agreement
    lines = [contract_caption(r.provenance()),
             f"pairs both scored: {ag['n_pairs']}; bootstrap over prompts "
             f"{'paired (same prompts)' if ag['shared_prompts'] else 'unpaired (different prompts)'}, {ag['n_boot']} resamples",
             f"{'protocol':<12} {'Spearman ρ [95% CI]':<28} {'Kendall τ [95% CI]':<28}"]
    for p in ("replacement", "interchange"):
        lines.append(f"{p:<12} {_ci(ag[p]['spearman']):<28} {_ci(ag[p]['kendall']):<28}")
    for k, v in ag["verdicts"].items():
        lines.append(f"verdict {k.upper()}: {v.get('regime')} ({v.get('sentence')})")
    if r.transfer:
        t = r.transfer
        lines.append(f"transfer to B: held-out ΔPPL % on B (baseline PPL {t['baseline_ppl']:.4g}, "
                     f"{t['n_windows']} windows); diff = A's set − B's set, paired 95% CI")
        for p, rows in t["protocols"].items():
            for x in rows:
                lines.append(f"  {p:<12} n={x['n']}  A's set {x['set_a']} {x['delta_a']:+.2f}%  B's set {x['set_b']} "
                             f"{x['delta_b']:+.2f}%  diff {x['diff']:+.2f} [{x['ci'][0]:+.2f}, {x['ci'][1]:+.2f}] "
                             f"{x['word']}")
        lines += [f"note: {n}" for n in t.get("notes", [])]
    lines += [f"note: {n}" for n in r.notes]
    return "\n".join(lines)
