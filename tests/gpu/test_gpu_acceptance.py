"""The GPU acceptance script (``tests/gpu/gpu_check.py``, issue 29) as a test: every stage on the CUDA device, within
its budget, each passing.  Marked ``gpu``: skipped on a machine without CUDA (CI's CPU runs; the skip is one that
``SWAPKL_FAIL_ON_SKIP=1`` accepts, support.skip_gate).  On the device machine::

    python3 -m pytest -q -n 0 -m gpu tests/gpu                 # this test
    python3 tests/gpu/gpu_check.py --out results.json          # the same run, the JSON kept (docs/scaling.md)

The CPU smoke run of the same stages on tiny shapes is ``tests/scoring/test_gpu_check.py``."""
from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_every_stage_passes_on_the_gpu(tmp_path, monkeypatch):
    import gpu_check  # beside this file (tests/gpu/ is on sys.path under pytest, as for a script run by path)

    monkeypatch.delenv("OUT", raising=False)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["device"].startswith("cuda") and res["smoke"] is False
    failed = {k: v.get("error") or v for k, v in res["stages"].items() if v.get("pass") is not True}
    assert not failed, failed
    assert res["complete"] is True and res["all_pass"] is True


def test_the_device_is_cuda():
    assert torch.cuda.is_available()
