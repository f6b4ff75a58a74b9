"""The teacher of a distillation heal (``--objective kd`` or ``kd+lm``) and the KD loss.

The teacher is the unpruned model (same tokenizer).  Its distribution at temperature T, ``softmax(logits / T)``,
is computed once per training chunk, **one chunk at a time** (so a chunk's teacher does not depend on the batch it
is drawn in), and kept as its top-k: per position the k largest log-probabilities (float32), their token ids
(int32 on disk) and the log of the mass outside them, the *tail* (float32, a logsumexp over the other tokens).  With a folder, each chunk is one checksummed
file under ``<cache>/heal-teacher/<key>/`` (key: the teacher's weights fingerprint, T, k), named by the sha256 of
its token ids and written atomically (:func:`swapkl.store.atomic_write_bytes` then a store entry of kind
:data:`KIND`): a run reads what an interrupted run computed, and memory holds one batch of it.  Size per chunk:
``seq_len × (8 k + 4)`` bytes (k = 64, 128 tokens: 66 KB).

The KD loss is the forward KL from teacher to student at every position, both at temperature T, times T² (so the
gradient's scale does not shrink with T), averaged over positions.  With the top-k teacher the KL is that of the
two distributions *coarsened* onto the k kept tokens plus one tail bucket (the student's tail mass is its mass
outside the teacher's top k):

    KL_k = Σ_{v ∈ top-k} p_v (log p_v − log q_v) + p_tail (log p_tail − log q_tail)

**The bound** (the log-sum inequality): 0 ≤ KL − KL_k = p_tail · KL(p(·|tail) ‖ q(·|tail)), the teacher's tail
mass times the KL of the two distributions renormalised inside the tail; it is 0 when k covers the vocabulary or
when the student's tail is shaped like the teacher's, and its gradient pulls the tail mass but not the tail's shape.
:func:`check_topk` measures both on a sample (a heal records it in ``training.healed.kd_topk_check``).
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from swapkl.contract import stable_hash
from swapkl.store import CorruptEntry, atomic_write_bytes, cache_root, read_entry, write_entry

KIND = "heal-teacher"
#: the layout of a chunk's file: bump when it changes (old files are then recomputed)
FORMAT = 1


@dataclass
class TopK:
    """A top-k teacher for a batch: ``logp`` (B, T, k) float32 log-probabilities at temperature T, ``idx``
    (B, T, k) int64 token ids, ``log_tail`` (B, T) float32 log of the mass outside them (−inf: none)."""

    logp: object
    idx: object
    log_tail: object

    def to(self, dev) -> TopK:
        return TopK(self.logp.to(dev), self.idx.to(dev), self.log_tail.to(dev))


def log_probs(logits, temperature: float):
    """``log_softmax(logits / T)`` in float32 over the last axis (vocabulary)."""
    import torch

    return torch.log_softmax(logits.float() / temperature, dim=-1)


def top_k(logp, k: int) -> TopK:
    """The top-``k`` of log-probabilities ``logp`` (..., V) and the log of the mass outside them, a logsumexp over
    the other tokens (the formula :func:`kd_loss` applies to the student, so a teacher equal to the student gives
    the same bits and a zero gradient)."""
    vals, idx = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return TopK(vals.float(), idx.long(), _log_outside(logp.float(), idx))


def _log_outside(logq, idx):
    """log Σ_{v ∉ idx} exp(logq_v) over the last axis; −inf when ``idx`` covers the vocabulary."""
    import torch

    if idx.shape[-1] >= logq.shape[-1]:
        return torch.full(logq.shape[:-1], float("-inf"), dtype=logq.dtype, device=logq.device)
    return torch.logsumexp(logq.scatter(-1, idx, float("-inf")), dim=-1)


def _kl_terms(logp, logq):
    """Σ p (log p − log q) over the last axis; 0 where p = 0."""
    import torch

    p = logp.exp()
    return (p * (torch.where(p > 0, logp, torch.zeros_like(logp)) - logq)).sum(-1)


def kd_loss(student_logits, teacher, temperature: float):
    """The KD loss (module docstring): mean over positions of KL(teacher ‖ student) at temperature T, times T².

    ``student_logits``: (B, T, V); ``teacher``: full teacher log-probabilities (B, T, V) at temperature T (the
    exact KL) or a :class:`TopK` (the coarsened KL, within the module's bound below the exact one).

    The value is the KL; the gradient is its analytic form, ``T (q − p) / N`` per logit for the full teacher and,
    with the top-k teacher, ``T (q_v − p_v) / N`` on the kept tokens and ``T q_v (1 − p_tail / q_tail) / N`` on
    the others (N positions; the teacher normalised).  Both are computed from the same log-probabilities as the
    value, so a student equal to its teacher gets a gradient of exactly 0 (autograd through ``log_softmax`` would
    leave the rounding of Σ p ≠ 1, which Adam's normalisation blows up to steps of size lr)."""
    import torch

    logq = log_probs(student_logits, temperature)
    q = logq.exp()
    if not isinstance(teacher, TopK):
        logp = teacher.to(logq.device)
        kl, g = _kl_terms(logp, logq), q - logp.exp()
    else:
        t = teacher.to(logq.device)
        kl = _kl_terms(t.logp, logq.gather(-1, t.idx))
        g = q
        if t.idx.shape[-1] < logq.shape[-1]:  # else there is no tail
            log_q_tail = _log_outside(logq, t.idx)
            kl = kl + _kl_terms(t.log_tail.unsqueeze(-1), log_q_tail.unsqueeze(-1))
            g = q * (1.0 - torch.exp(t.log_tail - log_q_tail)).unsqueeze(-1)
        g = g.scatter(-1, t.idx, q.gather(-1, t.idx) - t.logp.exp())
    value = kl.mean().detach() * temperature ** 2
    # ∂loss/∂z = g × T² / T / N: a linear surrogate carries this gradient, the value is the KL's
    surrogate = (g.detach() * student_logits.float()).sum() * (temperature / kl.numel())
    return value + surrogate - surrogate.detach()


def check_topk(teacher_logits, student_logits, temperature: float, k: int) -> dict:
    """The KD loss with the full teacher and with its top-``k`` on the same sample (both (B, T, V) logits), the gap
    (≥ 0, the module's bound) and the teacher's mean and largest tail mass: a recorded check of ``k``."""
    import torch

    with torch.no_grad():
        logp = log_probs(teacher_logits, temperature)
        full = float(kd_loss(student_logits, logp, temperature))
        tk = top_k(logp, k)
        approx = float(kd_loss(student_logits, tk, temperature))
        tail = tk.log_tail.double().exp()
    return {"k": k, "temperature": temperature, "kl_full": full, "kl_topk": approx, "gap": full - approx,
            "tail_mass_mean": float(tail.mean()), "tail_mass_max": float(tail.max()), "positions": int(tail.numel())}


def teacher_dir(fingerprint: str, temperature: float, k: int) -> Path:
    """``<cache>/heal-teacher/<key>/``: the top-k teacher of the model with weights ``fingerprint`` at T and k."""
    return cache_root() / "heal-teacher" / stable_hash({"teacher": fingerprint, "T": float(temperature), "k": int(k),
                                                        "format": FORMAT})[:24]


def chunk_digest(row) -> str:
    """sha256 of one chunk's token ids (int64 bytes): the name of its teacher file."""
    import torch

    return hashlib.sha256(row.to("cpu", dtype=torch.int64).numpy().tobytes()).hexdigest()[:32]


class Teacher:
    """The top-k teacher of ``model`` (the unpruned model, never changed) at ``temperature`` and ``k``, computed
    per chunk on first use and kept in ``folder`` (a store folder, :func:`teacher_dir`) or, without one, in
    memory.  ``computed`` counts the chunks this object ran the teacher on."""

    def __init__(self, model, temperature: float, k: int, folder: Path | None = None):
        self.model, self.temperature, self.k, self.folder = model, float(temperature), int(k), folder
        self.memory: dict[str, TopK] = {}
        self.computed = 0

    def batch(self, x) -> TopK:
        """The teacher of the chunks ``x`` ((B, T) token ids) as one batched :class:`TopK` on the CPU."""
        import torch

        rows = [self._row(r) for r in x]
        return TopK(torch.stack([r.logp for r in rows]), torch.stack([r.idx for r in rows]),
                    torch.stack([r.log_tail for r in rows]))

    def _row(self, row) -> TopK:
        key = chunk_digest(row)
        hit = self.memory.get(key) if self.folder is None else self._read(key)
        if hit is None:
            hit = self._compute(row)
            if self.folder is None:
                self.memory[key] = hit
            else:
                self._write(key, hit)
        return hit

    def _compute(self, row) -> TopK:
        import torch

        dev = next(self.model.parameters()).device
        with torch.no_grad():
            logits = self.model(input_ids=row.unsqueeze(0).to(dev), use_cache=False).logits[0]
        self.computed += 1
        t = top_k(log_probs(logits, self.temperature), self.k)
        return TopK(t.logp.cpu(), t.idx.cpu(), t.log_tail.cpu())

    def _write(self, key: str, t: TopK) -> None:
        import torch

        buf = io.BytesIO()
        torch.save({"logp": t.logp, "idx": t.idx.to(torch.int32), "log_tail": t.log_tail}, buf)
        data = buf.getvalue()
        atomic_write_bytes(self.folder / f"{key}.pt", data)
        write_entry(self.folder / f"{key}.json", KIND, {"format": FORMAT, "file": f"{key}.pt", "k": self.k,
                                                         "temperature": self.temperature,
                                                         "sha256": hashlib.sha256(data).hexdigest()})

    def _read(self, key: str) -> TopK | None:
        import torch

        try:
            entry = read_entry(self.folder / f"{key}.json", KIND)
            if entry is None or entry.get("format") != FORMAT or entry.get("k") != self.k:
                return None
            data = (self.folder / entry["file"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                return None
            d = torch.load(io.BytesIO(data), weights_only=True)
            return TopK(d["logp"], d["idx"].long(), d["log_tail"])
        except (CorruptEntry, OSError, RuntimeError, KeyError, ValueError):
            return None
