"""Accuracy of a model on the shipped offline task ``wikitext_lastword`` and the model-free levels beside it.

    HF_HUB_OFFLINE=1 python -m experiments run lastword [MODEL] [--limit K] [--json OUT]

MODEL defaults to the built-in SmolLM2-135M-Instruct (``default``); ``tests/fixtures/models/stories260K`` is the
other model the docs quote.  The base model only (no removal), through swapkl's lm-eval path
(:func:`swapkl.measure.lmeval.evaluate`).  Model-free levels, over the same documents:

* chance: the mean of 1 / (distinct candidate words of the passage) -- a uniform guess among the passage's
  possible targets (the task's ``chance`` field, what ``swapkl tasks`` prints);
* most frequent: guess the candidate word that occurs most often in the passage (ties: the latest);
* most recent: guess the candidate word seen last.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

CONFIG = {'batch_size': 16}


def model_free(docs) -> dict:
    """The model-free levels of ``docs`` (dicts with ``context``, ``target``, ``chance``)."""
    from swapkl.measure.lastword import eligible

    freq = recent = 0
    for d in docs:
        cands = [w for w in d["context"].split() if eligible(w)]
        counts = Counter(cands)
        last = {w: i for i, w in enumerate(cands)}
        freq += max(counts, key=lambda w: (counts[w], last[w])) == d["target"]
        recent += cands[-1] == d["target"]
    n = len(docs)
    return {"documents": n, "chance": sum(d["chance"] for d in docs) / n, "most_frequent": freq / n,
            "most_recent": recent / n}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="default")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    from swapkl.measure import lmeval
    from swapkl.measure.lastword import TASK, read_docs
    from swapkl.model.checkpoints import load_checkpoint

    docs = read_docs()[:a.limit] if a.limit else read_docs()
    free = model_free(docs)
    ck = load_checkpoint(a.model, device="cpu")
    tm, [task] = lmeval.load_tasks(None, [TASK])
    t0 = time.perf_counter()
    rows = lmeval.evaluate(ck.model, ck.tokenizer, task, tm, limit=a.limit, batch_size=a.batch_size)
    wall = time.perf_counter() - t0
    acc, err = rows["metrics"][TASK]["acc,none"], rows["stderr"][TASK]["acc,none"]
    out = {"model": a.model, "limit": a.limit, "acc": acc, "acc_stderr": err, "eval_s": round(wall, 1), **free}
    print(f"{a.model}: {TASK} ({free['documents']} documents) acc {acc:.4f} ± {err:.4f}; chance {free['chance']:.4f}, most frequent candidate {free['most_frequent']:.4f}, "
          f"most recent candidate {free['most_recent']:.4f}; evaluation {wall:.1f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
