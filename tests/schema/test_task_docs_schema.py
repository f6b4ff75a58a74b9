"""A task-accuracy file's per-document scores (``docs``) from outside: checked field by field, one line each."""
import pytest

from swapkl.errors import UploadError
from swapkl.schema.tasks import tasks_fields


def _doc(docs):
    row = {"metrics": {"t": {"acc,none": 0.5}}, "stderr": {"t": {"acc,none": 0.1}}, "docs": docs}
    return {"base": row, "methods": {"replacement": [{"n": 1, "removed": [1], **row}]},
            "contract": {"lm_eval_version": "0.4.13", "tasks": {"t": {"versions": {"t": 1}}}}}


def test_per_document_scores_pass_and_keep_their_values():
    docs = {"t": {"doc_id": [0, 1], "doc_sha": "abc", "acc,none": [1.0, 0.0]}}
    got = tasks_fields(_doc(docs))
    assert got["base"]["docs"] == docs and got["methods"]["replacement"][0]["docs"] == docs


@pytest.mark.parametrize("docs, pattern", [
    ({"t": {"doc_id": [0, 1], "doc_sha": "abc", "acc,none": [1.0]}}, r"holds 1 scores for 2 documents"),
    ({"t": {"doc_id": [0, -1], "doc_sha": "abc", "acc,none": [1.0, 0.0]}}, r"doc_id\[1\]"),
    ({"t": {"doc_id": [0], "doc_sha": 5, "acc,none": [1.0]}}, r"doc_sha"),
    ({"t": {"doc_id": [0], "doc_sha": "a", "acc,none": ["x"]}}, r"is not a number"),
])
def test_bad_per_document_scores_are_one_line(docs, pattern):
    with pytest.raises(UploadError, match=pattern) as e:
        tasks_fields(_doc(docs))
    assert "\n" not in str(e.value)
