"""The comparison of two analyses (:class:`CompareResult`, ``swapkl compare --json``): both models and contracts,
per protocol the rank agreement with its CIs under keys ``spearman`` and ``kendall``, each model's regime verdict, and
the transfer table."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from swapkl import __version__
from swapkl.compare.agreement import PROTOCOLS, rank_agreement
from swapkl.contract import Provenance
from swapkl.scoring.results import finite_json
from swapkl.stats import N_BOOT
from swapkl.store import dump_json

FORMAT = "swapkl.compare/1"


@dataclass
class CompareResult:
    """``a`` / ``b``: ``{"model": identity, "contract": ..., "source": "scores file PATH" or "scored here"}``;
    ``agreement``: :func:`swapkl.compare.agreement.rank_agreement`'s dict; ``transfer``:
    :func:`swapkl.compare.transfer.transfer`'s dict, or None when not computed."""

    a: dict
    b: dict
    agreement: dict
    transfer: dict | None = None
    notes: list = field(default_factory=list)

    def protocol(self, name: str) -> dict:
        return self.agreement[name]

    def provenance(self) -> Provenance:
        """A's contract (B's is the same but for the model and possibly the prompt seed) and both models."""
        name = lambda s: (s.get("model") or {}).get("display") or (s.get("model") or {}).get("id") or "?"
        extra = tuple(f"{k} A={v[0]} B={v[1]}" for k, v in (self.agreement.get("differs") or {}).items()
                      if k != "device")
        ev = (self.transfer or {}).get("evaluator")
        contract = {k: v for k, v in (self.a.get("contract") or {}).items()
                    if k not in (self.agreement.get("differs") or {})}
        return Provenance(model=f"A {name(self.a)} vs B {name(self.b)}", contract=contract,
                          evaluator=ev, extra=extra)

    def to_dict(self) -> dict:
        return finite_json({"format": FORMAT, "swapkl_version": __version__, "a": self.a, "b": self.b,
                            "agreement": self.agreement, "transfer": self.transfer, "notes": self.notes,
                            **{p: self.agreement[p] for p in PROTOCOLS}})

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        return dump_json(self.to_dict(), path)

    @classmethod
    def from_dict(cls, d: dict, what: str = "comparison") -> CompareResult:
        from swapkl.schema.compare import compare_fields

        return cls(**compare_fields(d, what))


def side(res, source: str) -> dict:
    return {"model": dict(res.identity or {}), "contract": dict(res.contract or {}), "source": source,
            "num_layers": res.num_layers, "num_prompts": res.num_prompts}


def compare(a, b, *, source_a: str = "", source_b: str = "", ck_b=None, budget: int = 0, evaluator="matched",
            corpus=None, spacing: int = 1, n_boot: int = N_BOOT, memo=None, progress=None, should_stop=None,
            batch_size: int | None = None) -> CompareResult:
    """Compare two :class:`~swapkl.scoring.results.SwapResult` s: the rank agreement always, the transfer of the
    decision when ``ck_b`` (B's loaded checkpoint) and ``budget`` >= 1 are given."""
    agreement = rank_agreement(a, b, n_boot=n_boot)
    out = CompareResult(a=side(a, source_a), b=side(b, source_b), agreement=agreement)
    if agreement["differs"].get("seed"):
        sa, sb = agreement["differs"]["seed"]
        out.notes.append(f"prompt seeds differ (A {sa}, B {sb}): other prompts, so the bootstrap is unpaired")
    if ck_b is not None and budget:
        from swapkl.compare.transfer import transfer

        out.transfer = transfer(ck_b, a, b, budget, evaluator, corpus, spacing=spacing, memo=memo, progress=progress,
                                should_stop=should_stop, batch_size=batch_size)
    return out
