"""``prune --format gguf`` and ``prune --format mergekit``: the removal set as a pruned GGUF or a mergekit
passthrough YAML (:mod:`swapkl.surgery.exports`).  The paths were checked by ``prune`` before this runs."""
from __future__ import annotations

from pathlib import Path

from swapkl.commands.common import load_from_args, model_inputs
from swapkl.errors import SwapklError
from swapkl.surgery.exports import ExportError

VERIFY_TEXT = "The quick brown fox jumps over the lazy dog."


def gguf_of(a) -> tuple[Path, dict]:
    """The GGUF file ``a.model`` names (a ``.gguf`` file or the built-in default) and its identity, without
    loading the model; anything else cannot be exported as a GGUF."""
    from swapkl.model.checkpoints import parse_spec  # deferred: pulls torch; the CLI's --help must not
    from swapkl.store import file_sha256

    sp = parse_spec(a.model, a.revision)
    if sp.kind == "builtin":
        from swapkl.model.builtin import NUM_LAYERS, default_gguf_path

        src = default_gguf_path()
        return src, {"kind": "builtin", "fingerprint": file_sha256(src), "num_layers": NUM_LAYERS}
    if sp.kind == "gguf":
        return Path(sp.source), {"kind": "gguf", "fingerprint": file_sha256(sp.source)}
    raise ExportError(f"--format gguf needs a GGUF source (a .gguf file or 'default'); {sp.display} is a {sp.kind} "
                      "model: export a Hugging Face folder (--format hf) and convert it with llama.cpp's "
                      "convert_hf_to_gguf.py")


def run_gguf(a, removal) -> int:
    from swapkl.surgery.exports import export_gguf
    from swapkl.surgery.gguf_prune import gguf_layout

    src, ident = gguf_of(a)
    if a.from_file is not None:
        remove, _ = removal(a, gguf_layout(src)["block_count"], ident)
    else:
        remove, _ = removal(a)
    if remove is None:
        raise SwapklError("give --remove LAYERS (or --from) with --format gguf")
    unit = getattr(a, "unit", None) or "block"
    if unit != "block":  # sublayers: every block kept, the sublayers' output projections written as zeros
        from swapkl.surgery.sublayer_export import RUNTIME_NOTE

        rep = export_gguf(src, [], a.out, force=a.force, inputs=model_inputs(a),
                          zero_units=[(int(i), unit) for i in remove])
        print(f"saved {rep['path']}: {unit} sublayers of blocks {[x[0] for x in rep['zeroed_units']]} written as "
              f"zeroed output projections, all {rep['num_layers_after']} blocks kept")
        print(f"note: {RUNTIME_NOTE}")
        if a.verify:
            print(f"verified: transformers reads the GGUF with swapkl's skipping model's logits (max |Δlogit| "
                  f"{verify_gguf(a, rep, unit):.1e})")
        return 0
    rep = export_gguf(src, remove, a.out, force=a.force, inputs=model_inputs(a))
    print(f"saved {rep['path']}: removed blocks {rep['removed']}, {rep['num_layers_after']} of "
          f"{rep['num_layers_before']} kept; quantised tensors copied as they are; block_count"
          + (f" and {', '.join(rep['trimmed_keys'])}" if rep["trimmed_keys"] else "") + " trimmed")
    print(f"the same with llama.cpp: {rep['llama_quantize']}")
    if a.verify:
        err = verify_gguf(a, rep)
        print(f"verified: transformers reads the pruned GGUF with the HF pruned model's logits (max |Δlogit| "
              f"{err:.1e})")
    return 0


def verify_gguf(a, rep: dict, unit: str = "block") -> float:
    """Max |Δlogit| between the written GGUF read by transformers and the source model with the same blocks
    removed in memory (:func:`swapkl.surgery.blocks.pruned_copy`); raises past 1e-4."""
    import torch

    from swapkl.model.gguf import load_gguf
    from swapkl.surgery.blocks import pruned_copy
    from swapkl.surgery.skip import skipping_copy

    ck = load_from_args(a)
    reread, _ = load_gguf(rep["path"], with_tokenizer=False)
    x = ck.tokenizer(VERIFY_TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        mem = (pruned_copy(ck.model, rep["removed"]) if unit == "block" else
               skipping_copy(ck.model, [layer for layer, _ in rep["zeroed_units"]], unit))
        a1 = mem(input_ids=x.to(ck.device), use_cache=False).logits.cpu()
        a2 = reread(input_ids=x, use_cache=False).logits
    err = float((a1.float() - a2.float()).abs().max())
    if err > 1e-4:
        raise SwapklError(f"the pruned GGUF differs from the in-memory pruned model (max |Δlogit| {err:.3g})")
    return err


def run_mergekit(a, removal) -> int:
    from swapkl.surgery.exports import export_removal

    if a.from_file is None:
        remove, prov = removal(a)  # a bad --remove fails before the model loads
    ck = load_from_args(a)
    if a.from_file is not None:
        remove, prov = removal(a, ck.num_layers, ck.identity)
    if remove is None:
        raise SwapklError("give --remove LAYERS (or --from) with --format mergekit")
    rep = export_removal(ck.model, remove, a.out, "mergekit", identity=ck.identity, force=a.force,
                         provenance={k: v for k, v in prov.items() if v}, force_hint="--force")
    print(f"saved {rep['path']}: removed layers {rep['removed']}, {len(rep['kept'])} of {ck.num_layers} kept in "
          f"{rep['slices']} slice(s); run: mergekit-yaml {rep['path']} OUT_DIR")
    if a.verify:  # the file was read back by export_mergekit; say what it keeps
        print(f"verified: the YAML read back keeps layers {rep['kept']} = range({ck.num_layers}) minus {rep['removed']}")
    return 0
