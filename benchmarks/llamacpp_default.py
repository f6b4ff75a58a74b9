"""The built-in default (SmolLM2-135M-Instruct, Q4_1 GGUF) pruned by swapkl and run by llama.cpp.

    python -m benchmarks run llamacpp_default [--remove 3,17] [--tokens 64] [--greedy 16] [--json out.json]
    python -m benchmarks run llamacpp_default --repair bridge [--remove 20,21,22] [--calib-tokens 8192] [--max-words 1000]

Writes the pruned GGUF with ``prune_gguf`` (what ``prune default --format gguf`` does), then on the same token ids
(the first ``--tokens`` tokens of the shipped WikiText-2 test text, BOS-free as the tokenizer gives them):

* llama.cpp (llama-cpp-python, one thread, F32 KV cache, no flash attention: tests/support/llamacpp_util.py) against
  transformers, on the unpruned source (the control) and on the pruned file (transformers' own load of the pruned
  GGUF, and swapkl's ``pruned_copy`` of the source): max and mean |Δlogit|, and how often the top-1 token agrees;
* greedy generation of ``--greedy`` tokens after a prompt by both (llama.cpp's sampler at temperature 0, HF by
  argmax with the whole prefix recomputed), with the top-1 / top-2 margin of each HF step.

With ``--repair bridge`` the file is ``prune default --remove … --repair bridge --format gguf --verify`` (the span
replaced by a linear bridge folded into block i−1's ``ffn_down``, docs/repair.md "GGUF"; ``--max-words`` shortens the
command's held-out evaluation), compared with transformers' load of that file (which ``--verify`` checked against
swapkl's bridged model) and with the raw cut (``pruned_copy``), which it must be far from.

The tokenizer is transformers' reading of the GGUF; llama.cpp's own tokenization of the prompt is printed beside it.
Slow on a shared CPU (transformers dequantises the 98 MB file twice, ~20 s each); the tiny-GGUF and stories260K
checks of the same code run in tests/surgery/test_gguf_llamacpp.py.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
from support.llamacpp_util import hf_greedy, hf_logits, llamacpp_greedy, llamacpp_logits, load_llamacpp  # noqa: E402

PROMPT = "The capital of France is"


def _hf(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def _compare(cpp: np.ndarray, ref: np.ndarray) -> dict:
    d = np.abs(cpp - ref)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "logit_range": float(np.abs(ref).max()),
            "top1_agree": float((cpp.argmax(-1) == ref.argmax(-1)).mean())}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--remove", default="3,17")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--greedy", type=int, default=16)
    ap.add_argument("--json")
    ap.add_argument("--repair", default="none", choices=["none", "bridge"])
    ap.add_argument("--calib-tokens", type=int, default=8192)
    ap.add_argument("--max-words", type=int, default=1000)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from swapkl.model.builtin import default_gguf_path
    from swapkl.surgery.blocks import pruned_copy
    from swapkl.surgery.gguf_prune import prune_gguf

    removed = [int(x) for x in a.remove.split(",")]
    src = default_gguf_path()
    out: dict = {"model": src.name, "removed": removed, "settings": "llama.cpp: 1 thread, F32 KV cache, no flash attention"}
    with tempfile.TemporaryDirectory(prefix="swapkl-llamacpp-") as d:
        t0 = time.perf_counter()
        if a.repair == "bridge":
            from swapkl.commands.cli import main as swapkl_main

            pruned = Path(d) / "bridged.gguf"
            args = ["prune", "default", "--remove", a.remove, "--repair", "bridge", "--format", "gguf", "--out",
                    str(pruned), "--verify", "--calib-tokens", str(a.calib_tokens), "--max-words", str(a.max_words)]
            if swapkl_main(args) != 0:
                raise SystemExit("the bridged export failed")
            out["command"] = "swapkl " + " ".join("OUT.gguf" if x == str(pruned) else x for x in args)
            out["provenance"] = json.loads(Path(f"{pruned}.swapkl_bridge.json").read_text())["heldout"]
        else:
            pruned = Path(prune_gguf(src, removed, Path(d) / "pruned.gguf")["path"])
        out["prune_s"] = round(time.perf_counter() - t0, 1)
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        text = (ROOT / "tests/fixtures/data/wikitext-2-raw/wiki.test.raw").read_text()[:4000]
        ids = tok(text).input_ids[: a.tokens]
        prompt = tok(PROMPT).input_ids
        t0 = time.perf_counter()
        source = _hf(src)
        refs = {"source": source, "pruned_gguf": _hf(pruned), "pruned_copy": pruned_copy(source, removed)}
        out["hf_load_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        llm_src, llm = load_llamacpp(src, n_ctx=256), load_llamacpp(pruned, n_ctx=256)
        out["llamacpp_prompt_ids"] = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
        out["hf_prompt_ids"] = prompt
        cpp_src, cpp = llamacpp_logits(llm_src, ids), llamacpp_logits(llm, ids)
        out["llamacpp_s"] = round(time.perf_counter() - t0, 1)
        out["control_source"] = _compare(cpp_src, hf_logits(source, ids))
        out["pruned_vs_pruned_gguf"] = _compare(cpp, hf_logits(refs["pruned_gguf"], ids))
        out["pruned_vs_pruned_copy" if a.repair == "none" else "bridged_vs_raw_cut"] = _compare(
            cpp, hf_logits(refs["pruned_copy"], ids))
        out["pruned_vs_unpruned_source"] = _compare(cpp, hf_logits(source, ids))
        for name, l_cpp, model in (("source", llm_src, source), ("pruned", llm, refs["pruned_gguf"])):
            hf_tokens, margins = hf_greedy(model, prompt, a.greedy)
            cpp_tokens, picked_from = llamacpp_greedy(l_cpp, prompt, a.greedy)
            ref = hf_logits(model, prompt + cpp_tokens[:-1])[len(prompt) - 1:]
            out[f"greedy_{name}"] = {"hf": hf_tokens, "llamacpp": cpp_tokens, "same": hf_tokens == cpp_tokens,
                                     "hf_text": tok.decode(hf_tokens), "llamacpp_text": tok.decode(cpp_tokens),
                                     "min_top2_margin": round(min(margins), 4),
                                     "decode_max_abs": float(np.abs(picked_from - ref).max())}
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
