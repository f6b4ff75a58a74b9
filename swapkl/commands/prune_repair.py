"""``swapkl prune MODEL --remove 3,4 --repair bridge --out DIR``: the removed span(s) replaced by a linear bridge
fitted on calibration text and folded into block i−1's MLP output projection (docs/repair.md), saved as an ordinary
Hugging Face folder with ``swapkl_bridge.json`` beside it; ``--max-ppl-increase P`` refuses (exit 1, nothing written)
a bridged model whose held-out ΔPPL is above P %; ``--verify`` reloads it with stock transformers."""
from __future__ import annotations

from swapkl.commands.common import add_fit_args, add_form_arg, bridge_settings_of
from swapkl.errors import SwapklError
from swapkl.repair import forms

# Deferred imports: torch and the torch-based swapkl modules are imported by run_repair(), not at import time.


def add_repair_args(p) -> None:
    g = p.add_argument_group("repair (--repair bridge)")
    g.add_argument("--repair", default="none", choices=["none", "bridge"],
                   help="bridge: replace each removed span by a linear map fitted on calibration text, folded into "
                        "the MLP before it (ReplaceMe); the export stays an ordinary checkpoint")
    add_form_arg(g, forms.DEFAULT, "the bridge form; only folded exports (residual is for 'swapkl bridge')")
    g.add_argument("--calib-tokens", type=int, default=None, help="calibration tokens of the bridge fit (default 8192)")
    add_fit_args(g)
    g.add_argument("--max-ppl-increase", type=float, default=None, metavar="P",
                   help="refuse (exit 1, write nothing) when the bridged model's held-out ΔPPL is above P %%")
    g.add_argument("--evaluator", default="matched", choices=["matched", "standard"], help="held-out evaluator")
    g.add_argument("--max-words", type=int, default=None, help="override the evaluator's word count (labelled)")
    g.add_argument("--eval-text", default=None, help="evaluation corpus (default: the automatic corpus)")


def check_repair_args(a, remove: list[int] | None = None) -> None:
    """Refusals that need no model; ``remove``: the layers of ``--remove`` when given (a span from block 0 has no
    MLP before it to fold into: refused here, before the model loads)."""
    if a.repair == "none":
        if a.max_ppl_increase is not None:
            raise SwapklError("--max-ppl-increase goes with --repair bridge")
        return
    if a.merge is not None or a.format not in ("hf", "gguf") or (a.unit or "block") != "block":
        raise SwapklError("--repair bridge removes whole blocks and exports a Hugging Face folder or, from a GGUF "
                          "source, a GGUF (--format hf|gguf, no --merge, --unit block)")
    kind = forms.get(a.form)
    if not kind.exports:
        raise SwapklError(f"--repair bridge exports the {forms.DEFAULT} form only (the {a.form} form is no ordinary "
                          f"checkpoint); use --form {forms.DEFAULT}")
    if remove:
        from swapkl.repair.bridge import spans_of

        for start, _ in spans_of(remove):
            kind.check_start(start)


def run_repair(a, ck, remove) -> int:
    """Fit, evaluate, gate, save and verify the bridged export of ``remove`` on the loaded checkpoint ``ck``."""
    from swapkl.commands.common import evaluator_and_corpus
    from swapkl.commands.prune_units import verify_reload
    from swapkl.contract import Contract
    from swapkl.measure.evaluate import delta_pct, eval_ids, evaluate_ppl
    from swapkl.repair.bridge import bridged_model, spans_of
    from swapkl.repair.bridger import Bridger
    from swapkl.repair.export import BRIDGE_FILE, check_foldable, save_bridged
    from swapkl.surgery.blocks import pruned_copy, validate_remove

    settings = bridge_settings_of(a)
    ev, corpus = evaluator_and_corpus(a)
    remove = validate_remove(remove, ck.num_layers)
    spans = spans_of(remove)
    check_foldable(ck.model, [_probe(s, settings.form) for s in spans])  # one line, before any work
    scoring = Contract()  # the calibration text avoids the default contract's scoring prompts
    bridger = Bridger(ck.model, ck.tokenizer, corpus, settings, scoring)
    bridges = bridger.span_bridges(spans)
    ids = eval_ids(corpus, ck.tokenizer, ev)
    ppl = {}
    for name, model in (("base", ck.model), ("raw", pruned_copy(ck.model, remove)),
                        ("bridged", bridged_model(ck.model, bridges))):
        ppl[name] = evaluate_ppl(model, ids, ev.window, ev.stride, ev.drop_first_target)
    d_raw, d_bridged = delta_pct(ppl["raw"], ppl["base"]), delta_pct(ppl["bridged"], ppl["base"])
    print(f"held-out ΔPPL ({ev.name}, {corpus.label}): without a bridge {d_raw:+.2f} %, bridged {d_bridged:+.2f} % "
          f"(PPL {ppl['base'].ppl:.3f} → {ppl['bridged'].ppl:.3f})")
    if a.max_ppl_increase is not None and d_bridged > a.max_ppl_increase:
        raise SwapklError(f"the bridged model's held-out ΔPPL is {d_bridged:+.2f} %, above --max-ppl-increase "
                          f"{a.max_ppl_increase:g} %: nothing written")
    prov = {"contract": {"bridge": settings.to_dict(), "calibration": bridger.calibration(),
                         "scoring_prompts_avoided": scoring.to_dict(), "evaluator": ev.to_dict(),
                         "eval_text": corpus.label},
            "heldout": {"ppl_base": ppl["base"].ppl, "ppl_raw": ppl["raw"].ppl, "ppl_bridged": ppl["bridged"].ppl,
                        "delta_ppl_pct_raw": d_raw, "delta_ppl_pct_bridged": d_bridged},
            "source": ck.identity}
    if a.format == "gguf":
        return _save_gguf(a, ck, bridges, prov)
    out = save_bridged(ck.model, bridges, a.out, ck.tokenizer, ck.identity, prov)
    for b in bridges:
        print(f"bridge over layers {b.start}..{b.end - 1}: folded into layer {b.start - 1}'s MLP output projection, "
              f"{b.fit['tokens']} calibration tokens, ε {b.fit['eps']:.3g}, fit residual {b.fit['residual']:.3f}")
    print(f"saved {out}: removed layers {remove}, {ck.num_layers - len(remove)} of {ck.num_layers} kept; "
          f"provenance in {BRIDGE_FILE}")
    if a.verify:
        verify_reload(out, ck, bridged_model(ck.model, bridges), "the reloaded folder differs from swapkl's bridged "
                      "model", "the reloaded folder's logits equal swapkl's bridged model", rel=1e-4)
    return 0


def _save_gguf(a, ck, bridges, prov) -> int:
    """The bridged model as a GGUF of the GGUF source (:func:`swapkl.repair.export.save_bridged_gguf`), verified
    with transformers' own GGUF reader against swapkl's bridged model when asked."""
    from swapkl.commands.common import model_inputs
    from swapkl.commands.prune_formats import gguf_of
    from swapkl.repair.export import save_bridged_gguf

    src, _ = gguf_of(a)
    rep = save_bridged_gguf(ck.model, bridges, src, a.out, force=a.force, inputs=model_inputs(a), provenance=prov)
    print(f"saved {rep['path']}: removed layers {rep['removed']}, {rep['num_layers_after']} of "
          f"{rep['num_layers_before']} kept; the bridges folded into {', '.join(rep['replaced'])} (F32), every other "
          f"tensor copied as it is; provenance in {rep['provenance']}")
    if a.verify:
        import torch

        from swapkl.commands.prune_formats import VERIFY_TEXT
        from swapkl.model.gguf import load_gguf
        from swapkl.repair.bridge import bridged_model

        reread, _ = load_gguf(rep["path"], with_tokenizer=False)
        x = ck.tokenizer(VERIFY_TEXT, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            ref = bridged_model(ck.model, bridges)(input_ids=x.to(ck.device), use_cache=False).logits.float().cpu()
            got = reread(input_ids=x, use_cache=False).logits.float()
        rel = float((ref - got).abs().max() / ref.abs().max().clamp_min(1e-12))
        if rel > 1e-4:
            raise SwapklError(f"the bridged GGUF differs from swapkl's bridged model (relative max |Δlogit| {rel:.3g})")
        print(f"verified: transformers reads the GGUF with swapkl's bridged model's logits (relative max |Δlogit| "
              f"{rel:.1e})")
    return 0


def _probe(span, form: str):
    """A placeholder bridge of ``span`` in ``form`` (for the refusal check before any fit)."""
    from swapkl.repair.bridge import Bridge

    return Bridge(span[0], span[1], form, None)
