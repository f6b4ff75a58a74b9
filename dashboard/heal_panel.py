"""The "Healing" panel of the removal-curves page: the sets that the chosen methods pick at each n, healed with one
LoRA recipe against one control (the unpruned base fine-tuned with the same recipe on the same text), run by the job
system (progress, ETA, cancel; :class:`swapkl.jobs.HealRequest`), drawn by :mod:`swapkl.healing.figures` (dashed
healed curves, also added to the page's removal-curves figure), with the paired comparison's headline and
downloads.

Optionally, lm-eval task accuracy after healing (:mod:`swapkl.healing.tasks`: the fine-tuned base and each healed
model next to the pruned models; the task panel's widgets, dashed healed curves over the task panel's figure).

Demo mode: the recipe widgets stop at the policy's bounds, and the policy refuses a request past them (a browser
can send anything; :func:`swapkl.jobs.policy.check_heal`); tasks: the operator's allow-listed names, a bounded limit,
the operator's task folder, never an include path from the browser (as in the task panel)."""
from __future__ import annotations

import streamlit as st

from dashboard import common, tasks_panel
from swapkl import views
from swapkl.errors import SwapklError
from swapkl.healing import figures as hf
from swapkl.healing import task_figures as htf
from swapkl.healing.recipe import OBJECTIVES, PARTS, Recipe
from swapkl.jobs.contents import content_key
from swapkl.jobs.exports import worse_heals
from swapkl.jobs.forms import curves_analysis, heal_parts, heal_repairs, heal_request, healable
from swapkl.jobs.policy import DEMO_MAX_LAST_K

#: the panel's recipe when nobody changes it: small enough for a CPU (about a minute per set on stories260K)
DEFAULT = Recipe(steps=30, rank=8, alpha=16.0, lr=2e-3, warmup=3, seq_len=128, batch=4)
#: how the objectives and the trained parts read in the panel (the recipe's names: ``heal --objective / --train``)
OBJECTIVE_LABELS = {"lm": "LM loss", "kd": "distillation (KD) from the unpruned model", "kd+lm": "KD + LM"}
PART_LABELS = {"lora": "LoRA", "last-k": "last k blocks + lm_head", "bridge": "LoRA + the bridge matrices"}


def _objective_widgets(pol, from_bridge: bool = False) -> dict:
    """The loss and the trained part -> the recipe's ``objective`` (with ``temperature`` for a KD term and
    ``kd_weight`` for kd+lm), ``part`` and ``last_k`` (for last-k; ``bridge`` only for a heal from the bridged
    model); the KD control note under a ``kd`` choice."""
    c1, c2, c3, c4, c5 = st.columns(5)
    objective = c1.selectbox("Objective", OBJECTIVES, format_func=lambda o: OBJECTIVE_LABELS.get(o, o),
                             key="w_heal_objective",
                             help="heal --objective: the loss of the fine-tune")
    out = {"objective": objective}
    if objective != "lm":
        out["temperature"] = float(c2.number_input("KD temperature T", 0.1, 100.0, DEFAULT.temperature,
                                                   key="w_heal_temp"))
    if objective == "kd+lm":
        out["kd_weight"] = float(c3.number_input("KD weight w", 0.0, 1.0, DEFAULT.kd_weight, step=0.1,
                                                 key="w_heal_kd_weight", help="loss = w KD + (1 − w) LM"))
    parts = heal_parts(PARTS, from_bridge)
    if st.session_state.get("w_heal_part") not in parts:
        st.session_state["w_heal_part"] = parts[0]
    out["part"] = c4.radio("Trained part", parts, format_func=lambda p: PART_LABELS.get(p, p), key="w_heal_part",
                           help="heal --train: LoRA on every linear layer of the kept blocks, or the last k kept "
                                "blocks and lm_head in full")
    if out["part"] == "last-k":
        top = DEMO_MAX_LAST_K if pol.demo else 1024
        out["last_k"] = int(c5.number_input("k (last blocks)", 1, top, min(DEFAULT.last_k, top), key="w_heal_k"))
    if objective == "kd":
        from swapkl.healing.heal import KD_CONTROL_NOTE  # deferred: that module imports torch

        st.info(f"Note: {KD_CONTROL_NOTE}.", icon=":material/info:")
    return out


def _recipe_widgets(pol, from_bridge: bool = False) -> Recipe:
    """The recipe from the widgets (demo: the widgets stop at the policy's bounds)."""
    how = _objective_widgets(pol, from_bridge)
    c1, c2, c3, c4, c5 = st.columns(5)
    max_steps = pol.max_heal_steps if pol.demo else 100_000
    steps = int(c1.number_input("Steps", 0, max_steps, min(DEFAULT.steps, max_steps), key="w_heal_steps"))
    max_rank = pol.max_heal_rank if pol.demo else 1024
    rank = int(c2.number_input("LoRA rank", 1, max_rank, min(DEFAULT.rank, max_rank), key="w_heal_rank",
                               disabled=how["part"] == "last-k"))
    lr = float(c3.number_input("Learning rate", 1e-5, 1.0, DEFAULT.lr, format="%.4g", key="w_heal_lr"))
    seq_len = int(c4.selectbox("Sequence length", [64, 128, 256, 512], index=1, key="w_heal_seq"))
    batch = int(c5.number_input("Batch", 1, 64 if not pol.demo else 16, DEFAULT.batch, key="w_heal_batch"))
    return Recipe(steps=steps, rank=rank, alpha=2.0 * rank, lr=lr, warmup=min(DEFAULT.warmup, steps),
                  seq_len=seq_len, batch=batch, **how)


def section(analysis_job) -> None:
    """The panel, below the removal curves of ``analysis_job`` (its model, contract, budget and methods)."""
    st.subheader("Healing after removal")
    st.caption("Each method's set at each n, healed with a short fine-tune (LoRA or the last k blocks; on the LM loss "
               "or distilled from the unpruned model), against the control: the unpruned base fine-tuned with the "
               "same recipe on the same text (so domain adaptation is not counted as "
               "healing), all on the same evaluation windows.")
    req = curves_analysis(analysis_job)
    if req is None:
        st.info("Start an analysis with a layer budget first: healing uses its model, contract, budget and methods.")
        return
    pol = common.policy()
    offered = healable(req.methods)
    c1, c2 = st.columns([3, 2])
    methods = c1.multiselect("Methods to heal", offered, default=[m for m in offered
                                                                  if m in ("interchange", "replacement")],
                             key="w_heal_methods")
    top = min(req.budget, pol.max_budget) if pol.demo else req.budget
    lo, hi = (c2.slider("n (layers removed)", 1, top, (1, min(2, top)), key="w_heal_n") if top > 1 else (1, 1))
    can = req.repair != "none" and heal_repairs()  # this build's healing can start from a bridge
    from_bridge = req.repair != "none" and st.checkbox(
        "Start from the bridged model", value=can, key="w_heal_from_bridge", disabled=not can,
        help="the analysis repairs each cut with a linear bridge: heal the bridged model (heal --repair bridge)"
        if can else "this build's healing cannot start from a bridged model yet")
    recipe = _recipe_widgets(pol, from_bridge)
    bound = f"; this server allows {pol.max_heal_tokens}" if pol.demo else ""
    st.caption(f"recipe: {recipe.describe()} ({recipe.tokens_seen} training tokens per set and for the control{bound})")
    tasks, limit, shots, include = (), None, None, None
    if st.checkbox("Also task accuracy after healing (lm-eval)", key="w_heal_tasks_on"):
        tasks, limit, shots, include = tasks_panel.task_widgets(pol, "w_heal_tasks")
    if st.button("Heal", key="heal_start", disabled=not methods):
        try:
            hreq = heal_request(req, methods, range(lo, hi + 1), recipe, pol.demo, tasks, limit, shots, include,
                                from_bridge)
        except SwapklError as e:
            st.error(str(e), icon=":material/block:")
        else:
            common.start(hreq)
    job = common.current_job("heal")
    if job is not None:
        common.live(job, body, "heal", watch=("heal",))


def overlay(fig, analysis_job, fig_key: tuple):
    """The removal-curves figure ``fig`` (memoised under ``fig_key``) with this session's healed curves dashed on
    it (same model), else ``fig``."""
    job = common.current_job("heal")
    if job is None or job.heal is None or analysis_job is None or job.request.model != analysis_job.request.model:
        return fig
    return common.memo("heal_overlay", fig_key + (content_key(job.heal),), lambda: hf.with_healed(fig, job.heal))


def body(job) -> None:
    hc = job.heal
    if hc is None or not hc.methods:
        st.info("The healed curves appear here set by set (each set's heal, then the next).")
        return
    if hc.headline:
        st.markdown(f"**{hc.headline[0].upper() + hc.headline[1:]}**")
    rk = (content_key(hc),)
    fig = common.memo("heal_fig", rk, lambda: hf.heal_figure(hc))
    st.plotly_chart(fig, key="heal_main")
    stages = None if views.draws_bridged(fig) else common.memo(
        "heal_stages", rk, lambda: views.healed_stages_figure(hc, hf.caption(hc)))
    if stages is not None:  # a heal that started from the bridged model: raw, bridged and healed per method
        st.plotly_chart(stages, key="heal_stages")
    table = common.memo("heal_table", rk, lambda: hf.heal_table(hc))
    st.dataframe(table, hide_index=True, key="heal_table")
    comp = common.memo("heal_comp", rk, lambda: hf.comparison_table(hc))
    if len(comp):
        st.markdown("**Paired comparison per n** (A − B in percentage points of the base PPL; same windows)")
        st.dataframe(comp, hide_index=True, key="heal_comp")
        for c in hc.comparisons:
            st.caption(c["sentence"])
    cap = hf.caption(hc)
    st.caption(f"contract: {cap}")
    if hc.tasks:
        st.markdown("**Task accuracy after healing** (solid: before healing; dashed: healed; dotted: the fine-tuned "
                    "base)")
        st.plotly_chart(common.memo("heal_tasks_fig", rk, lambda: htf.heal_tasks_figure(hc.tasks)),
                        key="heal_tasks_main")
        st.dataframe(common.memo("heal_tasks_table", rk, lambda: htf.heal_tasks_table(hc.tasks)), hide_index=True,
                     key="heal_tasks_table")
        st.caption(f"contract: {htf.caption(hc.tasks)}")
    for note in hc.notes:
        st.caption(f"note: {note}")
    worse = worse_heals(hc)
    for (m, n), line in worse.items():  # the gate of an export (heal --out without --force)
        st.error(f"{m}, n = {n}: {line}", icon=":material/trending_up:")
    if job.running:
        return
    common.downloads(fig, table, cap, hc.to_json(), "healed-curves", key="heal")
    _export(job, worse)


def _export(job, worse: dict) -> None:
    """Export one healed model (merged Hugging Face folder, :func:`swapkl.jobs.heal_export.export_healed_model`):
    a heal that made its model worse gets no button unless "export anyway" is ticked (``heal --force``)."""
    hc = job.heal
    st.markdown("**Export a healed model**")
    c1, c2, c3 = st.columns([2, 1, 2])
    m = c1.selectbox("method", list(hc.methods), key="w_heal_exp_method")
    n = c2.selectbox("n", [e["n"] for e in hc.methods[m]], key="w_heal_exp_n")
    force = False
    if (m, n) in worse:
        force = c3.checkbox("export anyway", key="w_heal_exp_force",
                            help="the heal made this model worse than the pruned model; heal --force exports it anyway")
        if not force:
            return
    common.export_healed_view(job, m, n, force)
