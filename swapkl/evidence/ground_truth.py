"""Ground truth per layer: the measured cost of removing each layer alone, with prefix reuse (docs/evidence.md §1).

For every layer ℓ, the model without ℓ computes exactly what the base model computes up to the hidden state that
*enters* ℓ; only blocks ℓ+1..L-1, the final norm and the head differ.  :func:`single_removal_sweep` therefore runs
the base model once per batch of windows, keeps the hidden state entering every block (forward pre-hooks on a
private module tree), and for each ℓ runs a *suffix model*: :func:`swapkl.surgery.prune.pruned_copy` of the model
without blocks 0..ℓ-1, whose first block (the original block ℓ) is replaced, on that private copy only, by a
function that returns the stored hidden state entering ℓ.  The kept blocks ℓ+1..L-1 get the ``layer_idx`` (and, for
GPT-2's ``scale_attn_by_inverse_layer_idx``, the scaling) they have in ``pruned_copy(model, [ℓ])``; position ids,
rotary embeddings and the causal mask are recomputed by the suffix model from the same window tokens, so they are
those of the plain evaluation.  Per-layer config lists (``layer_types``) are cut with the blocks.

Each result is a :class:`swapkl.measure.evaluate.PPLResult` with per-window NLL and KL(base ‖ pruned) sums, the
same numbers :func:`swapkl.measure.evaluate.evaluate_ppl` gives for ``pruned_copy(model, [ℓ])`` with a base
reference (to float tolerance; tests/removal/test_ground_truth.py).  Cost per window: one base pass (L blocks) plus
Σ_ℓ (L-1-ℓ) = L(L-1)/2 blocks, against L(L-1) for L independent evaluations (≈ 0.5× plus the heads).

:func:`ground_truth` wraps it with the removal memo (:class:`swapkl.measure.memo.EvalMemo`, entries written through
:mod:`swapkl.store`) under the same keys as ``curves``, so a cached sweep serves ``curves`` and vice versa.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from swapkl.errors import ComputeInterrupted, SwapklError
from swapkl.stats import BOOT_SEED, N_BOOT, bootstrap_indices, percentile_ci
from swapkl.model.block_io import hidden_in, hidden_of

# Deferred imports: torch and the torch-based swapkl modules are imported inside the functions that compute.

#: the hidden states entering every block, kept for one batch of windows, stay below this (the batch shrinks)
STATES_BUDGET_BYTES = 2 ** 30


def suffix_model(model, layer: int):
    """``(suffix, holder)``: a private copy of ``model`` that runs as ``pruned_copy(model, [layer])`` from the hidden
    state entering ``layer`` on.  Set ``holder["h"]`` to that state ((B, T, H)) and ``holder["template"]`` to an
    output of the base block ``layer`` (its type: a tensor or a tuple) before each forward pass."""
    from swapkl.model import architectures as arch
    from swapkl.surgery.blocks import renumber_layers
    from swapkl.surgery.prune import pruned_copy

    suffix = pruned_copy(model, list(range(layer)))  # keeps blocks layer..L-1, renumbered 0..
    loc = arch.locate(suffix)
    blocks = loc.blocks
    for pos in range(1, len(blocks)):  # original block layer+pos sits at slot layer+pos-1 once ``layer`` is gone
        renumber_layers(blocks[pos], loc.family, layer + pos - 1)
    holder: dict = {}

    def replay(*args, **kwargs):
        t = holder["template"]
        h = holder["h"]
        if isinstance(t, tuple):
            return (h,) + tuple(t[1:])
        return h

    blocks[0].forward = replay  # an instance attribute of the private copy; the caller's block is untouched
    return suffix, holder


@dataclass
class Sweep:
    """Per-window sums of the base model and of each single removal (nats; ``counts`` scored tokens per window)."""

    baseline: object  # PPLResult
    removed: dict = field(default_factory=dict)  # layer -> PPLResult (with kl)
    seconds: float = 0.0


def single_removal_sweep(model, input_ids, window: int, stride: int, drop_first_target: bool = False,
                         layers: Sequence[int] | None = None, batch_size: int | None = None, kl: bool = True,
                         should_stop: Callable[[], bool] | None = None, bridges: dict | None = None) -> Sweep:
    """The baseline and every single-layer removal of ``layers`` (default all) on the sliding windows of
    ``input_ids``, with prefix reuse (module docstring).  ``bridges``: ``{ℓ: Bridge}`` of the spans ``[ℓ, ℓ+1)``
    (:mod:`swapkl.repair.bridge`): block ℓ is then removed *with its bridge*, the state entering block ℓ+1 being
    the bridge's start state (:func:`swapkl.repair.bridge.start_state`: ``h_ℓ W`` residual, ``h_ℓ + m_{ℓ−1}(W − I)``
    folded).  Returns a :class:`Sweep`."""
    import torch

    for ell, b in (bridges or {}).items():
        if (b.start, b.end) != (ell, ell + 1):
            raise SwapklError(f"the bridge of block {ell} spans [{b.start}, {b.end}); a single removal needs [{ell}, "
                              f"{ell + 1})")
    with torch.no_grad():
        return _sweep(model, input_ids, window, stride, drop_first_target, layers, batch_size, kl, should_stop,
                      bridges or {})


def _base_pass(priv, blocks, x, keep, projs=None):
    """Base logits of the last ``keep`` positions, the hidden state entering every block and every block's output
    (its type only matters: the replayed block returns the same kind); with ``projs`` ({k: module}) the outputs
    of those modules too (``outs[("m", k)]``)."""
    from swapkl.measure.evaluate import forward_logits

    ins: dict = {}
    outs: dict = {}
    handles = [mod.register_forward_hook(lambda m_, a, o, k=k: outs.__setitem__(("m", k), hidden_of(o)))
               for k, mod in (projs or {}).items()]
    for k, b in enumerate(blocks):
        handles.append(b.register_forward_pre_hook(
            lambda mod, args, kwargs, k=k: ins.__setitem__(k, hidden_of(hidden_in(args, kwargs))),
            with_kwargs=True))
        handles.append(b.register_forward_hook(lambda mod, args, out, k=k: outs.__setitem__(k, out)))
    try:
        logits = forward_logits(priv, x, keep)
    finally:
        for h in handles:
            h.remove()
    return logits, ins, outs


def _sweep(model, input_ids, window, stride, drop_first_target, layers, batch_size, kl, should_stop,
           bridges) -> Sweep:
    import torch

    from swapkl.model import architectures as arch
    from swapkl.measure import evaluate as E
    from swapkl.repair.bridge import captured_blocks, start_state
    from swapkl.surgery.prune import pruned_copy

    t0 = time.perf_counter()
    ids = torch.as_tensor(input_ids).reshape(-1).long()
    n = int(ids.numel())
    wins = E.make_windows(n, window, stride, drop_first_target)
    priv = pruned_copy(model, []).eval()
    blocks = arch.locate(priv).blocks
    L = len(blocks)
    layers = list(range(L)) if layers is None else sorted({int(i) for i in layers})
    suffixes = {ell: suffix_model(priv, ell) for ell in layers}
    projs = {k: arch.get_path(blocks[k], arch.locate(priv).family.mlp_out)
             for k in captured_blocks(bridges.values())}
    dev = E.device_of(model)
    W = len(wins)
    counts = np.array([w.n_scored for w in wins], dtype=np.int64)
    base_nll = np.zeros(W)
    nll = {ell: np.zeros(W) for ell in layers}
    kls = {ell: np.zeros(W) for ell in layers} if kl else None
    groups: dict[tuple[int, int], list[int]] = {}
    for k, w in enumerate(wins):
        groups.setdefault((w.end - w.begin, w.keep), []).append(k)
    vocab = int(getattr(model.config, "vocab_size", 0) or 0) or 50000
    p0 = next(priv.parameters())
    hidden = int(getattr(model.config, "hidden_size", 0) or getattr(model.config, "n_embd", 0) or 4096)
    state_bytes = L * hidden * max(4, p0.element_size())  # the L kept states of one token
    for (length, keep), members in groups.items():
        bs = batch_size or max(1, min(E.auto_batch(keep, vocab), STATES_BUDGET_BYTES // max(1, state_bytes * length)))
        for start in range(0, len(members), bs):
            if should_stop is not None and should_stop():
                raise ComputeInterrupted("ground-truth sweep stopped")
            chunk = members[start:start + bs]
            x = torch.stack([ids[wins[k].begin:wins[k].end] for k in chunk]).to(dev)
            targets = x[:, length - keep + 1:].unsqueeze(-1)
            logits, ins, outs = _base_pass(priv, blocks, x, keep, projs)
            mouts = {k: outs[("m", k)] for k in projs}
            base_lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            base_nll[chunk] = (-base_lp.gather(-1, targets).squeeze(-1)).double().sum(1).cpu().numpy()
            base_p = base_lp.exp() if kl else None
            del logits
            for ell in layers:
                suffix, holder = suffixes[ell]
                h = start_state(bridges[ell], ins[ell], mouts) if ell in bridges else ins[ell]
                holder["h"], holder["template"] = h, outs[ell]
                lp = torch.log_softmax(E.forward_logits(suffix, x, keep)[:, :-1].float(), dim=-1)
                nll[ell][chunk] = (-lp.gather(-1, targets).squeeze(-1)).double().sum(1).cpu().numpy()
                if kl:
                    kls[ell][chunk] = (base_p * (base_lp - lp)).sum(-1).double().sum(1).cpu().numpy()
                holder.clear()
                del lp
            del ins, outs, mouts, base_lp, base_p
    secs = time.perf_counter() - t0

    def result(v, k=None):
        return E.PPLResult(nll=v, counts=counts.copy(), n_tokens=n, window=window, stride=stride,
                           drop_first_target=drop_first_target, kl=k, seconds=secs / (len(layers) + 1))

    return Sweep(baseline=result(base_nll), removed={ell: result(nll[ell], kls[ell] if kl else None)
                                                     for ell in layers}, seconds=secs)


# --------------------------------------------------------------------------------------------------- ground truth
@dataclass
class GroundTruth:
    """The cost of removing each layer alone on one evaluation region.

    ``delta_ppl_pct[i]``/``kl[i]``: ΔPPL % and mean KL(base ‖ pruned) per scored token (nats) for ``layers[i]``;
    ``*_ci``: 95 % percentile CIs, windows resampled (paired with the baseline); ``window_nll`` (layers × W),
    ``window_kl`` (layers × W), ``base_nll`` (W,), ``counts`` (W,): the per-window sums, for resampling."""

    layers: list
    delta_ppl_pct: list
    delta_ppl_pct_ci: list
    kl: list
    kl_ci: list
    baseline_ppl: float
    window_nll: np.ndarray
    window_kl: np.ndarray
    base_nll: np.ndarray
    counts: np.ndarray
    region: dict = field(default_factory=dict)
    seconds: float = 0.0
    computed: int = 0

    def resampled(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ΔPPL %, KL) per layer under window resamples ``idx`` (B, W): two (B, layers) arrays."""
        c = self.counts[idx].sum(1)  # (B,)
        dn = self.window_nll[:, idx].sum(-1) - self.base_nll[idx].sum(1)[None]  # (layers, B)
        d = 100.0 * (np.exp(dn / c[None]) - 1.0)
        k = self.window_kl[:, idx].sum(-1) / c[None]
        return d.T, k.T

    def to_dict(self) -> dict:
        return {"layers": list(self.layers), "delta_ppl_pct": list(self.delta_ppl_pct),
                "delta_ppl_pct_ci": [list(x) for x in self.delta_ppl_pct_ci], "kl": list(self.kl),
                "kl_ci": [list(x) for x in self.kl_ci], "baseline_ppl": self.baseline_ppl, "region": self.region,
                "n_windows": int(len(self.counts)), "n_scored": int(self.counts.sum()), "seconds": self.seconds,
                "computed": self.computed}


def from_results(layers, baseline, removed: dict, region: dict | None = None, seconds: float = 0.0,
                 computed: int = 0, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> GroundTruth:
    """A :class:`GroundTruth` from a baseline and per-layer :class:`~swapkl.measure.evaluate.PPLResult` values."""
    layers = list(layers)
    gt = GroundTruth(layers=layers, delta_ppl_pct=[], delta_ppl_pct_ci=[], kl=[], kl_ci=[],
                     baseline_ppl=baseline.ppl, window_nll=np.stack([removed[i].nll for i in layers]),
                     window_kl=np.stack([removed[i].kl for i in layers]), base_nll=np.asarray(baseline.nll),
                     counts=np.asarray(baseline.counts), region=dict(region or {}), seconds=seconds,
                     computed=computed)
    c = gt.counts.sum()
    gt.delta_ppl_pct = (100.0 * (np.exp((gt.window_nll.sum(1) - gt.base_nll.sum()) / c) - 1.0)).tolist()
    gt.kl = (gt.window_kl.sum(1) / c).tolist()
    d, k = gt.resampled(bootstrap_indices(len(gt.counts), n_boot, seed))
    gt.delta_ppl_pct_ci = percentile_ci(d, axis=0).T.tolist()
    gt.kl_ci = percentile_ci(k, axis=0).T.tolist()
    return gt


def text_key(corpus, ev, offset_words: int = 0) -> str:
    """The memo key of an evaluation text: ``curves``' own key for the standard region (offset 0)."""
    key = f"test:{getattr(corpus, 'sha256', '?')}:{ev.max_words}:{ev.window}:{ev.stride}:{ev.drop_first_target}"
    return key if not offset_words else key + f":offset{offset_words}"


def ground_truth(model, ids, ev, memo, key: str, layers: Sequence[int] | None = None, region: dict | None = None,
                 batch_size: int | None = None, should_stop=None) -> GroundTruth:
    """Ground truth on the evaluator ``ev``'s windows of ``ids``, through ``memo`` under ``key`` (the baseline is
    the entry of the empty set, layer ℓ the entry of ``{ℓ}``): layers already in the memo are not recomputed;
    the missing ones are swept together (:func:`single_removal_sweep`)."""
    from swapkl.model import architectures as arch

    t0 = time.perf_counter()
    L = arch.locate(model).num_layers
    layers = list(range(L)) if layers is None else list(layers)
    have, base, missing = memo_state(memo, key, layers)
    if missing or base is None:
        sw = single_removal_sweep(model, ids, ev.window, ev.stride, ev.drop_first_target, layers=missing,
                                  batch_size=batch_size, should_stop=should_stop)
        for ell, r in sw.removed.items():
            have[ell] = memo.get(key, [ell], lambda r=r: r)
        base = memo.get(key, [], lambda: sw.baseline) if base is None else base
    return from_results(layers, base, have, region, time.perf_counter() - t0, computed=len(missing))


def memo_state(memo, key: str, layers: Sequence[int]) -> tuple[dict, object, list]:
    """What the memo already holds of a ground truth under ``key``: ``(have, base, missing)``: ``{layer: result}``
    of the single removals with their KL, the baseline's result (None when absent) and the layers still to measure."""
    have = {}
    for ell in layers:
        r = memo.peek(key, [ell])
        if r is not None and r.kl is not None and len(r.counts):
            have[ell] = r
    return have, memo.peek(key, []), [ell for ell in layers if ell not in have]


def unit_ground_truth(model, ids, ev, memo, key: str, unit: str, layers: Sequence[int] | None = None,
                      region: dict | None = None, batch_size: int | None = None, should_stop=None) -> GroundTruth:
    """Ground truth for a sublayer ``unit`` (``attention`` / ``mlp``): ΔPPL % and KL(base ‖ pruned) of skipping
    that sublayer of each layer alone (:func:`swapkl.surgery.skip.skipping_copy`), through ``memo`` under ``key``
    plus the unit's suffix (``curves --unit``'s own keys, so either serves the other).  One plain evaluation per
    layer (no prefix reuse); ``unit="block"`` is :func:`ground_truth`."""
    from swapkl.model import architectures as arch
    from swapkl.measure import evaluate as E
    from swapkl.removal.units import unit_key_suffix
    from swapkl.surgery.skip import removed_copy

    if unit == "block":
        return ground_truth(model, ids, ev, memo, key, layers, region, batch_size, should_stop)
    t0 = time.perf_counter()
    ukey = key + unit_key_suffix(unit)
    layers = list(range(arch.locate(model).num_layers)) if layers is None else list(layers)
    have, base, missing = memo_state(memo, ukey, layers)
    run = lambda m, **kw: E.evaluate_ppl(m, ids, ev.window, ev.stride, ev.drop_first_target, batch_size=batch_size,
                                         should_stop=should_stop, **kw)
    if missing or base is None:
        fresh = run(model, capture_reference=True)
        base = memo.get(ukey, [], lambda: fresh) if base is None else base
        for ell in missing:
            have[ell] = memo.get(ukey, [ell], lambda ell=ell: run(removed_copy(model, [ell], unit),
                                                                  reference=fresh.reference))
    return from_results(layers, base, have, region, time.perf_counter() - t0, computed=len(missing))
