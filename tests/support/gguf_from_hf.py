"""A Hugging Face Llama folder (the shipped stories260K) written as a GGUF the way llama.cpp's
``convert_hf_to_gguf.py`` writes one, so that llama.cpp can run a real trained model with its real SentencePiece
tokenizer offline (no converter ships in a pip package; the ``gguf`` package supplies the writer, the tensor
name map and the tokenizer reader).

The one step that is not a rename: llama.cpp applies rotary embeddings to adjacent pairs (x0, x1), (x2, x3), ...
while Hugging Face Llama rotates the two halves of each head, so the converter permutes the rows of ``q_proj`` and
``k_proj`` within each head (:func:`hf_to_gguf_rows`); transformers' GGUF loader undoes the permutation when it
reads the file back, which the tests check (the GGUF read by transformers gives the folder's logits).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def hf_to_gguf_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a ``[n_head * head_dim, hidden]`` projection reordered per head from halves (HF) to interleaved
    pairs (GGUF): row ``j`` of the first half and row ``j`` of the second half become rows ``2j`` and ``2j + 1``."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_folder_gguf(folder: Path, path: Path, qtype: str = "F32") -> Path:
    """Write the Llama checkpoint in ``folder`` (``config.json``, ``model.safetensors``, ``tokenizer.model``) to
    ``path`` as a GGUF; returns ``path``.  ``qtype`` (a ``gguf.GGMLQuantizationType`` name): the type of the 2-D
    weights whose rows split into whole blocks of that type; the others (stories260K's ``ffn_down``, rows of 172)
    and the norms stay F32, as llama.cpp's converter falls back."""
    import gguf
    from gguf.quants import quantize
    from gguf.vocab import SentencePieceVocab, SpecialVocab
    from safetensors.numpy import load_file

    cfg = json.loads((folder / "config.json").read_text())
    n_layers, n_head, n_kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    wr = gguf.GGUFWriter(str(path), arch="llama")
    wr.add_name(folder.name)
    wr.add_block_count(n_layers)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(n_head)
    wr.add_head_count_kv(n_kv)
    wr.add_key_length(head_dim)
    wr.add_value_length(head_dim)
    wr.add_rope_dimension_count(head_dim)
    wr.add_rope_freq_base(float(cfg["rope_parameters"]["rope_theta"]))
    wr.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    wr.add_vocab_size(cfg["vocab_size"])
    qt = gguf.GGMLQuantizationType[qtype]
    wr.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}"))

    vocab = SentencePieceVocab(folder)
    pieces, scores, types = zip(*vocab.all_tokens())
    wr.add_tokenizer_model(vocab.tokenizer_model)
    wr.add_token_list(list(pieces))
    wr.add_token_scores(list(scores))
    wr.add_token_types(list(types))
    SpecialVocab(folder, n_vocab=len(pieces)).add_to_gguf(wr, quiet=True)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_layers)
    for name, arr in load_file(str(folder / "model.safetensors")).items():
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"no GGUF name for tensor {name}")
        if name.endswith("q_proj.weight"):
            arr = hf_to_gguf_rows(arr, n_head)
        elif name.endswith("k_proj.weight"):
            arr = hf_to_gguf_rows(arr, n_kv)
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.ndim == 2 and arr.shape[1] % gguf.GGML_QUANT_SIZES[qt][0] == 0:
            wr.add_tensor(new, quantize(arr, qt), raw_dtype=qt)
        else:
            wr.add_tensor(new, arr)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
