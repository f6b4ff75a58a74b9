"""Per-document task scores: paired accuracy changes and their bootstrap interval, against a plain loop."""
import numpy as np
import pytest

from swapkl.measure.lmeval import doc_rows
from swapkl.measure.task_docs import UnpairedDocuments, accuracy_key, delta, paired
from swapkl.stats import mean_diff


def _samples(scores, filt="none"):
    return [{"doc_id": i, "doc_hash": f"h{i}", "filter": filt, "metrics": ["acc", "acc_norm"], "acc": a,
             "acc_norm": 1.0 - a} for i, a in scores]


def test_doc_rows_orders_by_document_and_keys_by_metric_and_filter():
    rows = doc_rows({"t": _samples([(2, 1.0), (0, 0.0), (1, 1.0)])})["t"]
    assert rows["doc_id"] == [0, 1, 2]
    assert rows["acc,none"] == [0.0, 1.0, 1.0] and rows["acc_norm,none"] == [1.0, 0.0, 0.0]
    assert accuracy_key(rows) == "acc,none"
    same = doc_rows({"t": _samples([(0, 1.0), (1, 1.0), (2, 1.0)])})["t"]
    assert same["doc_sha"] == rows["doc_sha"]  # the documents, not the scores, make the hash


def test_mean_diff_matches_a_plain_resampling_loop():
    rng = np.random.default_rng(5)
    a, b = rng.integers(0, 2, 60).astype(float), rng.integers(0, 2, 60).astype(float)
    got = mean_diff(a, b, n_boot=300, seed=3)
    idx = np.random.default_rng(3).integers(0, 60, size=(300, 60))
    draws = [float(np.mean([b[j] - a[j] for j in row])) for row in idx]
    assert got["delta"] == pytest.approx(float(np.mean(b - a)))
    assert got["ci"] == pytest.approx([np.percentile(draws, 2.5), np.percentile(draws, 97.5)])
    assert got["n"] == 60


def test_delta_pairs_documents_and_refuses_other_documents():
    base = doc_rows({"t": _samples([(i, 1.0) for i in range(10)])})
    pruned = doc_rows({"t": _samples([(i, float(i % 2)) for i in range(10)])})
    d = delta(base, pruned, "t", n_boot=200)
    assert d["metric"] == "acc,none" and d["delta"] == pytest.approx(-0.5) and d["ci"][1] < 0
    assert paired(base, pruned, "t", "acc,none")[1] == [float(i % 2) for i in range(10)]
    other = doc_rows({"t": _samples([(i, 1.0) for i in range(8)])})
    with pytest.raises(UnpairedDocuments, match="different documents"):
        delta(base, other, "t")
    with pytest.raises(UnpairedDocuments, match="no per-document"):
        delta({}, pruned, "t")
