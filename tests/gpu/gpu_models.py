"""What tests/gpu/gpu_check.py runs on: model shapes (configs written here, random weights, no hub), weights that are
the same on every machine and torch version (a counter-based hash, not torch's generator or transformers' init),
the FLOPs a sweep spends, and the fp64 expected result it carries along (``tests/gpu/gpu_check_expected.json``).

    python tests/gpu/gpu_models.py --make-expected   # recompute the expected JSON here, in float64 on the CPU (minutes)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import zlib
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

EXPECTED = Path(__file__).resolve().parent / "gpu_check_expected.json"

PYTHIA_410M = dict(model_type="gpt_neox", num_hidden_layers=24, hidden_size=1024, num_attention_heads=16,
                   intermediate_size=4096, vocab_size=50304, rotary_pct=0.25, rotary_emb_base=10000,
                   max_position_embeddings=2048, use_parallel_residual=True, layer_norm_eps=1e-5,
                   tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
QWEN3_8B = dict(model_type="qwen3", num_hidden_layers=36, hidden_size=4096, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
                max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                tie_word_embeddings=False, bos_token_id=151643, eos_token_id=151645)
TINY = {"pythia": PYTHIA_410M | dict(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, intermediate_size=256,
                                     vocab_size=512, max_position_embeddings=256),
        "qwen": QWEN3_8B | dict(num_hidden_layers=6, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=16, intermediate_size=192, vocab_size=1024, max_position_embeddings=256,
                                bos_token_id=0, eos_token_id=0)}
#: the correctness cases: Pythia-410M's widths (hidden, heads, intermediate, vocabulary, rotary) on 4 layers
#: ("full", what the GPU run checks) and a tiny one (``--smoke`` on a CPU, and the tests)
CORRECTNESS = {
    "full": dict(config=PYTHIA_410M | dict(num_hidden_layers=4), prompts=2, tokens=128, seed=29),
    "smoke": dict(config=TINY["pythia"] | dict(num_hidden_layers=4), prompts=2, tokens=32, seed=29),
}
HEAD_GAIN = 3.0  # logits' standard deviation: distributions peaked enough that swap-KLs are far above rounding


def build(cfg: dict, dtype: torch.dtype, device: str | torch.device = "cpu", seed: int | None = None):
    """A causal LM of config ``cfg`` in eval mode, in ``dtype`` on ``device``: transformers' random init, or with
    ``seed`` the machine-independent weights of :func:`fill_deterministic` (made in float64 on the CPU)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(cfg)
    config = AutoConfig.for_model(kw.pop("model_type"), **kw)
    if seed is None:
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        rescale(model)
        return model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    model.weights_checksum = fill_deterministic(model, seed)
    return model.to(device=device, dtype=dtype).eval()


@torch.no_grad()
def rescale(model: torch.nn.Module) -> None:
    """Give transformers' random matrices (std 0.02) the scales of :func:`fill_deterministic` (fast, on the
    model's device), so that the random models' swap-KLs are of the real size (~1 nat), far above rounding."""
    head = model.get_output_embeddings().weight
    emb = model.get_input_embeddings().weight
    for p in model.parameters():
        if p.dim() < 2:
            continue
        target = 1.0 if p is emb else (HEAD_GAIN if p is head else 1.0) / math.sqrt(p.shape[1])
        std = float(p.float().std())
        if std > 0:
            p.mul_(target / std)


def det_uniform(n: int, seed: int) -> np.ndarray:
    """``n`` float64 numbers in [-1, 1): splitmix64 of a counter, the same bits on every machine."""
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) + np.uint64(seed & 0xFFFFFFFF) * np.uint64(0x100000001B3)
        z = z * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (2.0 / 2**53) - 1.0


@torch.no_grad()
def fill_deterministic(model: torch.nn.Module, seed: int) -> float:
    """Overwrite every parameter with hashed values (uniform, unit variance times a scale): matrices
    ``1/sqrt(fan_in)`` (embeddings 1, the output head ``HEAD_GAIN/sqrt(hidden)``), norm weights ``1 +- 0.17``,
    biases ``+- 0.03``.  Returns a checksum (sum of |w|, float64) that says whether two machines made the same."""
    total = 0.0
    head = model.get_output_embeddings().weight
    emb = model.get_input_embeddings().weight
    for name, p in sorted(model.named_parameters()):
        u = det_uniform(p.numel(), seed * 7919 + zlib.crc32(name.encode())) * math.sqrt(3.0)
        if p is emb:
            vals = u
        elif p is head:
            vals = u * HEAD_GAIN / math.sqrt(p.shape[1])
        elif p.dim() >= 2:
            vals = u / math.sqrt(p.shape[1])
        elif name.endswith("weight"):
            vals = 1.0 + 0.1 * u
        else:
            vals = 0.02 * u
        p.copy_(torch.from_numpy(vals.reshape(tuple(p.shape))).to(p.dtype))
        total += float(np.abs(vals).sum())
    return total


def det_ids(num_prompts: int, num_tokens: int, vocab: int, seed: int) -> torch.Tensor:
    """Token ids [P, T] from the same hash (uniform over the vocabulary)."""
    u = (det_uniform(num_prompts * num_tokens, seed + 1) + 1.0) / 2.0
    return torch.from_numpy(np.minimum((u * vocab).astype(np.int64), vocab - 1).reshape(num_prompts, num_tokens))


def block_flops_per_token(model, num_tokens: int) -> float:
    """FLOPs of one block for one token: 2 x its matmul weights, plus causal attention scores and values (2 matmuls
    x 2 FLOP x T/2 average context x heads x head_dim)."""
    from swapkl.model.architectures import locate

    blk = locate(model).blocks[0]
    mm = sum(p.numel() for p in blk.parameters() if p.dim() == 2)
    cfg = model.config
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2.0 * mm + 2.0 * num_tokens * cfg.num_attention_heads * hd


def head_flops_per_position(model) -> float:
    w = model.get_output_embeddings().weight
    return 2.0 * w.shape[0] * w.shape[1]


def predicted_block_runs(pairs, num_layers: int, num_prompts: int) -> int:
    """Rows x blocks a sweep of ``pairs`` runs (docs/method.md §7): per prompt and pair (i, j), the shared branch
    runs slots i..j-1, then M[i<-j], M[i<->j] and M[j<-i] each run slots j..L-1."""
    return num_prompts * sum((j - i) + 3 * (num_layers - j) for i, j in pairs)


def predicted_flops(model, pairs, num_prompts: int, num_tokens: int, limits: dict) -> dict:
    """Predicted FLOPs of a whole engine run (baseline pass + sweep, blocks and head) with ``limits``."""
    L = model.config.num_hidden_layers
    V = model.get_output_embeddings().weight.shape[0]
    runs = predicted_block_runs(pairs, L, num_prompts) + num_prompts * L
    cached = 2 * num_prompts * num_tokens * V * 4 <= limits["logp_budget"]
    chunks = math.ceil(len(pairs) / max(1, limits["max_live"] // 3))
    positions = num_prompts * num_tokens * (3 * len(pairs) + (1 if cached else chunks))
    blocks = runs * num_tokens * block_flops_per_token(model, num_tokens)
    head = positions * head_flops_per_position(model)
    return {"block_runs": runs, "head_positions": positions, "block_flops": blocks, "head_flops": head,
            "flops": blocks + head}


def make_expected(cases=("smoke", "full")) -> dict:
    """The expected swap-KLs of each correctness case: a float64 model, float64 KL, the plain batch-of-one
    implementation (swapkl/scoring/reference.py), on this CPU."""
    from swapkl.contract import pair_list
    from swapkl.scoring.reference import reference_sweep

    out = json.loads(EXPECTED.read_text()) if EXPECTED.is_file() else {}
    for name in cases:
        c = CORRECTNESS[name]
        model = build(c["config"], torch.float64, "cpu", seed=c["seed"])
        checksum = model.weights_checksum
        L = c["config"]["num_hidden_layers"]
        ids = det_ids(c["prompts"], c["tokens"], c["config"]["vocab_size"], c["seed"])
        pairs = pair_list("all", L)
        ref = reference_sweep(model, ids, pairs, positions="all", kl_dtype=torch.float64)
        out[name] = {"config": c["config"], "seed": c["seed"], "prompts": c["prompts"], "tokens": c["tokens"],
                     "weights_checksum": checksum, "torch": torch.__version__,
                     "pairs": [list(p) for p in pairs],
                     "kl": {f"{i}-{j}": {k: [float(x) for x in ref[(i, j)][k]] for k in ("repl_ij", "repl_ji", "inter")}
                            for i, j in pairs},
                     "how": "float64 model and KL, swapkl.scoring.reference.reference_sweep, on a CPU"}
        del model
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make-expected", action="store_true")
    ap.add_argument("--cases", default="smoke,full")
    a = ap.parse_args()
    if a.make_expected:
        torch.set_num_threads(max(1, (os.cpu_count() or 2)))
        data = make_expected(tuple(a.cases.split(",")))
        EXPECTED.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {EXPECTED} ({EXPECTED.stat().st_size} bytes)")
