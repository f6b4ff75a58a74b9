"""A local lm-eval task written for a test: last-word documents (``context``, ``target``) in a JSONL beside a YAML
that reads it by absolute path, as a user's ``--include-path`` folder holds one (no ``!function``)."""
from __future__ import annotations

import json
from pathlib import Path


def write_lastword_task(root: Path, name: str, docs: list[dict]) -> Path:
    """Task ``name`` under ``root/name/`` (``name.yaml`` + ``name.jsonl``) scored by lm-eval's ``acc`` of the
    greedy continuation; returns ``root`` (the include path)."""
    folder = Path(root) / name
    folder.mkdir(parents=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {folder / f'{name}.jsonl'}"
        "\ntest_split: test\noutput_type: loglikelihood\ndoc_to_text: '{{context}}'\n"
        "doc_to_target: \"{{' ' + target}}\"\nmetric_list:\n  - metric: acc\nmetadata:\n  version: 1.0\n")
    return Path(root)
