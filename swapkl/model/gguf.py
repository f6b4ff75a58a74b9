"""GGUF file -> Hugging Face model folder, converted once and kept in the cache.

transformers reads a GGUF directly (``from_pretrained(folder, gguf_file=name)``) and dequantises every tensor
to float32, which takes seconds per 100M parameters (:func:`_parsed_once` parses the file's header once).
:func:`gguf_to_hf_folder` does that once and saves an ordinary float32 safetensors folder (model + tokenizer) under
``<cache>/models/<stem>-<sha256 prefix>/``; later calls return the folder at once, and the folder loads with
plain ``from_pretrained(folder)`` without the ``gguf`` package.

The folder is written into a temporary directory beside its final place and moved there with one
``os.replace`` (atomic on one file system), so a crash or a concurrent reader never sees half a model.
A ``swapkl_source.json`` inside it records the GGUF it came from (path, sha256, size in bytes); a folder
without it, or with a different sha256, is not trusted and is converted again.  A cache that cannot be written
is not an error: the conversion then goes into the system's temporary folder for the life of the process
(warned once, :func:`swapkl.store.warn_unwritable`).

The sha256 of a big file is memoised in ``<cache>/sha256.json`` keyed by
(resolved path, size in bytes, mtime in ns), so an unchanged file is hashed once.

Remote code is never run (``trust_remote_code=False``).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from swapkl import store
from swapkl.store import (atomic_replace_dir, cache_root, file_sha256, read_entry_or_empty, temp_folder,
                          warn_unwritable, writable_error, write_entry)
from swapkl.errors import MissingDependency, ModelLoadError, SwapklError

# Deferred imports: torch and transformers are imported by the functions that convert or load: the cache lookups and
# the dashboard's model list must not load them.

GGUF_MAGIC = b"GGUF"
SOURCE_FILE = "swapkl_source.json"
SHA_MEMO_FILE = store.SHA_MEMO_FILE  # the sha256 memo, kept by swapkl.store
SHA_PREFIX_LEN = 12
# files a converted folder must hold (besides the weights) to count as complete
_REQUIRED = ("config.json", SOURCE_FILE)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


class GGUFError(ModelLoadError):
    """A GGUF file that is missing, not a GGUF file, truncated or not convertible."""


default_cache_root = cache_root  # one cache root for every store (swapkl.store)
SOURCE_KIND = "gguf-conversion"


def is_gguf_spec(spec: object) -> bool:
    """True for a string / path naming a ``.gguf`` file (whether or not it exists)."""
    return isinstance(spec, (str, os.PathLike)) and str(spec).lower().endswith(".gguf")


# --------------------------------------------------------------------------------------------- hashing



def sha256_file(path: str | os.PathLike, cache_root: str | os.PathLike | None = None,
                memo: bool = True) -> str:
    """Hex sha256 of a file's bytes, memoised in ``<cache_root>/sha256.json`` (:func:`swapkl.store.file_sha256`);
    a file that cannot be read raises :class:`GGUFError`."""
    try:
        return file_sha256(path, cache_root or default_cache_root(), memo)
    except ModelLoadError as e:
        raise GGUFError(str(e)) from e


# --------------------------------------------------------------------------------------------- checks

def check_gguf_file(path: str | os.PathLike) -> Path:
    """Resolve ``path`` and check it exists and starts with the GGUF magic bytes; returns the resolved path."""
    p = Path(path).expanduser()
    if not p.exists():
        raise GGUFError(f"no such GGUF file: {p}")
    if not p.is_file():
        raise GGUFError(f"not a file: {p}")
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise GGUFError(f"cannot read {p}: {e.strerror or e}") from e
    if head != GGUF_MAGIC:
        raise GGUFError(f"{p} is not a GGUF file (it does not start with the GGUF magic bytes)")
    return p.resolve()


def require_gguf_packages() -> None:
    """Raise :class:`MissingDependency` unless ``gguf`` and ``accelerate`` (both needed by transformers'
    GGUF loader) can be imported."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        pins = {"gguf": "gguf==0.19.0", "accelerate": "accelerate==1.15.0"}
        raise MissingDependency(
            f"reading a GGUF file needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: "
            f"pip install {' '.join(pins[m] for m in missing)}"
        )


# --------------------------------------------------------------------------------------------- folders

def folder_for(gguf_path: str | os.PathLike, sha256: str, cache_root: str | os.PathLike | None = None) -> Path:
    """Where the converted folder of a GGUF with this sha256 lives: ``<cache>/models/<stem>-<sha[:12]>``."""
    stem = Path(gguf_path).name
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    return Path(cache_root or default_cache_root()) / "models" / f"{stem}-{sha256[:SHA_PREFIX_LEN]}"


def is_complete(folder: str | os.PathLike, sha256: str | None = None) -> bool:
    """True if ``folder`` holds a finished conversion (config, weights, tokenizer, source record), and, when
    ``sha256`` is given, one made from a GGUF with that digest."""
    d = Path(folder)
    if not d.is_dir() or not all((d / name).is_file() for name in _REQUIRED):
        return False
    if not ((d / "model.safetensors").is_file() or (d / "model.safetensors.index.json").is_file()):
        return False
    if not any((d / name).is_file() for name in _TOKENIZER_FILES):
        return False
    src = read_entry_or_empty(d / SOURCE_FILE, SOURCE_KIND)  # a damaged or old-format record: not complete
    return bool(src) and (sha256 is None or src.get("sha256") == sha256)


def _file_lock(lock_path: Path):
    """An exclusive lock across processes (the ``filelock`` package) so two processes do not convert the same
    file at once."""
    from filelock import FileLock

    lock_path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(lock_path)


_PARSE_LOCK = threading.Lock()


@contextlib.contextmanager
def _parsed_once():
    """Within the block, a GGUF file's header is parsed once and gguf's tensor-name map built once per
    (architecture, layers).

    transformers' loader parses the whole header (every metadata field, the vocabulary included) for the config,
    again for the weights and again for the tokenizer, and builds the name map anew for each of the model's
    modules (``tests/model/test_gguf_parse_once.py`` counts the parses and compares with transformers' own
    loading).  Both are
    read-only and depend only on their arguments, so the block hands transformers one ``gguf.GGUFReader`` per
    file (keyed by resolved path, size and mtime) and one map per arguments; gguf's own attributes are restored
    on exit.  Blocks run one at a time (a lock), so no other thread sees a half-installed patch."""
    import gguf

    names = ("GGUFReader", "get_tensor_name_map")
    if not all(callable(getattr(gguf, n, None)) for n in names):  # another gguf layout: load as it comes
        yield
        return
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}

    def reader(path, *args, **kwargs):
        if args or kwargs:
            return reader_cls(path, *args, **kwargs)
        st = os.stat(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
        if key not in readers:
            readers[key] = reader_cls(path)
        return readers[key]

    with _PARSE_LOCK:
        gguf.GGUFReader = reader
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map


def load_gguf(gguf_path: str | os.PathLike, with_tokenizer: bool = True):
    """Load ``(model, tokenizer)`` straight from a GGUF file, dequantised to float32, in eval mode, with the
    leftover quantisation setting removed (so the model can be saved); ``with_tokenizer=False`` returns
    ``(model, None)`` without reading the tokenizer."""
    p = check_gguf_file(gguf_path)
    require_gguf_packages()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _parsed_once():
            model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch.float32,
                                                         trust_remote_code=False)
            tokenizer = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, trust_remote_code=False) \
                if with_tokenizer else None
    except MemoryError:
        raise
    except SwapklError:
        raise
    except Exception as e:  # struct.error, ValueError (reshape), KeyError, OSError, ...: all mean "bad file"
        msg = " ".join(str(e).split())[:200]
        raise GGUFError(f"cannot convert GGUF file {p} (corrupt, truncated or unsupported): "
                        f"{type(e).__name__}: {msg}") from e
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:  # belt and braces
        with contextlib.suppress(AttributeError):
            del model.config.quantization_config
    return model.eval(), tokenizer


def gguf_to_hf_folder(gguf_path: str | os.PathLike, cache_root: str | os.PathLike | None = None,
                      progress=None) -> Path:
    """Convert a GGUF file to a float32 Hugging Face folder in the cache (once) and return the folder.

    ``cache_root`` defaults to :func:`default_cache_root` (``<repo>/cache``).  ``progress``, if given, is
    called with one-line status strings.  Reuses ``<cache>/models/<stem>-<sha256[:12]>/`` when it is
    complete and was made from a file with the same sha256.  Raises :class:`GGUFError` for a missing, non-GGUF
    or unreadable file, :class:`MissingDependency` when ``gguf``/``accelerate`` are absent (only checked when a
    conversion is actually needed).
    """
    say = progress or (lambda msg: None)
    src = check_gguf_file(gguf_path)
    root = Path(cache_root or default_cache_root())
    digest = sha256_file(src, root)
    final = folder_for(src, digest, root)
    if is_complete(final, digest):
        return final
    require_gguf_packages()
    err = writable_error(final.parent)
    if err is not None:  # an unwritable cache: convert into a folder that lives as long as this process
        warn_unwritable(final.parent, err)
        return _uncached_folder(src, digest, say)
    with _file_lock(final.parent / f".{final.name}.lock"):
        if is_complete(final, digest):  # another process finished it while we waited
            return final
        # temp folders of this name can only be left over by a killed conversion (we hold the lock): drop them
        for leftover in final.parent.glob(f".{final.name}.*.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = _convert_into(src, digest, final.parent, f".{final.name}.", say)
        atomic_replace_dir(tmp, final)  # an incomplete or stale folder is moved aside, then dropped
        say(f"converted: {final}")
    return final


def _convert_into(src: Path, digest: str, parent: Path, prefix: str, say) -> Path:
    """Convert ``src`` into a new temporary folder under ``parent`` (config, float32 safetensors, tokenizer,
    source record) and return it; nothing is left behind on failure."""
    say(f"converting {src.name} to a float32 Hugging Face folder (once; ~10 s per 100M parameters)")
    t0 = time.perf_counter()
    model, tokenizer = load_gguf(src)
    with temp_folder(parent, prefix) as tmp:  # the cache is shared by the CLI and the dashboard: 0755
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        record = {
            "gguf_path": str(src),
            "gguf_name": src.name,
            "sha256": digest,
            "size_bytes": src.stat().st_size,
            "dtype": "float32",
            "model_type": getattr(model.config, "model_type", None),
            "num_hidden_layers": getattr(model.config, "num_hidden_layers", None),
            "converted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.perf_counter() - t0, 2),
        }
        with contextlib.suppress(ImportError):
            import transformers

            record["transformers_version"] = transformers.__version__
        write_entry(tmp / SOURCE_FILE, SOURCE_KIND, record, indent=1)
    say(f"converted in {time.perf_counter() - t0:.1f} s")
    return tmp


_UNCACHED: dict[str, Path] = {}  # sha256 -> this process's conversion (when the cache cannot be written)


def _uncached_folder(src: Path, digest: str, say) -> Path:
    """A conversion in the system's temporary folder, reused within this process and deleted at its exit."""
    hit = _UNCACHED.get(digest)
    if hit is not None and is_complete(hit, digest):
        return hit
    try:
        tmp = _convert_into(src, digest, Path(tempfile.gettempdir()), "swapkl-gguf-", say)
    except OSError as e:
        raise GGUFError(f"cannot convert {src}: neither the cache nor the temporary folder {tempfile.gettempdir()} "
                        f"can be written ({type(e).__name__}: {e.strerror or e})") from e
    atexit.register(shutil.rmtree, tmp, True)
    _UNCACHED[digest] = tmp
    return tmp


def source_record(folder: str | os.PathLike) -> dict:
    """The ``swapkl_source.json`` of a converted folder (empty dict if absent)."""
    return read_entry_or_empty(Path(folder) / SOURCE_FILE, SOURCE_KIND)
