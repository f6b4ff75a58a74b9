"""What removal gains: the parameters a pruned model uses, its KV cache at the stated context (a skipped attention
holds none), and throughput measured base vs pruned in one run."""
from __future__ import annotations

from conftest import tiny_model
from swapkl.measure.gains import gains_line, measure_gains
from swapkl.surgery.removal_set import RemovalSet


def test_gains_counts_and_kv_cache():
    model = tiny_model("llama", num_layers=4)
    cfg = model.config
    g = measure_gains(model, {"att": RemovalSet.of([0, 2], "attention"), "blk": [1], "mlp": RemovalSet.of([3], "mlp")},
                      context=24, decode_tokens=3, repeats=1)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    per_layer = 2 * cfg.num_key_value_heads * 27 * head_dim * 4  # keys + values, float32, 24 + 3 tokens
    assert g["base"]["kv_cache_bytes"] == 4 * per_layer
    assert g["sets"]["att"]["kv_cache_bytes"] == 2 * per_layer
    assert g["sets"]["blk"]["kv_cache_bytes"] == 3 * per_layer
    assert g["sets"]["mlp"]["kv_cache_bytes"] == 4 * per_layer
    total = sum(p.numel() for p in model.parameters())
    assert g["base"]["params"] == total
    blk = model.model.layers[0]
    att = sum(p.numel() for n, p in blk.named_parameters() if n.startswith(("self_attn.", "input_layernorm.")))
    assert g["sets"]["att"]["params"] == total - 2 * att
    assert g["sets"]["att"]["non_embedding_removed"] == 2 * att
    assert g["sets"]["blk"]["params"] == total - sum(p.numel() for p in blk.parameters())
    for row in g["sets"].values():
        assert row["prefill_speedup"] > 0 and row["decode_speedup"] > 0
        assert row["memory_bytes"] == row["param_bytes"] + row["kv_cache_bytes"]
    assert "non-emb params" in gains_line(g["sets"]["att"])
