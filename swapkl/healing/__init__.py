"""Healing after removal: a short, deterministic fine-tune of a pruned model (LoRA or the last k blocks and lm_head,
on the LM loss or distilled from the unpruned model), measured against the same fine-tune of the unpruned base (the
control), on evaluation text the training never sees (docs/healing.md).
Its modules and what each holds: docs/architecture.md (the ``healing/`` row of the package map).
"""
