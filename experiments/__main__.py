"""``python -m experiments run NAME [--key value ...]``: run one experiment with its CONFIG (overridden by the options
given) and stamp what it writes; ``python -m experiments list``.  See ``experiments/__init__.py``."""
from __future__ import annotations

import argparse
import ast
import json
import sys
import tempfile
from pathlib import Path

from benchmarks import _run

PKG = "experiments"
RUNS = _run.ROOT / PKG / "results" / "runs"


def config_of(path: Path) -> dict:
    """The module's top-level ``CONFIG`` dict (read without importing it), or ``{}`` (shell scripts)."""
    if path.suffix != ".py":
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def run(name: str, args: list[str], out: Path | None = None) -> dict:
    pkg, path = _run.find(name, packages=(PKG,))
    config = config_of(path)
    eff, argv = _run.with_config(config, args)
    tmp = None
    json_out = _run.json_option(argv)
    if json_out is None and path.suffix == ".py" and '"--json"' in path.read_text():
        tmp = tempfile.TemporaryDirectory(prefix=f"swapkl-exp-{name}-")
        json_out = str(Path(tmp.name) / f"{name}.json")
        argv = [*argv, "--json", json_out]
    child = _run.child_argv(pkg, path, argv)
    shown = ["python", "-m", PKG, "run", name, *args]
    prov = _run.provenance(shown, child=" ".join(child[1:] if child[0] == sys.executable else child))
    res = _run.run_child(child)
    record = {"experiment": name, "provenance": prov, "config": eff, "rc": res["rc"], "wall_s": res["wall_s"],
              "cpu_s": res["cpu_s"], "peak_rss_mib": res["peak_rss_mib"], "stdout": res["stdout"]}
    if json_out is not None:
        p = Path(json_out) if Path(json_out).is_absolute() else _run.ROOT / json_out
        if tmp is None:
            _run.stamp(p, prov)
            record["json"] = str(json_out)
        record["result"] = _run.read_json(p)
    if tmp is not None:
        tmp.cleanup()
    out = out or RUNS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"experiments: {name} rc={res['rc']} wall {res['wall_s']} s, peak {res['peak_rss_mib']} MiB -> "
          f"{out.relative_to(_run.ROOT) if out.is_relative_to(_run.ROOT) else out}", file=sys.stderr)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="every experiment and its configuration")
    r = sub.add_parser("run", help="run one experiment (other options go to it, over its CONFIG)")
    r.add_argument("name")
    r.add_argument("--record", type=Path, default=None,
                   help="where the run record goes (default experiments/results/runs/NAME.json)")
    a, rest = ap.parse_known_args(argv)
    if a.cmd == "list":
        for n in _run.names(PKG):
            print(f"{n:24s} {json.dumps(config_of(_run.find(n, packages=(PKG,))[1]))}")
        return 0
    return run(a.name, rest, a.record)["rc"]


if __name__ == "__main__":
    sys.exit(main())
