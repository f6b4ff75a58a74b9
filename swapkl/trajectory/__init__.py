"""The protocol gap over training: which checkpoints (checkpoints), the statistics of the gap over them (stats),
scoring them into a :class:`Trajectory` (compute) and the built-in demo trajectory (demo).  The names of the first
three are importable from here."""
from __future__ import annotations

from swapkl.trajectory.checkpoints import (MANIFEST, CheckpointListError, CheckpointSpec, checkpoints_in_folder,
                                           parse_checkpoints, read_manifest, step_from_name)
from swapkl.trajectory.compute import Trajectory, compute_trajectory, trajectory_provenance
from swapkl.trajectory.stats import (TrajectoryPoint, as_point, as_points, checkpoint_stats, gap_vs_depth,
                                     pair_frame, point_from_result, point_stats)

__all__ = ["MANIFEST", "CheckpointListError", "CheckpointSpec", "Trajectory", "TrajectoryPoint", "as_point",
           "as_points", "checkpoint_stats", "checkpoints_in_folder", "compute_trajectory", "gap_vs_depth",
           "pair_frame", "parse_checkpoints", "point_from_result", "point_stats", "read_manifest", "step_from_name",
           "trajectory_provenance"]
