"""Healing after removal: a short, deterministic LoRA fine-tune of a pruned model, measured against the same
fine-tune of the unpruned base (the control), on evaluation text the training never sees (docs/healing.md).

``recipe`` (torch-free): the training settings.  ``text``: the training region and its disjointness checks.
``train``: the LoRA training loop (checkpoints, resume, adapter cache).  ``heal``: the whole measurement
(base, pruned, healed, fine-tuned base on the same windows) and the export.  ``result``: the result type and the
share of the damage recovered with its paired bootstrap CI.
"""
