"""Sliding-window perplexity (docs/method.md §3), with per-window sums for bootstrap CIs and an optional KL to a base model.

Windows: ``window`` tokens, step ``stride`` (``1 <= stride <= window``).  With ``stride < window`` every token
after the first is scored exactly once, predicted with as much left context as its window allows (the first
window scores its tokens 1..window-1, every later window scores the tokens it adds beyond the previous window's
end).  ``stride == window`` (non-overlapping chunks, used for calibration) cannot score a chunk's first token.  The paper's
"matched" scripts additionally skip the first new target of each later window: ``drop_first_target=True``
reproduces that (a compatibility switch, off by default).

PPL = exp(total NLL / number of scored tokens), NLL in nats.  Bootstrap CI: resample windows with replacement
(1,000 resamples, fixed seed, percentile 2.5/97.5), PPL = exp(ΣNLL/Σcount) per resample.

Cost: every window is one forward pass of ``window`` tokens (the last may be shorter), so the cost is linear in
the number of tokens (≈ len/stride windows).  The output head is applied only to the positions that are scored
(``logits_to_keep``), and windows of equal shape are batched.  Calls always pass ``use_cache=False``.

KL to a base model (nats, mean over scored tokens of ``KL(p_base || p_model)``): evaluate the base once with
``capture_reference=True``; that run keeps the base model's *head input* at the scored positions (a tokens × hidden
float32 array, small) and the head module.  Evaluating a pruned model with ``reference=...`` then recomputes the
base distribution with the head only (no base forward pass) and returns NLL and KL from the same forward pass.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, asdict
from typing import Callable, Sequence

import numpy as np
import torch

from swapkl.errors import ComputeInterrupted, SwapklError

from swapkl.stats import BOOT_SEED, N_BOOT, bootstrap_indices, delta_ppl_draws, percentile_ci, ppl_draws  # 1,000 resamples, seed 0: the project-wide bootstrap setting
from swapkl.model import architectures as arch
from swapkl.surgery.blocks import pruned_copy
from swapkl.measure.windows import EvalTextError, Window, make_windows
LOGITS_BUDGET_BYTES = 2 ** 28  # float32 logits kept at once per batch (≈ 256 MiB)


# --------------------------------------------------------------------------------------------------- contracts
@dataclass(frozen=True)
class Evaluator:
    """A named perplexity contract: the first ``max_words`` words of the evaluation text, ``window``/``stride``
    in tokens, and the compatibility switch ``drop_first_target``."""

    name: str
    max_words: int
    window: int
    stride: int
    drop_first_target: bool = False

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Evaluator:
        return cls(**{k: d[k] for k in ("name", "max_words", "window", "stride", "drop_first_target") if k in d})


EVALUATORS: dict[str, Evaluator] = {
    "matched": Evaluator("matched", max_words=5000, window=512, stride=256),
    "standard": Evaluator("standard", max_words=20000, window=1024, stride=512),
}


def get_evaluator(spec: str | Evaluator, drop_first_target: bool | None = None) -> Evaluator:
    """Resolve ``"matched"`` / ``"standard"`` (or pass an :class:`Evaluator` through)."""
    if isinstance(spec, Evaluator):
        ev = spec
    else:
        if spec not in EVALUATORS:
            raise SwapklError(f"unknown evaluator {spec}; available: {', '.join(EVALUATORS)}")
        ev = EVALUATORS[spec]
    if drop_first_target is not None and drop_first_target != ev.drop_first_target:
        ev = Evaluator(ev.name + ("+dropfirst" if drop_first_target else ""), ev.max_words, ev.window, ev.stride,
                       drop_first_target)
    return ev


def eval_ids(corpus, tokenizer, evaluator: str | Evaluator) -> torch.Tensor:
    """Token ids (1-D LongTensor) of the evaluator's text: ``corpus.eval_text(max_words)`` tokenised once with the
    tokenizer's defaults (Llama adds one BOS, GPT-2/NeoX nothing).  Raises :class:`EvalTextError` when the
    corpus has fewer words than the contract needs or the text is shorter than one window."""
    ev = get_evaluator(evaluator)
    region = getattr(corpus, "split_point", None)
    if region is not None and region < ev.max_words:
        raise EvalTextError(
            f"evaluation text '{corpus.name}' has {region} words; the '{ev.name}' evaluator needs {ev.max_words} "
            f"(use a longer text or a smaller evaluator)")
    text = corpus.eval_text(ev.max_words)
    if not text.strip():
        raise EvalTextError(f"evaluation text '{corpus.name}' is empty")
    ids = tokenizer(text)["input_ids"]
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    if ids.numel() < ev.window:
        raise EvalTextError(
            f"evaluation text '{corpus.name}' gives {ids.numel()} tokens; the '{ev.name}' evaluator needs at least "
            f"one full window of {ev.window}")
    return ids


# --------------------------------------------------------------------------------------------------- results
@dataclass
class PPLResult:
    """Per-window sums of one perplexity evaluation.

    ``nll``: (W,) float64, summed NLL in nats per window; ``counts``: (W,) int64 scored tokens per window;
    ``kl``: (W,) float64 summed KL(base || model) in nats per window, or None.
    """

    nll: np.ndarray
    counts: np.ndarray
    n_tokens: int
    window: int
    stride: int
    drop_first_target: bool = False
    kl: np.ndarray | None = None
    seconds: float = 0.0
    reference: Reference | None = field(default=None, repr=False, compare=False)

    @property
    def n_scored(self) -> int:
        return int(self.counts.sum())

    @property
    def mean_nll(self) -> float:
        """Mean NLL per scored token (nats)."""
        return float(self.nll.sum() / self.counts.sum())

    @property
    def ppl(self) -> float:
        return math.exp(self.mean_nll)

    @property
    def kl_to_base(self) -> float | None:
        """Mean KL(base || model) per scored token (nats), when a reference was given."""
        return None if self.kl is None else float(self.kl.sum() / self.counts.sum())

    def ci(self, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> tuple[float, float]:
        """Percentile 2.5/97.5 bootstrap CI of the PPL, resampling windows."""
        return tuple(percentile_ci(ppl_draws(self.nll, self.counts, bootstrap_indices(len(self.counts), n_boot, seed))))

    def to_dict(self, with_windows: bool = False) -> dict:
        lo, hi = self.ci()
        d = {"ppl": self.ppl, "ppl_ci": [lo, hi], "mean_nll": self.mean_nll, "n_scored": self.n_scored,
             "n_windows": int(len(self.counts)), "n_tokens": self.n_tokens, "window": self.window,
             "stride": self.stride, "drop_first_target": self.drop_first_target, "kl_to_base": self.kl_to_base,
             "seconds": self.seconds}
        if with_windows:
            d["window_nll"] = self.nll.tolist()
            d["window_counts"] = self.counts.tolist()
            if self.kl is not None:
                d["window_kl"] = self.kl.tolist()
        return d


def delta_pct(result: PPLResult, baseline: PPLResult) -> float:
    """ΔPPL in % of ``result`` vs ``baseline`` (same windows)."""
    return 100.0 * (result.ppl / baseline.ppl - 1.0)


def delta_pct_ci(result: PPLResult, baseline: PPLResult, n_boot: int = N_BOOT,
                 seed: int = BOOT_SEED) -> tuple[float, float]:
    """Paired bootstrap CI (percentile 2.5/97.5) of ΔPPL % over the shared windows."""
    if len(result.counts) != len(baseline.counts) or not np.array_equal(result.counts, baseline.counts):
        raise SwapklError("ΔPPL CI needs two evaluations on the same windows")
    idx = bootstrap_indices(len(result.counts), n_boot, seed)
    return tuple(percentile_ci(delta_ppl_draws(result.nll, baseline.nll, result.counts, idx)))


# --------------------------------------------------------------------------------------------------- reference
@dataclass
class Reference:
    """The base model's next-token distributions on the scored positions, kept cheaply.

    ``kind="hidden"``: ``hidden[w]`` is the base head's input at window w's scored positions ((n_scored, H)
    float32, CPU) and ``head`` the base head module; base logits = ``head(hidden)``.  ``kind="model"``: the base
    model is re-run on each batch (used when the head alone does not reproduce the logits)."""

    kind: str
    n_tokens: int
    window: int
    stride: int
    drop_first_target: bool
    head: torch.nn.Module | None = None
    hidden: list[torch.Tensor] | None = None
    model: torch.nn.Module | None = None

    def matches(self, n_tokens, window, stride, drop_first_target) -> bool:
        return (self.n_tokens, self.window, self.stride, self.drop_first_target) == (
            n_tokens, window, stride, drop_first_target)


# --------------------------------------------------------------------------------------------------- evaluator
def device_of(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:  # pragma: no cover
        return torch.device("cpu")


def forward_logits(model, x: torch.Tensor, keep: int) -> torch.Tensor:
    """Logits of the last ``keep`` positions, (B, keep, V)."""
    try:
        out = model(input_ids=x, use_cache=False, logits_to_keep=keep)
    except TypeError:  # a model without logits_to_keep
        out = model(input_ids=x, use_cache=False)
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits[:, -keep:]


def auto_batch(keep: int, vocab: int) -> int:
    return int(max(1, min(16, LOGITS_BUDGET_BYTES // max(1, keep * vocab * 4 * 3))))


@torch.no_grad()
def evaluate_ppl(model, input_ids: torch.Tensor, window: int, stride: int, drop_first_target: bool = False,
                 batch_size: int | None = None, device: str | torch.device | None = None,
                 reference: Reference | None = None, capture_reference: bool = False,
                 should_stop: Callable[[], bool] | None = None) -> PPLResult:
    """Sliding-window perplexity of ``model`` on ``input_ids`` (1-D LongTensor of N tokens).

    ``batch_size``: windows per forward (None: as many as fit ≈256 MiB of float32 logits, at most 16).
    ``device``: where the inputs go (default: the model's device; the model itself is not moved).
    ``reference``: a :class:`Reference` from a base run on the same ids and windows → per-window KL(base || model).
    ``capture_reference``: keep this run's distributions as a :class:`Reference` in ``result.reference``.
    Returns a :class:`PPLResult` (per-window NLL sums in nats and token counts).
    """
    t0 = time.perf_counter()
    ids = torch.as_tensor(input_ids).reshape(-1).long()
    n = int(ids.numel())
    wins = make_windows(n, window, stride, drop_first_target)
    if reference is not None and not reference.matches(n, window, stride, drop_first_target):
        raise SwapklError("the KL reference was computed on different tokens or windows")
    dev = torch.device(device) if device is not None else device_of(model)
    run = _WindowRun(model, ids, wins, (n, window, stride, drop_first_target), reference, capture_reference)
    # group windows with equal (length, keep): all middle windows share one shape
    groups: dict[tuple[int, int], list[int]] = {}
    for k, w in enumerate(wins):
        groups.setdefault((w.end - w.begin, w.keep), []).append(k)
    try:
        for (length, keep), members in groups.items():
            for chunk in run.chunks(members, keep, batch_size, should_stop):
                run.score(chunk, length, keep, dev)
    finally:
        run.close()
    res = PPLResult(nll=run.nll, counts=np.array([w.n_scored for w in wins], dtype=np.int64), n_tokens=n,
                    window=window, stride=stride, drop_first_target=drop_first_target, kl=run.kl,
                    seconds=time.perf_counter() - t0)
    res.reference = run.ref_out
    return res


class _WindowRun:
    """The state of one :func:`evaluate_ppl` pass: the model it runs (a private copy when it must hook or switch to
    eval mode), the per-window NLL and KL sums, and the reference it captures."""

    def __init__(self, model, ids: torch.Tensor, wins: list[Window], shape: tuple, reference: Reference | None,
                 capture_reference: bool):
        self.ids, self.wins, self.shape, self.reference = ids, wins, shape, reference
        self.run_model = model
        self.hook_handle = None
        self.captured: list[torch.Tensor] = []
        self.ref_out: Reference | None = None
        self.verified = False
        self.vocab = None
        self.nll = np.zeros(len(wins), dtype=np.float64)
        self.kl = np.zeros(len(wins), dtype=np.float64) if reference is not None else None
        if capture_reference or model.training:
            # a private module tree (shared tensors): the hook and eval mode never touch the caller's model
            try:
                self.run_model = pruned_copy(model, []).eval()
            except SwapklError:
                if model.training:
                    raise SwapklError("evaluate a model of an unsupported family in eval mode (model.eval())") from None
            if capture_reference:
                self._start_capture(model)

    def _start_capture(self, model) -> None:
        if self.run_model is model:
            self.ref_out = Reference("model", *self.shape, model=model)
        else:
            head = arch.locate(self.run_model).head
            self.hook_handle = head.register_forward_pre_hook(lambda mod, args: self.captured.append(args[0].detach()))
            self.ref_out = Reference("hidden", *self.shape, head=head, hidden=[None] * len(self.wins))

    def chunks(self, members: list[int], keep: int, batch_size: int | None, should_stop):
        """The windows of one shape in batches (without a batch size: one window first, to learn the vocabulary
        size, then as many as fit)."""
        start = 0
        while start < len(members):
            if should_stop is not None and should_stop():
                raise ComputeInterrupted("perplexity evaluation stopped")
            if batch_size is None:
                size = 1 if self.vocab is None else auto_batch(keep, self.vocab)
            else:
                size = batch_size
            chunk = members[start:start + size]
            start += len(chunk)
            yield chunk

    def score(self, chunk: list[int], length: int, keep: int, dev) -> None:
        x = torch.stack([self.ids[self.wins[k].begin:self.wins[k].end] for k in chunk]).to(dev)
        self.captured.clear()
        logits = forward_logits(self.run_model, x, keep)  # (B, keep, V)
        self.vocab = logits.shape[-1]
        targets = x[:, length - keep + 1:]  # (B, keep-1): the scored targets
        lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        tok_nll = -lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, keep-1)
        self.nll[chunk] = tok_nll.double().sum(1).cpu().numpy()
        if self.ref_out is not None and self.ref_out.kind == "hidden":
            self._keep_hidden(chunk, keep, logits)
        if self.reference is not None:
            base_lp = _reference_logprobs(self.reference, chunk, x, keep)
            kl_tok = (base_lp.exp() * (base_lp - lp)).sum(-1)  # (B, keep-1)
            self.kl[chunk] = kl_tok.double().sum(1).cpu().numpy()
        del logits, lp

    def _keep_hidden(self, chunk: list[int], keep: int, logits: torch.Tensor) -> None:
        h = self.captured[-1][:, -keep:][:, :-1].float()
        if not self.verified:
            # the head alone must reproduce the logits (no soft-capping or scaling after it), else fall back to
            # re-running the base model for the KL
            tol = 1e-4 if logits.dtype == torch.float32 else 3e-2
            again = _apply_head(self.ref_out.head, h[:1]).float()
            self.verified = torch.allclose(again, logits[:1, :-1].float(), rtol=tol, atol=tol)
            if not self.verified:
                self.ref_out = Reference("model", *self.shape, model=self.run_model)
        if self.ref_out.kind == "hidden":
            for r, k in enumerate(chunk):
                self.ref_out.hidden[k] = h[r].cpu()

    def close(self) -> None:
        if self.hook_handle is not None:
            self.hook_handle.remove()


def _apply_head(head: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    w = getattr(head, "weight", None)
    if w is not None:
        h = h.to(device=w.device, dtype=w.dtype)
    return head(h)


def _reference_logprobs(ref: Reference, chunk: Sequence[int], x: torch.Tensor, keep: int) -> torch.Tensor:
    if ref.kind == "hidden":
        h = torch.stack([ref.hidden[k] for k in chunk])
        return torch.log_softmax(_apply_head(ref.head, h).float(), dim=-1).to(x.device)
    logits = forward_logits(ref.model, x.to(device_of(ref.model)), keep)
    return torch.log_softmax(logits[:, :-1].float(), dim=-1).to(x.device)


def kl_to_base(base, model, input_ids: torch.Tensor, window: int, stride: int, drop_first_target: bool = False,
               reference: Reference | None = None, **kw) -> float:
    """Mean KL(p_base || p_model) per scored token (nats) on the evaluation windows.

    Pass a ``reference`` from an earlier ``evaluate_ppl(base, ..., capture_reference=True)`` to avoid the base
    forward passes; otherwise one base run is made here."""
    if reference is None:
        reference = evaluate_ppl(base, input_ids, window, stride, drop_first_target, capture_reference=True,
                                 **kw).reference
    return evaluate_ppl(model, input_ids, window, stride, drop_first_target, reference=reference, **kw).kl_to_base
