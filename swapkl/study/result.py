"""The result of a study (:class:`StudyResult`): the one contract, one row per model (:mod:`swapkl.study.analyze`
plus the model, its cost and where the row came from), and the merge of shares run as separate jobs."""
from __future__ import annotations

from dataclasses import dataclass, field

from swapkl import schema
from swapkl.contract import Provenance, stable_hash
from swapkl.errors import SwapklError
from swapkl.scoring.results import finite_json
from swapkl.store import dump_json
from swapkl.study.plan import FORMAT


@dataclass
class StudyResult:
    """``contract``: :meth:`~swapkl.study.plan.StudyPlan.contract_dict` (shared by every row); ``rows``: one dict per
    model in the study's order -- ``{"model": {spec, revision, label}, "status": "done" | "failed", "error",
    "cached" (read from the study cache, nothing computed), "cost": {"seconds", "peak_bytes", "peak_what",
    "device"}}`` plus, when done, :func:`~swapkl.study.analyze.analyze_model`'s fields; ``shard``: ``[K, N]`` of a
    share, None for a whole study; ``complete``: every model of the list has a row."""

    contract: dict
    rows: list = field(default_factory=list)
    shard: list | None = None
    notes: list = field(default_factory=list)
    complete: bool = True

    def key(self) -> str:
        return stable_hash(self.contract)[:16]

    def done(self) -> list[dict]:
        return [r for r in self.rows if r.get("status") == "done"]

    def provenance(self) -> Provenance:
        """The study's contract as a caption (no single model: each row names its own)."""
        c = self.contract
        ev = c.get("evaluator") or {}
        extra = [f"budget {c.get('budget')}", f"methods {', '.join(c.get('methods') or [])}",
                 *([f"{c.get('seeds')} random seeds"] if "random" in (c.get("methods") or []) else []),
                 f"bootstrap B={c.get('n_boot')}", f"repair {c.get('repair')}"]
        if c.get("eval_text"):
            extra.append(f"held-out text {c['eval_text']}")
        return Provenance(model=f"study of {len(self.rows)} model(s)", contract=dict(c.get("scoring") or {}),
                          evaluator=ev, extra=tuple(extra))

    def to_dict(self) -> dict:
        return finite_json({"format": FORMAT, "contract": self.contract, "rows": self.rows, "shard": self.shard,
                            "notes": self.notes, "complete": self.complete})

    def to_json(self, path=None, indent: int = 2) -> str:
        return dump_json(self.to_dict(), path, indent)

    @classmethod
    def from_dict(cls, d: dict, what: str = "study") -> StudyResult:
        return cls(**schema.study_fields(d, what))

    @classmethod
    def from_json(cls, path, what: str = "study file") -> StudyResult:
        d = schema.read_json_file(path, what, keep_constants=True)
        return cls.from_dict(d, f"{what} {path}")


def merge(shares: list[StudyResult], names: list[str] | None = None) -> StudyResult:
    """One study from its shares (``--shard K/N`` runs): refused in one line when two shares' contracts differ or
    a model appears twice; rows in share order.  ``names``: the shares' file names, for the messages."""
    if not shares:
        raise SwapklError("--merge needs at least one study file")
    names = names or [f"share {i + 1}" for i in range(len(shares))]
    first = shares[0]
    for s, name in zip(shares[1:], names[1:]):
        if s.contract != first.contract:
            diff = sorted(k for k in set(s.contract) | set(first.contract) if s.contract.get(k) != first.contract.get(k))
            raise SwapklError(f"{name} was run under another contract than {names[0]} (differs in: "
                              f"{', '.join(diff)}); shares of one study share one contract")
    rows, seen = [], {}
    for s, name in zip(shares, names):
        for r in s.rows:
            label = r["model"]["label"]
            if label in seen:
                raise SwapklError(f"model {label!r} is in both {seen[label]} and {name}")
            seen[label] = name
            rows.append(r)
    shards = [s.shard for s in shares if s.shard]
    complete = all(s.complete for s in shares) and (not shards or len(shards) == shards[0][1])
    notes = [f"merged from {len(shares)} share(s): {', '.join(names)}"]
    if shards and len(shards) != shards[0][1]:
        notes.append(f"{len(shards)} of {shards[0][1]} shares merged: the study is incomplete")
    return StudyResult(contract=first.contract, rows=rows, shard=None, notes=notes, complete=complete)
