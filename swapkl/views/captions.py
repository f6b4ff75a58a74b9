"""The contract caption every figure, table and export carries, the one number formatter, and the exports
(:func:`figure_html`, :func:`table_csv`, their file names :func:`safe_name`) shared by the dashboard and the HTML report (no Streamlit).

Every figure carries the evaluation contract (:func:`contract_caption`) as its subtitle and in
``fig.layout.meta["contract"]``; every export carries it too.
"""
from __future__ import annotations

import base64
import html as _html
import math
from typing import Any

from swapkl.contract import SLOT, Provenance

SEP = " · "


# ============================================================================================ captions
def _fmt_model(m: dict | None) -> str:
    if not m:
        return "model ?"
    name = m.get("display") or m.get("id") or m.get("name_or_path") or m.get("name") or "?"
    rev = m.get("revision")
    parts = [str(name)]
    if rev and f"@{rev}" not in str(name):
        parts.append(f"@{rev}")
    commit = m.get("commit")
    fp = m.get("fingerprint") or m.get("sha256") or m.get("weights_sha256")
    extra = ""
    if commit:
        extra = f" (commit {str(commit)[:8]})"
    elif fp and not rev:
        extra = f" (fp {str(fp)[:8]})"
    return "".join(parts) + extra


def fmt_evaluator(ev: dict | None) -> str:
    if not ev:
        return ""
    if isinstance(ev, str):
        return f"evaluator {ev}"
    s = f"evaluator {ev.get('name', '?')}"
    bits = []
    if ev.get("max_words"):
        bits.append(f"{ev['max_words']} words")
    if ev.get("window"):
        bits.append(f"window {ev['window']}/stride {ev.get('stride', '?')}")
    if ev.get("drop_first_target"):
        bits.append("first target dropped")
    return s + (f" ({', '.join(bits)})" if bits else "")


def _contract_parts(c: dict) -> list[str]:
    parts = []
    if c.get("unit") and c["unit"] != "block":  # a sublayer unit leads: every number of it is that unit's
        parts.append(f"unit {c['unit']}")
    if c.get("per_layer") and c["per_layer"] != SLOT:  # the non-default definition of a block in another slot
        parts.append(f"per-layer {c['per_layer']}")
    if c.get("pairs") is not None:
        parts.append(f"pairs {c['pairs']}")
    if c.get("prompts") is not None and c.get("tokens") is not None:
        parts.append(f"{c['prompts']} prompts × {c['tokens']} tokens")
    if c.get("positions"):
        parts.append(f"positions {c['positions']}")
    if c.get("aggregation"):
        parts.append(f"aggregation {c['aggregation']}")
    if c.get("dtype"):
        parts.append(str(c["dtype"]))
    corpus = c.get("corpus_label") or c.get("corpus")
    if corpus:
        parts.append(f"corpus {corpus}")
    if c.get("seed") is not None:
        parts.append(f"seed {c['seed']}")
    return parts


def contract_caption(source: Any, evaluator: dict | str | None = None) -> str:
    """One line stating the evaluation contract of ``source``: a :class:`~swapkl.contract.Provenance`, or any
    result that gives one with ``provenance()`` (SwapResult, CurvesResult, Trajectory, Recommendation, Contract).
    A dict is not guessed at: build the result with its ``from_dict``, or use :func:`swapkl.removal.curves.curves_provenance`
    / :func:`swapkl.trajectory.compute.trajectory_provenance` for a curves or trajectory dict.

    Gives: model (display/id, revision or a fingerprint prefix), the unit (attention or mlp; nothing for whole
    blocks), the per-layer definition (block; nothing for the default, slot), pairs, prompts × tokens, positions,
    aggregation, dtype, corpus label, seed, the extra pieces (budget, spacing), and the perplexity evaluator when
    the source has one (``evaluator`` overrides it)."""
    prov = source
    if not isinstance(prov, Provenance):
        get = getattr(source, "provenance", None)
        if not callable(get):
            raise TypeError(f"contract_caption needs a Provenance or a result with provenance(), not "
                            f"{type(source).__name__}")
        prov = get()
    model = {"display": prov.model} if isinstance(prov.model, str) else prov.model
    parts = [_fmt_model(model)] if model is not None else []
    parts += _contract_parts(prov.contract or {}) + list(prov.extra)
    ev = evaluator or prov.evaluator
    if ev:
        parts.append(fmt_evaluator(ev))
    return SEP.join(parts)


def _wrap_caption(caption: str, width: int = 110) -> str:
    """Break a long caption at a separator for display (the pieces stay intact)."""
    if len(caption) <= width:
        return caption
    pieces = caption.split(SEP)
    lines, cur = [], ""
    for p in pieces:
        if cur and len(cur) + len(SEP) + len(p) > width:
            lines.append(cur)
            cur = p
        else:
            cur = f"{cur}{SEP}{p}" if cur else p
    lines.append(cur)
    return "<br>".join(lines)


def stamp(fig, title: str, caption: str, extra_top: int = 0):
    """Title + contract subtitle + ``layout.meta['contract']`` (other ``layout.meta`` keys are kept)."""
    n_lines = _wrap_caption(caption).count("<br>") + 1
    meta = fig.layout.meta if isinstance(fig.layout.meta, dict) else {}
    fig.update_layout(title={"text": title, "subtitle": {"text": _wrap_caption(caption), "font": {"size": 11}}},
                      meta=dict(meta, contract=caption), margin={"t": 72 + 15 * n_lines + extra_top})
    return fig


# ============================================================================================ helpers
def fmt_number(v, nd: int = 4, sci_from: float | None = 1e4) -> str:
    """The one number formatter of figures, tables and the report: ``nd`` decimals, scientific notation below
    ``10**-(nd-1)`` and from ``sci_from`` up (None: never for large values), "–" for None, NaN and inf; anything
    that is not a number as ``str(v)``."""
    if v is None:
        return "–"
    try:
        v = float(v)
    except (TypeError, ValueError):
        return str(v)
    if not math.isfinite(v):
        return "–"
    if v != 0 and (abs(v) < 10 ** -(nd - 1) or (sci_from is not None and abs(v) >= sci_from)):
        return f"{v:.{nd - 1}e}"
    return f"{v:.{nd}f}"


def fmt_ci(lo, hi) -> str:
    if lo is None or hi is None or not (math.isfinite(float(lo)) and math.isfinite(float(hi))):
        return ""
    return f" [{fmt_number(lo)}, {fmt_number(hi)}]"



# ============================================================================================ exports
def safe_name(s: str) -> str:
    """A download's file name made of ``s``: every character but letters, digits and ``-_.`` becomes ``-``, no leading
    or trailing ``-``, at most 60 characters; ``swapkl`` when nothing is left."""
    keep = "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in s)
    return keep.strip("-")[:60] or "swapkl"


def figure_html(fig, caption: str | None = None, include_plotlyjs: bool = True) -> str:
    """A self-contained HTML page of one figure: plotly.js inlined once (no network needed), the contract
    caption (``caption``, else the figure's ``layout.meta['contract']``) as a visible line and in <title>."""
    cap = caption
    if cap is None:
        meta = fig.layout.meta
        if isinstance(meta, dict):
            cap = meta.get("contract")
    div = fig.to_html(full_html=False, include_plotlyjs=include_plotlyjs, config={"displaylogo": False})
    title = _html.escape(fig.layout.title.text or "swapkl figure") if fig.layout.title else "swapkl figure"
    cap_html = f'<p class="contract">contract: {_html.escape(cap)}</p>' if cap else ""
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{title}</title></head><body>\n{div}\n{cap_html}\n</body></html>\n")


def table_csv(df, caption) -> str:
    """CSV text of ``df`` whose first line is ``# contract: <caption>`` (``caption``: a string, or anything
    :func:`contract_caption` accepts)."""
    cap = caption if isinstance(caption, str) else contract_caption(caption)
    cap = cap.replace("\n", " ").replace("\r", " ")
    return f"# contract: {cap}\n" + df.to_csv(index=False)


def rgba(hex_col: str, alpha: float) -> str:
    h = hex_col.lstrip("#")
    r, g, b = (int(h[x:x + 2], 16) for x in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# ============================================================================================ html and csv
def html_text(x) -> str:
    """``x`` as escaped HTML text."""
    return _html.escape(str(x))


def html_number(v, nd: int = 4) -> str:
    """:func:`fmt_number` in HTML: escaped, large values (perplexities) not scientific."""
    return html_text(fmt_number(v, nd, sci_from=None))


def html_table(df, caption: str | None = None, row_class=None, nd: int = 4) -> str:
    """``df`` as an HTML table (numbers through :func:`html_number`), its contract caption below."""
    head = "".join(f"<th class=\"l\">{html_text(c)}</th>" if df[c].dtype == object else f"<th>{html_text(c)}</th>"
                   for c in df.columns)
    rows = []
    for _, r in df.iterrows():
        cells = []
        for c in df.columns:
            v = r[c]
            if isinstance(v, bool) or type(v).__name__ == "bool_":
                cells.append(f"<td>{'yes' if v else ''}</td>")
            elif isinstance(v, float) or type(v).__name__.startswith("float"):
                cells.append(f"<td>{html_number(v, nd)}</td>")
            elif isinstance(v, (int,)) or type(v).__name__.startswith("int"):
                cells.append(f"<td>{int(v)}</td>")
            else:
                cells.append(f"<td class=\"l\">{html_text(v)}</td>")
        cls = f' class="{row_class(r)}"' if row_class and row_class(r) else ""
        rows.append(f"<tr{cls}>{''.join(cells)}</tr>")
    cap = f'<p class="caption">contract: {html_text(caption)}</p>' if caption else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{cap}"


def html_kv_table(items) -> str:
    rows = "".join(f"<tr><th class=\"l\">{html_text(k)}</th><td class=\"l\">{v}</td></tr>" for k, v in items)
    return f"<table><tbody>{rows}</tbody></table>"


def csv_link(df, caption: str, filename: str, label: str) -> str:
    """A download link holding :func:`table_csv` of ``df`` inline (no server needed)."""
    data = base64.b64encode(table_csv(df, caption).encode("utf-8")).decode("ascii")
    return f'<a download="{html_text(filename)}" href="data:text/csv;base64,{data}">{html_text(label)}</a>'
