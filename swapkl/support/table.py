"""The support table: one row per model type of the installed transformers, measured (:mod:`swapkl.support.check`),
never written by hand.

:func:`run_checks` checks model types in parallel child processes (forked, each under a memory cap and a time
limit, so that one model type that hangs or eats memory is its row's failure, not the run's), :func:`rows_of`
reduces the checks to the table's rows, and :func:`markdown` renders ``docs/families.md``.  The table shipped with
swapkl is ``swapkl/model/data/support.json`` (:mod:`swapkl.model.supported` reads it: the CLI and the dashboard say
from a config alone whether a model type is supported); ``swapkl families --check --write`` regenerates it.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time
from pathlib import Path
from typing import Callable

from swapkl.contract import PER_LAYER
from swapkl.model.supported import PAPER, SUPPORT_FILE, USERS

#: a child's limits: seconds and bytes of address space (a tiny model needs far less)
CHILD_SECONDS = 300
CHILD_BYTES = 8 << 30


def run_checks(types: list[str], workers: int = 2, on_row: Callable[[dict], None] | None = None,
               seconds: int = CHILD_SECONDS) -> dict[str, dict]:
    """``{model_type: check row}`` of :func:`~swapkl.support.check.check_model_type` for ``types``, ``workers`` at a
    time in forked children (sequentially in this process where ``fork`` is missing).  A child that runs out of
    time or memory, or dies, gives a row with status "traceback" and why."""
    from swapkl.support.check import check_model_type

    if not hasattr(os, "fork"):
        out = {}
        for t in types:
            out[t] = check_model_type(t)
            if on_row:
                on_row(out[t])
        return out
    from swapkl.model.tiny import tiny_model

    tiny_model("llama")  # transformers' first model import (seconds) happens once, before the children fork
    pending, running, out = list(types), {}, {}
    while pending or running:
        while pending and len(running) < max(1, workers):
            t = pending.pop(0)
            running[t] = _fork(t, check_model_type, seconds)
        fds = {v["fd"]: t for t, v in running.items()}
        ready, _, _ = select.select(list(fds), [], [], 1.0)
        for fd in ready:
            t = fds[fd]
            chunk = os.read(fd, 1 << 20)
            if chunk:
                running[t]["buf"] += chunk
                continue
            os.close(fd)
            child = running.pop(t)
            _, status = os.waitpid(child["pid"], 0)
            try:
                row = json.loads(child["buf"].decode())
            except ValueError:
                why = "ran out of time" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM else (
                    f"the check's process died (status {status})")
                row = {"model_type": t, "status": "traceback", "reason": f"traceback: {why}"}
            row.setdefault("seconds", round(time.perf_counter() - child["t0"], 2))
            out[t] = row
            if on_row:
                on_row(row)
    return out


def _fork(model_type: str, fn, seconds: int) -> dict:
    import resource

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one check, its row on the pipe, then gone
        os.close(r)
        try:
            import torch

            torch.set_num_threads(1)  # children share the cores: one intra-op thread each (spinning threads collapse)
            resource.setrlimit(resource.RLIMIT_AS, (CHILD_BYTES, CHILD_BYTES))
            signal.alarm(seconds)
            row = fn(model_type)
        except BaseException as e:  # out of memory, or anything the check did not turn into a row
            row = {"model_type": model_type, "status": "traceback",
                   "reason": f"traceback ({type(e).__name__}): {str(e).splitlines()[0][:200] if str(e) else ''}"}
        os.write(w, json.dumps(row, default=str).encode())
        os.close(w)
        os._exit(0)
    os.close(w)
    return {"pid": pid, "fd": r, "buf": b"", "t0": time.perf_counter()}


def _short(status: str) -> str:
    """A check's status without the unsupported-architecture preamble (the list of table families)."""
    s = status.removeprefix("refused: ")
    if s.startswith("unsupported architecture:") and "could not validate it: " in s:
        s = s.split("could not validate it: ", 1)[1].removesuffix(")")
    return s


def rows_of(checks: dict[str, dict]) -> dict[str, dict]:
    """The table's rows, by model type: ``status`` and ``reason`` (one line), and for each check "exact", "n/a: k
    pairs" (slot: blocks of different structure) or its one line: ``slot``, ``block``, ``sublayers``, ``export``,
    ``bridge``; ``covers``: the paper's or the users' family the type is."""
    out = {}
    for t in sorted(checks):
        c = checks[t]
        row = {"status": c["status"], "reason": _short(c.get("reason", ""))}
        for pl in PER_LAYER:
            if pl in c:
                st = c[pl]["status"]
                row[pl] = _short(st) if st != "exact" else ("exact" + (f", {c[pl]['na']} pairs n/a" if c[pl].get("na") else ""))
        sub = c.get("sublayers")
        if isinstance(sub, dict):
            if "status" in sub:
                row["sublayers"] = _short(sub["status"])
            else:
                bad = [f"{k}: {_short(v['status'])}" for k, v in sub.items() if v["status"] != "exact"]
                row["sublayers"] = "exact" if not bad else bad[0]
        for key in ("export", "bridge"):
            if isinstance(c.get(key), dict):
                row[key] = _short(c[key]["status"])
        covers = [f"paper: {PAPER[t]}"] if t in PAPER else []
        covers += [f"users: {USERS[t]}"] if t in USERS else []
        if covers:
            row["covers"] = "; ".join(covers)
        out[t] = row
    return out


def summary(rows: dict[str, dict]) -> dict:
    """Counts by status over the decoder-only types, the exact share, and the paper's and users' families that are
    not exact."""
    decoder = {t: r for t, r in rows.items() if r["status"] != "not decoder-only"}
    counts: dict[str, int] = {}
    for r in decoder.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    missing = sorted(t for t in (*PAPER, *USERS) if rows.get(t, {}).get("status") != "exact")
    return {"decoder_only": len(decoder), "counts": counts,
            "exact_share": counts.get("exact", 0) / max(1, len(decoder)), "paper_and_users_not_exact": missing}


#: the table's ``"about"`` (every table of ``swapkl/model/data`` says what it holds and who reads it)
ABOUT = ("The measured support table (generated by swapkl.support.table with 'swapkl families --check --write'; read by "
         "swapkl.model.supported): one row per model type of the installed transformers' causal-LM mapping, with its "
         "status, the reason and each check's result on a tiny random model.")


def write_table(rows: dict[str, dict], path: str | os.PathLike = SUPPORT_FILE) -> Path:
    """The table as ``support.json`` (with the transformers version it was measured on), written atomically."""
    import transformers

    from swapkl.store import dump_json

    dump_json({"format": "swapkl.support/1", "about": ABOUT, "transformers": transformers.__version__, "rows": rows}, path)
    return Path(path)


def markdown(rows: dict[str, dict], transformers_version: str) -> str:
    """``docs/families.md``: the summary, then one table row per model type."""
    s = summary(rows)
    c = s["counts"]
    lines = ["# Families: what swapkl supports, model type by model type", "",
             f"Generated by `swapkl families --check --markdown` on transformers {transformers_version}; do not edit by "
             "hand.  Each decoder-only model type is checked on a tiny random model built from its config class "
             "(`swapkl/model/tiny.py`): both protocols under both per-layer definitions (`--per-layer slot|block`, "
             "docs/method.md §1) against the plain implementation, attention / MLP sublayers, the pruned export "
             "reloaded with stock transformers against the plain removal, and the bridge's fold.  `n/a` pairs "
             "(`slot`: blocks of different structure; either: a block that needs a state only a block before it hands "
             "on, in slot 0) are listed in every result with their reason.", "",
             f"**{c.get('exact', 0)} of {s['decoder_only']} decoder-only model types exact "
             f"({100 * s['exact_share']:.1f} %)**; " + ", ".join(f"{n} {k}" for k, n in sorted(c.items()) if k != "exact")
             + ".  Not exact among the paper's and the users' families: "
             + (", ".join(s["paper_and_users_not_exact"]) or "none") + ".", "",
             "| model type | status | slot | block | sublayers | export | bridge fold | covers | reason |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t, r in rows.items():
        if r["status"] == "not decoder-only":
            continue
        cells = [f"`{t}`", r["status"]] + [_cell(r.get(k, "")) for k in ("slot", "block", "sublayers", "export", "bridge",
                                                                          "covers", "reason")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Not decoder-only language models", "",
              "Model types of transformers' causal-LM mapping that swapkl does not count (data: `swapkl/model/data/"
              "tiny.json`):", "", "| model type | why |", "|---|---|"]
    lines += [f"| `{t}` | {_cell(r['reason'])} |" for t, r in rows.items() if r["status"] == "not decoder-only"]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")

