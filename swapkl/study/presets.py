"""Ready model lists for ``swapkl study --preset NAME`` and the paper's published figures to hold a study against.

``paper``: the paper's models (GPT-2 S–XL, OPT-350M, BLOOM-560M, Pythia 160M–2.8B, Qwen3-8B, Llama-3.1-8B,
Mistral-7B) at the paper's 8B-panel contract (adjacent pairs, all real tokens, bf16, the matched evaluator,
n = 1..5); it needs the hub and a GPU.  :data:`PAPER_FIGURES` holds the numbers the paper (and its issue) print,
and :func:`against_paper` sets a finished study's rows beside them."""
from __future__ import annotations

from swapkl.study.plan import StudyModel

PAPER_MODELS = (
    ("gpt2", "GPT-2"), ("gpt2-medium", "GPT-2-Medium"), ("gpt2-large", "GPT-2-Large"), ("gpt2-xl", "GPT-2-XL"),
    ("facebook/opt-350m", "OPT-350M"), ("bigscience/bloom-560m", "BLOOM-560M"),
    ("EleutherAI/pythia-160m", "Pythia-160M"), ("EleutherAI/pythia-410m", "Pythia-410M"),
    ("EleutherAI/pythia-1b", "Pythia-1B"), ("EleutherAI/pythia-1.4b", "Pythia-1.4B"),
    ("EleutherAI/pythia-2.8b", "Pythia-2.8B"), ("Qwen/Qwen3-8B", "Qwen3-8B"),
    ("meta-llama/Llama-3.1-8B", "Llama-3.1-8B"), ("mistralai/Mistral-7B-v0.1", "Mistral-7B"))

#: the paper's contract (docs/method.md; the 8B panel's): the scoring settings and the study settings
PAPER_CONTRACT = {"scoring": {"pairs": "adjacent", "prompts": 100, "tokens": 128, "positions": "all",
                              "dtype": "bfloat16"},
                  "evaluator": "matched", "budget": 5, "methods": ("replacement", "interchange", "random", "bi"),
                  "n_boot": 1000}

#: the paper's published figures per model label: regime, ΔPPL % per n (interchange- and replacement-guided),
#: I/R ratios, the adjacent-pair KL ratio, and the predictor validity ρ (Spearman with single-layer ΔPPL)
PAPER_FIGURES = {
    "Qwen3-8B": {"regime": "divergent", "interchange": {1: 2.5, 3: 10.3, 5: 45.4},
                 "replacement": {1: 11.3, 3: 48.2, 5: 116.5}, "ratio": {1: 0.22, 3: 0.21, 5: 0.39},
                 "rho": {"replacement": 0.775, "interchange": 0.568}},
    "Llama-3.1-8B": {"regime": "tied", "kl_ratio": 0.30, "interchange": {1: 9.2, 3: 40.3},
                     "replacement": {1: 9.2, 3: 39.1}},
    "Pythia-1.4B": {"rho": {"replacement": 0.675, "interchange": 0.717}},
}

PRESETS = {"paper": PAPER_MODELS}


def preset_models(name: str) -> list[StudyModel]:
    from swapkl.errors import SwapklError

    if name not in PRESETS:
        raise SwapklError(f"unknown study preset {name!r} (known: {', '.join(PRESETS)})")
    return [StudyModel(spec, None, label) for spec, label in PRESETS[name]]


def against_paper(result) -> list[dict]:
    """Per finished row with published figures: ``{"label", "measure", "n", "paper", "here", "here_ci"}`` for
    each figure the paper gives (regime, ΔPPL % per protocol and n, I/R, KL ratio, ρ per protocol)."""
    out = []
    for r in result.done():
        fig = PAPER_FIGURES.get(r["model"]["label"])
        if not fig:
            continue
        label, rows = r["model"]["label"], {x["n"]: x for x in r["removal"]["rows"]}
        if "regime" in fig:
            out.append({"label": label, "measure": "regime", "n": None, "paper": fig["regime"],
                        "here": r["verdict"].get("regime"), "here_ci": None})
        if "kl_ratio" in fig:
            out.append({"label": label, "measure": "KL ratio I/R (median)", "n": None, "paper": fig["kl_ratio"],
                        "here": r["gap"]["median"], "here_ci": r["gap"]["ci"]})
        for p in ("interchange", "replacement"):
            for n, v in fig.get(p, {}).items():
                x = rows.get(n, {}).get(p) or {}
                out.append({"label": label, "measure": f"ΔPPL % {p}", "n": n, "paper": v,
                            "here": x.get("delta_pct"), "here_ci": x.get("delta_pct_ci")})
        for n, v in fig.get("ratio", {}).items():
            x = rows.get(n, {})
            out.append({"label": label, "measure": "I/R", "n": n, "paper": v, "here": x.get("ratio"),
                        "here_ci": x.get("ratio_ci")})
        for p, v in fig.get("rho", {}).items():
            x = ((r.get("evidence") or {}).get("raw") or {}).get(p) or {}
            out.append({"label": label, "measure": f"ρ {p}", "n": None, "paper": v, "here": x.get("rho"),
                        "here_ci": x.get("ci")})
    return out
