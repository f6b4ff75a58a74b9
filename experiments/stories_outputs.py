"""The evidence and one study row of stories260K, written as one JSON: what ``benchmarks compare`` diffs between two
trees to show that a refactor leaves every number where it was (issue 52: "bit-identical before and after").

    HF_HUB_OFFLINE=1 python -m benchmarks compare BASE HEAD stories_outputs --rounds 1
    HF_HUB_OFFLINE=1 python -m experiments run stories_outputs [--json OUT]

Runs ``swapkl evidence`` and ``swapkl study`` on the shipped stories260K with the shipped WikiText-2 text (budget 2,
8 prompts x 32 tokens, 800 held-out words, 50 resamples; the study's methods named, so that a tree whose default set
grew runs the same ones) in a fresh cache, and writes ``{"evidence": ..., "study": ...}``.  ``compare`` reports the
largest difference over the numbers both trees write (a key only one tree writes, a newer signal, is counted apart).
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORIES = ROOT / "tests/fixtures/models/stories260K"
WIKI = ROOT / "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"

#: the configuration of the run the docs quote: the runner (python -m experiments run stories_outputs) passes each as --key value unless the command line gives it
CONFIG = {
    'budget': 2,
    'prompts': 8,
    'tokens': 32,
    'max_words': 800,
    'boot': 50,
}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in CONFIG.items():
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from swapkl.commands.cli import main as swapkl

    contract = ["--prompts", str(a.prompts), "--tokens", str(a.tokens), "--corpus", str(WIKI), "--eval-text", str(WIKI),
                "--max-words", str(a.max_words), "--budget", str(a.budget)]
    out = {}
    with tempfile.TemporaryDirectory(prefix="swapkl-outputs-") as d:
        os.environ["SWAPKL_CACHE"] = str(Path(d) / "cache")  # nothing read from an earlier run
        for name, args in (("evidence", ["evidence", str(STORIES), *contract, "--boot", str(a.boot),
                                         "--boot-agreement", str(a.boot), "--quiet"]),
                           ("study", ["study", str(STORIES), *contract, "--n-boot", str(a.boot),
                                      "--methods", "replacement,interchange,random,bi"])):
            path = Path(d) / f"{name}.json"
            if swapkl([*args, "--json", str(path)]) != 0:
                raise SystemExit(f"swapkl {name} failed")
            out[name] = json.loads(path.read_text())
    text = json.dumps(out, indent=1, sort_keys=True)
    if a.json:
        Path(a.json).write_text(text)
    print(f"evidence: {len(out['evidence'].get('layers', []))} layers; study: {len(out['study'].get('rows', []))} row(s)")
    return out


if __name__ == "__main__":
    main()
