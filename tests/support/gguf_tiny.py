"""A tiny Llama written as a GGUF file with ``gguf.GGUFWriter`` (tensor names as llama.cpp's converter writes
them), so the GGUF export tests run in seconds instead of reading the 98 MB built-in model.

The 2-D weights are Q8_0 by default (a quantised type: the export must copy its blocks byte for byte; ``qtype``
picks another type the ``gguf`` package can quantise to, e.g. Q4_1 as in the built-in default, or F32), the norms
F32.
The weights are random (seeded): the tests compare two readings of the same file, not a trained model.  A
per-layer metadata array (``llama.attention.sliding_window_pattern``, one bool per block, which transformers'
Llama reader ignores) checks that the export trims every per-layer array.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 64, 128, 4, 2, 96


def write_tiny_llama_gguf(path: Path, n_layers: int = 5, seed: int = 0, extra_kv: dict | None = None,
                          extra_tensors: dict | None = None, qtype: str = "Q8_0") -> Path:
    """``qtype``: the type of the 2-D weights (a ``gguf.GGMLQuantizationType`` name); ``extra_kv``:
    ``{key: (value, GGUFValueType)}`` added to the metadata; ``extra_tensors``: ``{name: array}`` added as F32
    tensors (for the refusal tests)."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def w(rows, cols, scale=0.08):
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    wr = gguf.GGUFWriter(str(path), arch="llama")
    wr.add_name("tiny-llama-test")
    wr.add_block_count(n_layers)
    wr.add_context_length(1024)
    wr.add_embedding_length(HIDDEN)
    wr.add_feed_forward_length(FFN)
    wr.add_head_count(HEADS)
    wr.add_head_count_kv(KV_HEADS)
    wr.add_rope_dimension_count(head_dim)
    wr.add_rope_freq_base(10000.0)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_vocab_size(VOCAB)
    wr.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}"))
    wr.add_key_value("llama.attention.sliding_window_pattern", [i % 2 == 0 for i in range(n_layers)],
                     gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.BOOL)
    # a SentencePiece-style vocabulary: the control tokens, the 26 letters and the space marker, then pieces
    letters = [chr(ord("a") + i) for i in range(26)]
    pieces = ["<unk>", "<s>", "</s>", "\u2581", *letters, *[f"\u2581{c}" for c in letters]]
    pieces += [f"{c}{d}" for c in "aeiost" for d in "aeinrst" if f"{c}{d}" not in pieces][: VOCAB - len(pieces)]
    assert len(pieces) == VOCAB
    for k, (v, t) in (extra_kv or {}).items():
        wr.add_key_value(k, v, t)
    wr.add_tokenizer_model("llama")
    wr.add_token_list(pieces)
    wr.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(VOCAB - 3)])
    wr.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))
    wr.add_unk_token_id(0)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)

    qt = gguf.GGMLQuantizationType[qtype]

    def wq(name, arr):
        wr.add_tensor(name, quantize(arr, qt), raw_dtype=qt)

    wq("token_embd.weight", w(VOCAB, HIDDEN, 0.5))
    for i in range(n_layers):
        wr.add_tensor(f"blk.{i}.attn_norm.weight", norm(HIDDEN))
        wq(f"blk.{i}.attn_q.weight", w(HIDDEN, HIDDEN))
        wq(f"blk.{i}.attn_k.weight", w(KV_HEADS * head_dim, HIDDEN))
        wq(f"blk.{i}.attn_v.weight", w(KV_HEADS * head_dim, HIDDEN))
        wq(f"blk.{i}.attn_output.weight", w(HIDDEN, HIDDEN))
        wr.add_tensor(f"blk.{i}.ffn_norm.weight", norm(HIDDEN))
        wq(f"blk.{i}.ffn_gate.weight", w(FFN, HIDDEN))
        wq(f"blk.{i}.ffn_up.weight", w(FFN, HIDDEN))
        wq(f"blk.{i}.ffn_down.weight", w(HIDDEN, FFN))
    wr.add_tensor("output_norm.weight", norm(HIDDEN))
    wq("output.weight", w(VOCAB, HIDDEN, 0.3))
    for name, arr in (extra_tensors or {}).items():
        wr.add_tensor(name, np.asarray(arr, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
