"""A removal set as a mergekit ``passthrough`` configuration (``mergekit-yaml CONFIG.yaml OUT_DIR``).

mergekit's ``layer_range: [a, b]`` is 0-based with an *exclusive* upper bound (Python's ``range(a, b)``), the
source of off-by-one errors when layer numbers are written 1-based or the bound inclusive (PruneMe #4, mergekit
#360).  :func:`mergekit_yaml` writes one slice per contiguous run of kept layers, so removing layers 3 and 7 of
10 gives ``[0, 3]``, ``[4, 7]``, ``[8, 10]``; :func:`kept_from_config` rebuilds the kept-layer list from a parsed
configuration (the check the tests make).  A comment header carries the evaluation contract: the model and its
revision, the removed set, the method that chose it and what it was measured on.

No torch here: the CLI and the dashboard write the YAML without loading anything beyond the layer count.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import yaml

from swapkl import __version__
from swapkl.store import atomic_write_text
from swapkl.surgery.outputs import check_file_out
from swapkl.surgery.removal_set import kept_layers, kept_ranges, validate_remove

YAML_SUFFIXES = (".yaml", ".yml")


def _one_line(v) -> str:
    """A header value on one comment line (a newline in a model name cannot end the comment)."""
    return " ".join(str(v).split()) if v is not None else "-"


def mergekit_config(remove: Iterable[int], num_layers: int, model: str, dtype: str = "float32") -> dict:
    """The configuration as a dict: one ``passthrough`` slice per contiguous kept range of ``model``."""
    slices = [{"sources": [{"model": str(model), "layer_range": [a, b]}]} for a, b in kept_ranges(remove, num_layers)]
    return {"slices": slices, "merge_method": "passthrough", "dtype": str(dtype)}


def mergekit_yaml(remove: Iterable[int], num_layers: int, model: str, dtype: str = "float32",
                  contract: dict | None = None) -> str:
    """The YAML text: a ``#`` header with ``contract`` (keys ``model``, ``revision``, ``chosen_by``,
    ``measured_on`` and any others, each on one line) and the configuration of :func:`mergekit_config`.

    ``model`` is what mergekit loads: a hub id (``org/name@revision`` pins a revision) or a local Hugging Face
    folder.  Raises :class:`~swapkl.surgery.removal_set.PruneError` for an impossible removal set."""
    rem = validate_remove(remove, num_layers)
    kept = kept_layers(rem, num_layers)
    c = dict(contract or {})
    head = [f"mergekit passthrough configuration written by swapkl {__version__}",
            f"model: {_one_line(c.pop('model', model))}",
            f"revision: {_one_line(c.pop('revision', None))}",
            f"removed layers (0-based, of {num_layers}): {rem}",
            f"kept: {len(kept)} layers",
            f"chosen by: {_one_line(c.pop('chosen_by', 'given by hand'))}",
            f"measured on: {_one_line(c.pop('measured_on', 'not measured'))}"]
    head += [f"{_one_line(k)}: {_one_line(v)}" for k, v in c.items()]
    head += ["layer_range is [first, last + 1): 0-based, upper bound exclusive (mergekit's convention)",
             "run: mergekit-yaml THIS_FILE.yaml OUT_DIR"]
    body = yaml.safe_dump(mergekit_config(rem, num_layers, model, dtype), sort_keys=False, default_flow_style=None)
    return "".join(f"# {ln}\n" for ln in head) + body


def kept_from_config(cfg: dict) -> list[int]:
    """The source layers a parsed passthrough configuration keeps, in output order (one model only)."""
    out: list[int] = []
    for sl in cfg.get("slices") or []:
        for src in sl.get("sources") or []:
            a, b = src["layer_range"]
            out.extend(range(int(a), int(b)))
    return out


def write_mergekit_yaml(text: str, out: str | os.PathLike, force: bool = False, inputs: Iterable = (),
                        force_hint: str = "--force") -> Path:
    """Write ``text`` to ``out`` (a ``.yaml``/``.yml`` file; atomic) and return the path; an existing file is
    replaced only when ``force`` (:func:`swapkl.surgery.outputs.check_file_out`)."""
    p = check_file_out(out, YAML_SUFFIXES, "a mergekit YAML", force=force, inputs=inputs, force_hint=force_hint)
    atomic_write_text(p, text)
    return p
