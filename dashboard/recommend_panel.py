"""The "Recommended removal" section of the removal-curves page, when the run included ``recommend``: one sentence
per n (the set, how the rule chose it, held-out ΔPPL against the best zero-evaluation method) and the paired
comparison with every other method of the run (:meth:`swapkl.removal.recommend.Recommendation.paired_table`),
with its contract and a CSV download.  The rule is docs/recommend-rule.md."""
from __future__ import annotations

import streamlit as st

from dashboard import common
from swapkl import views
from swapkl.errors import SwapklError
from swapkl.removal.recommend import Recommendation


def section(curves) -> None:
    """Draw the section for a finished :class:`~swapkl.removal.curves.CurvesResult` that ran ``recommend``."""
    if curves is None or "recommend" not in (curves.methods or {}):
        return
    try:
        rec = Recommendation.from_curves(curves)
    except (SwapklError, KeyError, TypeError):
        return
    st.subheader("Recommended removal, judged on held-out text")
    cap = views.contract_caption(rec)
    st.caption(f"rule: {rec.settings.get('choice', 'lowest calibration PPL')}; contract: {cap}")
    for e in rec.entries:
        st.markdown(f"- {rec.explain(e['n'])}")
    if not rec.paired:
        return
    tbl = rec.paired_table()
    st.caption("ΔPPL %(recommend) − ΔPPL %(method), points, with the paired bootstrap 95 % CI over the held-out "
               "windows (tie when it includes 0; random: its mean over seeds).")
    st.dataframe(tbl, hide_index=True, key="cv_rec_paired")
    common.download_table(tbl, cap, "recommend-paired", key="dl_rec_paired")
