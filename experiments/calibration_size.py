"""Does a larger calibration text change which removal set wins?  (docs/recommend-results.md)

    HF_HUB_OFFLINE=1 python -m experiments run calibration_size [--tokens 1024,8192]

Perplexity of the built-in SmolLM2 with the sets chosen by SLEB / recommend and by interchange-guided removal
removed, on the first N tokens of the corpus's prompt region (the calibration text; windows of 512, no overlap),
for each N.  Prints one line per (N, set) with the PPL and its change vs the unpruned model.
"""
from __future__ import annotations

import argparse
import time


SETS = ([], [14], [17], [13, 14], [14, 17], [13, 14, 17], [14, 17, 26])


#: the configuration of the run the docs quote: the runner (python -m experiments run calibration_size) passes each as --key value unless the command line gives it
CONFIG = {
    'tokens': '1024,8192',
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1024,8192", help="calibration lengths (tokens), comma-separated")
    a = ap.parse_args()
    import torch

    from swapkl.measure import evaluate as E
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.scoring.corpora import load_corpus
    from swapkl.surgery.blocks import pruned_copy

    ck = load_checkpoint("default")
    corpus = load_corpus()
    lengths = [int(x) for x in a.tokens.split(",")]
    words = corpus.prompt_text().split()[: max(lengths) * 2]  # a word is at least one token
    ids = torch.as_tensor(ck.tokenizer(" ".join(words))["input_ids"]).reshape(-1)
    print(f"corpus {corpus.name}: {len(ids)} prompt-region tokens available")
    for n in lengths:
        base = None
        for s in SETS:
            t = time.perf_counter()
            ppl = E.evaluate_ppl(pruned_copy(ck.model, s) if s else ck.model, ids[:n], 512, 512).ppl
            base = base or ppl
            print(f"{n:6d} tokens  removed {str(s):14s} PPL {ppl:7.2f} ({100 * (ppl / base - 1):+5.1f} %)  "
                  f"{time.perf_counter() - t:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
