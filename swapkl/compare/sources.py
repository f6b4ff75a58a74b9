"""Where the two sides of a comparison come from: a ``score --json`` file, or a model spec scored here under the
comparison's contract; and the model spec a score file's identity names (to load B for the transfer)."""
from __future__ import annotations

from pathlib import Path

from swapkl.compare.agreement import CompareError


def is_scores_file(arg: str) -> bool:
    """A ``.json`` argument is a score file (it must exist); anything else is a model spec."""
    if str(arg).lower().endswith(".json"):
        if not Path(arg).is_file():
            raise CompareError(f"score file {arg} does not exist")
        return True
    return False


def spec_of(identity: dict) -> str:
    """The model spec that loads the checkpoint of a result's identity (the built-in default, a local folder or
    GGUF file, or a hub id with its revision); raises :class:`CompareError` when the identity names none."""
    ident = identity or {}
    kind, ident_id = ident.get("kind"), ident.get("id")
    if kind == "builtin":
        return "default"
    if kind in ("local", "gguf") and ident_id:
        return str(ident_id)
    if kind == "hub" and ident_id:
        rev = ident.get("revision")
        return f"{ident_id}@{rev}" if rev and rev != "main" else str(ident_id)
    raise CompareError(f"the score file's model ({ident.get('display') or ident_id or '?'}) names no loadable "
                       "checkpoint; give B as a model spec for the transfer, or --budget 0")


def contract_of(result, device: str = "auto"):
    """The :class:`~swapkl.contract.Contract` a score file was computed under (its recorded settings), to score
    the other side with the same one."""
    from swapkl.contract import Contract

    return Contract.from_dict(dict(result.contract or {}, device=device))
