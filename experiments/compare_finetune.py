"""Build the second checkpoint of the default-model comparison offline: SmolLM2-135M-Instruct after a short LoRA
fine-tune with the healing recipe (swapkl.healing) on the training region of the fixture WikiText (disjoint from the
evaluation text and the scoring prompts), merged into the weights and saved as a local folder.

    HF_HUB_OFFLINE=1 nice -n 10 OMP_NUM_THREADS=1 python -m experiments run compare_finetune --out /tmp/smollm2-ft --steps 100
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


#: the configuration of the run the docs quote: the runner (python -m experiments run compare_finetune) passes each as --key value unless the command line gives it
CONFIG = {
    'out': '/tmp/smollm2-ft',
    'steps': 100,
    'seq_len': 64,
    'batch': 2,
    'lr': 0.002,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/smollm2-ft")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--corpus", default=str(ROOT / "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"))
    a = p.parse_args()
    from swapkl.healing.heal import training_text
    from swapkl.healing.recipe import Recipe
    from swapkl.healing.train import healed_model, train
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.corpora import load_corpus

    ck = load_checkpoint("default", dtype="float32", device="cpu")
    corpus = load_corpus(a.corpus)
    recipe = Recipe(steps=a.steps, seq_len=a.seq_len, batch=a.batch, lr=a.lr, warmup=10)
    tt = training_text(ck.model, ck.tokenizer, corpus, recipe, prompts=8, tokens=64)
    t0 = time.perf_counter()
    state, stats = train(ck.model, [], tt.chunks, recipe,
                         progress=lambda s, n, m: print(f"  {m}", file=sys.stderr, flush=True) if s % 10 == 0 else None)
    merged = healed_model(ck.model, [], recipe, state)
    out = Path(a.out)
    merged.save_pretrained(str(out))
    ck.tokenizer.save_pretrained(str(out))
    info = {"base": ck.identity, "recipe": recipe.to_dict() if hasattr(recipe, "to_dict") else vars(recipe),
            "text": {k: v for k, v in tt.description.items() if k != "prompt_windows"} if hasattr(tt, "description")
            else None, "loss_first": stats["loss_first"], "loss_last": stats["loss_last"],
            "seconds": time.perf_counter() - t0, "out": str(out)}
    (out / "swapkl_finetune.json").write_text(json.dumps(info, indent=2, default=str))
    print(json.dumps({k: info[k] for k in ("loss_first", "loss_last", "seconds", "out")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
