"""``swapkl prune --unit attention|mlp --remove 3,7 --out DIR``: a Hugging Face folder with those sublayers'
output projections zeroed (stock transformers loads it; exactly skipping them), verified against swapkl's skipping
runtime with ``--verify``; the CLI says that stock runtimes still compute a zeroed sublayer."""
from __future__ import annotations

from swapkl.commands.common import load_from_args
from swapkl.errors import SwapklError


def run_units(a, removal) -> int:
    """The ``--remove`` sublayers of ``a.unit``, saved (and verified)."""
    remove, _ = removal(a)  # a bad --remove fails before the model loads
    return save_and_verify(a, load_from_args(a), remove)


def save_and_verify(a, ck, remove) -> int:
    from swapkl.surgery.prune import save_pruned
    from swapkl.surgery.removal_set import RemovalSet
    from swapkl.surgery.sublayer_export import RUNTIME_NOTE

    rs = RemovalSet.of(remove, a.unit).validate(ck.num_layers)
    out = save_pruned(ck.model, rs, a.out, tokenizer=ck.tokenizer, identity=ck.identity, force=a.force)
    print(f"saved {out}: {a.unit} sublayers of layers {rs.layers(a.unit)} removed as zeroed output projections "
          f"(weight and bias), all {ck.num_layers} layers kept")
    print(f"note: {RUNTIME_NOTE}")
    if a.verify:
        from swapkl.surgery.skip import skipping_copy

        verify_reload(out, ck, skipping_copy(ck.model, rs), "the reloaded folder differs from swapkl's skipping model",
                      "the reloaded folder's logits equal swapkl's skipping model")
    return 0


def verify_reload(out, ck, reference, differs: str, equals: str, rel: float | None = None) -> float:
    """Reload the saved folder ``out`` with stock ``transformers`` (no custom code) and compare its logits on one
    sentence with ``reference`` (the model in memory it should equal): a :class:`SwapklError` ``"{differs} (max
    |Δlogit| …)"`` above 1e-5 (with ``rel``: above ``rel`` × the reference's max |logit|, for new weights computed in
    another order), else one line ``"verified: {equals} …"``.  Returns the max |Δlogit|."""
    import torch  # deferred: the CLI's --help must not
    from transformers import AutoModelForCausalLM

    re = AutoModelForCausalLM.from_pretrained(out, dtype=next(ck.model.parameters()).dtype).to(ck.device).eval()
    x = ck.tokenizer("The quick brown fox jumps over the lazy dog.", return_tensors="pt")["input_ids"].to(ck.device)
    with torch.no_grad():
        want = reference(input_ids=x, use_cache=False).logits
        err = float((want - re(input_ids=x, use_cache=False).logits).abs().max())
    if err > (1e-5 if rel is None else rel * float(want.abs().max())):
        raise SwapklError(f"{differs} (max |Δlogit| {err:.3g})")
    print(f"verified: {equals} (max |Δlogit| {err:.1e})")
    return err
