"""``python -m swapkl evidence MODEL [--budget N]``: how far to trust a layer ranking: the measured cost of removing
each layer alone (held-out ΔPPL % and KL, with CIs), every signal on the same layers, their rank agreement and the
stability of the chosen sets under a bootstrap of the scoring prompts (docs/evidence.md)."""
from __future__ import annotations

import sys

from swapkl.commands.common import (add_fit_args, add_form_arg, bridge_settings_of, evaluator_and_corpus, add_contract_args, add_model_args, check_outputs, contract_from_args, emit,
                                    add_task_args, check_task_numbers, load_from_args, task_settings_of)
from swapkl.errors import SwapklError
from swapkl.removal import methods as M
from swapkl.repair import forms

SIGNALS = ("bi", "cka", "taylor", "sleb")


def register(sub) -> None:
    p = sub.add_parser("evidence", help="ground truth per layer, agreement and stability of every layer signal")
    add_model_args(p)
    p.add_argument("--budget", type=int, default=4, help="stability for n = 1..N removed layers (default 4)")
    p.add_argument("--eval-text", default=None, metavar="PATH",
                   help="text file: its evaluation region is the held-out text, the rest gives calibration text")
    p.add_argument("--evaluator", default="matched", choices=["matched", "standard"],
                   help="matched: 5,000 words, window 512, stride 256; standard: 20,000 words, 1024/512")
    p.add_argument("--max-words", type=int, default=None,
                   help="override the evaluator's word count (a labelled, non-standard contract; for quick runs)")
    p.add_argument("--boot", type=int, default=200, help="prompt resamples for the stability figures (default 200)")
    p.add_argument("--boot-agreement", type=int, default=1000, help="resamples for the agreement CIs (default 1000)")
    p.add_argument("--regions", type=int, default=2, choices=[1, 2],
                   help="evaluation regions (2: also the next words of the evaluation region, for the region effect)")
    p.add_argument("--calib-tokens", type=int, default=None,
                   help="calibration tokens for every signal and method that reads calibration text (default: "
                        "each method's own)")
    p.add_argument("--compare-seed", type=int, action="append", default=[], metavar="S",
                   help="also score with prompt seed S (repeatable) and report the rank agreement of the swap-KL "
                        "layer scores between the two contracts")
    p.add_argument("--compare-corpus", action="append", default=[], metavar="FILE",
                   help="also score with prompts from FILE's prompt region (repeatable); report the rank agreement")
    p.add_argument("--compare-dtype", action="append", default=[], metavar="DTYPE",
                   help="also score the weights loaded as float32, bfloat16, float16 or 4bit (bitsandbytes NF4; "
                        "CUDA only) (repeatable); report the rank agreement")
    p.add_argument("--no-sets", action="store_true",
                   help="skip the set-level agreement (it evaluates every method's sets at n = 1..budget)")
    _add_repair_args(p)
    g = p.add_argument_group("task ground truth (--tasks): each block removed alone, through lm-eval, as 'tasks'")
    add_task_args(g, required=False)
    p.add_argument("--json", default=None, metavar="OUT", help="write the evidence JSON here")
    p.add_argument("--quiet", action="store_true")
    add_contract_args(p)
    p.set_defaults(func=run)


def _add_repair_args(p) -> None:
    """``--repair bridge`` and the bridge settings: prune's flag names (commands/prune_repair) except the
    calibration tokens, ``--bridge-tokens``, since ``--calib-tokens`` here is the signals' calibration."""
    g = p.add_argument_group("evidence after repair (--repair bridge)")
    g.add_argument("--repair", default="none", choices=["none", "bridge"],
                   help="bridge: also the ground truth with each block's linear bridge in its place, the bridged "
                        "KL signal and every signal's agreement with both ground truths (docs/evidence.md)")
    add_form_arg(g, forms.DEFAULT, "bridge form (folded falls back to residual where no exact fold exists, e.g. "
                                   "block 0)")
    g.add_argument("--bridge-tokens", type=int, default=None, help="calibration tokens of each bridge fit "
                   "(default 8192)")
    add_fit_args(g)


def bridge_settings(a):
    """The :class:`~swapkl.repair.settings.BridgeSettings` of ``--repair bridge`` (None without it); bad values
    fail here, before the model is loaded."""
    bridge_flags = (a.bridge_tokens, a.calib_window, a.ridge)
    if a.repair == "none":
        if any(v is not None for v in bridge_flags) or a.form != forms.DEFAULT or a.calib_seed != 0:
            raise SwapklError("--form, --bridge-tokens, --calib-window, --calib-seed and --ridge go with "
                              "--repair bridge")
        return None
    return bridge_settings_of(a, "bridge_tokens")


def task_args(a):
    """``(task names, include path)`` of ``--tasks`` (None, None without it; the other task flags then refused);
    bad numbers, names and include paths fail here, before any model is loaded."""
    from swapkl.measure import lmeval

    if a.tasks is None:
        if a.include_path is not None or a.limit is not None or a.num_fewshot is not None:
            raise SwapklError("--include-path, --limit and --num-fewshot go with --tasks")
        return None, None
    check_task_numbers(a)
    names = lmeval.parse_task_names(a.tasks)
    return names, (lmeval.check_include_path(a.include_path) if a.include_path else None)


def run(a) -> int:
    names, include = task_args(a)
    if names is None:
        return _run(a, None)
    from swapkl.measure import lmeval

    if (getattr(a, "unit", None) or "block") != "block":
        raise SwapklError("--tasks removes whole blocks: use --unit block")
    with lmeval.preloaded(include, names):  # an unknown or unloadable task fails before the model is loaded
        return _run(a, task_settings_of(a, names, include))


def _run(a, tasks) -> int:
    if a.budget < 1:
        raise SwapklError(f"--budget must be at least 1 (got {a.budget})")
    if a.boot < 10 or a.boot_agreement < 10:
        raise SwapklError("--boot and --boot-agreement must be at least 10")
    M.calibration_params(a.calib_tokens, ())  # a count below the minimum fails before any work
    check_outputs(a, {"--json": a.json}, inputs=[a.eval_text, *a.compare_corpus])
    ev, corpus = evaluator_and_corpus(a)
    contract = contract_from_args(a)
    repair = bridge_settings(a)
    if repair is not None and getattr(contract, "unit", "block") != "block":
        raise SwapklError("--repair bridge replaces whole blocks: use --unit block")
    from swapkl.evidence.run import compute_evidence, regions  # deferred: the CLI's --help stays light

    regions(corpus, ev, a.regions)  # overlapping or too short regions fail before the model is loaded
    compare = _comparisons(a, contract)  # bad files, dtypes or a missing CUDA fail before the model is loaded
    ck = load_from_args(a)
    from swapkl.removal.checks import check_evaluator_context

    check_evaluator_context(ck.model, ev, name=ck.identity.get("display"))

    def prog(done, total, msg):
        if not a.quiet:
            print(f"  [{done}/{total}] {msg}", file=sys.stderr, flush=True)

    res = compute_evidence(ck, contract, ev, corpus, budget=a.budget, n_boot=a.boot_agreement,
                           n_stability=a.boot, n_regions=a.regions, calib_tokens=a.calib_tokens,
                           signals=SIGNALS, use_cache=not a.no_cache, progress=prog,
                           compare_contracts=compare, sets=not a.no_sets, repair=repair, tasks=tasks)
    return emit(a, res, render)


def _comparisons(a, contract) -> list:
    from swapkl.evidence import contracts as K

    def loader(dtype):
        from swapkl.model.checkpoints import load_checkpoint  # deferred: pulls torch

        return load_checkpoint(a.model, revision=a.revision, dtype=dtype, device=a.device,
                               trust_remote_code=a.trust_remote_code, device_map=a.device_map)

    return ([K.by_seed(contract, s) for s in a.compare_seed] + [K.by_corpus(contract, f) for f in a.compare_corpus]
            + [K.by_dtype(contract, d, loader) for d in a.compare_dtype])


def render(r) -> str:
    from swapkl.evidence.report import text_tables  # deferred: plain text formatting

    d = r.to_dict()
    if d.get("repair"):
        from swapkl.evidence.repair import text

        return text_tables(d) + "\n" + text(d["repair"])
    return text_tables(d)
