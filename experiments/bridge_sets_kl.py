"""The joint bridged KL on the scoring prompts of the sets ``experiments/repair_default.py`` compares (docs/repair.md,
"Measured on the default"): ReplaceMe's spans against bridge-joint's sets of its first run (16 × 32-token prompts),
under a scoring contract of adjacent pairs' prompts and the default bridge settings (folded, 8,192 calibration
tokens).  Shows whether a
bridge-guided method that also tried ReplaceMe's spans would pick them: it picks the lowest of these KLs.

    HF_HUB_OFFLINE=1 python -m experiments run bridge_sets_kl [--prompts 16] [--tokens 32]   (the checkout's root; CPU, minutes)

``--prompts`` / ``--tokens`` set the scoring contract (default: the bench's 16 × 32; the library's default contract
is 16 × 64); the calibration windows avoid that contract's prompts, as in a run.
"""
import argparse
import os
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("SWAPKL_CORPUS", str(ROOT / "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"))
from swapkl.contract import Contract  # noqa: E402
from swapkl.model.checkpoints import load_checkpoint  # noqa: E402
from swapkl.removal.bridging import Bridger  # noqa: E402
from swapkl.repair.joint_kl import JointKL  # noqa: E402
from swapkl.scoring.corpora import from_file  # noqa: E402

SETS = {"ReplaceMe": [[14], [14, 15], [13, 14, 15], [12, 13, 14, 15]],
        "bridge-joint": [[17], [16, 17], [16, 17, 18], [15, 16, 17, 18]]}

#: the configuration of the run the docs quote: the runner (python -m experiments run bridge_sets_kl) passes each as --key value unless the command line gives it
CONFIG = {
    'prompts': 16,
    'tokens': 32,
}


ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--prompts", type=int, default=16)
ap.add_argument("--tokens", type=int, default=32)
args = ap.parse_args()
ck = load_checkpoint("default", device="cpu")
contract = Contract(prompts=args.prompts, tokens=args.tokens, pairs="adjacent")
print(f"contract: {contract.prompts} x {contract.tokens} prompts, adjacent pairs; bridges: default settings", flush=True)
bridger = Bridger(ck.model, ck.tokenizer, from_file(os.environ["SWAPKL_CORPUS"]), {}, contract=contract)
kl = JointKL(ck.model, bridger.prompts.ids, contract.positions, getattr(torch, contract.kl_dtype))
bridger.fit_spans([(s[0], s[-1] + 1) for sets in SETS.values() for s in sets])
for n in range(1, 5):
    row = {name: sets[n - 1] for name, sets in SETS.items()}
    print(f"n={n}: " + "   ".join(f"{name} {s}: {float(kl(bridger.bridged(s)).mean()):.4f} nats"
                                   for name, s in row.items()), flush=True)
