"""Hostile input at the command line and in the library: every user error is one ``error: ...`` line on stderr
with exit code 2 (never a traceback), checked before any computation where it can be, and nothing already
computed is lost or silently overwritten.

The model, path and JSON cases run ``python -m swapkl`` as a real subprocess; the slower ones call
``swapkl.cli.main`` in-process and read stderr.  The tests run as root, so "a folder nobody may write" cannot be
made with chmod: an unwritable cache is a cache root whose parent is a regular file (NotADirectoryError).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, cache: Path, timeout: int = 300):
    env = dict(os.environ, HF_HUB_OFFLINE="1", SWAPKL_CACHE=str(cache), TRANSFORMERS_VERBOSITY="error")
    return subprocess.run([sys.executable, "-m", "swapkl", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=timeout)


def one_error_line(stderr: str, pattern: str) -> str:
    """stderr is exactly one line, ``error: ...`` matching ``pattern`` (a regex searched in the line)."""
    assert "Traceback" not in stderr, stderr
    lines = [l for l in stderr.splitlines() if l.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def assert_user_error(r, pattern: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    return one_error_line(r.stderr, pattern)


def tree_digest(folder: Path) -> dict:
    """``{relative path: sha256}`` of every file under ``folder`` (to show that nothing changed)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def model_copy(stories_path: Path, dest: Path) -> Path:
    shutil.copytree(stories_path, dest)
    for p in [dest, *dest.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the shared fixture is read-only
    return dest


# ============================================================================== 1. damaged or hostile model files
def test_config_not_json(stories_path, tmp_path):
    m = model_copy(stories_path, tmp_path / "m")
    (m / "config.json").write_text('{"model_type": "llama", ')
    before = tree_digest(m)
    r = run_cli("score", m, "--prompts", "2", "--tokens", "8", cache=tmp_path / "c")
    assert_user_error(r, rf"^error: {re.escape(str(m / 'config.json'))} is not valid JSON \(.* at line 1 column \d+\)$")
    assert tree_digest(m) == before and not (tmp_path / "c" / "scores").exists()


def test_truncated_safetensors(stories_path, tmp_path):
    m = model_copy(stories_path, tmp_path / "m")
    data = (m / "model.safetensors").read_bytes()
    (m / "model.safetensors").write_bytes(data[: len(data) // 2])
    before = tree_digest(m)
    r = run_cli("score", m, "--prompts", "2", "--tokens", "8", cache=tmp_path / "c")
    assert_user_error(r, rf"^error: model\.safetensors in {re.escape(str(m))} is truncated or corrupt: its header "
                         r"describes [\d,]+ bytes of tensor data, the file holds [\d,]+ after the header")
    assert tree_digest(m) == before and not (tmp_path / "c" / "scores").exists()


def test_malicious_pickle_is_refused_and_never_run(stories_path, tmp_path):
    """A folder with only ``pytorch_model.bin``: loaded with ``torch.load(weights_only=True)`` or refused; a pickle
    that would run code is refused in one line and the code never runs."""
    m = model_copy(stories_path, tmp_path / "m")
    (m / "model.safetensors").unlink()
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import pickle

    (m / "pytorch_model.bin").write_bytes(pickle.dumps(Evil(), protocol=2))
    before = tree_digest(m)
    r = run_cli("score", m, "--prompts", "2", "--tokens", "8", cache=tmp_path / "c")
    assert_user_error(r, rf"^error: cannot load the model in {re.escape(str(m))}: pytorch_model\.bin holds pickled "
                         r"objects other than tensors, refused by torch\.load\(weights_only=True\); swapkl never runs")
    assert not marker.exists() and tree_digest(m) == before


def test_plain_tensor_pickle_loads(stories_path, tmp_path):
    """The other side of the decision: an honest ``.bin`` of plain tensors (older hub checkpoints) still loads."""
    import torch
    from safetensors.torch import load_file

    from swapkl.checkpoints import load_checkpoint

    m = model_copy(stories_path, tmp_path / "m")
    torch.save(load_file(m / "model.safetensors"), m / "pytorch_model.bin")
    (m / "model.safetensors").unlink()
    assert load_checkpoint(str(m), device="cpu").num_layers == 5
