"""``prune --from RESULT.json --method M --n N``: the removal set a ``curves --json`` or ``recommend --json`` file
chose, with what chose it and the contract it was measured on (for the export's header), checked against the
model being exported."""
from __future__ import annotations

import json
from pathlib import Path

from swapkl.errors import SwapklError


def chosen_set(path: str, method: str | None, n: int | None) -> dict:
    """``{"removed", "chosen_by", "measured_on", "model"}`` from a curves or recommendation JSON file."""
    from swapkl.views.captions import contract_caption  # deferred: the CLI's --help must not load views

    if n is None:
        raise SwapklError("--from needs --n N (which point of the curve to export)")
    p = Path(path).expanduser()
    try:
        d = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SwapklError(f"--from {p}: cannot read a curves or recommendation JSON ({type(e).__name__})") from e
    if not isinstance(d, dict) or not ("methods" in d or "entries" in d):
        raise SwapklError(f"--from {p} is neither a 'curves --json' nor a 'recommend --json' file")
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
            "measured_on": contract_caption(res), "model": res.model or {}}


def check_same_model(chosen: dict, identity: dict, num_layers: int) -> None:
    """The file's model is the one being exported (layer count; fingerprint / commit when both sides have one)."""
    m = chosen.get("model") or {}
    if m.get("num_layers") not in (None, num_layers):
        raise SwapklError(f"the --from file is for a {m['num_layers']}-layer model; this model has {num_layers} layers")
    for key in ("fingerprint", "commit"):
        a, b = m.get(key), (identity or {}).get(key)
        if a and b and a != b:
            raise SwapklError(f"the --from file is for another model ({m.get('display') or m.get('id')}; {key} differs)")
