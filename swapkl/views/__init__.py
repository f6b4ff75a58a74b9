"""What the dashboard and the HTML report show: the contract caption and exports (captions), the score figures
(scores), the bridged matrix beside them (bridged), the removal-curve figures (curves) and their repaired side (repaired), the trajectory figures (trajectory) and the HTML report (report).
Plotly and pandas only; no Streamlit.  The figure functions are importable from here."""
from __future__ import annotations

from swapkl.views.bridged import bridge_caption, bridge_statement, bridged_heatmaps, span_costs
from swapkl.views.captions import SEP, contract_caption, figure_html, table_csv
from swapkl.views.curves import kl_to_base_figure, removal_curves, removed_layers_table
from swapkl.views.repaired import curves_caption, draws_bridged, healed_stages_figure, repair_caption, repair_table, with_bridged
from swapkl.views.scores import (LOG_FLOOR, depth_profile, gap_heatmap, heatmaps, is_adjacent_only, pair_distribution,
                                 profile_frame, top_pairs_table)
from swapkl.views.trajectory import trajectory_figures
from swapkl.views.units import common_axis_figure, units_axis_caption, units_export_hint

__all__ = ["LOG_FLOOR", "SEP", "contract_caption", "depth_profile", "figure_html", "gap_heatmap", "heatmaps",
           "is_adjacent_only", "kl_to_base_figure", "pair_distribution", "profile_frame", "removal_curves",
           "removed_layers_table", "table_csv", "top_pairs_table", "trajectory_figures", "common_axis_figure",
           "units_axis_caption", "units_export_hint", "curves_caption", "repair_caption", "repair_table",
           "with_bridged", "healed_stages_figure", "draws_bridged",
           "bridged_heatmaps", "bridge_statement", "bridge_caption", "span_costs"]
