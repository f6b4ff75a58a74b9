"""The calibration text of a bridge, the proof that it is disjoint from the scoring prompts and the evaluation text,
and the streamed fit of every bridge a set of spans needs (docs/repair.md).

Regions (a corpus is one word stream, :mod:`swapkl.scoring.corpora`): words ``[0, split)`` are the evaluation region
(perplexity windows); the rest is the prompt region, whose token stream holds the scoring prompts (P windows of T
tokens, :func:`swapkl.scoring.prompts.make_prompts`).  The bridge's *calibration region* is that token stream cut into
consecutive windows of ``window`` tokens, minus every window that touches a scoring-prompt window; ``tokens //
window`` of them are drawn, seeded by ``seed``.  :func:`check_disjoint` asserts it in token coordinates.

The fit (:func:`fit_bridges`) runs the model on the calibration windows in batches of ``batch_rows`` windows,
reads the activations a bridge needs with hooks on a private module tree (the caller's model carries no hook), adds
them to float64 normal equations (:mod:`swapkl.repair.fit`) and forgets them: peak memory is the normal equations
(8·D²·(1 + spans) bytes per start block, split into several passes over the text past ``budget_bytes``) plus one
batch of activations, whatever the number of calibration tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from swapkl.errors import SwapklError
from swapkl.model import architectures as arch
from swapkl.repair import forms
from swapkl.repair.bridge import Bridge
from swapkl.repair.fit import DEFAULT_RIDGE, NormalEquations
from swapkl.repair.settings import DEFAULT_CALIB_TOKENS, DEFAULT_CALIB_WINDOW
from swapkl.scoring.prompts import adds_bos, tokenize_stream
from swapkl.surgery.blocks import pruned_copy
from swapkl.model.block_io import hidden_in, hidden_of


#: the names of the regions in :func:`swapkl.scoring.corpora.check_regions`'s messages
CALIB, PROMPT, TRAIN = "calibration window", "scoring prompt window", "training chunk"


class RegionError(SwapklError):
    """Calibration text that would overlap the scoring prompts, or a corpus too short for it."""


@dataclass
class CalibrationText:
    """``ids`` [N, window] token ids (BOS first where the tokenizer adds one); ``spans``: each window's ``[begin,
    end)`` in the prompt region's token stream; ``description``: the contract fields (JSON-able)."""

    ids: torch.Tensor
    spans: list
    description: dict = field(default_factory=dict)


def calibration_text(tokenizer, corpus, prompt_desc: dict, prompt_tokens: int, tokens: int = DEFAULT_CALIB_TOKENS,
                     window: int = DEFAULT_CALIB_WINDOW, seed: int = 0) -> CalibrationText:
    """``tokens // window`` calibration windows of ``window`` tokens (module docstring), none touching a scoring
    prompt of ``prompt_desc`` (a :class:`~swapkl.scoring.prompts.Prompts` description; its windows are
    ``prompt_tokens`` long).  Raises :class:`RegionError` when the corpus has too few."""
    if window < 2 or tokens < window:
        raise RegionError(f"calibration needs tokens >= window >= 2 (got {tokens} tokens, window {window})")
    bos = tokenizer.bos_token_id if adds_bos(tokenizer) else None
    body = window - (1 if bos is not None else 0)
    stream = tokenize_stream(tokenizer, corpus.prompt_text())
    pbody = prompt_tokens - (1 if prompt_desc.get("bos") else 0)
    prompt_windows = [(int(s), pbody) for s in prompt_desc["window_starts"]]
    free = [s for s in range(0, len(stream) - body + 1, body)
            if not any(s < b + n and b < s + body for b, n in prompt_windows)]
    n = tokens // window
    if len(free) < n:
        raise RegionError(f"corpus '{corpus.name}' has {len(free)} calibration windows of {window} tokens outside "
                          f"the scoring prompts; {n} are needed for {tokens} calibration tokens")
    starts = sorted(np.random.default_rng(seed).choice(free, size=n, replace=False).tolist())
    rows = [([bos] if bos is not None else []) + stream[s:s + body] for s in starts]
    ct = CalibrationText(torch.tensor(rows, dtype=torch.long), [(s, s + body) for s in starts], {
        "region": "prompt region of the corpus minus the scoring-prompt windows", "corpus": corpus.describe(),
        "tokens": n * window, "window": window, "windows": n, "seed": seed, "window_starts": starts})
    check_disjoint(ct.spans, prompt_windows, corpus)
    return ct


def check_disjoint(spans, prompt_windows, corpus=None) -> None:
    """Assert, in the prompt region's token coordinates, that no calibration window ``[begin, end)`` touches a
    scoring-prompt window ``(begin, length)``; the evaluation region (the corpus's first ``split_point`` words) lies
    before the prompt region's stream, so it is disjoint from both by construction, which is checked too.  Raises
    :class:`RegionError` naming the first overlap."""
    from swapkl.scoring.corpora import check_regions

    if corpus is not None and corpus.split_point <= 0:
        raise RegionError(f"corpus '{corpus.name}' has no evaluation region before its prompt region")
    for b, e in spans:
        if b < 0:
            raise RegionError(f"calibration window [{b}, {e}) starts before the prompt region")
    check_regions({CALIB: spans, PROMPT: [(pb, pb + n) for pb, n in prompt_windows]}, error=RegionError)


def capture_tree(model: torch.nn.Module, slots: set[int], projs: set[int]):
    """``(run, got)``: ``run(ids)`` runs a private module tree of ``model`` (no head, ``use_cache=False``) whose hooks
    record into the dict ``got`` the block inputs ``("h", s)`` (slot ``L``: the last block's output) for ``slots`` and
    the MLP output projection's output ``("m", k)`` of blocks ``projs``, and stop the forward after the last of them."""
    tree = pruned_copy(model, [])
    loc = arch.locate(tree)
    L = loc.num_layers
    got: dict = {}

    def pre(s):
        def hook(mod, args, kwargs):
            got[("h", s)] = hidden_in(args, kwargs)
        return hook

    def post(key):
        def hook(mod, args, out):
            got[key] = hidden_of(out)
        return hook

    for s in slots:
        if s < L:
            loc.blocks[s].register_forward_pre_hook(pre(s), with_kwargs=True)
        else:
            loc.blocks[L - 1].register_forward_hook(post(("h", L)))
    for k in projs:
        arch.get_path(loc.blocks[k], loc.family.mlp_out).register_forward_hook(post(("m", k)))
    stop = max([*slots, *(k + 1 for k in projs)], default=L)
    if stop < L:  # nothing after this block is read: the forward stops there

        def halt(mod, args, kwargs):
            raise _Enough

        loc.blocks[stop].register_forward_pre_hook(halt, with_kwargs=True)
    backbone = arch.get_path(tree, loc.family.blocks.rsplit(".", 1)[0])

    def run(ids: torch.Tensor) -> None:
        try:
            backbone(input_ids=ids, use_cache=False)
        except _Enough:
            pass
    return run, got


class _Enough(Exception):
    """Stops a calibration forward once every activation it needs is read."""


def _passes(spans_by_start: dict, dim: int, budget_bytes: int) -> list[list[int]]:
    """Start blocks grouped so that each group's normal equations fit ``budget_bytes`` (at least one start each)."""
    out: list[list[int]] = [[]]
    used = 0
    for i, ends in spans_by_start.items():
        need = 8 * dim * dim * (1 + len(ends))
        if out[-1] and used + need > budget_bytes:
            out.append([])
            used = 0
        out[-1].append(i)
        used += need
    return out


@torch.inference_mode()
def fit_bridges(model: torch.nn.Module, calib: CalibrationText, spans, form: str, ridge: float = DEFAULT_RIDGE,
                batch_rows: int = 4, budget_bytes: int = 1 << 30) -> dict[tuple[int, int], Bridge]:
    """``{(i, j): Bridge}`` for every span ``[i, j)`` of ``spans``, all in the form named ``form``, fitted on
    ``calib`` (module docstring): ``W = (XᵀX+εI)⁻¹XᵀY`` on the rows the form regresses
    (:meth:`~swapkl.repair.forms.BridgeForm.fit_rows`), the ridge pulling toward the form's
    :attr:`~swapkl.repair.forms.BridgeForm.toward`.  A span the form does not apply to raises
    :class:`~swapkl.repair.forms.NoExactFold` before any forward.  The numerical core of
    :class:`swapkl.repair.bridger.Bridger`, which every consumer fits through."""
    kind = forms.get(form)
    spans = sorted({(int(i), int(j)) for i, j in spans})
    L = arch.locate(model).num_layers
    for i, j in spans:
        if not 0 <= i < j <= L or (i == 0 and j == L):
            raise SwapklError(f"bad bridge span [{i}, {j}) for {L} layers")
        kind.check(model, i)
    by_start: dict[int, list[int]] = {}
    for i, j in spans:
        by_start.setdefault(i, []).append(j)
    dim = int(model.get_input_embeddings().weight.shape[-1])
    dev = next(model.parameters()).device
    out: dict = {}
    for group in _passes(by_start, dim, budget_bytes):
        eqs = {i: NormalEquations(dim, len(by_start[i])) for i in group}
        slots = {s for i in group for s in (i, *by_start[i])}
        run, got = capture_tree(model, slots, {k for i in group for k in kind.captures(i)})
        for a in range(0, calib.ids.shape[0], batch_rows):
            run(calib.ids[a:a + batch_rows].to(dev))
            for i in group:
                eqs[i].add(*kind.fit_rows(got, i, by_start[i]))
            got.clear()
        for i in group:
            for t, j in enumerate(by_start[i]):
                fit = eqs[i].solve(ridge, toward=kind.toward, target=t)
                out[(i, j)] = Bridge(i, j, kind.name, fit.W, fit.summary() | {"calibration": _short(calib)})
        del eqs
    return out


def _short(calib: CalibrationText) -> dict:
    d = calib.description
    return {k: d[k] for k in ("tokens", "window", "seed", "region") if k in d}
