"""Contract effect (docs/evidence.md §4): the same checkpoint scored under another contract, and the rank agreement
of its ``replacement`` / ``interchange`` layer scores with the main contract's.

A :class:`Comparison` is one other contract: another prompt seed (other prompts from the same prompt region),
another corpus (the prompts come from that file's prompt region), another dtype (the weights loaded again in that
dtype), or 4-bit weights (bitsandbytes NF4 with bfloat16 compute; CUDA and bitsandbytes only).  Spearman ρ and
Kendall τ-b come from :mod:`scipy.stats`; their CIs from prompt bootstraps of the two results: *paired* (the same
prompt draws on both sides) when the two contracts scored the same prompt tokens (dtype, 4-bit), independent
otherwise (seed, corpus).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from swapkl.contract import DTYPES, Contract
from swapkl.errors import SwapklError, require_extra
from swapkl.evidence import agreement as A
from swapkl.stats import bootstrap_indices, finite_ci

FOUR_BIT = "4bit"
DTYPE_CHOICES = DTYPES + (FOUR_BIT,)


@dataclass
class Comparison:
    kind: str  # "seed" | "corpus" | "dtype" | "4bit" | "contract"
    label: str
    contract: Contract
    load: Callable | None = None  # another load of the same weights (dtype, 4-bit); None: the main checkpoint
    use_cache: bool = True  # False for 4-bit: the score cache's key does not see the quantisation


def by_seed(contract: Contract, seed: int) -> Comparison:
    return Comparison("seed", f"prompt seed {seed}", contract.with_(seed=int(seed)))


def by_corpus(contract: Contract, path: str) -> Comparison:
    """Prompts from the prompt region of the text file ``path`` (checked to load here, before any model work)."""
    from swapkl.scoring.corpora import load_corpus

    corpus = load_corpus(str(path))
    return Comparison("corpus", f"corpus {corpus.name} (its prompt region)", contract.with_(corpus=str(path)))


def by_dtype(contract: Contract, dtype: str, loader: Callable[[str], object]) -> Comparison:
    """The weights loaded again in ``dtype`` (``loader(dtype)`` returns a Checkpoint), or in 4-bit."""
    if dtype not in DTYPE_CHOICES:
        raise SwapklError(f"--compare-dtype must be one of {', '.join(DTYPE_CHOICES)} (got {dtype!r})")
    if dtype == contract.dtype:
        raise SwapklError(f"--compare-dtype {dtype} is the main contract's dtype; give another one")
    if dtype == FOUR_BIT:
        check_4bit()
        return Comparison(FOUR_BIT, "4-bit weights (bitsandbytes NF4, bfloat16 compute)",
                          contract.with_(dtype="bfloat16"), lambda: load_4bit(loader("bfloat16")), use_cache=False)
    return Comparison("dtype", f"dtype {dtype}", contract.with_(dtype=dtype), lambda: loader(dtype))


def check_4bit() -> None:
    """Raise a one-line :class:`SwapklError` unless CUDA and bitsandbytes are both present."""
    import torch

    if not torch.cuda.is_available():
        raise SwapklError("--compare-dtype 4bit needs CUDA and bitsandbytes; this machine has no CUDA device")
    require_extra("qlora", "--compare-dtype 4bit")


def load_4bit(ck):
    """``ck``'s weights quantised to 4-bit NF4 by bitsandbytes at load time (bfloat16 compute) on CUDA device 0.
    ``ck`` (a bfloat16 load of the same checkpoint) gives the folder, the tokenizer and the family."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from swapkl.model.checkpoints import Checkpoint, local_folder

    sp = ck.spec
    source = sp.source if sp.kind == "hub" else local_folder(sp)[0]
    kw = {"revision": sp.revision} if sp.kind == "hub" else {}
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained(source, quantization_config=q, dtype=torch.bfloat16,
                                                 device_map={"": 0}, weights_only=True, **kw).eval()
    ident = dict(ck.identity, dtype="bfloat16", quantization="bitsandbytes nf4, bfloat16 compute")
    return Checkpoint(model=model, tokenizer=ck.tokenizer, family=ck.family, identity=ident, spec=sp,
                      device=torch.device("cuda:0"), dtype="bfloat16")


def _as_comparison(c) -> Comparison:
    return c if isinstance(c, Comparison) else Comparison("contract", "another contract", c)


def agreement(ck, res, comparisons, n_boot: int, use_cache: bool = True, should_stop=None, seed: int = 3) -> list:
    """One row per comparison: its contract and label, Spearman ρ and Kendall τ of each swap-KL signal between
    the main result ``res`` (of checkpoint ``ck``) and the comparison's, with 95 % CIs (module docstring)."""
    from swapkl.evidence.signals import swap_signals
    from swapkl.scoring.score import score

    mine = {s.name: s for s in swap_signals(res)}
    rng = np.random.default_rng(seed)
    out = []
    for c in map(_as_comparison, comparisons):
        ck2 = c.load() if c.load is not None else ck
        res2 = score(ck2, c.contract, use_cache=use_cache and c.use_cache, should_stop=should_stop)
        paired = np.array_equal(np.asarray(res.prompt_token_ids), np.asarray(res2.prompt_token_ids))
        row = {"kind": c.kind, "label": c.label, "contract": res2.contract, "paired": bool(paired),
               "spearman": {}, "spearman_ci": {}, "kendall": {}, "kendall_ci": {}}
        if ck2 is not ck:
            row["model"] = ck2.identity
            del ck2
        i1 = bootstrap_indices(res.num_prompts, n_boot, rng)
        i2 = i1 if paired else bootstrap_indices(res2.num_prompts, n_boot, rng)
        for s2 in swap_signals(res2):
            s1 = mine[s2.name]
            row["spearman"][s2.name] = A.spearman(s1.values, s2.values)
            row["kendall"][s2.name] = A.kendall(s1.values, s2.values)
            if s1.resample is not None and s2.resample is not None:
                m = np.isfinite(s1.values) & np.isfinite(s2.values)
                a, b = s1.resample(i1)[:, m], s2.resample(i2)[:, m]
                row["spearman_ci"][s2.name] = finite_ci(A.spearman_rows(a, b))
                row["kendall_ci"][s2.name] = finite_ci(A.kendall_rows(a, b))
        out.append(row)
    return out
