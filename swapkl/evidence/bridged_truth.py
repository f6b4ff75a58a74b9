"""Ground truth after repair: the held-out cost of removing each block alone *with its bridge* (docs/evidence.md,
"After repair").

For every block ℓ the span ``[ℓ, ℓ+1)`` is replaced by its linear bridge (:mod:`swapkl.repair`): folded into block
ℓ−1's MLP output projection where an exact fold exists, else on the residual stream (block 0, a family without a
known projection or with a norm after it; the form used and why are recorded per block).  Every bridge is fitted on
one calibration text (a :class:`~swapkl.repair.bridger.Bridger`: the scoring contract's prompt region minus its prompts,
drawn with the bridge settings), and the bridged model is evaluated on the *same* evaluator windows as
the raw ground truth (:mod:`swapkl.evidence.ground_truth`), with KL(base ‖ bridged) per window from a base reference.
So the two ground truths are paired window by window.

With prefix reuse, as the raw ground truth: one base pass per batch of windows keeps the state entering every block
(and block ℓ−1's MLP output), and each block's bridged removal runs only blocks ℓ+1.. from the bridged state
(:func:`swapkl.evidence.ground_truth.single_removal_sweep` with ``bridges``; equal to evaluating the bridged model,
tests/evidence/test_evidence_repair.py).  The result is cached as one store entry (kind ``bridged-truth``, atomic, versioned) keyed by the model, the evaluation text, the bridge settings
and the calibration description; the settings and the calibration are part of the record.
"""
from __future__ import annotations

import time

import numpy as np

from swapkl.evidence.ground_truth import GroundTruth, from_results
from swapkl.store import CorruptEntry, cache_root, read_entry, warn_unwritable, write_entry

KIND = "bridged-truth"


def bridged_ground_truth(bridger, ids, ev, store: dict | None = None, layers=None, region: dict | None = None,
                         batch_size=None, should_stop=None) -> tuple[GroundTruth, dict]:
    """``(GroundTruth, record)`` of removing each block of ``layers`` (default all) of ``bridger.model`` with its
    bridge.

    ``bridger``: the :class:`~swapkl.repair.bridger.Bridger` whose calibration text and settings fit the bridges;
    ``ids``: the evaluation token ids (1-D); ``ev``: the evaluator (window, stride); ``store``: where the entry is filed, ``{"text": the
    evaluation text's key (:func:`swapkl.evidence.ground_truth.text_key`), "identity": the checkpoint identity}``
    (None, or an identity that cannot name the weights: no cache).
    ``record``: ``{"settings", "calibration", "forms": {ℓ: {"form", "note", "residual"}}}``."""
    from swapkl.model import architectures as arch

    t0 = time.perf_counter()
    model, settings = bridger.model, bridger.settings
    L = arch.locate(model).num_layers
    layers = list(range(L)) if layers is None else [int(x) for x in layers]
    calib_desc = dict(bridger.calib.description)
    path = _entry_path(store.get("identity"), store.get("text"), settings, calib_desc) if store else None
    data = _read(path, layers)
    computed = 0
    if data is None:
        data = _compute(bridger, ids, ev, layers, batch_size, should_stop)
        computed = len(layers)
        if path is not None:
            try:
                write_entry(path, KIND, data)
            except OSError as e:
                warn_unwritable(path, e)
    base, removed = _results(data, ids, ev)
    gt = from_results(layers, base, {ell: removed[ell] for ell in layers}, region, time.perf_counter() - t0,
                      computed=computed)
    record = {"settings": settings.to_dict(),
              "calibration": {k: v for k, v in calib_desc.items() if k != "window_starts"},
              "forms": {str(ell): data["forms"][str(ell)] for ell in layers}}
    return gt, record


def _compute(bridger, ids, ev, layers, batch_size, should_stop) -> dict:
    """Fit every block's bridge and sweep base and bridged removals on ``ev``'s windows of ``ids`` with prefix reuse
    (:func:`swapkl.evidence.ground_truth.single_removal_sweep` with ``bridges``): per-window NLL and KL sums (nats)
    and per block the form used."""
    from swapkl.evidence.ground_truth import single_removal_sweep

    spans = [(ell, ell + 1) for ell in layers]
    bridges = dict(zip(spans, bridger.span_bridges(spans)))
    forms = bridger.forms
    model = bridger.model

    sw = single_removal_sweep(model, ids, ev.window, ev.stride, ev.drop_first_target, layers=layers,
                              batch_size=batch_size, should_stop=should_stop,
                              bridges={ell: bridges[(ell, ell + 1)] for ell in layers})
    base = sw.baseline
    out = {"base_nll": base.nll.tolist(), "counts": base.counts.tolist(), "nll": {}, "kl": {}, "forms": {}}
    for ell in layers:
        r = sw.removed[ell]
        out["nll"][str(ell)], out["kl"][str(ell)] = r.nll.tolist(), r.kl.tolist()
        fit = bridges[(ell, ell + 1)].fit
        out["forms"][str(ell)] = {"form": forms[(ell, ell + 1)][0], "note": forms[(ell, ell + 1)][1],
                                  "residual": fit.get("residual"), "eps": fit.get("eps")}
    return out


def _results(data: dict, ids, ev):
    from swapkl.measure.evaluate import PPLResult

    counts = np.asarray(data["counts"], dtype=np.int64)
    n = int(getattr(ids, "numel", lambda: len(ids))())

    def res(nll, kl=None):
        return PPLResult(nll=np.asarray(nll, float), counts=counts.copy(), n_tokens=n, window=ev.window,
                         stride=ev.stride, drop_first_target=ev.drop_first_target,
                         kl=None if kl is None else np.asarray(kl, float))

    return res(data["base_nll"]), {int(k): res(v, data["kl"][k]) for k, v in data["nll"].items()}


def _entry_path(identity, text_key, settings, calib_desc):
    """Where this model's bridged ground truth on this text, bridge settings and calibration is stored; None when
    the identity cannot name the weights."""
    from swapkl import __version__
    from swapkl.contract import stable_hash

    ident = {k: (identity or {}).get(k) for k in ("kind", "id", "revision", "commit", "fingerprint", "dtype")}
    if not (ident["fingerprint"] or ident["commit"] or (ident["kind"] == "hub" and ident["revision"])):
        return None
    key = stable_hash({"model": ident, "text": text_key, "bridge": settings.to_dict(), "calibration": calib_desc,
                       "version": __version__})[:24]
    return cache_root() / "evidence" / f"bridged-truth-{key}.json"


def _read(path, layers) -> dict | None:
    """The cached entry when it holds every layer of ``layers``; a corrupt entry is removed (recomputed)."""
    if path is None:
        return None
    try:
        data = read_entry(path, KIND)
    except CorruptEntry:
        path.unlink(missing_ok=True)
        return None
    if data is None or not all(str(ell) in data.get("nll", {}) for ell in layers):
        return None
    return data
