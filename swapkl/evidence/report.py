"""Plain-text tables and CSV of an evidence dict (:meth:`swapkl.evidence.run.EvidenceResult.to_dict`): what the CLI
prints, the bench shows and the downloads hold.  Every table ends with the contract caption."""
from __future__ import annotations

import csv
import io

from swapkl.contract import Provenance

GT = ("ground_truth_ppl", "ground_truth_kl")
GT_ACC = "ground_truth_acc"  # swapkl.evidence.task_truth.GT_ACC (kept here: this module imports no compute)


def task_contract_line(c: dict) -> str:
    """The task ground truth's evaluation contract in words (``contract.tasks`` of an evidence dict): lm-eval
    version, each task's version, the limit and the few-shot count."""
    tasks = "; ".join(f"{t} v{(i.get('versions') or {}).get(t, '?')}" for t, i in (c.get("tasks") or {}).items())
    shots = (f"{c['num_fewshot']}-shot" if c.get("num_fewshot") is not None else "few-shot task default ("
             + ", ".join(f"{t} {k}" for t, k in (c.get("n-shot") or {}).items()) + ")")
    return f"lm-eval {c.get('lm_eval_version')}, tasks {tasks}, limit {c.get('limit') or 'all'}, {shots}"


def provenance(d: dict) -> Provenance:
    c = d.get("contract") or {}
    sc = dict(c.get("scoring") or {})
    extra = [f"budget {d.get('budget')}"]
    bs = c.get("bootstrap") or {}
    if bs:
        extra.append(f"bootstrap B={bs.get('agreement')} (agreement), B={bs.get('stability')} (stability)")
    regs = c.get("regions") or {}
    if regs:
        extra.append("regions " + ", ".join(f"{k} words {v[0]}-{v[1]}" for k, v in regs.items()))
    if c.get("tasks"):
        extra.append("task ground truth: " + task_contract_line(c["tasks"]))
    return Provenance(model=c.get("model"), contract=sc, evaluator=c.get("evaluator"), extra=tuple(extra))


def caption(d: dict) -> str:
    from swapkl.views.captions import contract_caption  # deferred: plotly-free, but keep this module light

    return contract_caption(provenance(d))


def _n(x, fmt="{:.2f}"):
    return "-" if x is None else fmt.format(x)


def _ci(ci, fmt="{:.2f}"):
    if not ci or ci[0] is None:
        return ""
    return f" [{fmt.format(ci[0])}, {fmt.format(ci[1])}]"


def ground_truth_table(d: dict) -> list[str]:
    g = d["ground_truth"]
    lines = [f"ground truth (remove one layer; baseline PPL {_n(g.get('baseline_ppl'), '{:.4g}')}, "
             f"{g.get('n_windows')} windows):",
             "  layer   ΔPPL %  [95% CI]                 KL nats [95% CI]"]
    for i, k in enumerate(d["layers"]):
        lines.append(f"  {k:>5}  {_n(g['delta_ppl_pct'][i], '{:+9.2f}')}{_ci(g['delta_ppl_pct_ci'][i], '{:+.2f}'):<24}"
                     f"  {_n(g['kl'][i], '{:.4f}')}{_ci(g['kl_ci'][i], '{:.4f}')}")
    return lines


def agreement_table(d: dict) -> list[str]:
    ag = d["agreement"]
    acc = GT_ACC in ag["spearman"]
    lines = ["rank agreement with the ground truth (Spearman ρ [95% CI]; Kendall τ [95% CI]):",
             f"  {'signal':<14} {'vs ΔPPL: ρ':<24} {'τ':<22} {'vs KL: ρ':<24} {'τ':<22}"
             + (" vs accuracy loss: ρ" if acc else "")]
    for s in d["signals"]:
        row = f"  {s:<14}"
        for g in GT:
            row += (f" {_n(ag['spearman'][s][g]) + _ci(ag['spearman_ci'][s][g]):<24}"
                    f" {_n(ag['kendall'][s][g]) + _ci(ag['kendall_ci'][s][g]):<22}")
        if acc:
            row += f" {_n(ag['spearman'][s][GT_ACC]) + _ci(ag['spearman_ci'][s][GT_ACC])}"
        lines.append(row.rstrip())
    for key in ("headline", "headline_kl", "headline_acc"):
        if d.get(key):
            lines.append(d[key])
    if (d.get("definitions") or {}).get("statement"):
        lines.append("per-layer definitions: " + d["definitions"]["statement"])
    return lines


def task_table(d: dict) -> list[str]:
    """The task ground truth (``evidence --tasks``): per block the accuracy change of each task with its
    per-document CI, the accuracy loss ranked (mean over tasks), the two ground truths' agreement and the
    evaluation contract; nothing for an evidence without it."""
    t = d.get("task_truth")
    if not t:
        return []
    tasks = t["tasks"]
    lines = ["task ground truth (remove one block; lm-eval accuracy change, pruned − base, [95% CI] over documents; "
             "accuracy loss = −ΔAcc" + (", mean over tasks" if len(tasks) > 1 else "") + ", higher = costlier):",
             "  base: " + ", ".join(f"{k} {t['metric'][k]} {t['base'][k]:.4f} ({t['n_docs'][k]} docs)" for k in tasks),
             "  layer  " + "".join(f"{'ΔAcc ' + k:<34}" for k in tasks) + "accuracy loss [95% CI]"]
    for i, k in enumerate(d["layers"]):
        cells = "".join(f"{_n(t['delta_acc'][x][i], '{:+.4f}') + _ci(t['delta_acc_ci'][x][i], '{:+.4f}'):<34}"
                        for x in tasks)
        lines.append(f"  {k:>5}  {cells}{_n(t['acc_loss'][i], '{:+.4f}')}{_ci(t['acc_loss_ci'][i], '{:+.4f}')}")
    ta = t.get("truths_agreement") or {}
    lines.append(f"do blocks that cost perplexity cost accuracy? ΔPPL % vs accuracy loss: ρ = {_n(ta.get('spearman'))}"
                 f"{_ci(ta.get('spearman_ci'))}, τ = {_n(ta.get('kendall'))}{_ci(ta.get('kendall_ci'))} (windows and "
                 "documents resampled jointly)")
    for task, row in (t.get("per_task") or {}).items():
        lines.append(f"  vs {task} alone: " + ", ".join(f"{s} ρ = {_n(v)}{_ci(row['spearman_ci'][s])}"
                                                        for s, v in row["spearman"].items()))
    c = (d.get("contract") or {}).get("tasks")
    if c:
        lines.append("  evaluated: " + task_contract_line(c))
    return lines


def stability_table(d: dict) -> list[str]:
    lines = ["stability under a bootstrap of the scoring prompts (P(same set); the set; unstable below 0.8):"]
    for s, per_n in d["stability"].items():
        cells = []
        for n, v in per_n.items():
            flag = " UNSTABLE" if v["unstable"] else ""
            cells.append(f"n={n}: {v['same_set']:.2f} {v['set']}{flag}")
        lines.append(f"  {s:<14} " + "; ".join(cells))
    return lines


def region_table(d: dict) -> list[str]:
    r = d.get("region")
    if not r:
        return ["region effect: no second evaluation region"]
    return [f"region effect (ground truth on words {r['region_1'].get('words')} vs {r['region_2'].get('words')}): "
            f"ΔPPL ρ = {_n(r['spearman_ppl'])}{_ci(r['spearman_ppl_ci'])}, τ = {_n(r['kendall_ppl'])}"
            f"{_ci(r['kendall_ppl_ci'])}; KL ρ = {_n(r['spearman_kl'])}{_ci(r['spearman_kl_ci'])}"]


def contracts_table(d: dict) -> list[str]:
    lines = []
    for row in d.get("contracts") or []:
        c = row["contract"]
        label = row.get("label") or f"contract seed {c.get('seed')}"
        cells = [f"{k} ρ = {_n(v)}{_ci(row['spearman_ci'].get(k))}, τ = {_n(row['kendall'].get(k))}"
                 f"{_ci((row.get('kendall_ci') or {}).get(k))}" for k, v in row["spearman"].items()]
        how = "paired" if row.get("paired") else "independent"
        lines.append(f"same checkpoint, {label} ({c.get('prompts')}×{c.get('tokens')}, {c.get('dtype')}; "
                     f"{how} prompt bootstrap): " + "; ".join(cells))
    return lines


def set_agreement_table(d: dict) -> list[str]:
    """The set-level agreement: every distinct set with its measured cost, then each signal's pooled ρ and τ."""
    sa = d.get("set_agreement")
    if not sa:
        return []
    lines = [f"sets the methods chose (n = 1..{sa['budget']}), measured on the held-out text:",
             "  n  set             ΔPPL % [95% CI]            chosen by"]
    for e in sa["sets"]:
        lines.append(f"  {e['n']:<2} {str(e['set']):<15} {_n(e['delta_ppl_pct'], '{:+.2f}')}"
                     f"{_ci(e['delta_ppl_pct_ci'], '{:+.2f}'):<22} {', '.join(e['methods'])}")
    lines.append("set-level agreement (set score vs measured cost, ranks within each n; pooled ρ [95% CI]; τ):")
    pooled = sa["pooled"]
    for s, r in pooled["ground_truth_ppl"].items():
        k = pooled["ground_truth_kl"][s]
        lines.append(f"  {s:<15} vs ΔPPL ρ = {_n(r['spearman'])}{_ci(r['spearman_ci'])}, τ = {_n(r['kendall'])}"
                     f"{_ci(r['kendall_ci'])}; vs KL ρ = {_n(k['spearman'])}{_ci(k['spearman_ci'])}  "
                     f"({r['pairs']} pairs)")
    lines.append(sa["headline"])
    lines += [f"note (sets): {n}" for n in sa.get("notes", [])]
    return lines


def text_tables(d: dict) -> str:
    tasks = task_table(d)
    lines = ground_truth_table(d) + [""] + ([*tasks, ""] if tasks else []) + agreement_table(d) + [""]
    lines += stability_table(d) + [""] + region_table(d)
    lines += contracts_table(d)
    sa = set_agreement_table(d)
    lines += [""] + sa if sa else []
    lines += [f"note: {n}" for n in d.get("notes", [])]
    lines.append(caption(d))
    return "\n".join(lines)


def csv_text(d: dict) -> str:
    """One row per layer: ground truth with CIs and every signal's score (lower = safer); the caption first.  With
    a ``repair`` part, also the bridged ground truth (ΔPPL % with CI, KL, the bridge's form) and ``bridged_kl``,
    under the bridge's contract caption."""
    rep = d.get("repair") or {}
    buf = io.StringIO()
    if rep:
        buf.write(f"# {repair_caption(d)}\n")
    else:
        buf.write(f"# {caption(d)}\n")
    w = csv.writer(buf)
    sig = list(d["signals"])
    extra = ["bridged_delta_ppl_pct", "bridged_delta_ppl_pct_lo", "bridged_delta_ppl_pct_hi", "bridged_kl_to_base",
             "bridge_form", "bridged_kl"] if rep else []
    t = d.get("task_truth") or {}
    extra += ["acc_loss", "acc_loss_lo", "acc_loss_hi"] if t else []
    w.writerow(["layer", "delta_ppl_pct", "delta_ppl_pct_lo", "delta_ppl_pct_hi", "kl", "kl_lo", "kl_hi", *sig,
                *extra])
    g, b = d["ground_truth"], rep.get("ground_truth") or {}
    for i, k in enumerate(d["layers"]):
        more = [b["delta_ppl_pct"][i], *b["delta_ppl_pct_ci"][i], b["kl"][i],
                ((b.get("forms") or {}).get(str(k)) or {}).get("form"),
                (rep.get("signal") or {}).get("bridged_kl", [None] * len(d["layers"]))[i]] if rep else []
        more += [t["acc_loss"][i], *t["acc_loss_ci"][i]] if t else []
        w.writerow([k, g["delta_ppl_pct"][i], *g["delta_ppl_pct_ci"][i], g["kl"][i], *g["kl_ci"][i],
                    *[d["signals"][s][i] for s in sig], *more])
    return buf.getvalue()


def bridge_line(b: dict) -> str:
    """The bridge settings in words: "folded, 8192 calibration tokens in windows of 256, seed 0, ridge 0.0001"."""
    return (f"{b.get('form')}, {b.get('calib_tokens')} calibration tokens in windows of {b.get('calib_window')}, "
            f"seed {b.get('calib_seed')}, ridge {b.get('ridge'):g}")


def repair_caption(d: dict) -> str:
    """The evidence's contract caption plus the bridge settings and the calibration they were fitted on (an evidence
    dict with a ``repair`` part, :mod:`swapkl.evidence.repair`)."""
    c = d["repair"]["contract"]
    cal = c.get("calibration") or {}
    return (f"{caption(d)} · bridge {bridge_line(c['bridge'])} · calibration {cal.get('tokens')} tokens "
            f"({cal.get('windows')} windows) from {cal.get('region', '?')}")
