"""Study page: one analysis over a list of models under one contract -- the grid (one row per model, a link from each
row to that model's own analysis on the Start page), the I/R ratio per n as small multiples, the predictor validity
ρ per model with CIs, each model's progress while the study runs; the address bar holds the study, so a study
opened by link shows the same grid.  Request, pipeline and links: :mod:`swapkl.jobs.studies`; figures and table:
:mod:`swapkl.study.figures` (docs/study.md)."""
from __future__ import annotations

import streamlit as st

from dashboard import common
from swapkl.errors import SwapklError
from swapkl.jobs import contents, defaults as D, studies as S
from swapkl.views import captions

common.app_navigation()  # first: a fresh server's first visit may run this file without app.py
st.title("Study"), st.caption(S.INTRO)

pol = common.policy()
base = D.default_contract()
defaults = {"models": "\n".join(pol.models) if pol.demo else "default", "budget": 2, "max_words": 600,
            "n_boot": 200, "prompts": base.prompts, "tokens": base.tokens, "pairs": base.pairs, "evidence": True}
for k, v in (defaults | S.query_form(st.query_params)).items():
    st.session_state.setdefault(f"w_st_{k}", v)
text = st.text_area("Models (one a line: spec[@revision] [label])", key="w_st_models", height=110,
                    help="hub id, local folder, .gguf file or 'default'" + (" (this demo server's models)"
                                                                              if pol.demo else ""))
c1, c2, c3, c4, c5 = st.columns(5)
budget = c1.number_input("budget n", 1, pol.max_budget if pol.demo else 16, key="w_st_budget")
max_words = c2.number_input("held-out words", 100, pol.max_heldout_words if pol.demo else 20000, key="w_st_max_words",
                            step=100)
n_boot = c3.number_input("bootstrap B", 10, 5 * pol.max_evidence_boot if pol.demo else 5000, key="w_st_n_boot",
                         step=10)
prompts = c4.number_input("prompts P", 1, 256, key="w_st_prompts")
tokens = c5.number_input("tokens T", 2, 512, key="w_st_tokens")
evidence = st.checkbox("predictor validity (single-block removal cost of every block)", key="w_st_evidence")
request, err = None, None
try:
    contract = base.__class__(**(base.to_dict() | {"prompts": int(prompts), "tokens": int(tokens),
                                                   "pairs": st.session_state["w_st_pairs"]}))
    request = S.study_request(text, contract, int(budget), int(max_words), int(n_boot), evidence=evidence)
    pol.check_request(request)
except (SwapklError, TypeError, ValueError) as e:
    request, err = None, str(e).splitlines()[0]
if err:
    st.error(err)
else:
    st.code(request.label(), language=None, wrap_lines=True)
    for k, v in S.study_query(request).items():  # the address bar is the study's shared link
        if st.query_params.get(k) != v:
            st.query_params[k] = v

job = None
if st.button("Run the study", type="primary", disabled=request is None, key="run_study"):
    job = common.start(request)
elif request is not None:
    job = common.find(request)
    if job is None and S.finished(common.manager(), request):  # opened by link: the finished study at once
        job = common.start(request)
if job is None and request is None:
    job = common.current_job("study")


def body(job) -> None:
    study = job.study
    models = job.request.plan.models
    done = {r["model"]["label"]: r for r in (study.rows if study is not None else [])}
    st.dataframe([{"model": m.label, "status": (done[m.label].get("status") + (" (cached)" if done[m.label].get("cached")
                                                                                else ""))
                   if m.label in done else ("running" if job.running and len(done) == k else "waiting")}
                  for k, m in enumerate(models)], hide_index=True, key="study_progress")
    if study is None or not study.done():
        return
    from swapkl.study.across import statements
    from swapkl.study.figures import grid, figures

    sk = (contents.content_key(study.to_dict()),)
    cap = captions.contract_caption(study.provenance())
    for s in statements(study):
        st.markdown(f"- {s}")
    g = common.memo("study_grid", sk, lambda: grid(study)).copy()
    links = {r["model"]["label"]: S.analysis_link(job.request, r["model"]) for r in study.rows}
    g.insert(1, "analysis", [links[m] for m in g["model"]])
    st.dataframe(g, hide_index=True, key="study_grid",
                 column_config={"analysis": st.column_config.LinkColumn("analysis", display_text="open")})
    st.caption(f"contract: {cap}")
    figs = common.memo("study_figs", sk, lambda: figures(study))
    for name, fig in figs.items():
        st.plotly_chart(fig, key=f"study_{name}")
    if not job.running:
        common.download_json(study.to_dict(), "swapkl-study", key="study_dl")


if job is not None:
    st.divider()
    common.live(job, body, "study", watch=("study",))
else:
    st.info("Press **Run the study**; finished models (here or from `swapkl study`) are read from the study cache.")
