"""One self-contained HTML report of a swap-KL analysis (no network needed to view it).

:func:`build_report` puts together, for whatever it is given:

* ``result`` (a :class:`~swapkl.scoring.results.SwapResult`, its JSON dict, or a path to a ``score --json`` file): model
  and contract, the regime verdict with its evidence (:func:`swapkl.scoring.verdict.regime_verdict` on the adjacent
  pairs, 0.10 nats threshold), summary statistics (gap distribution in nats with bootstrap CIs, KL ratio, counts
  below 0.05 / 0.10 nats, Pearson r, noise floor), the replacement/interchange heatmaps (one shared colour
  scale), the gap heatmap, the top-pairs table;
* ``curves`` (a ``CurvesResult``, its dict, or a path): ΔPPL %-vs-n removal curves, the removed-layers table,
  the ΔPPL ratio, the KL-to-base figure;
* ``trajectory`` (a ``Trajectory``, its ``to_json()`` dict, a path, or ``(stats_df, depth_df)``): the gap
  distribution, KL ratio and Pearson r over training, and gap vs depth at the last checkpoint.

plotly.js is inlined once in ``<head>``; every figure is a ``<div>`` plus one ``Plotly.newPlot`` call.  Every
figure and table carries the contract caption (:func:`swapkl.views.captions.contract_caption`).  No Streamlit here.
"""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from swapkl import __version__, schema
from swapkl.errors import SwapklError
from swapkl.removal.recommend import Recommendation
from swapkl.scoring.results import SwapResult
from swapkl.store import atomic_write_text
from swapkl.trajectory.compute import trajectory_provenance
from swapkl.scoring.verdict import regime_verdict
from swapkl.views.captions import fmt_evaluator, contract_caption, csv_link, html_kv_table, html_number, html_table, html_text
from swapkl.views.curves import kl_to_base_figure, removal_curves, removed_layers_table
from swapkl.views.repaired import curves_caption, repair_html, with_bridged
from swapkl.views.scores import gap_heatmap, heatmaps, top_pairs_table
from swapkl.views.trajectory import trajectory_figures

# Deferred imports: pandas and plotly are imported by the functions that build the HTML: the CLI's --help imports
# this module without them.

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;margin:2em auto;
     padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em} th,td{border:1px solid #ccc;padding:.25em .6em;
     text-align:right} th{background:#f3f3f3} td.l,th.l{text-align:left}
.caption{color:#555;font-size:.88em} .verdict{font-size:1.1em;padding:.7em 1em;border-left:5px solid #1f77b4;
     background:#f4f8fc} .verdict.weak{border-color:#999} .verdict.tied{border-color:#2ca02c}
.note{color:#8a6d3b} tr.disagree td{background:#fff4e5} .fig{margin:1em 0}
"""


# ============================================================================================ inputs
def _load_json(obj, keep_constants: bool = False) -> Any:
    """A dict as it is; JSON text or a path parsed within :mod:`swapkl.schema`'s size and depth limits."""

    if isinstance(obj, (str, Path)) and not (isinstance(obj, str) and obj.lstrip().startswith("{")):
        return schema.read_json_file(obj, "file", keep_constants=keep_constants)
    if isinstance(obj, (str, bytes)):
        return schema.parse_json(obj, "JSON text", keep_constants=keep_constants)
    return obj


def as_result(obj):
    """A SwapResult from a SwapResult, its ``to_json()`` dict, JSON text or a path to a ``score --json`` file
    (validated by :func:`swapkl.schema.result_fields`)."""

    if obj is None or isinstance(obj, SwapResult):
        return obj
    d = _load_json(obj, keep_constants=True)
    if not isinstance(d, dict) or "per_prompt" not in d:
        raise SwapklError("not a swapkl score result (expected the JSON written by 'python -m swapkl score --json')")
    return SwapResult.from_json(d, _label("scores file", obj))


def as_curves(obj) -> dict | None:
    """A curves dict (``CurvesResult.to_dict()`` form) from a CurvesResult, dict, JSON text or path (validated
    by :func:`swapkl.schema.curves_fields`)."""

    if obj is None:
        return None
    if hasattr(obj, "to_dict") and hasattr(obj, "methods"):
        return obj.to_dict()
    d = _load_json(obj, keep_constants=True)
    if not isinstance(d, dict) or "methods" not in d:
        raise SwapklError("not a swapkl curves file (expected the JSON written by 'python -m swapkl curves --json')")
    return schema.curves_fields(d, _label("curves file", obj))


def _label(what: str, obj) -> str:
    """``what`` plus the path when ``obj`` is one (for messages)."""
    if isinstance(obj, Path) or (isinstance(obj, str) and not obj.lstrip().startswith("{")):
        return f"{what} {obj}"
    return what


def as_trajectory(obj):
    """``(dict or None, stats_df, depth_df)`` from a Trajectory, its ``to_json()`` dict, a path, or a
    ``(stats_df, depth_df)`` tuple."""
    if obj is None:
        return None
    if isinstance(obj, tuple) and len(obj) == 2:
        return None, obj[0], obj[1]
    if isinstance(obj, tuple) and len(obj) == 3:  # already converted
        return obj
    if hasattr(obj, "to_dict") and hasattr(obj, "specs"):
        obj = obj.to_dict()
    d = _load_json(obj)
    if not isinstance(d, dict) or "summary" not in d:
        raise SwapklError("not a swapkl trajectory result (expected the JSON written by "
                          "'python -m swapkl trajectory ... --json')")
    import pandas as pd

    stats = pd.DataFrame(d.get("summary") or [])
    depth = pd.DataFrame(d["gap_vs_depth"]) if d.get("gap_vs_depth") else None
    return d, stats, depth


class _Figures:
    """Collects figures as divs (plotly.js is added once by the page)."""

    def __init__(self):
        self.count = 0

    def __call__(self, fig) -> str:
        self.count += 1
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"swapkl-fig-{self.count}",
                          config={"displaylogo": False, "responsive": True})
        return f'<div class="fig">{div}</div>'


@dataclass(frozen=True)
class Section:
    """A report section built by a tier above ``views`` (evidence, healing, task accuracy), which this module must
    not import: ``title`` (the ``<h2>`` text), ``intro`` (HTML paragraphs, already escaped), ``figures`` (plotly
    figures, drawn in order), ``blocks`` (HTML blocks after the figures: tables, CSV links; already escaped).  Each
    block should carry its contract caption (:func:`swapkl.views.captions.html_table` does)."""

    title: str
    intro: str = ""
    figures: tuple = ()
    blocks: tuple = ()

    def html(self, fig) -> str:
        return "\n".join([f"<h2>{html_text(self.title)}</h2>", self.intro]
                         + [fig(f) for f in self.figures] + list(self.blocks))


# ============================================================================================ sections
def report_verdict(result, curves: dict | None) -> dict | None:
    """The regime verdict on the adjacent pairs: from the result when given, else the curves' stored verdict;
    ``{"error": message}`` when the adjacent pairs are not scored."""
    if result is not None:
        try:
            return regime_verdict(result.replacement(), result.interchange())
        except SwapklError as e:
            return {"error": str(e)}
    if curves and curves.get("verdict"):
        return curves["verdict"]
    return None


def _verdict_html(v: dict | None) -> str:
    if v is None:
        return ""
    if "error" in v:
        return f'<h2>Regime verdict</h2><p class="note">{html_text(v["error"])}</p>'
    ev = v.get("evidence", {})
    rows = []
    for name in ("replacement", "interchange"):
        e = ev.get(name) or {}
        rows.append(f"<tr><td class=\"l\">{name}</td><td>{e.get('n_pairs', '–')}</td><td>{e.get('below_0.05', '–')}"
                    f"</td><td>{e.get('below_threshold', '–')}</td><td>{html_number(e.get('min'))}</td>"
                    f"<td>{html_number(e.get('median'))}</td><td class=\"l\">{html_text(tuple(e.get('best_pair') or ()))}</td></tr>")
    thr = ev.get("threshold", 0.10)
    pairs = ev.get("pairs", "adjacent")
    pairs_txt = "adjacent pairs" if pairs == "adjacent" else f"pairs {pairs}"
    return (f"<h2>Regime verdict</h2><p class=\"verdict {html_text(v.get('regime', ''))}\"><b>{html_text(v.get('regime', ''))}"
            f"</b> (prefer: {html_text(v.get('prefer', ''))}) — {html_text(v['sentence'])}</p>"
            f"<p>Evidence on the {html_text(pairs_txt)}; a protocol is <i>low</i> when some pair scores below "
            f"{html_number(thr, 2)} nats.</p>"
            "<table><thead><tr><th class=\"l\">protocol</th><th>pairs</th><th>&lt; 0.05 nats</th>"
            f"<th>&lt; {html_number(thr, 2)} nats</th><th>min (nats)</th><th>median (nats)</th><th class=\"l\">best pair"
            f"</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
            f"<p>KL ratio d_inter / d_repl: median over pairs {html_number(ev.get('kl_ratio_median'), 3)}, best-to-best "
            f"{html_number(ev.get('kl_ratio_best'), 3)}.</p>")


def _model_html(result, curves: dict | None) -> str:
    if result is not None:
        ident, c = result.identity or {}, result.contract or {}
        items = [("model", html_text(ident.get("display") or ident.get("id") or "?")),
                 ("source", html_text(ident.get("id", "–"))),
                 ("revision / commit", html_text(ident.get("revision") or "–") +
                  (f" / {html_text(ident['commit'])}" if ident.get("commit") else "")),
                 ("fingerprint", html_text((ident.get("fingerprint") or "–")[:16])),
                 ("family / layers", f"{html_text(ident.get('family', '?'))} / {result.num_layers}"),
                 ("pairs", f"{html_text(c.get('pairs'))} ({len(result.pairs)} scored)"),
                 ("prompts × tokens", f"{html_text(c.get('prompts'))} × {html_text(c.get('tokens'))} (seed {html_text(c.get('seed'))})"),
                 ("positions", html_text(c.get("positions"))), ("aggregation of d_repl", html_text(c.get("aggregation"))),
                 ("dtype (KL in)", f"{html_text(c.get('dtype'))} ({html_text(c.get('kl_dtype', 'float32'))})"),
                 ("corpus", html_text(c.get("corpus_label") or c.get("corpus") or "–")),
                 ("noise floor", f"{html_number(result.noise_floor)} nats" if result.noise_floor is not None else "–")]
        meta = result.meta or {}
        if meta.get("seconds") is not None:
            items.append(("compute", f"{html_text(meta.get('computed_pairs'))} pairs computed, "
                                     f"{html_text(meta.get('cached_pairs'))} from cache, {meta['seconds']:.1f} s "
                                     f"on {html_text(meta.get('device', '?'))}"))
    else:
        m = (curves or {}).get("model") or {}
        items = [("model", html_text(m.get("display") or m.get("id") or m.get("name_or_path") or "?")),
                 ("layers", html_text(m.get("num_layers", "?")))]
    if curves:
        ev = curves.get("evaluator") or {}
        items.append(("perplexity evaluator", html_text(fmt_evaluator(ev))))
        corpus = curves.get("corpus") or {}
        if corpus:
            items.append(("perplexity text", html_text(corpus.get("label") or corpus.get("name"))))
    return "<h2>Model and contract</h2>" + html_kv_table(items)


def _summary_html(result) -> str:
    s = result.summary(ci=True)
    if not s.get("pairs"):
        return "<h2>Summary statistics</h2><p class=\"note\">no pairs scored</p>"
    g = s["gap"]

    def ci(key):
        v = g.get(key)
        return f" [{html_number(v[0])}, {html_number(v[1])}]" if v else ""

    rows = [("pairs scored", str(s["pairs"])),
            ("gap d_repl − d_inter, mean (nats)", html_number(g["mean"]) + ci("mean_ci")),
            ("gap median (nats)", html_number(g["median"]) + ci("median_ci")),
            ("gap p75 / max / min (nats)", f"{html_number(g['p75'])} / {html_number(g['max'])} / {html_number(g['min'])}"),
            ("pairs with negative gap (d_inter > d_repl)", str(g["negative_pairs"])),
            ("KL ratio d_inter / d_repl, mean / median", f"{html_number(s['kl_ratio']['mean'], 3)} / "
                                                         f"{html_number(s['kl_ratio']['median'], 3)}"),
            ("Pearson r (d_repl vs d_inter over pairs)", html_number(s.get("pearson"), 3))]
    for name in ("replacement", "interchange"):
        p = s[name]
        rows.append((f"{name}: best pair, value (nats)", f"{html_text(tuple(p['best_pair']))} {html_number(p['best'])}"))
        rows.append((f"{name}: pairs &lt; 0.05 / &lt; 0.10 nats, median", f"{p['strong']} / {p['conditional']}, "
                                                                           f"{html_number(p['median'])}"))
    body = "".join(f"<tr><th class=\"l\">{k if '&lt;' in k else html_text(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return ("<h2>Summary statistics</h2><p>All values in nats (KL(base ‖ variant), mean over prompts); 95 % "
            f"bootstrap intervals over prompts (1,000 resamples) in brackets.</p><table><tbody>{body}</tbody></table>")


def _curves_html(curves: dict, fig, caption: str) -> str:
    out = ["<h2>Removal curves</h2>",
           f"<p>Baseline perplexity {html_number(curves.get('baseline_ppl'), 3)}"
           + (f" [{html_number(curves['baseline_ppl_ci'][0], 3)}, {html_number(curves['baseline_ppl_ci'][1], 3)}]"
              if curves.get("baseline_ppl_ci") else "") + "; ΔPPL in % of the baseline.</p>",
           fig(with_bridged(removal_curves(curves, caption=caption), curves)), repair_html(curves, caption)]
    tbl = removed_layers_table(curves)
    if len(tbl):
        out.append("<h3>Removed layers</h3>")
        out.append(html_table(tbl, caption, row_class=lambda r: "disagree" if r.get("repl_vs_inter_differ") else ""))
        out.append(csv_link(tbl, caption, "removed_layers.csv", "download CSV"))
    if curves.get("delta_ratio"):
        import pandas as pd
        dr = pd.DataFrame([{"n": x["n"], "ΔPPL % interchange": x.get("interchange_delta_pct"),
                            "ΔPPL % replacement": x.get("replacement_delta_pct"), "ratio": x.get("ratio")}
                           for x in curves["delta_ratio"]])
        out.append("<h3>ΔPPL ratio (interchange-guided / replacement-guided)</h3>")
        out.append(html_table(dr, caption, nd=3))
    if any(e.get("kl_to_base") is not None for es in (curves.get("methods") or {}).values() for e in es):
        out.append("<h3>KL of the pruned model to the base model</h3>")
        out.append(fig(kl_to_base_figure(curves, caption=caption)))
    from swapkl.views.units import cost_gain_html  # the measured gains beside ΔPPL, when the curves have them

    out.append(cost_gain_html(curves, caption))
    for n in curves.get("notes") or []:
        out.append(f'<p class="note">note: {html_text(n)}</p>')
    return "\n".join(out)


def _recommend_html(curves: dict) -> str:
    """"Recommended removal": the table of :meth:`swapkl.removal.recommend.Recommendation.table` (captioned with its
    contract, calibration included) and one sentence per n."""

    try:
        rec = Recommendation.from_curves(curves)
    except (SwapklError, KeyError, TypeError):
        return ""
    cap = contract_caption(rec)
    out = ["<h2>Recommended removal</h2>",
           f"<p>Chosen on calibration text only ({html_text(rec.calibration_caption())}; never the test text) by "
           f"a beam search (width {html_text(rec.settings.get('width'))}) seeded "
           f"by every method's sets, with {html_text(rec.stats.get('evaluations'))} calibration evaluations "
           f"(SLEB-iterative: {html_text(rec.stats.get('sleb_evaluations'))}); rule: "
           f"{html_text(rec.settings.get('choice', 'lowest calibration PPL'))}. ΔPPL is held-out.</p>",
           html_table(rec.table(), cap, nd=4)]
    out += [f"<p>{html_text(rec.explain(e['n']))}</p>" for e in rec.entries]
    if rec.paired:
        tbl = rec.paired_table()
        out += ["<h3>Recommend against every method, paired on the held-out windows</h3><p>ΔPPL %(recommend) − "
                "ΔPPL %(method) in points with its paired bootstrap 95 % CI (1,000 resamples of the windows); "
                "tie when the CI includes 0; random: its mean over seeds.</p>",
                html_table(tbl, cap, nd=2), csv_link(tbl, cap, "recommend_paired.csv", "download CSV")]
    return "\n".join(out)


# ============================================================================================ the report
def build_report(result=None, curves=None, trajectory=None, title: str | None = None, out=None,
                 top_k: int = 10, sections: Sequence[Section] = ()) -> str:
    """The HTML text of a self-contained report (see the module docstring); written to ``out`` when given.

    Figures: 2 with ``result`` (heatmaps, gap), 1–2 with ``curves`` (ΔPPL curves; KL to base when recorded),
    3–4 with ``trajectory``, plus each :class:`Section`'s own (appended after the rest, in order).  Raises
    :class:`SwapklError` when given nothing."""
    result = as_result(result)
    curves = as_curves(curves)
    traj = as_trajectory(trajectory)
    sections = tuple(sections)
    if result is None and curves is None and traj is None and not sections:
        raise SwapklError("nothing to report: give a score result, removal curves, a trajectory or a section")
    fig = _Figures()
    caption = contract_caption(result) if result is not None else (
        curves_caption(curves) if curves is not None
        else contract_caption(trajectory_provenance(traj[0] or {})) if traj is not None else "")  # "": sections only
    if title is None:
        name = (result.identity.get("display") if result is not None else None) or (
            ((curves or {}).get("model") or {}).get("display")) or "swap-KL"
        title = f"swapkl report: {name}"
    parts = [f"<h1>{html_text(title)}</h1>",
             f'<p class="caption">contract: {html_text(caption)}</p>' if caption else "",
             f'<p class="caption">generated {_dt.datetime.now().strftime("%Y-%m-%d %H:%M")} by swapkl '
             f'{html_text(_version())}; swap-KL = KL(base ‖ variant) in nats: replacement runs block j\'s weights in slot '
             f'i (d_repl = {html_text(result.aggregation if result is not None else "max")} of the two directions), '
             f'interchange swaps blocks i and j.</p>']
    parts.append(_model_html(result, curves) if result is not None or curves is not None else "")
    parts.append(_verdict_html(report_verdict(result, curves)))
    if result is not None:
        parts.append(_summary_html(result))
        parts.append("<h2>Swap-KL matrices</h2><p>Lower = more redundant; blank = not computed. Hover a cell for "
                     "both protocols with 95 % bootstrap intervals.</p>")
        parts.append(fig(heatmaps(result, caption=caption)))
        parts.append("<h2>Protocol gap</h2><p>Red: replacement finds the pair less swappable than interchange "
                     "does; blue: the reverse (d_inter can exceed d_repl; the order is not guaranteed).</p>")
        parts.append(fig(gap_heatmap(result, caption=caption)))
        top = top_pairs_table(result, k=top_k)
        parts.append(f"<h2>Most redundant pairs (top {len(top)})</h2><p>Highlighted rows: the pairs differ "
                     "between the two rankings (in one top-k but not the other).</p>")
        parts.append(html_table(top, caption, row_class=lambda r: "disagree" if r["disagree"] else ""))
        parts.append(csv_link(top, caption, "top_pairs.csv", "download CSV") + " · " +
                     csv_link(result.pair_table(), caption, "pairs.csv", "all pairs with CIs (CSV)"))
    if curves is not None:
        parts.append(_curves_html(curves, fig, curves_caption(curves)))
        if "recommend" in (curves.get("methods") or {}):
            parts.append(_recommend_html(curves))
    if traj is not None:
        tdict, stats, depth = traj
        tcap = contract_caption(trajectory_provenance(tdict)) if tdict else caption
        figs = trajectory_figures(stats, depth, caption=tcap)
        parts.append("<h2>Training trajectory</h2>")
        if tdict and tdict.get("checkpoints"):
            parts.append("<p>Checkpoints: " + ", ".join(html_text(c.get("label") or c.get("spec"))
                                                        for c in tdict["checkpoints"]) + "</p>")
        for key in ("gap", "kl_ratio", "pearson", "depth"):
            if key in figs:
                parts.append(fig(figs[key]))
        cols = [c for c in ("step", "label", "pairs", "gap_mean", "gap_median", "gap_p75", "gap_max", "ratio_mean",
                            "ratio_median", "kl_ratio_mean", "kl_ratio_median", "pearson") if c in stats.columns]
        if cols:
            parts.append(html_table(stats[cols], tcap))
    parts.extend(sec.html(fig) for sec in sections)
    doc = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
           f"<title>{html_text(title)}</title><style>{CSS}</style>\n"
           f"<script type=\"text/javascript\">{_plotlyjs()}</script>\n</head><body>\n"
           + "\n".join(p for p in parts if p) + "\n</body></html>\n")
    if out is not None:
        atomic_write_text(out, doc)
    return doc


def figure_count(html_text: str) -> int:
    """Number of plotly figures in a report (one ``Plotly.newPlot`` call each)."""
    return html_text.count("Plotly.newPlot(")


def _plotlyjs() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def _version() -> str:
    return __version__
