"""CPU seconds of the test suite per file, from a run with ``tests/support/cpu_times.py``:

    SWAPKL_CPU_TIMES=/tmp/cpu python3 -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder
    python3 -m benchmarks run suite_cpu /tmp/cpu [--top 30]

Prints the total and the files with the most CPU (user + system of the test process and the children it waited
for), with their wall time summed over their tests and their number of tests."""
from __future__ import annotations

import argparse
import collections
import glob
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix", help="the SWAPKL_CPU_TIMES prefix of the run")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    rows = [row for path in sorted(glob.glob(f"{a.prefix}.*.json")) for row in json.load(open(path))]
    if not rows:
        raise SystemExit(f"error: no {a.prefix}.*.json (run pytest with SWAPKL_CPU_TIMES=PREFIX)")
    cpu, wall, count = collections.Counter(), collections.Counter(), collections.Counter()
    for nodeid, c, w in rows:
        path = nodeid.split("::")[0]
        cpu[path] += c
        wall[path] += w
        count[path] += 1
    print(f"{len(rows)} tests, {sum(cpu.values()):.0f} s CPU in the test processes and their waited children")
    print(f"{'CPU s':>7} {'wall s':>7} {'tests':>5}  file")
    for path, c in cpu.most_common(a.top):
        print(f"{c:7.1f} {wall[path]:7.1f} {count[path]:5d}  {path}")


if __name__ == "__main__":
    main()
