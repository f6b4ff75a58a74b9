"""Defaults of the dashboard (and of anything that wants "a sensible first run").

The built-in model (SmolLM2-135M-Instruct, 30 layers) is the preselected checkpoint.  On a CPU the default
contract and perplexity evaluator are sized so that the first cold run -- both protocols on the 29 adjacent
pairs (the verdict and the guided curves need only those), then replacement- and interchange-guided removal
curves up to n = :data:`DEFAULT_BUDGET` plus the random baseline (5 seeds) -- finishes within five minutes on
two cores (``benchmarks/default_cold_cached.py`` on an idle 2-core machine: verdict after ~64 s, all done after
~130 s; see ``docs/dashboard.md``).  On a GPU the paper-sized
settings are affordable.

Units: ``tokens`` and evaluator ``window``/``stride`` are tokens; ``max_words`` is words of the evaluation text.
"""
from __future__ import annotations

import os
from pathlib import Path

from swapkl.contract import Contract

# Deferred imports: torch and swapkl.measure.evaluate are imported inside the functions: the dashboard and the CLI import
# the defaults without them.

DEFAULT_MODEL = "default"
DEFAULT_BUDGET = 4
# The methods the dashboard offers and preselects are the registry's: swapkl.removal.methods.offered() and
# swapkl.removal.methods.default_set("dashboard").

# CPU: P x T prompt windows and a "quick" evaluator (256-token windows, stride 192, over the first 600 words)
CPU_PROMPTS, CPU_TOKENS = 16, 32
CPU_EVAL_WORDS, CPU_EVAL_WINDOW, CPU_EVAL_STRIDE = 600, 256, 192
# GPU: the canonical contract size and the paper's "matched" evaluator
GPU_PROMPTS, GPU_TOKENS = 64, 128
# GPU: |i-j| <= 3 (3L-6 pairs: 84 for SmolLM2) so the first view has real heatmaps.  The dashboard scores the
# adjacent pairs first (verdict and guided curves need only those), then widens.  gap:3 is about 3x the adjacent
# pairs, and a GPU forward of 64 x 128 tokens through a 135M model is short, so the first view stays within the
# minutes a CPU run of the adjacent default takes.
GPU_PAIRS = "gap:3"


def _is_gpu(device) -> bool:
    if device is None or str(device) == "auto":
        try:
            import torch

            return bool(torch.cuda.is_available())
        except ImportError:  # pragma: no cover
            return False
    return str(device).startswith("cuda")


def default_contract(device: str | None = "auto") -> Contract:
    """The dashboard's default :class:`Contract` for ``device`` (``"auto"``: CUDA when available).

    CPU: adjacent pairs, 16 prompts x 32 tokens, all positions, float32, max aggregation.
    GPU: pairs gap:3 (adjacent first, then wider), 64 prompts x 128 tokens, otherwise the same."""
    dev = "cuda" if _is_gpu(device) else "cpu"
    if dev == "cuda":
        return Contract(pairs=GPU_PAIRS, prompts=GPU_PROMPTS, tokens=GPU_TOKENS, device=dev)
    return Contract(pairs="adjacent", prompts=CPU_PROMPTS, tokens=CPU_TOKENS, device=dev)


def default_evaluator(device: str | None = "auto"):
    """The default perplexity :class:`~swapkl.measure.evaluate.Evaluator`: on a CPU ``quick`` (600 words ≈ 800 SmolLM2
    tokens, window 256, stride 192: 4 windows, 993 token-forwards per evaluation, every token after the first
    scored once with >= 64 tokens of context after the first window); on a GPU the paper's ``matched``
    (5,000 words, 512/256)."""
    from swapkl.measure.evaluate import (EVALUATORS, Evaluator)  # deferred: pulls torch; the CLI and the dashboard import this module without it

    if _is_gpu(device):
        return EVALUATORS["matched"]
    return Evaluator("quick", max_words=CPU_EVAL_WORDS, window=CPU_EVAL_WINDOW, stride=CPU_EVAL_STRIDE)


def evaluator_choices(device: str | None = "auto") -> dict:
    """Evaluators offered by the dashboard, by name: the device's default (``quick`` on a CPU) and the two
    named contracts of docs/method.md §3."""
    from swapkl.measure.evaluate import EVALUATORS  # deferred: pulls torch; the CLI and the dashboard import this module without it

    out = {}
    d = default_evaluator(device)
    out[d.name] = d
    out.update({k: v for k, v in EVALUATORS.items() if k not in out})
    return out


#: the trajectory page's example when no demo trajectory has been trained: hub revisions of one model
HUB_TRAJECTORY = "EleutherAI/pythia-160m@step0, @step1000, @step16000, @step143000"


def default_trajectory_list() -> str:
    """The trajectory page's first checkpoint list: the demo trajectory's folder (``<cache>/demo-trajectory``) once
    trained, else :data:`HUB_TRAJECTORY`."""
    from swapkl.store import cache_root

    demo = cache_root() / "demo-trajectory"
    return str(demo) if demo.is_dir() else HUB_TRAJECTORY


def local_model_folders(root: str | os.PathLike) -> list[str]:
    """Model folders worth offering on a local server (a demo server offers only its allow-list): the sub-folders
    holding a ``config.json`` of each folder in ``$SWAPKL_MODEL_DIRS`` (``os.pathsep`` separated), of
    ``<root>/../shared/models``, ``<cache>/demo-trajectory`` and ``<cache>/exports``, sorted per folder; those
    beside ``root`` (the project's folder) relative to it, the others absolute."""
    from swapkl.store import cache_root

    root = Path(root)
    out = []
    extra = [Path(p) for p in os.environ.get("SWAPKL_MODEL_DIRS", "").split(os.pathsep) if p]
    for base in (*extra, root.parent / "shared" / "models", cache_root() / "demo-trajectory", cache_root() / "exports"):
        if base.is_dir():
            for d in sorted(base.iterdir()):
                if (d / "config.json").is_file():
                    out.append(os.path.relpath(d, root) if str(d).startswith(str(root.parent)) else str(d))
    return out
