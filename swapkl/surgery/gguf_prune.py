"""A GGUF file with decoder blocks removed, written with the ``gguf`` package (no dequantisation, no llama.cpp).

:func:`prune_gguf` reads the source with ``gguf.GGUFReader`` and writes a new file with ``gguf.GGUFWriter``:

* every tensor of a kept block is copied byte for byte in its own type (Q4_1 stays Q4_1), renamed
  ``blk.{old}.x`` -> ``blk.{new}.x`` with ``new`` counting the kept blocks 0, 1, 2, ...; the tensors of removed
  blocks are dropped; tensors outside the blocks (embeddings, output norm and head) are copied unchanged;
* ``{arch}.block_count`` is set to the new count, and *every* per-layer metadata array (an array-valued key
  under ``{arch}.`` whose length is the old block count, e.g. ``head_count_kv`` or ``feed_forward_length`` per
  layer in some models) keeps only the kept layers' entries -- a per-layer array left at the old length is a
  known way to get a file llama.cpp misreads;
* ``{arch}.leading_dense_block_count`` (the first k blocks dense) drops by the removed blocks below k; a file
  with a layer-index key that cannot be renumbered blindly (``nextn_predict_layers``, ``full_attention_interval``)
  or with global per-layer tensors (``per_layer_*``) is refused rather than written wrong;
* all other metadata (tokenizer, chat template, rope, general.*) is copied, and ``swapkl.removed_layers`` /
  ``swapkl.source_sha256`` record where the file came from.

The output is written to a temporary file beside it and moved into place with one rename.  No torch here.
:func:`llama_quantize_command` prints the equivalent ``llama-quantize --prune-layers`` command line.
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

from swapkl import __version__
from swapkl.contract import SUBLAYERS
from swapkl.model.gguf import GGUFError, check_gguf_file, require_gguf_packages
from swapkl.store import atomic_path
from swapkl.surgery.outputs import check_file_out
from swapkl.surgery.removal_set import kept_layers, validate_remove

GGUF_SUFFIXES = (".gguf",)
_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")
#: layer-index scalars whose meaning a blind renumbering would break: refused
_REFUSED_KEYS = ("nextn_predict_layers", "full_attention_interval")
#: the output projection of each sublayer unit as llama.cpp names it (weight and bias, when present, are zeroed)
GGUF_UNIT_OUT = dict(zip(SUBLAYERS, ("attn_output", "ffn_down")))  # attention, mlp


class _Replaced:
    """A tensor of the source written as the float32 array ``data`` instead (type F32, same logical shape)."""

    def __init__(self, t, data, name: str):
        import gguf
        import numpy as np

        shape = tuple(int(x) for x in reversed(t.shape))  # the reader's shape is GGML's ne, fastest axis first
        self.data = np.ascontiguousarray(data, dtype=np.float32)
        if self.data.shape != shape:
            raise GGUFError(f"the replacement of {name} has shape {self.data.shape}, the GGUF tensor {shape}")
        self.tensor_type = gguf.GGMLQuantizationType.F32


class _Zeroed:
    """A tensor of the source written as zero bytes of the same type and shape: zero for every GGML type (float
    types; quantised blocks whose scales are zero dequantise to zero)."""

    def __init__(self, t):
        import numpy as np

        self.data, self.tensor_type = np.zeros_like(t.data), t.tensor_type


def _reader(path):
    require_gguf_packages()
    import gguf  # deferred: numpy-heavy, only when a GGUF is read

    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise GGUFError(f"cannot read GGUF file {path}: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from e


def _scalar(reader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def gguf_layout(path: str | os.PathLike) -> dict:
    """``{"arch", "block_count", "path"}`` of a GGUF file (raises :class:`GGUFError` for a bad file)."""
    p = check_gguf_file(path)
    r = _reader(p)
    return {"arch": _scalar(r, "general.architecture"), "block_count": _block_count(r), "path": str(p)}


def _block_count(reader) -> int:
    arch = _scalar(reader, "general.architecture")
    n = _scalar(reader, f"{arch}.block_count")
    if not isinstance(arch, str) or not isinstance(n, int):
        raise GGUFError(f"the GGUF file has no {arch}.block_count; cannot remove blocks from it")
    return n


def _new_metadata(reader, arch: str, n_old: int, kept: list[int]) -> dict:
    """``{key: new value}`` for the keys that change with the block count (everything else is copied)."""
    import gguf

    out = {f"{arch}.block_count": len(kept)}
    rem = [i for i in range(n_old) if i not in set(kept)]
    for name, f in reader.fields.items():
        if not name.startswith(f"{arch}."):
            continue
        short = name[len(arch) + 1:]
        if short in _REFUSED_KEYS:
            raise GGUFError(f"the GGUF file sets {name}; removing blocks would change what it means, so swapkl does "
                            "not write a pruned copy of this model")
        if short == "leading_dense_block_count":
            out[name] = int(f.contents()) - sum(1 for i in rem if i < int(f.contents()))
        elif f.types and f.types[0] == gguf.GGUFValueType.ARRAY and len(f.data) == n_old:
            vals = f.contents()
            out[name] = [vals[i] for i in kept]
    return out


def prune_gguf(src: str | os.PathLike, remove: Iterable[int], out: str | os.PathLike, force: bool = False,
               inputs: Iterable = (), force_hint: str = "--force", zero_units: Iterable = (),
               replace: dict | None = None) -> dict:
    """Write ``src`` with blocks ``remove`` (0-based) deleted to the file ``out`` (see the module docstring).

    ``out`` must end in ``.gguf``, may not be ``src`` or another of ``inputs``, and an existing file is replaced
    only when ``force``.  ``zero_units``: ``(layer, "attention" | "mlp")`` items (old layer indices) whose output
    projection (:data:`GGUF_UNIT_OUT`) is written as zeros, which skips that residual sublayer; llama.cpp still
    computes it.  ``replace``: ``{source tensor name: float32 array}`` written as F32 in place of that tensor (same
    logical shape, numpy order: rows = output features), e.g. a linear bridge folded into a kept block's MLP output
    projection (:mod:`swapkl.repair.export`).  Returns ``{"path", "arch", "removed", "kept", "num_layers_before",
    "num_layers_after", "tensors", "trimmed_keys", "replaced"}``.  Raises :class:`GGUFError` (bad source),
    :class:`~swapkl.surgery.removal_set.PruneError` (impossible set), :class:`~swapkl.errors.OutputPathError`."""
    p = check_gguf_file(src)
    dest = check_file_out(out, GGUF_SUFFIXES, "a pruned GGUF", force=force, inputs=[p, *inputs], force_hint=force_hint)
    reader = _reader(p)
    import gguf

    arch = _scalar(reader, "general.architecture")
    n_old = _block_count(reader)
    rem = validate_remove(remove, n_old)
    kept = kept_layers(rem, n_old)
    new_index = {old: new for new, old in enumerate(kept)}
    zero = {(int(layer), u) for layer, u in zero_units if int(layer) in new_index}
    names = {t.name for t in reader.tensors}
    for layer, u in sorted(zero):
        if u not in GGUF_UNIT_OUT or f"blk.{layer}.{GGUF_UNIT_OUT[u]}.weight" not in names:
            raise GGUFError(f"the GGUF file has no {u} output projection for block {layer} "
                            f"(blk.{layer}.{GGUF_UNIT_OUT.get(u, '?')}.weight); cannot zero that sublayer")
    zeroed = {f"blk.{layer}.{GGUF_UNIT_OUT[u]}.{x}" for layer, u in zero for x in ("weight", "bias")}
    replace = dict(replace or {})
    if missing := sorted(set(replace) - names):
        raise GGUFError(f"the GGUF file has no tensor {missing[0]} to replace")
    changed = _new_metadata(reader, arch, n_old, kept)
    tensors = []
    for t in reader.tensors:
        m = _BLK.match(t.name)
        if m is None:
            if t.name.startswith("per_layer_"):
                raise GGUFError(f"the GGUF file has a global per-layer tensor {t.name}; swapkl cannot remove blocks "
                                "from this model")
            if t.name in replace:
                raise GGUFError(f"tensor {t.name} is outside the blocks: only a block's tensor can be replaced")
            tensors.append((t.name, t))
            continue
        old = int(m.group(1))
        if old >= n_old:
            raise GGUFError(f"tensor {t.name} names block {old}, but block_count is {n_old}")
        if t.name in replace and old not in new_index:
            raise GGUFError(f"tensor {t.name} belongs to a removed block: it cannot be replaced")
        if old in new_index:
            new = _Replaced(t, replace[t.name], t.name) if t.name in replace else _Zeroed(t) if t.name in zeroed else t
            tensors.append((f"blk.{new_index[old]}.{m.group(2)}", new))
    from swapkl.store import file_sha256

    extra = {"swapkl.removed_layers": (rem, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32),
             "swapkl.source_sha256": (file_sha256(p), gguf.GGUFValueType.STRING, None),
             "swapkl.version": (__version__, gguf.GGUFValueType.STRING, None)}
    if not rem:  # sublayers only: GGUF refuses an empty array
        del extra["swapkl.removed_layers"]
    if zero:
        extra["swapkl.zeroed_units"] = ([f"{layer}:{u}" for layer, u in sorted(zero)], gguf.GGUFValueType.ARRAY,
                                        gguf.GGUFValueType.STRING)
    _write(reader, dest, arch, changed, extra, tensors)
    return {"path": str(dest), "arch": arch, "removed": rem, "kept": kept, "num_layers_before": n_old,
            "num_layers_after": len(kept), "tensors": len(tensors),
            "trimmed_keys": sorted(k for k, v in changed.items() if isinstance(v, list)),
            "zeroed_units": [[layer, u] for layer, u in sorted(zero)], "replaced": sorted(replace)}


def _write(reader, dest: Path, arch: str, changed: dict, extra: dict, tensors: list) -> None:
    """GGUFWriter into a temporary file beside ``dest``, then one rename (nothing half-written at ``dest``)."""
    import gguf

    with atomic_path(dest) as tmp:
        w = gguf.GGUFWriter(tmp, arch=arch, endianess=reader.endianess)
        align = _scalar(reader, "general.alignment")
        if align is not None:
            w.data_alignment = align
        for name, f in reader.fields.items():
            if name == "general.architecture" or name.startswith("GGUF.") or name in extra:
                continue
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(name, changed.get(name, f.contents()), vtype, sub_type=sub)
        for name, (val, vtype, sub) in extra.items():
            w.add_key_value(name, val, vtype, sub_type=sub)
        for name, t in tensors:
            w.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for _, t in tensors:
            w.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        w.close()


def llama_quantize_command(src: str | os.PathLike, remove: Iterable[int], out: str | os.PathLike) -> str:
    """The same removal with llama.cpp's own tool: ``llama-quantize --prune-layers 3,7 SRC OUT COPY`` (0-based
    block ids; ``COPY`` keeps every tensor's type, as :func:`prune_gguf` does)."""
    rem = sorted({int(i) for i in remove})
    return shlex.join(["llama-quantize", "--prune-layers", ",".join(map(str, rem)), str(src), str(out), "COPY"])
