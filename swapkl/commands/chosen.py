"""``prune --from RESULT.json --method M --n N``: the removal set a ``curves --json``, ``recommend --json`` or
``evidence --json`` file chose, with what chose it and the contract it was measured on (for the export's header),
checked against the model being exported."""
from __future__ import annotations

import json
from pathlib import Path

from swapkl.contract import BLOCK, UNITS
from swapkl.errors import SwapklError


def chosen_set(path: str, method: str | None, n: int | None) -> dict:
    """``{"removed", "chosen_by", "measured_on", "model", "unit"}`` from a curves, recommendation or evidence JSON
    file (``unit``: what each removed index removes; ``block`` unless a curves file says otherwise)."""
    from swapkl.views.captions import contract_caption  # deferred: the CLI's --help must not load views

    if n is None:
        raise SwapklError("--from needs --n N (which point of the curve to export)")
    p = Path(path).expanduser()
    try:
        d = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SwapklError(f"--from {p}: cannot read a curves or recommendation JSON ({type(e).__name__})") from e
    if isinstance(d, dict) and "stability" in d and "ground_truth" in d and "methods" not in d:
        return _from_evidence(d, p, method, n)
    if not isinstance(d, dict) or not ("methods" in d or "entries" in d):
        raise SwapklError(f"--from {p} is neither a 'curves --json', a 'recommend --json' nor an 'evidence --json' "
                          "file")
    if "entries" in d and "methods" not in d:
        from swapkl.removal.recommend import Recommendation

        if method not in (None, "recommend"):
            raise SwapklError(f"--from {p} is a recommendation: --method is 'recommend' (or leave it out)")
        res = Recommendation.from_dict(d)
        entry = next((e for e in res.entries if e.get("n") == n), None)
        name = "recommend"
    else:
        from swapkl.removal.curves import CurvesResult

        res = CurvesResult.from_dict(d, f"--from {p}")
        if method not in res.methods:
            raise SwapklError(f"--from {p} has no method '{method}'; it has {', '.join(res.methods) or 'none'} "
                              "(give --method)")
        entry = next((e for e in res.methods[method] if e.get("n") == n), None)
        name = method
    if entry is None:
        raise SwapklError(f"--from {p}: {name} has no point n={n}")
    if entry.get("removed") is None:
        raise SwapklError(f"--from {p}: {name} at n={n} has no single removal set (a seeded method is a mean over "
                          "seeds)")
    if entry.get("merge"):
        raise SwapklError(f"--from {p}: {name} at n={n} merges layers ({entry['merge']}); export it with --merge")
    try:
        removed = [int(i) for i in entry["removed"]]
    except (TypeError, ValueError):
        raise SwapklError(f"--from {p}: {name} at n={n} has a malformed removal set") from None
    return {"removed": removed, "chosen_by": f"{name}, n={n} (from {p.name})",
            "measured_on": contract_caption(res), "model": res.model or {}, "unit": getattr(res, "unit", "block")}


#: the ground-truth rankings an evidence file offers to --method (the n layers each cheapest to remove alone)
GROUND_TRUTH = {"ground_truth_ppl": "delta_ppl_pct", "ground_truth_kl": "kl"}


def _from_evidence(d: dict, p: Path, method: str | None, n: int) -> dict:
    """An ``evidence --json`` file: ``--method SIGNAL`` is the set that signal's selection rule chose at n on the
    full sample (its row of the stability table); ``--method ground_truth_ppl`` / ``ground_truth_kl`` the n layers
    whose removal alone cost the least held-out ΔPPL / KL (every layer a candidate, ties by index)."""
    from swapkl.evidence.report import caption  # deferred: the CLI's --help must not load views

    if n < 1:
        raise SwapklError(f"--from {p}: --n must be at least 1 (got {n})")
    stab = d.get("stability") if isinstance(d.get("stability"), dict) else {}
    offered = [*stab, *GROUND_TRUTH]
    if method not in offered:
        raise SwapklError(f"--from {p} is an evidence file: give --method, one of {', '.join(offered)}")
    try:
        if method in GROUND_TRUTH:
            cost = [float("nan") if v is None else float(v) for v in d["ground_truth"][GROUND_TRUTH[method]]]
            layers = [int(i) for i in d["layers"]]
            order = sorted((k for k, v in enumerate(cost) if v == v), key=lambda k: (cost[k], layers[k]))
            removed = sorted(layers[k] for k in order[:n]) if 1 <= n <= len(order) and n < len(layers) else None
            what = f"{method}, n={n}: the {n} layer(s) cheapest to remove alone (from {p.name})"
        else:
            entry = stab[method].get(str(n))
            removed = None if entry is None else sorted(int(i) for i in entry["set"])
            what = f"{method}, n={n} (its rule's set on the full sample, from {p.name})"
        model = dict(d["contract"]["model"] or {})
        measured = caption(d)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError):
        removed = ()
    if removed is not None and len(set(removed)) != n:
        raise SwapklError(f"--from {p}: {method} at n={n} is malformed in this evidence file")
    if removed is None:
        raise SwapklError(f"--from {p}: {method} has no point n={n}")
    unit = d["unit"] if d.get("unit") in UNITS else BLOCK
    return {"removed": removed, "chosen_by": what, "measured_on": measured, "model": model, "unit": unit}


def check_same_model(chosen: dict, identity: dict, num_layers: int) -> None:
    """The file's model is the one being exported (layer count; fingerprint / commit when both sides have one)."""
    m = chosen.get("model") or {}
    if m.get("num_layers") not in (None, num_layers):
        raise SwapklError(f"the --from file is for a {m['num_layers']}-layer model; this model has {num_layers} layers")
    for key in ("fingerprint", "commit"):
        a, b = m.get(key), (identity or {}).get(key)
        if a and b and a != b:
            raise SwapklError(f"the --from file is for another model ({m.get('display') or m.get('id')}; {key} differs)")
