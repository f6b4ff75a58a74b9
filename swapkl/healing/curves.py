"""Healed curves: the heals of several methods' sets at several n, with ONE recipe and ONE control, on the same
evaluation windows, and the paired comparison of two methods at each n (:class:`HealCurves`; numpy only, no torch).

:func:`swapkl.healing.multi.heal_curves` computes one; :meth:`HealCurves.from_dict` reads its JSON back (or the
JSON of ``swapkl heal --json``, one set, as a one-point curve), validating a file from outside first.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from swapkl.contract import Provenance
from swapkl.errors import SwapklError
from swapkl.healing import compare as C
from swapkl.removal import methods as M
from swapkl.scoring.results import finite_json
from swapkl.store import dump_json

FORMAT = "swapkl.heal_curves/1"
#: what an entry keeps of a HealResult (its windows go to HealCurves.windows, its contract to the top)
ENTRY_KEYS = ("removed", "selection", "ppl", "ppl_ci", "delta_pct", "recovered", "recovered_ci", "training", "seconds")
MAX_ENTRIES = 500
MAX_WINDOWS = 200_000


def set_key(removed) -> str:
    return ",".join(str(int(i)) for i in sorted(removed))


def method_label(m: str) -> str:
    """``interchange-guided``: the registry's label (the name for an unknown method)."""
    return M.label(m)


def _point(row: dict) -> dict:
    return {"ppl": row["ppl"], "ppl_ci": row["ppl_ci"], "delta_pct": row["delta_pct"]}


def points(h: dict) -> dict:
    """The keys a healed-curves entry adds for one heal ``h`` (a ``HealResult`` dict): ``raw``, ``bridged`` and
    ``healed``, each ``{"ppl", "ppl_ci", "delta_pct": {"value", "ci", "tie"}}`` (ΔPPL % vs the base, paired CI over
    the evaluation windows; ``bridged`` is None without ``--repair bridge``), ``bridge`` (the bridge alone:
    ``bridged_vs_pruned``, ``healed_vs_bridged``, ``recovered_by_bridge`` + CI; None without a repair) and
    ``held_out`` (None without a held-out text, else the heal's held-out ``ppl``, ``ppl_ci``, ``delta_pct``,
    ``recovered`` + CI, with its own ``raw`` / ``bridged`` / ``healed`` points)."""
    def three(ppl, ci, d, rep):
        if rep:
            return {k: _point(rep["rows"][k]) for k in ("raw", "bridged", "healed")}
        return {"raw": {"ppl": ppl["pruned"], "ppl_ci": ci["pruned"], "delta_pct": d["pruned_vs_base"]},
                "bridged": None, "healed": {"ppl": ppl["healed"], "ppl_ci": ci["healed"], "delta_pct": d["healed_vs_base"]}}

    rep = h.get("repair") or {}
    ev = rep.get("eval")
    out = dict(three(h["ppl"], h["ppl_ci"], h["delta_pct"], ev), held_out=None,
               bridge={k: ev[k] for k in ("bridged_vs_pruned", "healed_vs_bridged", "recovered_by_bridge",
                                          "recovered_by_bridge_ci")} if ev else None)
    ho = h.get("held_out") or {}
    if ho:
        out["held_out"] = dict({k: v for k, v in ho.items() if k != "windows"},
                               **three(ho["ppl"], ho["ppl_ci"], ho["delta_pct"], rep.get("held_out")))
    return out


def default_pair(methods) -> tuple[str, str] | None:
    """The two methods compared: interchange vs replacement when both are healed, else the first two."""
    ms = list(methods)
    if "interchange" in ms and "replacement" in ms:
        return ("interchange", "replacement")
    return (ms[0], ms[1]) if len(ms) >= 2 else None


@dataclass
class HealCurves:
    """``methods``: ``{method: [entry per n]}`` (entry: ``n``, :data:`ENTRY_KEYS` of the heal and :func:`points`:
    ``raw`` / ``bridged`` / ``healed`` ΔPPL points, ``bridge``, ``held_out``); ``pair``: the
    two methods compared (A, B) or None; ``comparisons``: per n healed by both, ``{"n", "a", "b", "same_set",
    "diff" (:func:`swapkl.healing.compare.paired_difference`, None for equal sets), "sentence"}``; ``headline``:
    the sentence at the largest n where the two sets differ; ``recipe``, ``contract``, ``train_text``: shared by
    every heal; ``windows``: ``counts``, ``base``, ``base_finetuned`` and per set (:func:`set_key`) its
    ``pruned`` and ``healed`` per-window NLL sums."""

    methods: dict
    recipe: dict
    contract: dict
    train_text: dict
    windows: dict
    pair: list | None = None
    comparisons: list = field(default_factory=list)
    headline: str = ""
    seconds: float = 0.0
    notes: list = field(default_factory=list)
    #: task accuracy after healing (:func:`swapkl.healing.tasks.heal_task_accuracy`), when asked for
    tasks: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ building
    @classmethod
    def from_heals(cls, heals, pair=None, seconds: float = 0.0, notes=()) -> HealCurves:
        """From ``[(method, n, HealResult or its dict)]`` (one recipe, one control, the same windows)."""
        heals = [(m, n, h if isinstance(h, dict) else h.to_dict()) for m, n, h in heals]
        if not heals:
            raise SwapklError("no heal to draw")
        first = heals[0][2]
        w0 = first["windows"]
        windows = {"counts": w0["counts"], "base": w0["base"], "base_finetuned": w0["base_finetuned"], "sets": {}}
        methods: dict = {}
        for m, n, h in heals:
            if h["recipe"] != first["recipe"] or h["windows"]["counts"] != w0["counts"]:
                raise SwapklError("healed curves need one recipe and the same evaluation windows for every set")
            methods.setdefault(m, []).append({"n": int(n), **{k: h.get(k) for k in ENTRY_KEYS}, **points(h)})
            windows["sets"][set_key(h["removed"])] = {"pruned": h["windows"]["pruned"],
                                                      "healed": h["windows"]["healed"]}
        for v in methods.values():
            v.sort(key=lambda e: e["n"])
        pair = list(pair) if pair else (list(default_pair(methods)) if default_pair(methods) else None)
        out = cls(methods=methods, recipe=first["recipe"], contract=first["contract"],
                  train_text=first.get("train_text") or {}, windows=windows, pair=pair, seconds=seconds,
                  notes=list(notes))
        out.compare()
        return out

    def compare(self) -> None:
        """Fill ``comparisons`` and ``headline`` for ``pair`` (paired over the shared windows)."""
        self.comparisons, self.headline = [], ""
        if not self.pair or any(m not in self.methods for m in self.pair):
            return
        a, b = self.pair
        la, lb = method_label(a), method_label(b)
        by_n = {m: {e["n"]: e for e in self.methods[m]} for m in (a, b)}
        w = self.windows
        for n in sorted(set(by_n[a]) & set(by_n[b])):
            ka, kb = set_key(by_n[a][n]["removed"]), set_key(by_n[b][n]["removed"])
            same = ka == kb
            diff = C.paired_difference(w["counts"], w["base"], w["base_finetuned"], w["sets"][ka], w["sets"][kb])
            self.comparisons.append({"n": n, "a": a, "b": b, "removed_a": by_n[a][n]["removed"],
                                     "removed_b": by_n[b][n]["removed"], "same_set": same, "diff": diff,
                                     "sentence": C.sentence(n, la, lb, diff, same)})
        differ = [c for c in self.comparisons if not c["same_set"]]
        if differ:
            self.headline = differ[-1]["sentence"]
        elif self.comparisons:
            ns = ", ".join(str(c["n"]) for c in self.comparisons)
            self.headline = f"{la} and {lb} remove the same layers at every n healed ({ns}): a tie by construction"

    # ------------------------------------------------------------------ reading
    @property
    def base_ppl(self) -> float | None:
        e = next((e for v in self.methods.values() for e in v), None)
        return e["ppl"]["base"] if e else None

    @property
    def finetuned_ppl(self) -> float | None:
        e = next((e for v in self.methods.values() for e in v), None)
        return e["ppl"]["base_finetuned"] if e else None

    def recipe_line(self) -> str:
        return self.contract.get("recipe_line") or ""

    def provenance(self) -> Provenance:
        c = self.contract
        extra = [f"healing: {c.get('recipe_line', '')}", f"training text: {self.train_text.get('label', '?')}",
                 "CIs: paired bootstrap over the shared windows (1,000 resamples, seed 0)"]
        return Provenance(model=c.get("model"), contract={"corpus_label": c.get("corpus_label")},
                          evaluator=c.get("evaluator"), extra=tuple(extra))

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return finite_json({"format": FORMAT, **d})

    def to_json(self, path=None, indent: int = 2) -> str:
        return dump_json(self.to_dict(), path, indent)

    @classmethod
    def from_dict(cls, d: dict, where: str = "healed curves") -> HealCurves:
        """From :meth:`to_dict`'s JSON, or from one ``swapkl heal --json`` result (a one-point curve of its
        method, ``given`` when the set was given), validated first."""
        validate(d, where)
        if d.get("format") != FORMAT:
            sel = d.get("selection") or {}
            m, n = str(sel.get("method") or "given"), int(sel.get("n") or len(d["removed"]))
            out = cls.from_heals([(m, n, d)])
            out.tasks = d.get("tasks") or {}
            return out
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**kw)


def validate(d, where: str = "healed curves") -> None:
    """Refuse (one line, :class:`SwapklError`) a file that is neither healed curves nor a heal result, or whose
    sizes are out of bounds."""
    def need(ok, what):
        if not ok:
            raise SwapklError(f"{where}: {what}")

    need(isinstance(d, dict), "not a JSON object")
    if d.get("format") == FORMAT:
        for k in ("methods", "recipe", "contract", "windows"):
            need(isinstance(d.get(k), dict), f"'{k}' missing or not an object")
        entries = [e for v in d["methods"].values() for e in (v if isinstance(v, list) else [None])]
        need(len(entries) <= MAX_ENTRIES, f"more than {MAX_ENTRIES} heals")
        need(all(isinstance(e, dict) and isinstance(e.get("n"), int) and isinstance(e.get("ppl"), dict)
                 for e in entries), "an entry without n or ppl")
        counts = d["windows"].get("counts")
    else:
        for k in ("removed", "ppl", "delta_pct", "recipe", "contract", "windows"):
            need(k in d, f"neither healed curves ({FORMAT}) nor a 'swapkl heal --json' result (no '{k}')")
        need(isinstance(d["removed"], list) and all(isinstance(i, int) for i in d["removed"]), "bad 'removed'")
        counts = (d.get("windows") or {}).get("counts")
    need(isinstance(counts, list) and 0 < len(counts) <= MAX_WINDOWS, "no evaluation windows")
    if d.get("tasks"):
        from swapkl.healing.task_figures import validate_tasks

        validate_tasks(d["tasks"], f"{where}: tasks")
