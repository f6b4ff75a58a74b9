"""An evidence file (``swapkl evidence --json``) from outside: its shape (per-layer lists of the same length, the
headline) and its contract (the model's identity, the scoring contract, the evaluator, the bootstrap sizes, the word
regions), checked before anything is drawn from it; one-line :class:`~swapkl.errors.SwapklError` /
:class:`~swapkl.errors.UploadError` otherwise."""
from __future__ import annotations

from swapkl.errors import SwapklError
from swapkl.schema.fields import (_array, _document, _evaluator, _fail, _fields, _int, _json, _object, _scalar,
                                  contract, identity)

#: the keys of every evidence file
EVIDENCE_KEYS = ("layers", "ground_truth", "signals", "agreement", "stability", "contract")


def evidence_fields(d, what: str = "evidence file") -> dict:
    """``d`` (a parsed evidence file) checked: its keys, per-layer lists of one length (layers, the ground truth's
    ΔPPL % and KL, every signal), the agreement and stability objects, the headline a string, and its contract
    (:func:`evidence_contract`).  Returns ``d``."""
    if not isinstance(d, dict) or not all(k in d for k in EVIDENCE_KEYS):
        raise SwapklError(f"{what}: not a swapkl evidence file (expected the JSON written by 'python -m swapkl "
                          f"evidence --json'; keys {', '.join(EVIDENCE_KEYS)})")
    L = d["layers"]
    g = d["ground_truth"]
    ok = (isinstance(L, list) and all(isinstance(k, int) for k in L) and isinstance(g, dict)
          and all(isinstance(g.get(k), list) and len(g[k]) == len(L) for k in ("delta_ppl_pct", "kl"))
          and isinstance(d["signals"], dict)
          and all(isinstance(v, list) and len(v) == len(L) for v in d["signals"].values())
          and isinstance(d["agreement"], dict) and isinstance(d["stability"], dict) and isinstance(d.get("headline"), str)
          and isinstance(d["contract"], dict))
    if not ok:
        raise SwapklError(f"{what}: malformed evidence (layers, ground truth and signals must be per-layer lists, "
                          "the headline a string)")
    evidence_contract(d["contract"], what)
    if d.get("task_truth") is not None:
        task_truth_fields(d["task_truth"], len(L), what)
    return d


def task_truth_fields(t, n: int, what: str) -> None:
    """The optional ``task_truth`` of ``evidence --tasks`` (older files have none): its tasks, and per task the
    accuracy change and its CIs, and the accuracy loss with its CIs, per layer (``n`` of them)."""
    def per_layer(v, ci=False):
        return isinstance(v, list) and len(v) == n and all(
            (isinstance(x, list) and len(x) == 2) if ci else (x is None or isinstance(x, (int, float))) for x in v)
    ok = (isinstance(t, dict) and isinstance(t.get("tasks"), list) and t["tasks"]
          and all(isinstance(k, str) for k in t["tasks"])
          and all(isinstance(t.get(k), dict) and set(t[k]) >= set(t["tasks"])
                  for k in ("delta_acc", "delta_acc_ci", "base", "metric"))
          and all(per_layer(t["delta_acc"][k]) and per_layer(t["delta_acc_ci"][k], True) for k in t["tasks"])
          and per_layer(t.get("acc_loss")) and per_layer(t.get("acc_loss_ci"), True)
          and isinstance(t.get("truths_agreement"), dict))
    if not ok:
        raise SwapklError(f"{what}: malformed task ground truth (task_truth: per-layer accuracy changes and losses "
                          "with their CIs for every task)")


def evidence_contract(c: dict, what: str) -> None:
    """The evidence file's contract, as its caption reads it: the model's identity, the scoring contract, the
    evaluator, the bootstrap sizes and the word regions ([first, last] word indices)."""
    def regions(v, w):
        for k, r in _object(v, w).items():
            if len(_array(r, f"{w}.{k}", 2)) != 2:
                _fail(w, k, "is not a [first, last] word range")
            [_int(e, f"{w}.{k}[{i}]", 0, 10 ** 12) for i, e in enumerate(r)]
        return v
    with _document(what):
        _fields(c, "contract", {"model": identity, "scoring": contract, "evaluator": _evaluator, "regions": regions,
                                "bootstrap": lambda v, w: _fields(v, w, {}, extra=_scalar)}, extra=_json)
