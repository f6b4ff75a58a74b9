"""A tiny random model of any model type saved as a Hugging Face folder with a word-level tokenizer, and loaded
back as a swapkl checkpoint: what ``score()`` and the CLI take."""
from __future__ import annotations

from pathlib import Path


def tiny_checkpoint(model_type: str, folder: Path, vocab: int = 256):
    """``swapkl.model.tiny.tiny_model(model_type)`` saved to ``folder`` with a tokenizer of ``vocab`` words
    ("w0" ... , the last one unknown), loaded as a :class:`~swapkl.model.checkpoints.Checkpoint` on the CPU."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.model.tiny import tiny_model

    tiny_model(model_type).save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"w{k}": k for k in range(vocab - 1)} | {"[UNK]": vocab - 1},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tf.PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(folder)
    return load_checkpoint(str(folder), device="cpu")
