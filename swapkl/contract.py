"""The evaluation contract: every setting that determines a swap-KL number, validated, recorded and hashed.

A :class:`Contract` is what the user asks for.  Its :meth:`Contract.key` is the subset of settings that
determine each per-pair value (the pair set is *not* in it: pairs are cached one by one, so an adjacent run
is reused by a later ``gap:3`` or ``all`` run of the same contract).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from swapkl.errors import ContractError

#: the whole-block unit of analysis (the default: a removed index deletes the block)
BLOCK = "block"
#: the sublayer units of a block, in block order (each with its norms, :mod:`swapkl.model.units`)
SUBLAYERS = ("attention", "mlp")
#: the units of analysis, in the order the CLI and the dashboard offer them.  The one place their names are spelled:
#: every other module imports these (tests/model/test_unit_names.py checks it).
UNITS = (BLOCK, *SUBLAYERS)

#: the two definitions of "block j in slot i" (docs/method.md §1): ``slot`` (the paper's; block j's weights in slot i's
#: module, with the slot's per-layer settings) and ``block`` (block j's own module, with its own settings).  The one
#: place their names are spelled; :mod:`swapkl.scoring.definitions` holds one class per definition.
SLOT = "slot"
PER_LAYER = (SLOT, "block")

POSITIONS = ("all", "last")
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
AGGREGATIONS = ("max", "mean", "forward")

PRESETS = {
    # the canonical default (docs/method.md §2)
    "canonical": {},
    # the paper's GPT-2/OPT/Pythia static runs: last position only
    "paper-last-token": {"positions": "last"},
    # the paper's Qwen3-8B run: all real tokens
    "paper-all-tokens": {"positions": "all"},
}


def check_unit(unit, error: Callable[[str], Exception] = ContractError) -> str:
    """``unit`` when it is one of :data:`UNITS`; else raises ``error(message)`` (a :class:`ContractError` unless
    the caller's layer has its own error type) with the one message every caller shows:
    ``unknown unit 'x'; choose one of: block, attention, mlp``."""
    if not isinstance(unit, str) or unit not in UNITS:
        shown = str(unit) if len(str(unit)) <= 40 else str(unit)[:40] + "…"  # a name from a file may be huge
        raise error(f"unknown unit '{shown}'; choose one of: {', '.join(UNITS)}")
    return unit


def check_per_layer(name, error: Callable[[str], Exception] = ContractError) -> str:
    """``name`` when it is one of :data:`PER_LAYER`; else raises ``error(message)``:
    ``unknown per-layer definition 'x'; choose one of: slot, block``."""
    if not isinstance(name, str) or name not in PER_LAYER:
        shown = str(name) if len(str(name)) <= 40 else str(name)[:40] + "…"
        raise error(f"unknown per-layer definition '{shown}'; choose one of: {', '.join(PER_LAYER)}")
    return name


def parse_pairs(spec: str) -> tuple[str, int | None]:
    """``"adjacent"`` -> ("gap", 1); ``"gap:K"`` -> ("gap", K); ``"all"`` -> ("all", None)."""
    s = str(spec).strip().lower()
    if s == "adjacent":
        return "gap", 1
    if s == "all":
        return "all", None
    m = re.fullmatch(r"gap:(-?\d+)", s)
    if m:
        k = int(m.group(1))
        if k < 1:
            raise ContractError(f"--pairs gap:{k}: K must be at least 1 (gap:1 is the adjacent pairs)")
        return "gap", k
    raise ContractError(f"unknown pair set '{spec}'; use adjacent, gap:K (K >= 1) or all")


def pair_list(spec: str, num_layers: int) -> list[tuple[int, int]]:
    """The pairs (i, j), i < j, of a pair set, ordered by gap j - i, then by i (adjacent pairs first)."""
    kind, k = parse_pairs(spec)
    if num_layers < 2:
        raise ContractError(f"a model with {num_layers} layer(s) has no layer pairs")
    max_gap = num_layers - 1 if kind == "all" else min(k, num_layers - 1)
    return [(i, i + g) for g in range(1, max_gap + 1) for i in range(num_layers - g)]


@dataclass(frozen=True)
class Provenance:
    """What a shown number was computed under: the one input of :func:`swapkl.views.captions.contract_caption`.

    ``model``: the model identity (``display``/``id``, ``revision``, ``commit`` or a weights fingerprint), a plain
    display string, or None;
    ``contract``: the swap-KL settings (:meth:`Contract.to_dict` keys, plus ``corpus_label``); ``evaluator``: the
    perplexity evaluator (its dict or name), or None; ``extra``: further caption pieces (budget, spacing).  Every
    result type gives one with ``provenance()``."""

    model: dict | str | None = None
    contract: dict = field(default_factory=dict)
    evaluator: dict | str | None = None
    extra: tuple = ()


@dataclass(frozen=True)
class Contract:
    """Settings of one swap-KL evaluation.

    * ``pairs``: ``adjacent`` | ``gap:K`` | ``all``.
    * ``prompts`` x ``tokens``: P windows of T tokens cut (seeded by ``seed``) from the prompt region of
      ``corpus`` (a spec for :func:`swapkl.scoring.corpora.load_corpus`; None = automatic choice).
    * ``positions``: ``all`` (mean KL over every position of a window, then over prompts) or ``last``.
    * ``dtype``: weights/activations dtype.  ``kl_dtype``: log-softmax and KL in float32 (default, as the paper's
      scripts) or float64 (more accurate, twice the memory per KL chunk; for checking tiny KLs against the noise floor).
    * ``aggregation``: how ``d_repl`` combines the two directed means (``max`` = Definition 1).
    * ``bos``: ``auto`` (start each window with BOS when the tokenizer adds one by default), ``yes``, ``no``.
    * ``unit``: the unit of analysis, ``block`` (default), ``attention`` or ``mlp`` (:mod:`swapkl.model.units`):
      which part of layer i and j each protocol exchanges.
    * ``per_layer``: what "block j in slot i" means (docs/method.md §1): ``slot`` (default, the paper's: block j's
      weights in slot i's module with the slot's per-layer settings; a pair of blocks of different structure is
      undefined) or ``block`` (block j's own module with its own settings; what removal does).
    """

    pairs: str = "adjacent"
    prompts: int = 16
    tokens: int = 64
    positions: str = "all"
    corpus: str | None = None
    seed: int = 0
    dtype: str = "float32"
    device: str = "auto"
    aggregation: str = "max"
    kl_dtype: str = "float32"
    bos: str = "auto"
    unit: str = BLOCK
    per_layer: str = SLOT

    def __post_init__(self):
        parse_pairs(self.pairs)
        if not isinstance(self.prompts, int) or self.prompts < 1:
            raise ContractError(f"prompts must be a positive integer, got {self.prompts!r}")
        if not isinstance(self.tokens, int) or self.tokens < 2:
            raise ContractError(f"tokens must be an integer >= 2, got {self.tokens!r}")
        if self.positions not in POSITIONS:
            raise ContractError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.dtype not in DTYPES:
            raise ContractError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in DEVICES and not str(self.device).startswith("cuda:"):
            raise ContractError(f"device must be one of {DEVICES} (or cuda:N), got {self.device!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ContractError(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.kl_dtype not in ("float32", "float64"):
            raise ContractError("kl_dtype must be float32 or float64")
        if self.bos not in ("auto", "yes", "no"):
            raise ContractError("bos must be auto, yes or no")
        check_unit(self.unit)
        check_per_layer(self.per_layer)

    def with_(self, **kw) -> Contract:
        return replace(self, **kw)

    @classmethod
    def preset(cls, name: str, **kw) -> Contract:
        if name not in PRESETS:
            raise ContractError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **kw})

    def pair_list(self, num_layers: int) -> list[tuple[int, int]]:
        return pair_list(self.pairs, num_layers)

    def to_dict(self) -> dict:
        return asdict(self)

    def provenance(self, model: dict | str | None = None, evaluator: dict | str | None = None) -> Provenance:
        """These settings as a :class:`Provenance` (before any result exists: ``model`` as typed)."""
        return Provenance(model=model, contract=self.to_dict(), evaluator=evaluator)

    @classmethod
    def from_dict(cls, d: dict) -> Contract:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def key(self, corpus_sha: str) -> dict:
        """The settings that determine each per-pair value (pairs, device, aggregation excluded).  The unit
        enters only when it is not ``block`` and the per-layer definition only when it is not ``slot``: such an entry's
        key has no field for them, the same key as every entry written before they existed."""
        key = {"prompts": self.prompts, "tokens": self.tokens, "positions": self.positions,
               "corpus_sha256": corpus_sha, "seed": self.seed, "dtype": self.dtype,
               "kl_dtype": self.kl_dtype, "bos": self.bos}
        if self.unit != BLOCK:
            key["unit"] = self.unit
        if self.per_layer != SLOT:
            key["per_layer"] = self.per_layer
        return key


def stable_hash(obj) -> str:
    """sha256 of the canonical JSON of ``obj`` (sorted keys), hex."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
