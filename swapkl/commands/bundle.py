"""``python -m swapkl bundle --scores S.json [--curves C.json ...] --out B.json``: every finished result of one
analysis in one demo bundle, which the dashboard opens with no model and no computation."""
from __future__ import annotations

from swapkl.commands.common import check_outputs


def register(sub) -> None:
    p = sub.add_parser("bundle", help="one demo file with every finished result of an analysis (for the dashboard)")
    p.add_argument("--scores", required=True, metavar="S.json", help="the 'score --json' result")
    p.add_argument("--curves", default=None, metavar="C.json", help="its 'curves --json' result")
    p.add_argument("--evidence", default=None, metavar="E.json", help="its 'evidence --json' result")
    p.add_argument("--tasks", default=None, metavar="T.json", help="its 'tasks --json' result")
    p.add_argument("--heal", default=None, metavar="H.json", help="its 'heal --json' healed curves")
    p.add_argument("--device", default=None, help="where it was computed, for the caption (default: cpu)")
    p.add_argument("--out", required=True, metavar="B.json", help="the bundle to write")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=run)


def run(a) -> int:
    from swapkl import schema
    from swapkl.compare.bundle import make_bundle, read_bundle, write_bundle
    from swapkl.removal.curves import CurvesResult
    from swapkl.scoring.results import SwapResult

    files = {"scores": a.scores, "curves": a.curves, "evidence": a.evidence, "tasks": a.tasks, "heal": a.heal}
    check_outputs(a, {"--out": a.out}, inputs=[f for f in files.values() if f])
    scores = SwapResult.load(a.scores)
    curves = CurvesResult.from_json(a.curves) if a.curves else None
    rest = {k: schema.read_json_file(files[k], f"{k} file", keep_constants=True) if files[k] else None
            for k in ("evidence", "tasks", "heal")}
    bundle = make_bundle(scores, curves, device=a.device, **rest)  # validated: a bundle that cannot open is not written
    write_bundle(a.out, bundle)
    if not a.quiet:
        b = read_bundle(a.out)
        print(f"wrote {a.out}: {', '.join(b.parts())} of {scores.identity.get('display') or '?'}; {b.caption()}")
    return 0
