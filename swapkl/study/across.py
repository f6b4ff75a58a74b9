"""Across models: the table a paper prints (one row per model, the columns of :mod:`swapkl.study.measure`), the
statements the table supports, each counted from per-model CIs ("interchange-guided removal is cheaper at n = 3 on 4
of 6 models; tie on 2"), and the rank agreement of the layer orderings of models that share a depth."""
from __future__ import annotations

from itertools import combinations

import numpy as np

from swapkl.schema.text import plain_text
from swapkl.stats import finite_ci as ci_of, spearman, spearman_rows
from swapkl.study.measure import PROTOCOLS
from swapkl.views.captions import fmt_number as fmt

WORD_OF = {"better": "cheaper", "worse": "costlier", "tie": "tie"}


def _ci(ci, digits: int = 2) -> str:
    if not ci or ci[0] is None:
        return ""
    return f" [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def table_rows(result) -> list[dict]:
    """One flat dict per row (the grid's and the HTML table's columns, plain strings and numbers): model, layers,
    parameters (M), regime, KL ratio I/R [CI], per n ΔPPL % R / I, I/R [CI], I − R word, best baseline, ρ per
    protocol [CI] raw and bridged, seconds, peak GiB; a failed row: its reason."""
    out = []
    for r in result.rows:
        row = {"model": plain_text(r["model"]["label"]), "spec": plain_text(r["model"]["spec"])}
        if r.get("status") != "done":
            out.append(row | {"status": f"failed: {r.get('error')}"})
            continue
        g = r["gap"]
        row |= {"status": "cached" if r.get("cached") else "done", "layers": r["layers"],
                "params (M)": round(r["params"] / 1e6, 1), "regime": r["verdict"].get("regime"),
                "KL ratio I/R": f"{fmt(g['median'], 3)}{_ci(g['ci'], 3)}"}
        for x in r["removal"]["rows"]:
            n = x["n"]
            row[f"n={n} ΔPPL% R"] = round(x["replacement"]["delta_pct"], 2)
            row[f"n={n} ΔPPL% I"] = round(x["interchange"]["delta_pct"], 2)
            row[f"n={n} I/R"] = f"{fmt(x['ratio'], 3)}{_ci(x['ratio_ci'], 3)}"
            row[f"n={n} I vs R"] = WORD_OF.get(x["word"], "-")
            b = x.get("best_baseline")
            row[f"n={n} best baseline"] = f"{b['method']} {b['delta_pct']:+.1f}" if b else "-"
        for part in ("raw", "bridged"):
            ev = (r.get("evidence") or {}).get(part)
            if not ev:
                continue
            tag = "" if part == "raw" else " (bridged)"
            for p in PROTOCOLS:
                row[f"ρ {p}{tag}"] = f"{fmt(ev[p]['rho'], 2)}{_ci(ev[p]['ci'])}"
            if "best" in ev:  # a file's part may name no best signal
                row[f"best predictor{tag}"] = f"{ev['best']} {fmt(ev.get('best_rho'), 2)}{_ci(ev.get('best_ci'))}"
        row |= task_columns(r)
        cost = r.get("cost") or {}
        row["seconds"] = round(cost.get("seconds") or 0.0, 1)
        row["peak GiB"] = round(cost["peak_bytes"] / 2**30, 2) if cost.get("peak_bytes") else None
        out.append(row)
    return out


def row_tasks(r: dict) -> list[str]:
    """The lm-eval tasks study row ``r`` measured (its ``tasks`` part's contract); none for a row without tasks."""
    return list(((r.get("tasks") or {}).get("contract") or {}).get("tasks") or [])


def study_tasks(rows) -> list[str]:
    """Every task any of ``rows`` measured, in first-seen order."""
    return list(dict.fromkeys(t for r in rows for t in row_tasks(r)))


#: the guided methods whose task accuracy a row shows, with their column tags
TASK_COLUMNS = (("replacement", "R"), ("interchange", "I"), ("consensus-mean", "mean"), ("consensus-max", "max"))


def task_columns(r: dict) -> dict:
    """A row's task-accuracy columns (with ``--tasks``): per task and n the ΔAcc (accuracy points, pruned − base)
    of each guided set with its per-document 95 % CI, and each protocol's ρ with the single-block accuracy loss."""
    t_part, out = r.get("tasks") or {}, {}
    for t in row_tasks(r):
        for m, tag in TASK_COLUMNS:
            for e in (t_part.get("methods") or {}).get(m, []):
                d = (e.get("delta") or {}).get(t)
                if d:
                    ci = [None if v is None else 100 * v for v in d["ci"]]
                    out[f"{t} n={e['n']} ΔAcc {tag}"] = f"{fmt(100 * d['delta'], 1)}{_ci(ci, 1)}"
        pred = (t_part.get("predictors") or {}).get(t) or {}
        for p in PROTOCOLS:
            if p in pred:
                out[f"{t} ρ acc-loss {p}"] = f"{fmt(pred[p]['rho'], 2)}{_ci(pred[p]['ci'])}"
    return out


def _picks_line(what: str, picks: list, how: str) -> str:
    """How many models' ``picks`` (``{"winner": protocol or None}``) say replacement, interchange or neither predicts
    ``what`` better, with ``how`` the pick was made."""
    w = [p["winner"] or "tie" for p in picks]
    return (f"replacement predicts {what} better on {w.count('replacement')} of {len(picks)} models, interchange on "
            f"{w.count('interchange')}, tie on {w.count('tie')} ({how})")


def _count(words: list, keys=("better", "tie", "worse")) -> dict:
    return {k: words.count(k) for k in keys}


def removal_statements(result) -> list[str]:
    """Per n: on how many models interchange-guided removal is cheaper / tied / costlier than replacement-guided
    (the paired CI of ΔPPL %(I) − ΔPPL %(R); a tie when it includes 0), and on how many the best baseline is below
    both guided sets."""
    done = result.done()
    ns = sorted({x["n"] for r in done for x in r["removal"]["rows"]})
    out = []
    for n in ns:
        rows = [x for r in done for x in r["removal"]["rows"] if x["n"] == n]
        c = _count([x["word"] for x in rows])
        s = (f"interchange-guided removal is cheaper at n = {n} on {c['better']} of {len(rows)} models; tie on "
             f"{c['tie']}; costlier on {c['worse']} (paired 95 % CI of ΔPPL %(I) − ΔPPL %(R) over the same windows)")
        beat = sum(1 for x in rows if x.get("best_baseline") and x["best_baseline"]["delta_pct"]
                   < min(x["replacement"]["delta_pct"], x["interchange"]["delta_pct"]))
        out.append(s + f"; the best baseline is below both guided sets on {beat} (point estimates)")
    return out


def gap_statement(result) -> str | None:
    done = result.done()
    if not done:
        return None
    below = sum(1 for r in done if r["gap"]["ci"][1] is not None and r["gap"]["ci"][1] < 1)
    above = sum(1 for r in done if r["gap"]["ci"][0] is not None and r["gap"]["ci"][0] > 1)
    regimes = [r["verdict"].get("regime") or "none" for r in done]
    counts = ", ".join(f"{k} on {regimes.count(k)}" for k in dict.fromkeys(regimes))
    return (f"interchange KL is below replacement KL (95 % CI of the median ratio below 1) on {below} of {len(done)} "
            f"models, above on {above}, undecided on {len(done) - below - above}; regimes: {counts}")


def predictor_statements(result) -> list[str]:
    """Which protocol predicts single-block removal cost better, counted over models, raw and after the bridge."""
    out = []
    for part, tag in (("raw", ""), ("bridged", " after the bridge")):
        picks = [((r.get("evidence") or {}).get(part) or {}).get("pick") for r in result.done()]
        picks = [p for p in picks if p]
        if not picks:
            continue
        out.append(_picks_line(f"single-block removal cost{tag}", picks,
                               "Spearman ρ with the held-out ΔPPL %; paired ρ-difference CI where one is the best "
                               "signal, else the ρ CIs' overlap"))
    return out


#: the n of the consensus statements (docs/consensus.md: the study's headline n), or the largest n evaluated
HEADLINE_N = 2


def _consensus_line(c: str, metric: str, cells: list, n: int, gain: str) -> str:
    """One consensus method's counts on one metric, from ``cells`` ``[(model index, n, cell)]``: models where it is
    significantly worse than the better protocol at ``n`` (docs/consensus.md) and at some n (docs/METHOD.md's "never
    worse"), and, among cells where R and I differ significantly, those where it is significantly ``gain``
    ("cheaper" in ΔPPL, "more accurate" in ΔAcc) than the worse (the cells' ``cheaper_than_worse``)."""
    at_n = [x for _, k, x in cells if k == n]
    worse = sum(1 for x in at_n if x["worse_than_better"])
    any_n = len({m for m, _, x in cells if x["worse_than_better"]})
    differ = [x for _, _, x in cells if x["r_i_differ"]]
    cheaper = sum(1 for x in differ if x["cheaper_than_worse"])
    return (f"{c} is significantly worse than the better of R and I at n = {n} on {worse} of {len(at_n)} models "
            f"({metric}), at some n on {any_n}; significantly {gain} than the worse in {cheaper} of {len(differ)} "
            "cells where R and I differ (docs/consensus.md)")


def consensus_statements(result) -> list[str]:
    """docs/consensus.md's counts per consensus method, on held-out ΔPPL % and, per task, on ΔAcc."""
    from swapkl.study.measure import CONSENSUS

    done = result.done()
    sources = [("held-out ΔPPL %, paired window bootstrap", "cheaper",
                [(m, x, None) for m, r in enumerate(done) for x in (r["removal"].get("consensus") or [])])]
    for t in study_tasks(done):
        rows = [(m, x, t) for m, r in enumerate(done) for x in ((r.get("tasks") or {}).get("consensus") or [])]
        sources.append((f"{t} ΔAcc, paired document bootstrap", "more accurate", rows))
    out = []
    for metric, gain, rows in sources:
        ns = sorted({x["n"] for _, x, _ in rows})
        if not ns:
            continue
        n = HEADLINE_N if HEADLINE_N in ns else ns[-1]
        for c in CONSENSUS:
            cells = [(m, x["n"], (x if t is None else x.get(t) or {}).get(c)) for m, x, t in rows]
            cells = [(m, k, v) for m, k, v in cells if v]
            if cells:
                out.append(_consensus_line(c, metric, cells, n, gain))
    return out


def task_statements(result) -> list[str]:
    """Per task and n: on how many models interchange-guided removal loses less accuracy than replacement-guided
    (the paired per-document CI of acc(I) − acc(R)); which protocol's layer score predicts single-block accuracy
    loss better (the paired ρ-difference CI over document resamples)."""
    done = [r for r in result.done() if r.get("tasks")]
    out = []
    for t in study_tasks(done):
        for n in sorted({x["n"] for r in done for x in r["tasks"]["i_vs_r"]}):
            w = [x[t]["word"] for r in done for x in r["tasks"]["i_vs_r"] if x["n"] == n and t in x]
            c = _count(w)
            out.append(f"{t}: interchange-guided removal loses less accuracy at n = {n} on {c['better']} of {len(w)} "
                       f"models; tie on {c['tie']}; loses more on {c['worse']} (paired per-document 95 % CI of "
                       "acc(I) − acc(R))")
        picks = [r["tasks"]["predictors"][t]["pick"] for r in done if t in (r["tasks"].get("predictors") or {})]
        if picks:
            out.append(f"{t}: " + _picks_line("single-block accuracy loss", picks,
                                              "Spearman ρ of the layer score with the single-block accuracy loss; "
                                              "paired ρ-difference CI over document resamples"))
    return out


def statements(result) -> list[str]:
    return [s for s in [gap_statement(result), *removal_statements(result), *predictor_statements(result),
                        *task_statements(result), *consensus_statements(result)] if s]


def rank_agreement(result) -> list[dict]:
    """Every pair of finished models of one depth: per protocol the Spearman ρ of their adjacent-pair scores with
    a 95 % CI over independent prompt resamples of each model (:func:`swapkl.study.measure.layer_order`)."""
    out = []
    done = [r for r in result.done() if r.get("order")]
    for a, b in combinations(done, 2):
        if a["layers"] != b["layers"]:
            continue
        row = {"a": plain_text(a["model"]["label"]), "b": plain_text(b["model"]["label"]), "layers": a["layers"]}
        for p in PROTOCOLS:
            va, vb = (np.array([np.nan if v is None else v for v in r["order"][p]["values"]]) for r in (a, b))
            ra, rb = (np.array(r["order"][p]["replicates"], dtype=float) for r in (a, b))
            ra, rb = ra[:len(rb)], rb[:len(ra)]  # as many replicates of each (a file may hold other counts)
            m = np.isfinite(va) & np.isfinite(vb)
            ci = ci_of(spearman_rows(ra[:, m], rb[:, m])) if m.sum() >= 3 else [None, None]
            row[p] = {"rho": spearman(va, vb) if m.sum() >= 3 else None, "ci": ci}
        out.append(row)
    return out
