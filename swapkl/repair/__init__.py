"""Repairing a cut: a linear bridge fitted on calibration activations in place of a removed span (docs/repair.md)."""
