"""llama.cpp (through llama-cpp-python) and the Hugging Face model side by side on the same token ids: the
next-token logits of every position, and greedy generation.  Used by tests/surgery/test_gguf_llamacpp.py and
benchmarks/llamacpp_default.py.

llama.cpp runs on one thread, with flash attention off and its KV cache in F32 (its default F16 cache rounds
every key and value to 11 significant bits, an error of its own that would hide the model's), so what is left
between the two sides is the arithmetic of the weights: float32 in another order for F32 tensors, and for
quantised tensors llama.cpp's 8-bit quantisation of the activations in every matrix product.
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

INSTALL_HINT = ("llama-cpp-python is not installed: pip install 'swapkl[llamacpp]' "
                "(CI: .ci/install_llamacpp.sh builds it from source, CPU only)")


def require_llama_cpp():
    """The ``llama_cpp`` module; an ImportError with :data:`INSTALL_HINT` when it is missing."""
    try:
        import llama_cpp
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return llama_cpp


def load_llamacpp(path: Path, n_ctx: int = 128):
    """The GGUF at ``path`` in llama.cpp, keeping the logits of every evaluated position."""
    llama_cpp = require_llama_cpp()
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                           n_threads=1, n_threads_batch=1, flash_attn=False, type_k=llama_cpp.GGML_TYPE_F32,
                           type_v=llama_cpp.GGML_TYPE_F32, seed=0, verbose=False)


def llamacpp_logits(llm, ids: list[int]) -> np.ndarray:
    """``[len(ids), vocab]`` float32: llama.cpp's logits after each prefix of ``ids`` (one batch, from scratch)."""
    llm.reset()
    llm.eval(list(ids))
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def llamacpp_greedy(llm, ids: list[int], n: int) -> tuple[list[int], np.ndarray]:
    """``n`` tokens of llama.cpp's own greedy generation after ``ids`` (its sampler at temperature 0, the KV
    cache filled by the prompt and then one token at a time; EOS does not stop it), and ``[n, vocab]`` float32: the
    logits each token was picked from (row ``i`` after ``ids + tokens[:i]``)."""
    gen = llm.generate(list(ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True)
    tokens = list(itertools.islice(gen, n))
    return tokens, np.array(llm.scores[len(ids) - 1: len(ids) - 1 + n], dtype=np.float32)


def hf_logits(model, ids: list[int]) -> np.ndarray:
    """``[len(ids), vocab]`` float32 logits of a Hugging Face causal LM on ``ids`` (no cache)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0].float().numpy()


def hf_greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """``n`` greedy tokens of a Hugging Face model after ``ids``, recomputing the whole prefix at every step
    (no cache: the plain reference), and the top-1 minus top-2 logit margin of each step."""
    seq, margins = list(ids), []
    for _ in range(n):
        last = hf_logits(model, seq)[-1]
        top2 = np.sort(last)[-2:]
        margins.append(float(top2[1] - top2[0]))
        seq.append(int(last.argmax()))
    return seq[len(ids):], margins
