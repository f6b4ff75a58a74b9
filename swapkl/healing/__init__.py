"""Healing after removal: a short, deterministic LoRA fine-tune of a pruned model, measured against the same
fine-tune of the unpruned base (the control), on evaluation text the training never sees (docs/healing.md).

``recipe`` (torch-free): the training settings.  ``text``: the training region and its disjointness checks.
``train``: the LoRA training loop (checkpoints, resume, adapter cache).  ``heal``: the whole measurement
(base, pruned, healed, fine-tuned base on the same windows) and the export.  ``result``: the result type and the
share of the damage recovered with its paired bootstrap CI.  ``multi``: every method's set at every n healed with
one recipe and one control (healed curves); ``curves`` (torch-free): their result type; ``compare``: the paired
comparison of two methods' healed models and its headline; ``figures``: figures, tables, the report section;
``qlora``: the 4-bit base through bitsandbytes (CUDA).
"""
