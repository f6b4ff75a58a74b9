"""Two methods' healed models compared window by window (numpy only: no torch).

At each n, the sets that methods A and B choose are healed with the same recipe and measured on the same
evaluation windows as the base and the fine-tuned base (the control).  The difference A − B of their ΔPPL (in
percentage points of the base PPL) gets a **paired** bootstrap CI: each of the project's 1,000 resamples (seed 0)
draws windows with replacement and recomputes every perplexity from the same windows
(:func:`swapkl.healing.result._boot`).  Three differences are reported:

* ``before``: ΔPPL of the pruned models vs the base (before healing), 100 (PPL_A − PPL_B) / PPL_base;
* ``healed``: ΔPPL of the healed models vs the base, 100 (PPL_A' − PPL_B') / PPL_base;
* ``healed_vs_finetuned``: the same against the fine-tuned base, 100 (PPL_A' − PPL_B') / PPL_base_finetuned.

A difference whose CI includes 0 is a *tie*; below 0: A is *better* (safer: less damage); above 0: *worse*.
Two equal sets give the same per-window NLLs, so their difference is exactly 0 with CI [0, 0]: a tie.
"""
from __future__ import annotations

import numpy as np

from swapkl.healing.result import _boot
from swapkl.stats import BOOT_SEED, N_BOOT, percentile_ci, side, tie

WHAT = {"before": "before healing", "healed": "after healing (vs the base)",
        "healed_vs_finetuned": "after healing (vs the fine-tuned base)"}


def word(ci) -> str:
    """``better`` (the CI lies below 0: A's ΔPPL is lower), ``worse`` (above 0) or ``tie`` (it includes 0)."""
    return side(ci)


def paired_difference(counts, base, base_finetuned, a: dict, b: dict, n_boot: int = N_BOOT,
                      seed: int = BOOT_SEED) -> dict:
    """The differences A − B (module docstring) with paired bootstrap CIs.  ``counts``: scored tokens per window
    ((W,)); ``base``, ``base_finetuned``: per-window NLL sums ((W,) nats); ``a``, ``b``: ``{"pruned": (W,),
    "healed": (W,)}`` of the two methods' sets on the same windows.  Returns ``{key: {"value", "ci", "tie",
    "word"}}`` for ``before``, ``healed``, ``healed_vs_finetuned``."""
    counts = np.asarray(counts, dtype=np.int64)
    nll = {"base": base, "base_finetuned": base_finetuned, "a_pruned": a["pruned"], "a_healed": a["healed"],
           "b_pruned": b["pruned"], "b_healed": b["healed"]}
    nll = {k: np.asarray(v, dtype=np.float64) for k, v in nll.items()}
    if any(v.shape != counts.shape for v in nll.values()):
        raise ValueError("the two methods were not evaluated on the same windows")
    ppl = {k: np.exp(v.sum() / counts.sum()) for k, v in nll.items()}
    boot = _boot(nll, counts, n_boot, seed)

    def diff(p, x, y, ref):
        return 100.0 * (p[x] - p[y]) / p[ref]

    out = {}
    for key, (x, y, ref) in {"before": ("a_pruned", "b_pruned", "base"), "healed": ("a_healed", "b_healed", "base"),
                             "healed_vs_finetuned": ("a_healed", "b_healed", "base_finetuned")}.items():
        value = float(diff(ppl, x, y, ref))
        vals = diff(boot, x, y, ref)
        ci = percentile_ci(vals)
        out[key] = {"value": value, "ci": ci, "tie": tie(ci), "word": word(ci)}
    return out


def _pp(x: dict) -> str:
    return f"{x['value']:+.1f} pp [{x['ci'][0]:+.1f}, {x['ci'][1]:+.1f}]"


def sentence(n: int, label_a: str, label_b: str, diff: dict | None, same_set: bool = False) -> str:
    """The headline of one n: "after healing, A stays / stops being safer than B at n = k", with the CIs, a tie
    said as a tie, and equal sets said as such."""
    if same_set or diff is None:
        return (f"at n = {n} {label_a} and {label_b} remove the same layers: the healed models are the same "
                "(a tie by construction)")
    before, after = diff["before"]["word"], diff["healed"]["word"]
    nums = f"(ΔPPL difference after healing {_pp(diff['healed'])}; before {_pp(diff['before'])})"
    if before == "better":
        if after == "better":
            return f"after healing, {label_a} stays safer than {label_b} at n = {n} {nums}"
        how = "a tie: the CI of the difference includes 0" if after == "tie" else f"{label_a} is now worse"
        return f"after healing, {label_a} stops being safer than {label_b} at n = {n} ({how}) {nums}"
    was = "they tied" if before == "tie" else f"{label_a} was worse"
    if after == "better":
        return f"after healing, {label_a} becomes safer than {label_b} at n = {n} (before healing {was}) {nums}"
    now = "they tie (the CI of the difference includes 0)" if after == "tie" else f"{label_a} is worse"
    return f"after healing, {label_a} is not safer than {label_b} at n = {n}: {now}; before healing {was} {nums}"
