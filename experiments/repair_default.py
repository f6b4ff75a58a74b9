"""Issue 36's table on the built-in default: removal curves raw and bridged for eight methods, and each
bridge-guided method's bridged set (``bridge``, ``bridge-joint``) against every other method's bridged set on the
same windows.

    HF_HUB_OFFLINE=1 python -m experiments run repair_default [--budget 4] [--max-words 1000] [--prompts 16] [--tokens 32]
                                                    [--json OUT]

Runs ``swapkl curves default --repair bridge --methods replacement,interchange,bridge,bridge-joint,replaceme,bi,sleb,random``
with the given contract (scores on adjacent pairs; the held-out evaluator ``matched`` shortened to ``--max-words``;
the shipped WikiText-2 copy unless ``$SWAPKL_CORPUS`` names another text) -- the command prints its own raw vs bridged
table with the paired bridged − raw CI -- then reads every bridged evaluation back from the run's evaluation memo
(``<cache>/ppl/``: per-window NLLs, nothing evaluated again) and prints, per n:

* the best bridged method against the best raw cut (the goal: at most half of it at n = 4);
* each of ``bridge`` and ``bridge-joint`` (sets chosen by bridged KL) minus each other method, both bridged, as ΔPPL points with the paired
  bootstrap 95 % CI over the same windows (``swapkl.removal.recommend.paired.paired_delta``; a seeded method: the mean over its
  seeds) and better / tie / worse (the goal: never significantly worse).

A second run with the same settings reads everything from the cache (the calibration fits of sets not yet evaluated
excepted).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
METHODS = "replacement,interchange,bridge,bridge-joint,replaceme,bi,sleb,random"
FOCUS = ("bridge", "bridge-joint")


#: the configuration of the run the docs quote: the runner (python -m experiments run repair_default) passes each as --key value unless the command line gives it
CONFIG = {
    'budget': 4,
    'max_words': 1000,
    'prompts': 16,
    'tokens': 32,
}


def _module(*names: str):
    """The first of the module ``names`` that imports: the experiment also runs on a tree from before a module moved
    (``python -m benchmarks compare BASE HEAD repair_default`` runs this file on both trees)."""
    import importlib

    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    return importlib.import_module(names[-1])


def _memo_entries(identity: dict) -> dict:
    """``{(text_key, frozenset(removed)): (window_nll, window_counts)}`` of every evaluation in the model's memo."""
    from swapkl.store import read_entry

    memo = _module("swapkl.measure.memo", "swapkl.removal.memo")
    KIND, disk_memo = memo.KIND, memo.disk_memo

    out = {}
    folder = disk_memo(identity, kl=True).disk
    for f in sorted(folder.glob("*.json")) if folder is not None else []:
        d = read_entry(f, KIND)
        if d is not None:
            out[(d["text_key"], frozenset(d["removed"]))] = (np.asarray(d["window_nll"], float),
                                                             np.asarray(d["window_counts"], np.int64))
    return out


def _keys(entries: dict, curves: dict) -> tuple[str, str]:
    """The raw and the bridged text keys of this run: the baseline whose scored tokens and PPL are the run's, and
    the one key extending it under which every bridged set of the run was evaluated."""
    base = curves["baseline"]
    raw = [k for (k, s), (nll, c) in entries.items() if not s and int(c.sum()) == base["n_scored"]
           and abs(np.exp(nll.sum() / c.sum()) - base["ppl"]) < 1e-6 * base["ppl"]]
    if len(set(raw)) != 1:
        raise SystemExit(f"cannot tell this run's evaluations in the memo apart ({len(set(raw))} candidates)")
    raw_key = raw[0]
    wanted = {frozenset(e["removed"]) for rows in curves["methods"].values() for e in rows if e.get("removed")}
    bridged = [k for k in {k for k, _ in entries} if k.startswith(raw_key + "|bridge:")
               and wanted <= {s for kk, s in entries if kk == k}]
    if len(bridged) != 1:
        raise SystemExit(f"cannot find this run's bridged evaluations in the memo ({len(bridged)} candidates)")
    return raw_key, bridged[0]


def _sets(curves: dict, name: str, n: int) -> list:
    if name in curves.get("random_seeds", {}):
        return [v[n - 1]["removed"] for v in curves["random_seeds"][name].values() if len(v) >= n]
    return [e["removed"] for e in curves["methods"].get(name, []) if e["n"] == n and e.get("removed")]


def compare(curves: dict, entries: dict) -> list[dict]:
    """Per n: the best bridged and best raw ΔPPL %, and each :data:`FOCUS` method − each other method (both
    bridged), paired (``vs[focus]``)."""
    paired_delta = _module("swapkl.removal.recommend.paired", "swapkl.removal.paired").paired_delta

    raw_key, br_key = _keys(entries, curves)
    base_nll, counts = entries[(raw_key, frozenset())]
    rows = []
    for n in range(1, curves["budget"] + 1):
        best_raw = min(((e["delta_pct"], m) for m, es in curves["methods"].items() for e in es if e["n"] == n))
        best_br = min(((e["delta_pct"], m) for m, es in curves["repaired"].items() for e in es if e["n"] == n))
        vs = {}
        for f in FOCUS:
            focus = _sets(curves, f, n)
            if f not in curves["repaired"] or not focus:
                continue
            comps = vs[f] = []
            for name in curves["repaired"]:
                if name == f:
                    continue
                others = [entries[(br_key, frozenset(s))][0] for s in _sets(curves, name, n)]
                st = paired_delta(entries[(br_key, frozenset(focus[0]))][0], others, base_nll, counts)
                comps.append({"method": name} | st)
        rows.append({"n": n, "best_raw": best_raw, "best_bridged": best_br, "vs": vs})
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--max-words", type=int, default=1000)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    os.environ.setdefault("SWAPKL_CORPUS", str(ROOT / "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"))
    from swapkl.commands.cli import main as swapkl

    with tempfile.TemporaryDirectory(prefix="swapkl-repair-") as d:
        out = Path(d) / "curves.json"
        args = ["curves", "default", "--budget", str(a.budget), "--repair", "bridge", "--methods", METHODS,
                "--evaluator", "matched", "--max-words", str(a.max_words), "--pairs", "adjacent",
                "--prompts", str(a.prompts), "--tokens", str(a.tokens), "--json", str(out)]
        print("swapkl " + " ".join(args[:-2]), flush=True)
        if swapkl(args) != 0:
            raise SystemExit("the curves run failed")
        curves = json.loads(out.read_text())
    rows = compare(curves, _memo_entries(curves["model"]))
    print(f"\nbridge-guided sets (bridged) minus each method's (bridged), ΔPPL points [paired 95 % CI] "
          f"({curves['evaluator']['name']}, {curves['baseline']['n_windows']} windows):")
    for r in rows:
        (raw, m_raw), (br, m_br) = r["best_raw"], r["best_bridged"]
        print(f"n={r['n']}: best raw {m_raw} {raw:+.1f} %, best bridged {m_br} {br:+.1f} % "
              f"({br / raw:.2f} of the best raw cut)")
        for f, comps in r["vs"].items():
            for c in comps:
                lo, hi = c["ci"]
                print(f"    {f:>12} − {c['method']:<12} {c['diff']:+8.1f} [{lo:+.1f}, {hi:+.1f}]  {c['word']}")
    report = {"contract": {"evaluator": curves["evaluator"], "plan": curves["plan"], "repair": curves["repair"]
                           and {k: curves["repair"][k] for k in ("settings", "calibration")}}, "rows": rows}
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
    return report


if __name__ == "__main__":
    main()
