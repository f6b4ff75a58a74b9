"""Validation of result files that come from outside: browser uploads, ``--scores`` / ``--curves`` files, saved
results.  Such a file is hostile until checked: nothing is built from it (no matrix, no pair list, no array)
before the whole document has passed.

Three steps, each bounded in time and memory by the size of the input:

1. :func:`read_json_file` / :func:`parse_json`: at most ``max_bytes`` of UTF-8 text (64 MiB by default), nesting
   at most :data:`MAX_DEPTH` levels (checked on the raw text *before* Python's recursive JSON parser runs), and no
   ``NaN`` / ``Infinity`` tokens (Python's ``json`` accepts them by default; JSON does not).
2. :func:`result_fields` (a ``score --json`` result), :func:`curves_fields` (a ``curves --json`` file) and
   :func:`score_matrices` (plain ``{"replacement": L×L, "interchange": L×L}`` scores): every field has the right
   type, layer indices are in range, numbers are finite, sizes are bounded (see the constants below).
3. Only then the caller's object is built from the normalised fields this module returns.

Every problem is one :class:`~swapkl.errors.UploadError` whose message is one line naming the file and the field,
e.g. ``result file: pairs[3] = (-1, 2) is outside 0..4``.  Pure library (no Streamlit).

Modules: :mod:`~swapkl.schema.text` (step 1), one per document type (:mod:`~swapkl.schema.result`,
:mod:`~swapkl.schema.curves`, :mod:`~swapkl.schema.scores`) and :mod:`~swapkl.schema.fields` (limits and primitives).
"""
from __future__ import annotations

from swapkl.schema.curves import curves_fields
from swapkl.schema.fields import (IDENTITY_KINDS, MAX_BYTES, MAX_DEPTH, MAX_INT, MAX_KL, MAX_LAYERS, MAX_METHODS,
                                  MAX_SEEDS, MAX_STRING, MAX_VALUES, PREFERENCES, REGIMES, RESULT_FORMAT, NonFinite,
                                  contract, identity)
from swapkl.schema.result import result_fields
from swapkl.schema.scores import score_matrices
from swapkl.schema.study import study_fields
from swapkl.schema.text import nesting_depth, parse_json, plain_text, read_json_file

__all__ = ["IDENTITY_KINDS", "MAX_BYTES", "MAX_DEPTH", "MAX_INT", "MAX_KL", "MAX_LAYERS", "MAX_METHODS", "MAX_SEEDS",
           "MAX_STRING", "MAX_VALUES", "PREFERENCES", "REGIMES", "RESULT_FORMAT", "NonFinite", "contract",
           "curves_fields", "identity", "nesting_depth", "parse_json", "plain_text", "read_json_file", "result_fields",
           "score_matrices", "study_fields"]
