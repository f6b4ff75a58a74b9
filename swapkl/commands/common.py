"""Arguments shared by commands that load a model and score it, and the up-front checks of their paths."""
from __future__ import annotations

import sys
import time
from collections.abc import Iterable

from swapkl.contract import PER_LAYER, Contract, PRESETS, UNITS
from swapkl.errors import SwapklError
from swapkl.scoring.corpora import load_corpus
from swapkl.surgery.outputs import check_output_file


def add_model_args(p) -> None:
    p.add_argument("model", help="hub id[@revision], local HF folder, .gguf file, or 'default'")
    p.add_argument("--revision", default=None, help="hub revision (branch, tag such as step143000, or commit)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--device-map", default=None, help="accelerate device_map (e.g. auto) for models larger than one GPU")
    p.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model (off by default)")
    p.add_argument("--family", default=None, metavar="FILE",
                   help="a JSON or YAML file describing where the model keeps its blocks, final norm, head and units "
                        "(docs/architecture.md, 'Describe a family'); used only when it validates on the model")


def add_contract_args(p, pairs_default: str = "adjacent") -> None:
    p.add_argument("--preset", default="canonical", choices=sorted(PRESETS),
                   help="named contract (paper-last-token: KL at the last position only, as the paper's GPT-2/"
                        "Pythia runs); explicit flags below override it")
    p.add_argument("--pairs", default=pairs_default, help="adjacent | gap:K | all")
    p.add_argument("--prompts", type=int, default=16, help="number of prompt windows P")
    p.add_argument("--tokens", type=int, default=64, help="tokens per window T")
    p.add_argument("--positions", default=None, choices=["all", "last"], help="KL positions (default: all)")
    p.add_argument("--corpus", default=None, help="text file for prompts (default: WikiText-2, else built-in)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--aggregation", default="max", choices=["max", "mean", "forward"],
                   help="how d_repl combines the two directions (max = Definition 1)")
    p.add_argument("--unit", default=None, metavar="|".join(UNITS),
                   help="what each protocol moves between layers: whole blocks (default), or only the attention or "
                        "MLP sublayer with its norms (docs/method.md, 'Sublayer units')")
    p.add_argument("--per-layer", default=None, metavar="|".join(PER_LAYER),
                   help="what 'block j in slot i' means (docs/method.md §1): slot (default, the paper's: block j's "
                        "weights in slot i's module, with the slot's per-layer settings; pairs of blocks of different "
                        "structure are n/a) or block (block j's own module with its own settings, as removal does)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the score cache")


def add_unit_arg(p) -> None:
    """``--unit block|attention|mlp`` (what a removed index removes), unless the parser already has it."""
    if "--unit" in getattr(p, "_option_string_actions", {}):
        return
    p.add_argument("--unit", default=None, choices=UNITS,
                   help="unit of analysis: a whole block (default), or its attention or MLP sublayer (skipped)")


def add_task_args(p, required: bool = True, batch: bool = True) -> None:
    """The lm-eval task flags of ``tasks``, ``evidence`` and ``study``: ``--tasks`` (required, or optional where task
    accuracy is an optional part), ``--include-path``, ``--limit``, ``--num-fewshot`` and, with ``batch``,
    ``--batch-size`` (checked by :func:`check_task_numbers`)."""
    p.add_argument("--tasks", required=required, default=None,
                   help="comma-separated lm-eval task names (hub tasks such as hellaswag,arc_easy,piqa,winogrande,"
                        "lambada_openai; swapkl's offline task wikitext_lastword; or tasks from --include-path)")
    p.add_argument("--include-path", default=None, metavar="DIR",
                   help="folder of local lm-eval task YAML files (your own code: a task YAML can run Python)")
    p.add_argument("--limit", type=int, default=None, metavar="K", help="evaluate the first K documents of each task")
    p.add_argument("--num-fewshot", type=int, default=None, metavar="F",
                   help="few-shot examples (default: each task's own, else 0)")
    if batch:
        p.add_argument("--batch-size", type=int, default=16, help="lm-eval batch size (default %(default)s)")


def check_task_numbers(a) -> None:
    """``--limit`` and ``--batch-size`` at least 1, ``--num-fewshot`` at least 0 (one line each)."""
    for flag, v, lo in (("--limit", a.limit, 1), ("--num-fewshot", a.num_fewshot, 0),
                        ("--batch-size", getattr(a, "batch_size", None), 1)):
        if v is not None and v < lo:
            raise SwapklError(f"{flag} must be at least {lo} (got {v})")


def task_settings_of(a, tasks, include):
    """The :class:`~swapkl.measure.task_runner.TaskSettings` of :func:`add_task_args`' flags."""
    from swapkl.measure.task_runner import TaskSettings

    return TaskSettings(tuple(tasks), include_path=include, limit=a.limit, num_fewshot=a.num_fewshot,
                        batch_size=a.batch_size, use_cache=not a.no_cache)


def contract_from_args(a) -> Contract:
    """The contract of the parsed flags: the ``--preset`` first, then every flag given explicitly.  A
    ``--corpus`` file is read now, so a missing, binary or empty one fails before any model is loaded."""
    given = {"pairs": a.pairs, "prompts": a.prompts, "tokens": a.tokens, "corpus": a.corpus, "seed": a.seed,
             "dtype": a.dtype, "device": a.device, "aggregation": a.aggregation,
             "unit": getattr(a, "unit", None) or "block", "per_layer": getattr(a, "per_layer", None) or "slot"}
    if a.positions is not None:
        given["positions"] = a.positions
    contract = Contract.preset(getattr(a, "preset", "canonical") or "canonical", **given)
    if contract.corpus:
        load_corpus(contract.corpus)  # memoised: score() gets the same object
    return contract


def add_rank_args(p) -> None:
    """The flags of a torchrun command (``score-distributed``, ``bridge-distributed``): output, backend, GPUs."""
    p.add_argument("--json", default=None, metavar="OUT", help="rank 0 writes the merged result JSON here")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"],
                   help="torch.distributed backend for the coordination (a barrier and small objects); "
                        "gloo works for CPU and GPU ranks alike")
    p.add_argument("--gpus-per-rank", type=int, default=0,
                   help="give each rank its own group of this many GPUs (with --device-map auto, for models "
                        "larger than one GPU); 0 = one GPU per rank (cuda:LOCAL_RANK)")
    p.add_argument("--timeout-hours", type=float, default=168.0,
                   help="how long a rank waits for the others at the barrier")
    p.add_argument("--quiet", action="store_true")


def block_unit_only(a, command: str) -> None:
    """Refuse, in one line and before any loading, a sublayer ``--unit`` for a command that removes or evaluates
    whole blocks only (its swap-KL would be of sublayers while it removes blocks)."""
    unit = getattr(a, "unit", None) or "block"
    if unit != "block":
        Contract(unit=unit)  # an unknown unit: the contract's own one-line error
        raise SwapklError(f"'{command}' works on whole blocks only for now; --unit {unit} is available on 'score', "
                          "'trajectory' and 'distributed' (use --unit block here)")


def model_inputs(a) -> list[str]:
    """The local folder or GGUF file that ``a.model`` names (nothing for a hub id or the built-in model): what
    no output of the command may overwrite."""
    if not getattr(a, "model", None):
        return []
    from swapkl.model.checkpoints import parse_spec  # deferred: pulls torch; the CLI's --help must not

    sp = parse_spec(a.model, getattr(a, "revision", None))
    return [sp.source] if sp.kind in ("local", "gguf") else []


def check_outputs(a, files: dict, inputs: Iterable = ()) -> None:
    """Check every output file of a command before anything is loaded or computed
    (:func:`swapkl.surgery.outputs.check_output_file`): ``files`` maps a flag (``"--json"``) to its path (None = not
    given); ``inputs`` are further files the command reads (scores, curves, corpus), besides the model's own."""

    ins = [*model_inputs(a), *(i for i in inputs if i), getattr(a, "corpus", None)]
    for flag, path in files.items():
        if path:
            check_output_file(path, flag, ins)


def emit(a, obj, render) -> int:
    """The end of a command that makes a result: write it as JSON to ``--json`` (when given), print
    ``render(obj)`` unless ``--quiet``, and return the exit code 0."""
    if a.json:
        obj.to_json(a.json)
    if not a.quiet:
        print(render(obj))
    return 0


def load_from_args(a):
    from swapkl.model.checkpoints import load_checkpoint  # deferred: pulls torch; the CLI's --help must not

    return load_checkpoint(a.model, revision=a.revision, dtype=a.dtype, device=a.device,
                           trust_remote_code=a.trust_remote_code, device_map=a.device_map, family=a.family)


class ProgressPrinter:
    """A one-line progress display on stderr with an ETA."""

    def __init__(self, quiet: bool = False):
        self.silent = quiet                        # --quiet: nothing at all
        self.quiet = quiet or not sys.stderr.isatty()  # not a terminal: only the final line
        self.t0 = time.perf_counter()
        self.last = 0.0

    def __call__(self, done: int, total: int, what: str) -> None:
        now = time.perf_counter()
        if self.silent or (self.quiet and done != total):
            return
        if now - self.last < 0.2 and done != total:
            return
        self.last = now
        el = now - self.t0
        eta = el / done * (total - done) if done else float("nan")
        end = "\n" if done == total else "\r"
        print(f"  {done}/{total} variants  {el:6.1f}s elapsed  ETA {eta:5.1f}s  {what:<24}", end=end,
              file=sys.stderr, flush=True)


def evaluator_and_corpus(a, drop_first_target: bool | None = None):
    """The held-out evaluator (``--evaluator``, shortened to ``--max-words`` and labelled so) and the corpus
    (``--eval-text``, else the default) a command evaluates on.  Raises :class:`SwapklError` for a bad
    ``--max-words``."""
    from swapkl.errors import SwapklError
    from swapkl.measure.evaluate import Evaluator, get_evaluator  # deferred: pulls torch; the CLI's --help must not

    ev = get_evaluator(a.evaluator, drop_first_target=drop_first_target)
    if a.max_words is not None:
        if a.max_words < 1:
            raise SwapklError(f"--max-words must be positive (got {a.max_words})")
        ev = Evaluator(f"{ev.name}@{a.max_words}w", a.max_words, ev.window, ev.stride, ev.drop_first_target)
    return ev, (load_corpus(a.eval_text) if a.eval_text else load_corpus())


def add_form_arg(g, default: str | None = None, help: str = "") -> None:
    """``--form``, its choices the bridge forms' registry (:data:`swapkl.repair.forms.NAMES`)."""
    from swapkl.repair import forms

    g.add_argument("--form", default=default, choices=list(forms.NAMES), help=help)


def add_fit_args(g) -> None:
    """``--calib-window``, ``--calib-seed`` (default 0) and ``--ridge``: the bridge fit's flags of a command that
    always fits a bridge or refuses them without ``--repair bridge`` (bridge, heal, evidence, prune)."""
    from swapkl.repair.settings import DEFAULT_CALIB_WINDOW, DEFAULT_RIDGE

    g.add_argument("--calib-window", type=int, default=None,
                   help=f"tokens per calibration window (default {DEFAULT_CALIB_WINDOW})")
    g.add_argument("--calib-seed", type=int, default=0, help="which calibration windows are drawn (default 0)")
    g.add_argument("--ridge", type=float, default=None,
                   help=f"relative ridge ε/mean eigenvalue of XᵀX (default {DEFAULT_RIDGE:g})")


def bridge_settings_of(a, tokens: str = "calib_tokens"):
    """The :class:`~swapkl.repair.settings.BridgeSettings` of a command's bridge flags (``--form``,
    ``--calib-window``, ``--calib-seed``, ``--ridge`` and the calibration tokens under ``tokens``), built once here:
    a bad value is one line before any model loads."""
    from swapkl.repair.settings import BridgeSettings

    return BridgeSettings.from_dict({"form": a.form, "calib_tokens": getattr(a, tokens, None),
                                     "calib_window": a.calib_window, "calib_seed": a.calib_seed, "ridge": a.ridge})


def add_bridge_args(p) -> None:
    """``--repair none|bridge`` and the bridge's settings for a removal command (curves, recommend); the command's
    ``--calib-tokens`` also sets the bridge's calibration tokens (docs/repair.md, "Removal with repair")."""
    g = p.add_argument_group("repair (--repair bridge)")
    g.add_argument("--repair", default="none", choices=["none", "bridge"],
                   help="bridge: evaluate every set also with a linear bridge in place of each removed span "
                        "(fitted on calibration text, no training), on the same windows, with the paired CI")
    add_form_arg(g, None, "the bridge form (default folded: ReplaceMe's, into the MLP before the span; residual "
                          "where no exact fold exists)")
    g.add_argument("--calib-window", type=int, default=None, help="tokens per bridge calibration window (default 256)")
    g.add_argument("--calib-seed", type=int, default=None, help="which bridge calibration windows are drawn (default 0)")
    g.add_argument("--ridge", type=float, default=None, help="the bridge's relative ridge (default 1e-4)")


def bridge_fields(a) -> dict:
    """The plan fields ``repair`` and ``bridge`` of :func:`add_bridge_args`' flags (a bridge flag without
    ``--repair bridge`` is refused by the plan in one line)."""
    repair = getattr(a, "repair", None) or "none"
    given = {"form": a.form, "calib_window": a.calib_window, "calib_seed": a.calib_seed, "ridge": a.ridge}
    if repair == "bridge":
        given["calib_tokens"] = getattr(a, "calib_tokens", None)
    elif any(v is not None for v in given.values()):
        raise SwapklError("--form, --calib-window, --calib-seed and --ridge go with --repair bridge")
    return {"repair": repair, "bridge": {k: v for k, v in given.items() if v is not None}}


def add_selection_args(p) -> None:
    """The selection rule's candidates and partners, for every command that picks removal sets (curves, tasks, heal):
    ``--include-boundary`` and ``--partners``."""
    p.add_argument("--include-boundary", action="store_true", help="allow removing the first and last layer")
    p.add_argument("--partners", default=None,
                   help="partner set for the layer score: adjacent | K (|i-j| <= K) | all scored pairs (default)")


def selection_fields(a) -> dict:
    """The plan fields of :func:`add_selection_args`' flags: ``exclude_boundary`` and ``partners`` (``adjacent``,
    ``all``, an integer K, or None for every scored pair); a bad ``--partners`` is refused in one line."""
    partners = a.partners
    if partners is not None and partners not in ("adjacent", "all"):
        try:
            partners = int(partners)
        except ValueError:
            raise SwapklError(f"--partners must be adjacent, all or an integer K (got '{a.partners}')") from None
    return {"exclude_boundary": not a.include_boundary, "partners": partners}


def removal_plan(a, methods, **fields):
    """The :class:`~swapkl.removal.plan.RemovalPlan` of a removal command, built once from its arguments and
    checked here, before any model is loaded: ``--budget`` (and ``--spacing`` where the command has it) refused in
    the flag's words, then the plan's own checks (methods known, unit, seeds; one line each).  ``methods``: the
    method names; ``fields``: the plan's other fields the command sets (unit, evaluator, seeds, method_params...)."""
    from swapkl.removal.plan import RemovalPlan

    for name, flag, lo in (("budget", "--budget", 1), ("spacing", "--spacing", 0)):
        v = getattr(a, name, None)
        if v is not None and v < lo:
            raise SwapklError(f"{flag} must be at least {lo} (got {v})")
    if getattr(a, "spacing", None) is not None:
        fields.setdefault("spacing", a.spacing)
    if hasattr(a, "repair"):
        for k, v in bridge_fields(a).items():
            fields.setdefault(k, v)
    return RemovalPlan(budget=a.budget, methods=tuple(methods), **fields)
