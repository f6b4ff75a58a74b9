"""The protocol gap over training: computing it over checkpoints (compute) and the built-in demo trajectory (demo)."""
