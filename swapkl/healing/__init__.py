"""Healing after removal: a short, deterministic fine-tune of a pruned model (LoRA or the last k blocks and lm_head,
on the LM loss or distilled from the unpruned model), measured against the same fine-tune of the unpruned base (the
control), on evaluation text the training never sees (docs/healing.md).

``recipe`` (torch-free): the training settings.  ``text``: the training region and its disjointness checks.
``train``: the training loop (checkpoints, resume, adapter cache).  ``teacher``: the unpruned model's top-k
distributions per training chunk (cached) and the KD loss.  ``heal``: the whole measurement (base, pruned, healed,
fine-tuned base on the same windows, and on a held-out text) and the export behind its gate.  ``result``: the result type and the
share of the damage recovered with its paired bootstrap CI.  ``multi``: every method's set at every n healed with
one recipe and one control (healed curves); ``curves`` (torch-free): their result type; ``compare``: the paired
comparison of two methods' healed models and its headline; ``figures``: figures, tables, the report section;
``qlora``: the 4-bit base through bitsandbytes (CUDA).
"""
