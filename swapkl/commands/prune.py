"""``python -m swapkl prune MODEL --remove 3,7 --out DIR``: save a model with layers removed (reloads with
``from_pretrained``)."""
from __future__ import annotations

from swapkl.commands.common import add_model_args, load_from_args, model_inputs
from swapkl.errors import SwapklError
from swapkl.surgery.outputs import check_output_dir

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
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder: new or empty; never the source model's folder or inside it")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out: its old weight files are replaced (none left beside the new)")
    p.add_argument("--verify", action="store_true",
                   help="reload the saved folder and check its logits equal the in-memory pruned model's")
    p.set_defaults(func=run)


def run(a) -> int:
    import torch  # deferred: the CLI's --help must not

    from swapkl.surgery.prune import pruned_copy, save_pruned, validate_remove

    if a.remove is None and a.merge is None:
        raise SwapklError("give --remove LAYERS or --merge GROUPS")
    remove = parse_layers(a.remove) if a.remove is not None else None
    groups = parse_groups(a.merge) if a.merge is not None else None
    check_output_dir(a.out, "--out", force=a.force, protected=model_inputs(a))  # before loading anything
    ck = load_from_args(a)
    merge = None
    if groups is not None:
        from swapkl.surgery.merge import merge_plan  # deferred: pulls torch (see the module comment)

        merge = merge_plan({"groups": groups, "mode": a.merge_mode}, ck.num_layers)
        if remove is not None and validate_remove(remove, ck.num_layers) != merge["removed"]:
            raise SwapklError(f"--remove {a.remove} does not match --merge {a.merge}, which removes "
                              f"{merge['removed']}")
        remove = merge["removed"]
    remove = validate_remove(remove, ck.num_layers)
    out = save_pruned(ck.model, remove, a.out, tokenizer=ck.tokenizer, identity=ck.identity, force=a.force,
                      merge=merge)
    kept = [i for i in range(ck.num_layers) if i not in remove]
    how = f"merged {a.merge} ({a.merge_mode}), " if merge else ""
    print(f"saved {out}: {how}removed layers {remove}, {len(kept)} of {ck.num_layers} kept")
    if a.verify:
        from transformers import AutoModelForCausalLM

        re = AutoModelForCausalLM.from_pretrained(out, dtype=next(ck.model.parameters()).dtype).to(ck.device).eval()
        x = ck.tokenizer("The quick brown fox jumps over the lazy dog.", return_tensors="pt")["input_ids"]
        x = x.to(ck.device)
        with torch.no_grad():
            if merge is not None:
                from swapkl.surgery.merge import merged_copy
                mem = merged_copy(ck.model, merge["groups"], merge["mode"])
            else:
                mem = pruned_copy(ck.model, remove)
            a1 = mem(input_ids=x, use_cache=False).logits
            a2 = re(input_ids=x, use_cache=False).logits
        err = float((a1 - a2).abs().max())
        if err > 1e-5:
            raise SwapklError(f"the reloaded model differs from the in-memory model (max |Δlogit| {err:.3g})")
        print(f"verified: reloaded logits equal the in-memory pruned model's (max |Δlogit| {err:.1e})")
    return 0
