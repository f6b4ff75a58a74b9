"""``python -m swapkl families``: which model types swapkl supports, measured (docs/families.md).

Without arguments it prints the support table shipped with swapkl (one row per model type of the transformers it
was measured on).  ``families MODEL ...`` says, for a hub id, a local folder or a model type, whether its family is
supported, from its config alone (nothing but ``config.json`` is fetched).  ``--check`` measures the table again on
the installed transformers: a tiny random model of every model type (or of ``--types``), checked in parallel child
processes (minutes); ``--write`` stores it as the shipped table and ``--markdown FILE`` writes docs/families.md.
"""
from __future__ import annotations

import sys

from swapkl.errors import SwapklError


def register(sub) -> None:
    p = sub.add_parser("families", help="which model types are supported (measured on tiny models; docs/families.md)")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="hub id[@revision], local folder or model type: is it supported? (reads its config only)")
    p.add_argument("--check", action="store_true",
                   help="measure the table on the installed transformers (a tiny model per model type; minutes)")
    p.add_argument("--types", default=None, help="with --check: only these model types, comma-separated")
    p.add_argument("--workers", type=int, default=2, help="with --check: model types checked at once (default 2)")
    p.add_argument("--write", action="store_true", help="with --check: store the result as swapkl's support table")
    p.add_argument("--markdown", default=None, metavar="FILE", help="write the table as Markdown (docs/families.md)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the table's rows as JSON")
    p.add_argument("--all", action="store_true", help="list the model types that are not decoder-only LMs too")
    p.set_defaults(func=run)


def run(a) -> int:
    from swapkl.model.supported import support_table

    if a.models:
        return _models(a.models)
    if a.check:
        rows, version = _check(a)
    else:
        table = support_table()
        if not table["rows"]:
            raise SwapklError("swapkl's support table is missing; run 'swapkl families --check --write'")
        rows, version = table["rows"], table["transformers"]
    if a.json:
        from swapkl.store import dump_json

        dump_json({"format": "swapkl.support/1", "transformers": version, "rows": rows}, a.json)
    if a.markdown:
        from swapkl.store import atomic_write_text
        from swapkl.support.table import markdown

        atomic_write_text(a.markdown, markdown(rows, version))
    print(render(rows, version, a.all))
    return 0


def _check(a) -> tuple[dict, str]:
    import transformers

    from swapkl.model.tiny import causal_lm_types
    from swapkl.support.table import rows_of, run_checks, write_table

    known = causal_lm_types()
    types = [t.strip() for t in a.types.split(",") if t.strip()] if a.types else known
    unknown = [t for t in types if t not in known]
    if unknown:
        raise SwapklError(f"unknown model type(s) {', '.join(unknown)}; transformers {transformers.__version__} "
                          f"has {len(known)} causal-LM model types (swapkl families lists them)")
    done = [0]

    def say(row):
        done[0] += 1
        print(f"  {done[0]}/{len(types)} {row['model_type']}: {row['status']}", file=sys.stderr, flush=True)

    rows = rows_of(run_checks(types, workers=a.workers, on_row=say))
    if a.write:
        if a.types:
            raise SwapklError("--write stores the whole table: leave out --types")
        write_table(rows)
    return rows, transformers.__version__


def _models(specs: list[str]) -> int:
    from swapkl.model.supported import support_line, support_table
    from swapkl.model.tiny import causal_lm_types

    code = 0
    for spec in specs:
        if spec in support_table()["rows"] or spec in causal_lm_types():
            ok, line = support_line(spec)
        else:
            from swapkl.model.checkpoints import load_config, parse_spec

            config = load_config(parse_spec(spec))
            try:
                text = config.get_text_config()
            except Exception:  # several text configs: judged by the model type alone
                text = config
            ok, line = support_line(config.model_type, text.model_type if text is not config else None)
            line = f"{spec}: {line}"
        print(line)
        code = max(code, 0 if ok is not False else 1)
    return code


def render(rows: dict, version: str | None, everything: bool = False) -> str:
    from swapkl.support.table import summary

    s = summary(rows)
    c = s["counts"]
    lines = [f"swapkl's support table (measured on tiny models, transformers {version}): "
             f"{c.get('exact', 0)} of {s['decoder_only']} decoder-only model types exact "
             f"({100 * s['exact_share']:.1f} %); " + ", ".join(f"{n} {k}" for k, n in sorted(c.items()) if k != "exact")]
    width = max(len(t) for t in rows)
    for t, r in rows.items():
        if r["status"] == "not decoder-only" and not everything:
            continue
        detail = r["reason"] if r["status"] != "exact" else "; ".join(
            f"{k} {r[k]}" for k in ("slot", "sublayers", "export", "bridge") if k in r and r[k] != "exact")
        lines.append(f"  {t:<{width}}  {r['status']:<16} {detail}"[:220])
    return "\n".join(lines)
