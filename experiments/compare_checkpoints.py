"""Must-show figures of issue 30 (docs/compare.md): two checkpoints side by side through ``swapkl compare``, the
agreement table and the transfer table written to experiments/results/compare-<name>.{json,txt}.

    # stories260K, prompt seed 0 vs seed 1 (two score files of one model: agreement should be high)
    HF_HUB_OFFLINE=1 nice -n 10 OMP_NUM_THREADS=1 python -m experiments run compare_checkpoints stories-seeds \
        tests/fixtures/models/stories260K tests/fixtures/models/stories260K --seed-b 1 --pairs all --prompts 16 \
        --budget 3 --spacing 0 --max-words 2000
    # the built-in default against its 100-step LoRA fine-tune (experiments/compare_finetune.py)
    HF_HUB_OFFLINE=1 nice -n 10 OMP_NUM_THREADS=1 python -m experiments run compare_checkpoints default-vs-ft \
        default /tmp/smollm2-ft --pairs adjacent --prompts 8 --budget 3
"""
from __future__ import annotations

import argparse
import contextlib
import io
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"


#: the configuration of the run the docs quote: the runner (python -m experiments run compare_checkpoints) passes each as --key value unless the command line gives it
CONFIG = {
    'pairs': 'adjacent',
    'prompts': 8,
    'tokens': 64,
    'budget': 3,
    'spacing': 1,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--seed-b", type=int, default=None, help="score B under another prompt seed (A: seed 0)")
    p.add_argument("--pairs", default="adjacent")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--budget", type=int, default=3)
    p.add_argument("--max-words", type=int, default=None)
    p.add_argument("--spacing", type=int, default=1, help="Δ of the selection rule")
    p.add_argument("--corpus", default=str(ROOT / "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"))
    a = p.parse_args()
    from swapkl.commands.cli import main as cli

    RESULTS.mkdir(parents=True, exist_ok=True)
    common = ["--pairs", a.pairs, "--prompts", str(a.prompts), "--tokens", str(a.tokens), "--corpus", a.corpus,
              "--device", "cpu", "--quiet"]
    t0 = time.perf_counter()
    args_a, args_b = a.a, a.b
    if a.seed_b is not None:  # two score files of the same contract but the seed
        fa, fb = f"/tmp/compare-{a.name}-a.json", f"/tmp/compare-{a.name}-b.json"
        assert cli(["score", a.a, *common, "--json", fa]) == 0
        assert cli(["score", a.b, *common, "--seed", str(a.seed_b), "--json", fb]) == 0
        args_a, args_b = fa, fb
    out = RESULTS / f"compare-{a.name}.json"
    extra = ["--max-words", str(a.max_words)] if a.max_words else []
    buf = io.StringIO()
    argv = ["compare", args_a, args_b, *common[:-1], "--budget", str(a.budget), "--spacing", str(a.spacing), "--eval-text", a.corpus, *extra,
            "--json", str(out)]
    with contextlib.redirect_stdout(buf):
        rc = cli(argv)
    text = buf.getvalue() + f"\nwall time {time.perf_counter() - t0:.0f} s (this machine, 1 thread)\n"
    (RESULTS / f"compare-{a.name}.txt").write_text(text)
    print(text)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
