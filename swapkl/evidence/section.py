"""The evidence section of the HTML report (:class:`swapkl.views.report.Section`): the headline, the three figures
(agreement heatmap, ground-truth bars with every signal's rank, stability strip), the agreement table with CIs,
the ground truth per layer, the region effect, the set-level agreement and the contract comparisons, each with the
contract caption; with a ``repair`` part (``evidence --repair bridge``), "After repair" too.  Built from an evidence
dict (:meth:`swapkl.evidence.run.EvidenceResult.to_dict`, or the ``swapkl evidence --json`` file read by
:func:`as_evidence`)."""
from __future__ import annotations

from swapkl.errors import SwapklError
from swapkl.evidence.report import caption, repair_caption
from swapkl.views.captions import csv_link, html_table, html_text
from swapkl.views.report import Section

ND = 3  # decimals of the coefficients in the tables


def as_evidence(obj, what: str = "evidence file") -> dict:
    """An evidence dict from an EvidenceResult, a dict, or a path to a ``swapkl evidence --json`` file (read
    within :mod:`swapkl.schema`'s limits); raises :class:`SwapklError` for anything else."""
    from swapkl import schema

    from swapkl.schema.evidence import evidence_fields

    if hasattr(obj, "to_dict") and hasattr(obj, "data"):
        return obj.to_dict()
    d = obj if isinstance(obj, dict) else schema.read_json_file(obj, what)
    return evidence_fields(d, what)


def opened_evidence(raw: bytes, what: str = "evidence file") -> dict:
    """An evidence dict from the bytes of a ``swapkl evidence --json`` file (the dashboard's upload), checked as
    :func:`as_evidence` does, its ``repair`` part too (:func:`swapkl.evidence.repair.check_part`)."""
    from swapkl.evidence.repair import check_part
    from swapkl.schema.text import parse_json

    d = as_evidence(parse_json(raw, what), what)
    if d.get("repair") is not None:
        check_part(d["repair"], what)
    return d


def _df(rows):
    import pandas as pd

    return pd.DataFrame(rows)


def _ci(ci, i):
    return None if not ci or ci[i] is None else float(ci[i])


def agreement_rows(d: dict) -> list[dict]:
    """One row per signal: ρ and τ against held-out ΔPPL and against KL, each with its 95 % CI, and the verdict
    against the best predictor of ΔPPL."""
    ag, rows = d["agreement"], []
    others = ((d.get("comparison") or {}).get("ground_truth_ppl") or {}).get("others") or {}
    best = ((d.get("comparison") or {}).get("ground_truth_ppl") or {}).get("best")
    for s in d["signals"]:
        row = {"signal": s}
        for g, tag in (("ground_truth_ppl", "ΔPPL"), ("ground_truth_kl", "KL"), ("ground_truth_acc", "acc. loss")):
            if g not in ag["spearman"][s]:  # an evidence without --tasks has no accuracy ground truth
                continue
            for coef, sym in (("spearman", "ρ"), ("kendall", "τ")):
                ci = ag[f"{coef}_ci"][s][g]
                row[f"{sym} vs {tag}"] = ag[coef][s][g]
                row[f"{sym} vs {tag} lo"], row[f"{sym} vs {tag} hi"] = _ci(ci, 0), _ci(ci, 1)
        row["vs best (ΔPPL)"] = "best" if s == best else (others.get(s) or {}).get("verdict", "–")
        rows.append(row)
    return rows


def ground_truth_rows(d: dict) -> list[dict]:
    g = d["ground_truth"]
    rows = []
    for i, k in enumerate(d["layers"]):
        dci, kci = (g.get("delta_ppl_pct_ci") or [None] * len(d["layers"]))[i], (g.get("kl_ci") or [None] * len(
            d["layers"]))[i]
        rows.append({"layer": k, "ΔPPL %": g["delta_ppl_pct"][i], "lo": _ci(dci, 0), "hi": _ci(dci, 1),
                     "KL (nats)": g["kl"][i], "KL lo": _ci(kci, 0), "KL hi": _ci(kci, 1)})
    return rows


def task_truth_rows(d: dict) -> list[dict]:
    """The task ground truth per block (``evidence --tasks``): each task's ΔAcc (pruned − base) with its
    per-document CI, and the accuracy loss ranked (−ΔAcc, the mean over tasks where several) with its CI."""
    t, rows = d.get("task_truth") or {}, []
    for i, k in enumerate(d["layers"] if t else []):
        row = {"block": k}
        for task in t["tasks"]:
            ci = t["delta_acc_ci"][task][i]
            row[f"ΔAcc {task}"], row[f"{task} lo"], row[f"{task} hi"] = t["delta_acc"][task][i], _ci(ci, 0), _ci(ci, 1)
        ci = t["acc_loss_ci"][i]
        row["accuracy loss"], row["loss lo"], row["loss hi"] = t["acc_loss"][i], _ci(ci, 0), _ci(ci, 1)
        row["ΔPPL %"] = d["ground_truth"]["delta_ppl_pct"][i]
        rows.append(row)
    return rows


def truths_statement(d: dict) -> str:
    """"Do blocks that cost perplexity cost accuracy?" in one sentence, with ρ, τ and their CIs ('' without
    --tasks)."""
    from swapkl.evidence.report import task_contract_line

    t = d.get("task_truth")
    if not t:
        return ""
    ta = t["truths_agreement"]

    def ci(c):
        return f" [{c[0]:.2f}, {c[1]:.2f}]" if c and c[0] is not None else ""
    rho, tau = ta.get("spearman"), ta.get("kendall")
    return (f"Do blocks that cost perplexity cost accuracy? Spearman ρ between single-block ΔPPL % and accuracy "
            f"loss = {'–' if rho is None else f'{rho:.2f}'}{ci(ta.get('spearman_ci'))}, Kendall τ = "
            f"{'–' if tau is None else f'{tau:.2f}'}{ci(ta.get('kendall_ci'))} (windows and documents resampled "
            f"jointly; {task_contract_line((d.get('contract') or {}).get('tasks') or {})}).")


def _tasks_html(d: dict, cap: str) -> str:
    if not d.get("task_truth"):
        return ""
    rows = _df(task_truth_rows(d))
    return (f"<h3>Task ground truth</h3><p><b>{html_text(d.get('headline_acc', ''))}</b></p>"
            f"<p>{html_text(truths_statement(d))}</p>" + html_table(rows, cap, nd=4)
            + csv_link(rows, cap, "evidence_task_truth.csv", "download CSV"))


def set_rows(d: dict) -> list[dict]:
    """The set-level agreement: one row per signal (pooled ρ and τ against ΔPPL with CIs, pairs of sets)."""
    sa = d.get("set_agreement") or {}
    pooled = (sa.get("pooled") or {}).get("ground_truth_ppl") or {}
    cmp = sa.get("comparison") or {}
    return [{"set score": s, "pooled ρ": r["spearman"], "ρ lo": _ci(r["spearman_ci"], 0),
             "ρ hi": _ci(r["spearman_ci"], 1), "pooled τ": r["kendall"], "τ lo": _ci(r["kendall_ci"], 0),
             "τ hi": _ci(r["kendall_ci"], 1), "pairs": r["pairs"],
             "vs best": "best" if s == cmp.get("best") else ((cmp.get("others") or {}).get(s) or {}).get(
                 "verdict", "–")} for s, r in pooled.items()]


def _region_html(d: dict, cap: str) -> str:
    r = d.get("region")
    if not r:
        return "<p class=\"note\">Region effect: no second evaluation region.</p>"
    rows = [{"cost": name, "ρ": r[f"spearman_{k}"], "ρ lo": _ci(r[f"spearman_{k}_ci"], 0),
             "ρ hi": _ci(r[f"spearman_{k}_ci"], 1), "τ": r.get(f"kendall_{k}"),
             "τ lo": _ci(r.get(f"kendall_{k}_ci"), 0), "τ hi": _ci(r.get(f"kendall_{k}_ci"), 1)}
            for k, name in (("ppl", "ΔPPL %"), ("kl", "KL"))]
    return (f"<h3>Region effect</h3><p>The ground truth on words {html_text(r['region_1'].get('words'))} and on "
            f"words {html_text(r['region_2'].get('words'))} of the evaluation text, and their rank agreement: how "
            "much the cost ranking moves from text to text at all.</p>" + html_table(_df(rows), cap, nd=ND))


def _contracts_html(d: dict, cap: str) -> str:
    rows = []
    for row in d.get("contracts") or []:
        for s, v in row["spearman"].items():
            ci = (row.get("spearman_ci") or {}).get(s)
            rows.append({"other contract": row.get("label") or f"seed {row['contract'].get('seed')}", "signal": s,
                         "ρ": v, "ρ lo": _ci(ci, 0), "ρ hi": _ci(ci, 1), "τ": row["kendall"].get(s),
                         "bootstrap": "paired" if row.get("paired") else "independent"})
    if not rows:
        return ""
    return ("<h3>Same checkpoint, other contracts</h3><p>Rank agreement of the swap-KL layer scores between the "
            "main contract and each other one.</p>" + html_table(_df(rows), cap, nd=ND))


def _sets_html(d: dict, cap: str) -> str:
    sa = d.get("set_agreement")
    if not sa:
        return ""
    sets = _df([{"n": e["n"], "set": str(e["set"]), "ΔPPL %": e["delta_ppl_pct"], "lo": _ci(e["delta_ppl_pct_ci"], 0),
                 "hi": _ci(e["delta_ppl_pct_ci"], 1), "KL (nats)": e["kl"], "chosen by": ", ".join(e["methods"])}
                for e in sa["sets"]])
    notes = "".join(f'<p class="note">note: {html_text(n)}</p>' for n in sa.get("notes") or [])
    return (f"<h3>Set-level agreement</h3><p><b>{html_text(sa['headline'])}</b></p><p>Each set score (the sum of a "
            "signal's per-layer scores over the set; <i>sleb_set</i>: calibration PPL without the set; "
            "<i>angular_blocks</i>: the angular distance across a block) against the measured held-out cost of the "
            "set, ranked within each n; 95 % bootstrap CIs over prompts and windows.</p>"
            + html_table(_df(set_rows(d)), cap, nd=ND) + html_table(sets, cap, nd=ND) + notes)


def _repair_html(d: dict) -> str:
    """After repair (``evidence --repair bridge``): the statement, the rule, every signal's ρ [CI] against the raw
    and the bridged ground truth, and the bridged ground truth per block with the form of its bridge."""
    rep = d.get("repair")
    if not rep:
        return ""
    from swapkl.evidence import repair as R

    cap = repair_caption(d)
    raw, bridged = rep["agreement"]["raw"], rep["agreement"]["bridged"]
    rows = [{"signal": s, "ρ vs raw": raw[s]["rho"], "raw lo": _ci(raw[s]["ci"], 0), "raw hi": _ci(raw[s]["ci"], 1),
             "ρ vs bridged": bridged[s]["rho"], "bridged lo": _ci(bridged[s]["ci"], 0),
             "bridged hi": _ci(bridged[s]["ci"], 1),
             "ρ vs bridged KL": ((rep["agreement"].get("bridged_kl") or {}).get(s) or {}).get("rho")}
            for s in R.ordered(rep)]
    g = rep["ground_truth"]
    forms = g.get("forms") or {}
    gt = [{"layer": k, "ΔPPL % bridged": g["delta_ppl_pct"][i], "lo": _ci(g["delta_ppl_pct_ci"][i], 0),
           "hi": _ci(g["delta_ppl_pct_ci"][i], 1), "ΔPPL % raw": d["ground_truth"]["delta_ppl_pct"][i],
           "bridge form": (forms.get(str(k)) or {}).get("form", "–")} for i, k in enumerate(d["layers"])]
    return (f"<h3>After repair</h3><p><b>{html_text(rep['statement'])}</b></p><p>Rule (fixed before any number): "
            f"{html_text(rep['rule'])}.</p>" + html_table(_df(rows), cap, nd=ND)
            + csv_link(_df(rows), cap, "evidence_after_repair.csv", "download CSV")
            + html_table(_df(gt), cap, nd=4) + f'<p class="caption">contract: {html_text(cap)}</p>')


def section(obj, title: str = "Evidence: how far to trust a layer ranking") -> Section:
    """The report section of an evidence dict, EvidenceResult or JSON path (module docstring)."""
    d = as_evidence(obj)
    from swapkl.evidence.figures import evidence_figures

    try:
        cap = caption(d)
        figs = evidence_figures(d)
        agree = _df(agreement_rows(d))
        intro = (f'<p class="verdict">{html_text(d.get("headline", ""))}</p>'
                 + (f"<p>{html_text(d['headline_kl'])}</p>" if d.get("headline_kl") else "")
                 + "<p>The measured cost of removing each layer alone on held-out text (disjoint from the scoring "
                 "prompts and the calibration text), how well every layer signal ranks it (Spearman ρ, Kendall τ, "
                 "95 % bootstrap CIs), and how often each layer is chosen when the scoring prompts are "
                 "resampled.</p>" + f'<p class="caption">contract: {html_text(cap)}</p>')
        unstable = [f"{s} n={n}" for s, per in d["stability"].items() for n, v in per.items() if v.get("unstable")]
        blocks = ["<h3>Agreement with the ground truth</h3>", html_table(agree, cap, nd=ND),
                  csv_link(agree, cap, "evidence_agreement.csv", "download CSV"),
                  "<h3>Ground truth per layer</h3>", html_table(_df(ground_truth_rows(d)), cap, nd=4),
                  _tasks_html(d, cap), _repair_html(d), _region_html(d, cap), _sets_html(d, cap), _contracts_html(d, cap)]
        if unstable:
            blocks.append(f'<p class="note">unstable (P(same set) &lt; 0.8): {html_text(", ".join(unstable))}</p>')
        blocks += [f'<p class="note">note: {html_text(n)}</p>' for n in d.get("notes") or []]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise SwapklError(f"evidence file: malformed evidence ({type(e).__name__}: {str(e)[:200]})") from None
    extra = ()
    if d.get("repair"):
        from swapkl.evidence.figures import repair_agreement

        extra = (repair_agreement(d),)
    return Section(title=title, intro=intro,
                   figures=(figs["agreement"], figs["ground_truth"], *([figs["task_truth"]] if "task_truth" in figs
                                                                        else []), figs["stability"], *extra),
                   blocks=tuple(b for b in blocks if b))
