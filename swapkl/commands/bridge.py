"""``python -m swapkl bridge MODEL ...``: the third matrix, bridged swap-KL: per span [i, j) of the pair set (and every
span to the last block), KL(base ‖ the span replaced by a linear bridge fitted on calibration text) beside the same
span removed without a bridge, with prompt-bootstrap CIs; cached and resumable (docs/repair.md)."""
from __future__ import annotations

from swapkl.commands.common import (add_fit_args, ProgressPrinter, add_form_arg, bridge_settings_of, add_contract_args, add_model_args, block_unit_only,
                                    check_outputs, contract_from_args, emit, load_from_args)
from swapkl.repair import forms


def register(sub) -> None:
    p = sub.add_parser("bridge", help="bridged swap-KL: each span replaced by a fitted linear bridge, vs removed")
    add_model_args(p)
    add_contract_args(p)
    add_bridge_args(p)
    p.add_argument("--json", default=None, metavar="OUT", help="write the result JSON here")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def add_bridge_args(p) -> None:
    """The bridge settings' flags (``bridge`` and its torchrun form, ``bridge-distributed``)."""
    add_form_arg(p, forms.DEFAULT, "folded (ReplaceMe: into the MLP before the span; a span from block 0 uses "
                                   "residual) or residual (a map on the residual stream)")
    p.add_argument("--calib-tokens", type=int, default=None, help="calibration tokens per fit (default 8192)")
    add_fit_args(p)


def run(a) -> int:
    from swapkl.repair.bridged_kl import bridged_scores  # deferred: pulls torch; the CLI's --help must not

    contract = contract_from_args(a)
    block_unit_only(a, "bridge")
    settings = bridge_settings_of(a)
    check_outputs(a, {"--json": a.json})
    ck = load_from_args(a)
    res = bridged_scores(ck, contract, settings, progress=ProgressPrinter(a.quiet), use_cache=not a.no_cache)
    return emit(a, res, render)


def render(res) -> str:
    c, s = res.contract, res.settings
    lines = [f"model: {res.identity.get('display') or res.identity.get('id')}  layers: {res.num_layers}",
             f"contract: pairs={c['pairs']} prompts={c['prompts']}x{c['tokens']} positions={c['positions']} "
             f"dtype={c['dtype']} corpus={c.get('corpus_label')}; bridge form={s['form']} calib={s['calib_tokens']} "
             f"tokens (window {s['calib_window']}, seed {s['calib_seed']}) ridge={s['ridge']:g}",
             f"spans computed: {res.meta.get('computed_spans')}, from cache: {res.meta.get('cached_spans')}",
             "span (removed layers)   bridged KL [95% CI]           removed, no bridge [95% CI]   form      fit residual"]
    for r in res.rows():
        i, j = r["span"]
        lo, hi = r["bridged_ci"]
        rlo, rhi = r["raw_ci"]
        resid = f"{r['residual']:.3f}" if r["residual"] is not None else "-"
        lines.append(f"{i:>3}..{j - 1:<3}               {r['bridged']:.4f} [{lo:.4f}, {hi:.4f}]    "
                     f"{r['raw']:.4f} [{rlo:.4f}, {rhi:.4f}]    {r['form'] or '-':<9} {resid}")
    return "\n".join(lines)
