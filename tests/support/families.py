"""The family sweep's helpers: the decoder-only model types of the installed transformers split into shards (one test
file each, so that pytest-xdist spreads them over its workers), and one model type checked against the shipped
support table (swapkl/model/data/support.json, docs/families.md)."""
from __future__ import annotations

import pytest

#: test files the sweep is split into (tests/families/test_families_*.py)
SHARDS = 4


def shard(k: int, of: int = SHARDS) -> list[str]:
    """Every ``of``-th model type of transformers' causal-LM mapping, from the ``k``-th."""
    from swapkl.model.tiny import causal_lm_types

    return causal_lm_types()[k::of]


def check_against_table(model_type: str) -> None:
    """The model type's row measured now equals the shipped table's row (status, reason and every check), and the
    row is not a traceback or a wrong number."""
    import transformers

    from swapkl.model.supported import support_table
    from swapkl.support.check import check_model_type
    from swapkl.support.table import rows_of

    table = support_table()
    if table["transformers"] != transformers.__version__:
        pytest.skip(f"the support table was measured on transformers {table['transformers']}, not "
                    f"{transformers.__version__}: run swapkl families --check")
    got = rows_of({model_type: check_model_type(model_type)})[model_type]
    assert got["status"] not in ("traceback", "wrong"), got
    assert got == table["rows"][model_type]
