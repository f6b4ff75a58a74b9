"""``python -m benchmarks {list,run,compare}``: see ``benchmarks/__init__.py``."""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from benchmarks import _run

PKG = "benchmarks"
RESULTS = _run.ROOT / PKG / "results"
#: result keys that hold timings or memory (left out of the BASE / HEAD number check)
TIMING_WORDS = ("second", "cpu", "wall", "time", "timing", "rss", "mib", "mem", "peak_bytes", "ratio", "speed", "date")


def record(entry: dict, commit: str | None = None) -> Path:
    """Append ``entry`` to ``benchmarks/results/<machine>/<commit>.json`` (made on first use)."""
    path = RESULTS / _run.machine() / f"{commit or _run.commit()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    d = _run.read_json(path) or {"machine": _run.machine(), "commit": commit or _run.commit(), "runs": []}
    d["runs"].append(entry)
    path.write_text(json.dumps(d, indent=1) + "\n")
    return path


def _with_json(path: Path, args: list[str], tmp: Path, tag: str) -> tuple[list[str], Path | None]:
    given = _run.json_option(args)
    if given is not None:
        return args, Path(given)
    if path.suffix == ".py" and '"--json"' in path.read_text():
        out = tmp / f"{tag}.json"
        return [*args, "--json", str(out)], out
    return args, None


def run(name: str, args: list[str]) -> int:
    pkg, path = _run.find(name)
    with tempfile.TemporaryDirectory(prefix=f"swapkl-bench-{name}-") as tmp:
        argv, out = _with_json(path, args, Path(tmp), name)
        prov = _run.provenance(["python", "-m", PKG, "run", name, *args])
        res = _run.run_child(_run.child_argv(pkg, path, argv))
        result = _run.read_json(out) if out is not None else None
        if out is not None and _run.json_option(args) is not None:
            _run.stamp(out, prov)
    entry = {"name": name, "args": args, "rc": res["rc"], "wall_s": res["wall_s"], "cpu_s": res["cpu_s"],
             "peak_rss_mib": res["peak_rss_mib"], "provenance": prov, "result": result,
             "stdout_tail": res["stdout"][-4000:]}
    where = record(entry)
    print(f"benchmarks: {name} rc={res['rc']} wall {res['wall_s']} s, CPU {res['cpu_s']} s, "
          f"peak {res['peak_rss_mib']} MiB -> {where.relative_to(_run.ROOT)}", file=sys.stderr)
    return res["rc"]


def extract(rev: str, into: Path) -> str:
    """The tree of ``rev`` in ``into`` (``git archive``: no worktree registered), with this checkout's benchmarks/
    and experiments/ in place of its own, so both sides run the same benchmark code.  Returns the short hash."""
    h = _run.git("rev-parse", "--short", rev)
    if not h:
        raise SystemExit(f"unknown revision {rev!r}")
    data = subprocess.run(["git", "archive", "--format=tar", h], cwd=_run.ROOT, capture_output=True, check=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        tf.extractall(into, filter="data")
    for pkg in _run.PACKAGES:
        shutil.rmtree(into / pkg, ignore_errors=True)
        shutil.copytree(_run.ROOT / pkg, into / pkg, ignore=shutil.ignore_patterns("results", "__pycache__"))
    return h


def numbers(d, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a JSON value whose key is not a timing (``TIMING_WORDS``, ``*_s``), by path."""
    out: dict[str, float] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            if k == "provenance" or str(k).endswith("_s") or any(w in str(k).lower() for w in TIMING_WORDS):
                continue
            out.update(numbers(v, f"{prefix}/{k}"))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.update(numbers(v, f"{prefix}/{i}"))
    elif isinstance(d, (int, float)) and not isinstance(d, bool):
        out[prefix] = float(d)
    return out


def max_difference(a, b) -> tuple[float | None, int]:
    """Largest |a - b| over the numbers both results hold (None when neither holds any) and how many keys differ."""
    diffs, unmatched = differences(a, b)
    return max(diffs.values(), default=None), unmatched


def differences(a, b) -> tuple[dict[str, float], int]:
    """``({path: |a - b|} over the numbers both results hold, NaN on both sides left out; how many keys only one
    side holds)``."""
    na, nb = numbers(a), numbers(b)
    common = na.keys() & nb.keys()
    diffs = {k: abs(na[k] - nb[k]) for k in sorted(common) if not (math.isnan(na[k]) and math.isnan(nb[k]))}
    return diffs, len(na.keys() ^ nb.keys())


def own_cache(shared: Path, folder: Path) -> Path:
    """A fresh, empty swapkl cache for one side and round, holding only a link to ``shared``'s converted models
    (``models/``: the default's GGUF converted once, an input, not a result): every score, perplexity and fit is
    computed on each side, so matching results say the two trees compute the same numbers, not that one read the
    other's cache."""
    folder.mkdir(parents=True)
    if (shared / "models").is_dir():
        (folder / "models").symlink_to((shared / "models").resolve(), target_is_directory=True)
    return folder


def compare(base: str, head: str, name: str, args: list[str], rounds: int) -> int:
    pkg, _ = _run.find(name)
    with tempfile.TemporaryDirectory(prefix="swapkl-compare-") as tmp:
        trees = {"base": Path(tmp) / "base", "head": Path(tmp) / "head"}
        hashes = {side: extract(rev, trees[side]) for side, rev in (("base", base), ("head", head))}
        shared = Path(os.environ.get("SWAPKL_CACHE") or _run.ROOT / "cache")
        runs: dict[str, list[dict]] = {"base": [], "head": []}
        for r in range(rounds):
            for side in ("base", "head"):
                tree = trees[side]
                path = _run.find(name, root=tree, packages=(pkg,))[1]
                argv, out = _with_json(path, args, Path(tmp), f"{side}-{r}")
                if _run.json_option(args) is not None:  # one file per side and round
                    out = Path(tmp) / f"{side}-{r}.json"
                    i = argv.index("--json") if "--json" in argv else None
                    argv = [*argv[:i], "--json", str(out), *argv[i + 2:]] if i is not None else argv
                extra = {"SWAPKL_CACHE": str(own_cache(shared, Path(tmp) / f"cache-{side}-{r}"))}
                res = _run.run_child(_run.child_argv(pkg, path, argv), cwd=tree, env=_run.child_env(tree, **extra),
                                     echo=False)
                res["result"] = _run.read_json(out) if out is not None else None
                runs[side].append(res)
                print(f"round {r} {side:4s} {hashes[side]}: rc={res['rc']} wall {res['wall_s']:.3f} s, "
                      f"CPU {res['cpu_s']:.3f} s, peak {res['peak_rss_mib']:.1f} MiB", flush=True)
                if res["rc"] != 0:
                    sys.stdout.write(res["stdout"][-2000:])
                    print(f"benchmarks compare: {name} failed on {side} ({hashes[side]})", file=sys.stderr)
                    return res["rc"]

    def med(side, key):
        return statistics.median(x[key] for x in runs[side])

    summary = {"name": name, "args": args, "rounds": rounds, "base": hashes["base"], "head": hashes["head"]}
    print(f"\n{name}: {hashes['head']} (HEAD) / {hashes['base']} (BASE), median of {rounds} interleaved round(s)")
    print(f"{'':14s}{'BASE':>12s}{'HEAD':>12s}{'HEAD/BASE':>11s}")
    for key, unit in (("wall_s", "s"), ("cpu_s", "s"), ("peak_rss_mib", "MiB")):
        b, h = med("base", key), med("head", key)
        ratio = h / b if b else float("nan")
        summary[key] = {"base": b, "head": h, "ratio": round(ratio, 3)}
        print(f"{key:14s}{b:>10.3f} {unit:<1s}{h:>10.3f} {unit:<1s}{ratio:>10.3f}"
              if unit == "s" else f"{key:14s}{b:>9.1f}MiB{h:>9.1f}MiB{ratio:>10.3f}")
    # the benchmark's own timings (top-level numbers of its --json result, e.g. engine_sweep's sweep_cpu)
    own = [k for k, v in (runs["base"][-1]["result"] or {}).items() if isinstance(v, (int, float))
           and not isinstance(v, bool) and (k.endswith("_s") or any(w in k.lower() for w in TIMING_WORDS))
           and all(isinstance((x["result"] or {}).get(k), (int, float)) for x in runs["base"] + runs["head"])]
    for key in own:
        b = statistics.median(x["result"][key] for x in runs["base"])
        h = statistics.median(x["result"][key] for x in runs["head"])
        ratio = h / b if b else float("nan")
        summary[key] = {"base": b, "head": h, "ratio": round(ratio, 3)}
        print(f"{key[:13]:14s}{b:>12.4g}{h:>12.4g}{ratio:>11.3f}   (the benchmark's own figure)")
    same_out = all(x["stdout"] == runs["base"][0]["stdout"] for x in runs["base"] + runs["head"])
    summary["stdout_identical"] = same_out
    print(f"stdout: {'IDENTICAL on every run' if same_out else 'differs between runs (timings printed?)'}")
    if runs["base"][-1]["result"] is not None and runs["head"][-1]["result"] is not None:
        diff, unmatched = max_difference(runs["base"][-1]["result"], runs["head"][-1]["result"])
        summary["max_result_difference"] = diff
        summary["unmatched_result_keys"] = unmatched
        print(f"results (--json, timings left out): largest |HEAD - BASE| {diff}, keys in one side only: {unmatched}")
        worst = sorted(((v, k) for k, v in differences(runs["base"][-1]["result"], runs["head"][-1]["result"])[0].items()
                        if v), reverse=True)
        summary["differing_keys"] = [k for _, k in worst]
        for v, k in worst[:8]:
            print(f"  differs: {k} by {v:g}")
        if len(worst) > 8:
            print(f"  ... and {len(worst) - 8} more")
    summary["provenance"] = _run.provenance(["python", "-m", PKG, "compare", base, head, name, "--rounds",
                                             str(rounds), "--", *args])
    where = record({"compare": summary}, commit=hashes["head"])
    print(f"recorded in {where.relative_to(_run.ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="every benchmark")
    r = sub.add_parser("run", help="one run of NAME; the other arguments go to it")
    r.add_argument("name")
    c = sub.add_parser("compare", help="NAME on BASE and HEAD, interleaved; arguments for NAME after --")
    c.add_argument("base")
    c.add_argument("head")
    c.add_argument("name")
    c.add_argument("--rounds", type=int, default=3)
    if argv and argv[0] == "compare" and "--" in argv:  # NAME's own arguments after --
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
        a = ap.parse_args(argv)
    else:
        a, rest = ap.parse_known_args(argv)
    if a.cmd == "list":
        for pkg in _run.PACKAGES:
            print(f"{pkg}: " + ", ".join(_run.names(pkg)))
        return 0
    if a.cmd == "run":
        return run(a.name, rest)
    return compare(a.base, a.head, a.name, rest, a.rounds)


if __name__ == "__main__":
    sys.exit(main())
