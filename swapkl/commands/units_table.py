"""The common-axis table (and figure) of ``swapkl curves --with``: blocks, attention and MLP removal sets of one
model against the share of non-embedding parameters they remove, with ΔPPL and the measured gains."""
from __future__ import annotations


def common_axis_table(rows: list[dict]) -> str:
    """Rows of :func:`swapkl.views.units.common_axis_rows` as aligned text lines, by parameters removed."""
    lines = ["common axis: unit  method  n  non-emb params removed  ΔPPL % [CI]  prefill×  decode×  memory×"]
    for r in sorted(rows, key=lambda r: (r["params_removed_pct"] is None, r["params_removed_pct"] or 0, r["unit"])):
        ci = r.get("delta_pct_ci")
        ci_txt = f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci and None not in ci else ""
        pr = "-" if r["params_removed_pct"] is None else f"{r['params_removed_pct']:.1f}%"
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        lines.append(f"  {r['unit']:<9} {r['method']:<14} {r['n']:<3} {pr:>7}  {r['delta_pct']:+8.2f}{ci_txt}  "
                     f"{fmt(r['prefill_speedup'])}  {fmt(r['decode_speedup'])}  {fmt(r['memory_ratio'])}")
    return "\n".join(lines)


def common_axis_output(curves_list, figure_path=None) -> str:
    """The table's text; writes the figure to ``figure_path`` (HTML) when given."""
    from swapkl.store import atomic_write_text
    from swapkl.views.captions import figure_html
    from swapkl.views.units import common_axis_figure, common_axis_rows

    text = common_axis_table(common_axis_rows(curves_list))
    if figure_path:
        atomic_write_text(figure_path, figure_html(common_axis_figure(curves_list)))
        text += f"\ncommon-axis figure written to {figure_path}"
    return text
