"""The family sweep, shard 1 of 4: every model type of the installed transformers' causal-LM mapping, on a tiny
random model, measured as the support table says (tests/support/families.py)."""
from __future__ import annotations

import pytest

from support.families import check_against_table, shard


@pytest.mark.parametrize("model_type", shard(1))
def test_family(model_type):
    check_against_table(model_type)
