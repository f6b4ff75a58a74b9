"""The result of a heal (:class:`HealResult`, JSON-able) and the share of the removal damage recovered, with a
paired bootstrap CI over the shared evaluation windows (numpy only: no torch).

recovered = 1 − (PPL_healed − PPL_finetuned_base) / (PPL_pruned − PPL_base): 1 when healing brings the pruned
model to where the same fine-tune brings the unpruned one, 0 when it recovers nothing beyond what the
fine-tune gives any model on this text.  Each bootstrap resample draws windows with replacement (the project's
1,000 resamples, seed 0) and computes all four perplexities from the same windows (paired).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from swapkl.contract import Provenance
from swapkl.store import dump_json
from swapkl.scoring.results import finite_json
from swapkl.stats import BOOT_SEED, N_BOOT, bootstrap_indices, percentile_ci, ppl_draws, tie

ROLES = ("base", "pruned", "healed", "base_finetuned")


def _boot(nll: dict, counts: np.ndarray, n_boot: int, seed: int) -> dict:
    """PPL of each role per resample, (n_boot,) arrays; windows drawn with replacement, the same for all roles."""
    idx = bootstrap_indices(len(counts), n_boot, seed)
    return {r: ppl_draws(v, counts, idx) for r, v in nll.items()}


def recovered_share(ppl: dict) -> float | None:
    """1 − (healed − base_finetuned) / (pruned − base); None when the removal did no damage (pruned == base)."""
    damage = ppl["pruned"] - ppl["base"]
    if not np.isfinite(damage) or abs(damage) < 1e-12:
        return None
    return float(1.0 - (ppl["healed"] - ppl["base_finetuned"]) / damage)


def compare(nll: dict, counts, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """Everything the heal reports from per-window NLL sums ``nll[role]`` ((W,) nats) and ``counts`` ((W,)
    scored tokens), all on the same windows: ``ppl``, ``ppl_ci``, ``delta_pct`` (pruned/healed/base_finetuned vs
    base, healed vs base_finetuned) with paired CIs and a tie flag (the CI includes 0), and ``recovered`` with
    ``recovered_ci``."""
    counts = np.asarray(counts, dtype=np.int64)
    nll = {r: np.asarray(nll[r], dtype=np.float64) for r in ROLES}
    ppl = {r: float(np.exp(nll[r].sum() / counts.sum())) for r in ROLES}
    boot = _boot(nll, counts, n_boot, seed)
    ci = {r: percentile_ci(boot[r]) for r in ROLES}

    def delta(a, b):
        vals = 100.0 * (boot[a] / boot[b] - 1.0)
        lo, hi = percentile_ci(vals)
        return {"value": 100.0 * (ppl[a] / ppl[b] - 1.0), "ci": [lo, hi], "tie": tie([lo, hi])}

    deltas = {"pruned_vs_base": delta("pruned", "base"), "healed_vs_base": delta("healed", "base"),
              "base_finetuned_vs_base": delta("base_finetuned", "base"),
              "healed_vs_base_finetuned": delta("healed", "base_finetuned"),
              "healed_vs_pruned": delta("healed", "pruned")}
    rec = recovered_share(ppl)
    rec_ci = None
    if rec is not None:
        damage = boot["pruned"] - boot["base"]
        with np.errstate(all="ignore"):
            vals = 1.0 - (boot["healed"] - boot["base_finetuned"]) / damage
        vals = vals[np.isfinite(vals) & (np.abs(damage) > 1e-12)]
        if vals.size:
            rec_ci = percentile_ci(vals)
    return {"ppl": ppl, "ppl_ci": ci, "delta_pct": deltas, "recovered": rec, "recovered_ci": rec_ci}


def compare_bridged(nll: dict, counts, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """The three rows of a heal that starts from a bridged model, from per-window NLL sums ``nll`` of ``base``,
    ``pruned`` (the raw cut), ``bridged`` (before training) and ``healed`` ((W,) nats each, same windows) and
    ``counts`` ((W,) tokens): ``rows`` = ``{"raw" | "bridged" | "healed": {"ppl", "ppl_ci", "delta_pct": {"value",
    "ci", "tie"}}}`` (ΔPPL % vs base, paired CIs), ``bridged_vs_pruned`` and ``healed_vs_bridged`` (ΔPPL %, paired),
    and ``recovered_by_bridge`` = 1 − (bridged − base) / (pruned − base) with its CI (no training: against the base
    itself, not the fine-tuned one)."""
    counts = np.asarray(counts, dtype=np.int64)
    nll = {r: np.asarray(v, dtype=np.float64) for r, v in nll.items()}
    ppl = {r: float(np.exp(v.sum() / counts.sum())) for r, v in nll.items()}
    boot = _boot(nll, counts, n_boot, seed)

    def delta(a, b):
        lo, hi = percentile_ci(100.0 * (boot[a] / boot[b] - 1.0))
        return {"value": 100.0 * (ppl[a] / ppl[b] - 1.0), "ci": [lo, hi], "tie": tie([lo, hi])}

    rows = {name: {"ppl": ppl[r], "ppl_ci": percentile_ci(boot[r]), "delta_pct": delta(r, "base")}
            for name, r in (("raw", "pruned"), ("bridged", "bridged"), ("healed", "healed"))}
    damage = ppl["pruned"] - ppl["base"]
    rec, rec_ci = None, None
    if np.isfinite(damage) and abs(damage) >= 1e-12:
        rec = float(1.0 - (ppl["bridged"] - ppl["base"]) / damage)
        d = boot["pruned"] - boot["base"]
        with np.errstate(all="ignore"):
            vals = 1.0 - (boot["bridged"] - boot["base"]) / d
        vals = vals[np.isfinite(vals) & (np.abs(d) > 1e-12)]
        rec_ci = percentile_ci(vals) if vals.size else None
    return {"rows": rows, "bridged_vs_pruned": delta("bridged", "pruned"),
            "healed_vs_bridged": delta("healed", "bridged"), "recovered_by_bridge": rec,
            "recovered_by_bridge_ci": rec_ci}


@dataclass
class HealResult:
    """One heal: ``removed`` (0-based slots of the base), ``ppl``/``ppl_ci`` per role (:data:`ROLES`),
    ``delta_pct`` (see :func:`compare`), ``recovered`` (+ ``recovered_ci``), ``recipe`` (with ``tokens_seen``),
    ``training`` ({"healed": stats, "base_finetuned": stats}: loss, seconds, tokens/s, cached, resumed_from),
    ``train_text`` (where the training text came from and how it was kept disjoint), ``contract`` (model,
    evaluator, corpus, recipe: what every number was computed under), ``seconds`` (wall time of the run),
    ``selection`` (how ``removed`` was chosen), ``windows`` (per-window NLL sums, for re-analysis)."""

    removed: list
    ppl: dict
    ppl_ci: dict
    delta_pct: dict
    recovered: float | None
    recovered_ci: list | None
    recipe: dict
    training: dict
    train_text: dict
    contract: dict
    seconds: float
    selection: dict = field(default_factory=dict)
    windows: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    #: task accuracy after healing (:func:`swapkl.healing.tasks.heal_task_accuracy`), when asked for
    tasks: dict = field(default_factory=dict)
    #: the four models on a second text domain no run trained on: ``corpus``, ``label``, ``ppl``, ``ppl_ci``,
    #: ``delta_pct``, ``recovered`` (+ CI), ``windows`` (as above), when asked for
    held_out: dict = field(default_factory=dict)
    #: a heal that started from a bridged model (``--repair bridge``): the bridge record (settings, calibration,
    #: fits) and per text (``eval``, ``held_out``) the three rows raw cut / bridged / healed
    #: (:func:`compare_bridged`); {} without a repair
    repair: dict = field(default_factory=dict)

    def worse(self) -> list[str]:
        """The gate: one phrase per text on which the healed model's perplexity is above the pruned model's with
        the paired CI of ``healed_vs_pruned`` above 0 (the evaluation windows, the held-out domain); [] when the
        heal made nothing worse (or the result predates the comparison)."""
        out = []
        for what, d in (("evaluation", self.delta_pct), ("held-out", (self.held_out or {}).get("delta_pct"))):
            x = (d or {}).get("healed_vs_pruned")
            if x and x["ci"][0] > 0:
                out.append(f"{what} PPL {x['value']:+.4g} % [{x['ci'][0]:+.4g}, {x['ci'][1]:+.4g}] vs the pruned model")
        return out

    def gate_line(self) -> str | None:
        """One line when :meth:`worse` finds a text, else None."""
        w = self.worse()
        return ("the healed model is worse than the pruned model it heals: " + "; ".join(w)) if w else None

    def provenance(self) -> Provenance:
        c = self.contract
        extra = [f"healing: {c.get('recipe_line', '')}", f"training text: {self.train_text.get('label', '?')}"]
        if self.repair:
            s, cal = self.repair.get("settings", {}), self.repair.get("calibration", {})
            extra.append(f"repair: linear bridge ({s.get('form')}), fitted on {cal.get('tokens')} calibration tokens "
                         f"(seed {s.get('calib_seed')}), disjoint from the training text")
        return Provenance(model=c.get("model"), contract={"corpus_label": c.get("corpus_label")},
                          evaluator=c.get("evaluator"), extra=tuple(extra))

    def to_dict(self) -> dict:
        return finite_json({k: getattr(self, k) for k in self.__dataclass_fields__})

    def to_json(self, path=None, indent: int = 2) -> str:
        return dump_json(self.to_dict(), path, indent)

    def headline(self) -> str:
        """One sentence: what healing recovered, against the honest control."""
        d = self.delta_pct
        hb = d["healed_vs_base_finetuned"]
        if self.recovered is None:
            return "the removal did no damage on these windows; nothing to recover"
        lo, hi = self.recovered_ci or (float("nan"), float("nan"))
        tie = " (a tie with the fine-tuned base: its CI includes 0)" if hb["tie"] else ""
        return (f"healing recovers {100 * self.recovered:.0f} % [{100 * lo:.0f}, {100 * hi:.0f}] of the removal "
                f"damage against the fine-tuned base; healed vs fine-tuned base ΔPPL {hb['value']:+.1f} % "
                f"[{hb['ci'][0]:+.1f}, {hb['ci'][1]:+.1f}]{tie}")
