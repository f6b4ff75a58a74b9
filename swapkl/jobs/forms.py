"""From the dashboard's forms to requests, and back: each page's request built from its widgets' values (one
function per request type; bad values raise :class:`~swapkl.errors.SwapklError` with the line the page shows), the
query string of a shared link (:func:`query_params` and its inverse :func:`query_settings`), and the contract line
of a request shown before any result exists (:func:`request_caption`).  The pages draw the widgets; the server's
:class:`~swapkl.jobs.policy.Policy` checks what comes out."""
from __future__ import annotations

from pathlib import Path

from swapkl import views
from swapkl.contract import BLOCK, SLOT, Contract
from swapkl.errors import SwapklError
from swapkl.removal import methods as M
from swapkl.removal import plan as _plan
from swapkl.repair import forms
from swapkl.jobs.requests import AnalysisRequest, EvidenceRequest, HealRequest, TasksRequest, TrajectoryRequest

#: the contract fields and analysis settings a shared link carries, with their types
QUERY_FIELDS = (("pairs", str), ("prompts", int), ("tokens", int), ("positions", str), ("dtype", str),
                ("device", str), ("aggregation", str), ("seed", int), ("budget", int), ("evaluator", str),
                ("unit", str), ("per_layer", str), ("repair", str), ("bridge_form", str), ("bridge_tokens", int))

#: the Start form's repair choices with their labels (the plan's ``repair`` field; docs/repair.md)
REPAIR_CHOICES = {"none": "none", "bridge": "linear bridge"}
#: the bridge's forms and its default calibration tokens: the plan's (one spelling, torch-free)
BRIDGE_FORMS = _plan.BRIDGE_FORMS
BRIDGE_TOKENS = _plan.BRIDGE_DEFAULTS["calib_tokens"]
#: the calibration tokens the form accepts (the lower bound is the calibration window,
#: :data:`swapkl.repair.calibration.DEFAULT_CALIB_WINDOW`; the upper one keeps a fit within minutes on a CPU)
BRIDGE_TOKENS_RANGE = (256, 1_048_576)

#: what the start page says when a sublayer unit is chosen (the analysis then computes swap-KL only)
SUBLAYER_NOTE = ("Attention and MLP units: both protocols move only that sublayer (with its norms) between layers, "
                 "and removal curves skip the chosen sublayers (the residual stream passes through). Methods defined "
                 "on whole blocks only (CKA, angular, Taylor, LaCo, the recommendation) are left out.")


# ============================================================================================ requests
def bridge_settings(repair: str, form: str = forms.DEFAULT, calib_tokens=BRIDGE_TOKENS) -> dict:
    """The Start form's repair -> the plan's ``bridge`` dict (``{"form", "calib_tokens"}``; ``{}`` without a repair).
    A repair, form or token count outside :data:`REPAIR_CHOICES`, :data:`BRIDGE_FORMS` and
    :data:`BRIDGE_TOKENS_RANGE` (an integer) is refused in one line (:class:`~swapkl.errors.SwapklError`)."""
    if repair not in REPAIR_CHOICES:
        raise SwapklError(f"unknown repair '{repair}'; choose one of: {', '.join(REPAIR_CHOICES)}")
    if repair == "none":
        return {}
    forms.get(form)  # the forms registry's one-line refusal
    lo, hi = BRIDGE_TOKENS_RANGE
    if isinstance(calib_tokens, bool) or not isinstance(calib_tokens, int) or not lo <= calib_tokens <= hi:
        raise SwapklError(f"calibration tokens must be an integer in {lo}..{hi} (got {calib_tokens!r})")
    return {"form": form, "calib_tokens": int(calib_tokens)}


def analysis_request(spec: str, revision: str | None, contract: Contract, budget: int, methods, evaluator: dict | None,
                     repair: str = "none", bridge: dict | None = None) -> AnalysisRequest:
    """The start page's request; an empty checkpoint spec is refused.  A sublayer unit (attention, mlp) keeps only
    the methods that apply per unit (the registry's, :func:`swapkl.removal.methods.for_unit`; :data:`SUBLAYER_NOTE`); its removal plan is checked
    here.  ``repair`` / ``bridge``: the repair after removal (:func:`bridge_settings` checks the bridge; a repair
    needs whole blocks)."""
    if not spec:
        raise SwapklError("choose a checkpoint")
    if contract.unit != BLOCK:
        methods = tuple(M.for_unit(methods, contract.unit))
    b = dict(bridge or {})
    bridge = bridge_settings(repair, b.get("form", BRIDGE_FORMS[0]), b.get("calib_tokens", BRIDGE_TOKENS))
    if repair != "none" and contract.unit != BLOCK:
        raise SwapklError(f"a linear bridge replaces removed blocks; unit {contract.unit} removes sublayers")
    # a repair without curves (budget 0) still asks for the third matrix, the bridged heatmap
    req = AnalysisRequest(model=spec, revision=revision, contract=contract, budget=budget, methods=methods,
                          evaluator=evaluator, repair=repair, bridge=bridge)
    if req.wants_curves:
        req.removal_plan()  # the plan's checks (budget, methods, unit) refuse a bad form here, in one line
    return req


def unit_note(contract: Contract | None) -> str:
    """What the start page says under the contract for its unit: :data:`SUBLAYER_NOTE` for a sublayer, else ""."""
    return SUBLAYER_NOTE if contract is not None and contract.unit != "block" else ""


def trajectory_request(text: str, k: int, prompts: int, tokens: int, device: str) -> TrajectoryRequest:
    """The trajectory page's request: the checkpoint list ``text`` scored on the pairs ``|i - j| <= k``
    (``adjacent`` for 1) with ``prompts`` x ``tokens`` per checkpoint."""
    contract = Contract(pairs="adjacent" if k == 1 else f"gap:{int(k)}", prompts=int(prompts), tokens=int(tokens),
                        device=device)
    if not text.strip():
        raise SwapklError("give at least one checkpoint")
    return TrajectoryRequest(text.strip(), contract)


def evidence_request(model: str, budget: int, n_boot: int, base: AnalysisRequest | None = None,
                     repair: str = "none", bridge: dict | None = None, tasks=(), limit: int | None = None,
                     shots: int | None = None, include: str | None = None) -> EvidenceRequest:
    """The evidence page's request for ``model``: on the model of the session's analysis ``base`` it keeps that
    analysis's revision, contract (as whole blocks: the evidence removes blocks) and evaluator (so the evidence
    speaks for it), else the default contract and the ``matched`` evaluator.  ``repair`` / ``bridge``: the "after
    repair" part (``"bridge"``: each block also removed with its linear bridge), checked by :func:`bridge_settings`
    as the Start form's repair is (one line for a bad form or token count).  ``tasks`` (with ``limit``, ``shots``,
    ``include``, as :func:`tasks_request`): the task ground truth, each block's accuracy loss through lm-eval."""
    model = model.strip()
    if not model:
        raise SwapklError("choose a checkpoint")
    b = dict(bridge or {})
    bridge = bridge_settings(repair, b.get("form", BRIDGE_FORMS[0]), b.get("calib_tokens", BRIDGE_TOKENS))
    same = base is not None and base.model == model
    return EvidenceRequest(model=model, revision=base.revision if same else None,
                           contract=base.contract.with_(unit="block") if same else Contract(), budget=int(budget),
                           evaluator=(base.evaluator if same else None) or "matched", n_boot=int(n_boot),
                           repair=repair, bridge=bridge, tasks=tuple(tasks or ()),
                           limit=limit if tasks else None, num_fewshot=shots if tasks else None,
                           include_path=include if tasks else None)


def curves_analysis(job) -> AnalysisRequest | None:
    """The request of ``job`` when it is an analysis with a layer budget (what the task and healing panels follow:
    its model, contract, budget and methods), else None."""
    req = job.request if job is not None else None
    blocks = req is not None and getattr(req.contract, "unit", "block") == "block"  # the panels remove blocks
    return req if req is not None and req.kind == "analysis" and req.wants_curves and blocks else None


def task_list(text: str) -> tuple[str, ...]:
    """lm-eval task names typed comma-separated."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def few_shot(text: str) -> int | None:
    """A typed few-shot count; None (the task's default) unless it is a non-negative integer."""
    text = text.strip()
    return int(text) if text.isdigit() else None


def tasks_request(base: AnalysisRequest, tasks, limit: int | None, shots: int | None, include: str | None
                  ) -> TasksRequest:
    """Task accuracy after removal for the analysis ``base`` (its model, contract, budget and methods)."""
    req = TasksRequest(model=base.model, revision=base.revision, contract=base.contract, budget=base.budget,
                       methods=base.methods, tasks=tuple(tasks), limit=limit, num_fewshot=shots, include_path=include)
    req.removal_plan()  # the plan's checks refuse a bad request here, in one line
    return req


def heal_request(base: AnalysisRequest, methods, ns, recipe, demo: bool, tasks=(), limit: int | None = None,
                 shots: int | None = None, include: str | None = None, from_bridge: bool = False) -> HealRequest:
    """Healing of ``methods``' sets at each n of ``ns`` for the analysis ``base`` with ``recipe``; a demo server
    heals on its own evaluator (the analysis's evaluator is a local choice); the task folder only with tasks.
    ``from_bridge``: the heals start from the bridged model of ``base``'s repair (:func:`heal_repairs`: refused in
    one line where the healing package cannot)."""
    repair = base.repair if from_bridge else "none"
    if repair != "none" and not heal_repairs():
        raise SwapklError("healing from a bridged model needs a healing package that takes the repair "
                          "(HealSetup.repair); untick 'start from the bridged model'")
    req = HealRequest(model=base.model, revision=base.revision, contract=base.contract, methods=tuple(methods),
                      ns=tuple(ns), recipe=recipe, evaluator=None if demo else base.evaluator, tasks=tuple(tasks),
                      limit=limit, num_fewshot=shots, include_path=include if tasks else None, repair=repair,
                      bridge=base.bridge if repair != "none" else None)
    if req.methods and req.ns:
        req.removal_plan()  # the plan's checks refuse a bad request here, in one line
    return req


def heal_repairs() -> bool:
    """Whether a heal can start from a bridged model here (``HealSetup`` has the ``repair`` field)."""
    from swapkl.healing.heal import HealSetup  # deferred: that module imports torch

    return "repair" in HealSetup.__dataclass_fields__


def heal_parts(parts, from_bridge: bool) -> list[str]:
    """The trained parts the panel offers: ``bridge`` (the bridge matrices with LoRA) only for a heal that starts
    from the bridged model."""
    return [p for p in parts if p != "bridge" or from_bridge]


def healable(methods) -> list[str]:
    """The deterministic, non-merging methods among ``methods`` (guided ones first): the ones with one set per n,
    which healing can fine-tune."""
    from swapkl.healing.multi import MERGING
    from swapkl.removal import methods as M

    out = []
    for m in M.run_order(methods):
        spec = M.find(m)
        if spec is not None and not spec.seeded and m not in M.GROUPS and m not in MERGING:
            out.append(m)
    return out


# ============================================================================================ shared links
def query_params(req: AnalysisRequest) -> dict[str, str]:
    """The query string of a shared link to ``req``: its model (and revision), contract fields and settings (the
    unit only when it is a sublayer: a block analysis, the default, needs no unit in its link)."""
    c = req.contract
    q = {"model": req.model, "pairs": c.pairs, "prompts": c.prompts, "tokens": c.tokens,
         "positions": c.positions, "dtype": c.dtype, "device": c.device, "aggregation": c.aggregation,
         "seed": c.seed, "budget": req.budget, "methods": ",".join(req.methods),
         "evaluator": (req.evaluator or {}).get("name", "")}
    if req.revision:
        q["revision"] = req.revision
    if c.unit != "block":
        q["unit"] = c.unit
    if c.per_layer != SLOT:
        q["per_layer"] = c.per_layer
    if req.repair != "none":
        q.update(repair=req.repair, bridge_form=req.bridge.get("form", BRIDGE_FORMS[0]),
                 bridge_tokens=req.bridge.get("calib_tokens", BRIDGE_TOKENS))
    return {k: str(v) for k, v in q.items()}


def query_settings(query, offered_methods) -> dict:
    """The settings a shared link's query string carries, typed (:data:`QUERY_FIELDS`); a value that does not
    convert, or a repair setting the form would refuse (:func:`bridge_settings`), is left out.  ``methods``: those
    among ``offered_methods``.  The model is read by :func:`spec_source`."""
    out = {}
    for k, conv in QUERY_FIELDS:
        if k in query:
            try:
                out[k] = conv(query[k])
            except (ValueError, TypeError):
                pass
    for k, args in (("repair", lambda v: (v,)), ("bridge_form", lambda v: ("bridge", v)),
                    ("bridge_tokens", lambda v: ("bridge", BRIDGE_FORMS[0], v))):
        try:
            if k in out:
                bridge_settings(*args(out[k]))
        except SwapklError:
            out.pop(k)
    if "methods" in query:
        out["methods"] = [m for m in str(query["methods"]).split(",") if m in offered_methods]
    return out


def family_note(spec: str, revision: str | None = None) -> tuple[bool, str] | None:
    """``(supported, one line)`` for a typed model spec from its config alone (a hub id's ``config.json`` is the
    only file fetched; a local folder's is read and checked), through swapkl's support table
    (:func:`swapkl.model.supported.support_line`); None for the built-in default, a GGUF file, an empty spec, a
    config that cannot be read (the analysis says why) or a model type the table does not know."""
    if not spec or spec_source(spec) in ("builtin", "gguf"):
        return None
    from swapkl.model.checkpoints import load_config, parse_spec  # deferred: pulls torch
    from swapkl.model.supported import support_line

    try:
        config = load_config(parse_spec(spec, revision or None))
        text = config.get_text_config()
    except Exception:  # unreadable, offline, several text configs: the analysis itself will say why
        return None
    ok, line = support_line(config.model_type, text.model_type if text is not config else None)
    return None if ok is None else (ok, line)


def spec_source(spec: str) -> str:
    """Where a model spec points: ``builtin`` (the default), ``gguf`` (a ``.gguf`` file), ``local`` (an existing
    path, or one that starts like a path) or ``hub`` (an ``org/name`` id)."""
    if spec in ("default", "builtin"):
        return "builtin"
    if spec.lower().endswith(".gguf"):
        return "gguf"
    if Path(spec).expanduser().exists() or spec.startswith((".", "/", "~")):
        return "local"
    return "hub"


def request_caption(req) -> str:
    """The contract line of a request (what is shown before any result exists); empty for None."""
    if req is None:
        return ""
    if req.kind == "trajectory":
        return views.contract_caption(req.contract.provenance(model=f"trajectory: {req.checkpoints[:80]}"))
    if req.kind == "study":
        return req.label()
    model = req.model + (f"@{req.revision}" if req.revision else "")
    cap = views.contract_caption(req.contract.provenance(model=model),
                                 evaluator=req.evaluator if req.wants_curves else None)
    if req.wants_curves:
        cap += f"{views.SEP}budget {req.budget}{views.SEP}methods {', '.join(req.methods)}"
        if getattr(req, "repair", "none") != "none":
            b = req.bridge
            cap += (f"{views.SEP}repair: {REPAIR_CHOICES.get(req.repair, req.repair)} ({b.get('form', BRIDGE_FORMS[0])}, "
                    f"{b.get('calib_tokens', BRIDGE_TOKENS)} calibration tokens)")
    return cap
