"""``python -m swapkl prune MODEL --remove 3,7 --out DIR``: save a model with layers removed (reloads with
``from_pretrained``); ``--format mergekit`` (a passthrough YAML) or ``--format gguf`` (a pruned GGUF of a GGUF
source) instead, and ``--from RESULT.json --method M --n N`` for the set a curves, recommend or evidence run chose."""
from __future__ import annotations

from swapkl.commands.common import add_model_args, add_unit_arg, load_from_args, model_inputs
from swapkl.commands.prune_repair import add_repair_args, check_repair_args
from swapkl.errors import SwapklError
from swapkl.surgery.exports import FILE_SUFFIX, FORMATS, check_format
from swapkl.surgery.outputs import check_file_out, check_output_dir

# Deferred imports: torch, transformers and the torch-based swapkl modules are imported by run(): the CLI's --help
# must not load them.


def parse_layers(s: str) -> list[int]:
    """``"3,7"`` → [3, 7]; a clear error for anything else."""
    try:
        out = [int(x) for x in str(s).replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise SwapklError(f"--remove wants comma-separated layer indices such as 3,7 (got '{s}')") from None
    if not out:
        raise SwapklError("--remove needs at least one layer index")
    return out


def parse_groups(s: str) -> list[list[int]]:
    """``"3-4,7-9"`` → [[3, 4], [7, 8, 9]]; a clear error for anything else."""
    out = []
    for part in str(s).replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi if sep else "x")
        except ValueError:
            raise SwapklError(f"--merge wants groups such as 3-4,7-9 (got '{s}')") from None
        if b <= a:
            raise SwapklError(f"--merge group {part} must go from a lower to a higher layer")
        out.append(list(range(a, b + 1)))
    if not out:
        raise SwapklError("--merge needs at least one group such as 3-4")
    return out


def register(sub) -> None:
    p = sub.add_parser("prune", help="remove layers and save the pruned model (save_pretrained, safetensors)")
    add_model_args(p)
    p.add_argument("--remove", default=None, help="comma-separated layer indices to remove, e.g. 3,7")
    p.add_argument("--merge", default=None, metavar="GROUPS",
                   help="merge groups of consecutive layers instead, e.g. 3-4,7-9: each group is merged into its "
                        "lowest slot and the rest removed (recorded in swapkl_prune.json)")
    p.add_argument("--merge-mode", default="average", choices=["average", "laco"],
                   help="average: every parameter averaged (default); laco: θ_l + Σ_k (θ_{l+k} − θ_l)")
    p.add_argument("--from", dest="from_file", default=None, metavar="RESULT.json",
                   help="take the removal set from a 'curves --json', 'recommend --json' or 'evidence --json' file (with "
                        "--method, --n; evidence: --method SIGNAL or ground_truth_ppl / ground_truth_kl)")
    p.add_argument("--method", default=None, help="with --from: the method whose set to export")
    p.add_argument("--n", type=int, default=None, help="with --from: the number of removed layers")
    p.add_argument("--format", default="hf", choices=FORMATS,
                   help="hf: a Hugging Face folder (default); mergekit: a passthrough YAML (.yaml); gguf: a pruned "
                        "GGUF of a GGUF source (.gguf), quantised blocks copied as they are")
    p.add_argument("--chosen-by", default=None, help="for the mergekit header: what chose the set (default: --from's)")
    p.add_argument("--measured-on", default=None, help="for the mergekit header: what it was measured on")
    p.add_argument("--out", required=True, metavar="PATH",
                   help="hf: output folder, new or empty; mergekit/gguf: a .yaml/.gguf file; never the source "
                        "model's file or folder, nor inside it")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out folder (its old weight files are replaced, none left beside "
                        "the new) or over an existing --out file")
    p.add_argument("--verify", action="store_true",
                   help="reload what was written and check it: the logits (hf, gguf) or the kept layers (mergekit)")
    add_unit_arg(p)
    add_repair_args(p)
    p.set_defaults(func=run)


def _removal(a, num_layers: int | None = None, identity: dict | None = None) -> tuple[list[int] | None, dict]:
    """The layers to remove (``--remove`` or ``--from``) and the provenance for an export's header."""
    prov = {"chosen_by": a.chosen_by, "measured_on": a.measured_on}
    if a.from_file is None:
        return (parse_layers(a.remove) if a.remove is not None else None), prov
    from swapkl.commands.chosen import chosen_set, check_same_model

    ch = chosen_set(a.from_file, a.method, a.n)
    if getattr(a, "unit", None) not in (None, ch.get("unit", "block")):
        raise SwapklError(f"--unit {a.unit} does not match --from's unit ({ch.get('unit', 'block')})")
    a.unit = ch.get("unit", "block")
    if a.unit != "block" and a.format == "mergekit":
        raise SwapklError(f"--from {a.from_file} removes {a.unit} sublayers: they export as a Hugging Face folder or "
                          "a GGUF (--format hf|gguf)")
    if num_layers is not None:
        check_same_model(ch, identity or {}, num_layers)
    return ch["removed"], {"chosen_by": a.chosen_by or ch["chosen_by"], "measured_on": a.measured_on or ch["measured_on"]}


def _check_args(a) -> None:
    """Everything that can be refused before a model is loaded."""
    if a.from_file is not None and (a.remove is not None or a.merge is not None):
        raise SwapklError("give either --from or --remove/--merge, not both")
    if a.from_file is None and (a.method is not None or a.n is not None):
        raise SwapklError("--method and --n go with --from RESULT.json")
    if a.remove is None and a.merge is None and a.from_file is None:
        raise SwapklError("give --remove LAYERS, --merge GROUPS or --from RESULT.json")
    check_format(a.format, merge=a.merge)
    check_repair_args(a, parse_layers(a.remove) if a.remove is not None else None)
    if (a.unit or "block") != "block" and (a.merge is not None or a.format == "mergekit"):
        raise SwapklError(f"--unit {a.unit} exports as a Hugging Face folder or a GGUF (--format hf|gguf) without "
                          "--merge (a mergekit YAML cannot zero a sublayer)")
    if a.format == "hf":
        check_output_dir(a.out, "--out", force=a.force, protected=model_inputs(a))
    else:
        check_file_out(a.out, (FILE_SUFFIX[a.format], *((".yml",) if a.format == "mergekit" else ())),
                       "a mergekit YAML" if a.format == "mergekit" else "a pruned GGUF", force=a.force,
                       inputs=model_inputs(a))


def run(a) -> int:
    _check_args(a)
    if a.format == "gguf":
        from swapkl.commands.prune_formats import gguf_of, run_gguf

        if a.repair == "bridge":  # the fit needs the model: a GGUF source (refused here otherwise), then as hf
            gguf_of(a)
            return _run_hf(a)
        return run_gguf(a, _removal)
    if a.format == "mergekit":
        from swapkl.commands.prune_formats import run_mergekit

        return run_mergekit(a, _removal)
    if a.from_file is None and (a.unit or "block") != "block":
        from swapkl.commands.prune_units import run_units

        return run_units(a, _removal)
    return _run_hf(a)


def _run_hf(a) -> int:
    from swapkl.surgery.prune import pruned_copy, save_pruned, validate_remove

    groups = parse_groups(a.merge) if a.merge is not None else None
    if a.from_file is None:
        remove, _ = _removal(a)  # a bad --remove fails before the model loads
    ck = load_from_args(a)
    if a.from_file is not None:
        remove, _ = _removal(a, ck.num_layers, ck.identity)
        if a.unit != "block":
            from swapkl.commands.prune_units import save_and_verify

            return save_and_verify(a, ck, remove)
    merge = None
    if groups is not None:
        from swapkl.surgery.merge import merge_plan  # deferred: pulls torch (see the module comment)

        merge = merge_plan({"groups": groups, "mode": a.merge_mode}, ck.num_layers)
        if remove is not None and validate_remove(remove, ck.num_layers) != merge["removed"]:
            raise SwapklError(f"--remove {a.remove} does not match --merge {a.merge}, which removes "
                              f"{merge['removed']}")
        remove = merge["removed"]
    remove = validate_remove(remove, ck.num_layers)
    if a.repair == "bridge":
        from swapkl.commands.prune_repair import run_repair

        return run_repair(a, ck, remove)
    out = save_pruned(ck.model, remove, a.out, tokenizer=ck.tokenizer, identity=ck.identity, force=a.force,
                      merge=merge)
    kept = [i for i in range(ck.num_layers) if i not in remove]
    how = f"merged {a.merge} ({a.merge_mode}), " if merge else ""
    print(f"saved {out}: {how}removed layers {remove}, {len(kept)} of {ck.num_layers} kept")
    if a.verify:
        from swapkl.commands.prune_units import verify_reload

        if merge is not None:
            from swapkl.surgery.merge import merged_copy
            mem = merged_copy(ck.model, merge["groups"], merge["mode"])
        else:
            mem = pruned_copy(ck.model, remove)
        verify_reload(out, ck, mem, "the reloaded model differs from the in-memory model",
                      "reloaded logits equal the in-memory pruned model's")
    return 0
