"""Checks that score matrices and removal curves belong to the model at hand, and that an evaluator's window fits
its context: the one place the CLI, the dashboard and the bundle loader ask "is this file for this model?"."""
from __future__ import annotations

import numpy as np

from swapkl.errors import SwapklError


class ScoresMismatch(SwapklError):
    """A scores file that belongs to a different model (or layer count)."""


def check_scores(scores: dict, num_layers: int, identity: dict | None = None, model_identity: dict | None = None,
                 what: str = "the scores file is for a different model"):
    """Raise :class:`ScoresMismatch` when score matrices do not fit the model (layer count; identity when both
    sides give one).  ``what`` starts the identity message."""
    for name, d in scores.items():
        d = np.asarray(d)
        if d.shape != (num_layers, num_layers):
            raise ScoresMismatch(
                f"the {name} scores are for a {d.shape[0]}-layer model; this model has {num_layers} layers "
                f"(a scores file from a different model?)")
    if identity and model_identity:
        keys = ["model_type", "num_layers", "fingerprint", "commit"]
        if identity.get("kind") == "hub" and model_identity.get("kind") == "hub":
            keys += ["id", "revision"]
        for key in keys:
            a, b = identity.get(key), model_identity.get(key)
            if a is not None and b is not None and a != b:
                name = identity.get("display") or identity.get("id") or "?"
                raise ScoresMismatch(f"{what} ({name}; {key} {a} != {b})")


def check_same_model(result, curves_model: dict | None,
                     what: str = "the scores and the removal curves are for different models") -> None:
    """Raise :class:`ScoresMismatch` when removal curves (their ``model`` identity) were computed on another model
    than the score result ``result`` (a :class:`~swapkl.scoring.results.SwapResult`): the one check for every place that
    shows the two together (the dashboard's file upload, ``report --scores --curves``)."""
    check_scores(result.protocol_scores(), result.num_layers,
                 result.identity, curves_model, what=what)


def check_evaluator_context(model, evaluator, name: str | None = None) -> None:
    """Raise :class:`ContractError` when the perplexity evaluator's window (tokens) exceeds the model's context."""
    from swapkl.model import architectures as arch  # deferred: pulls torch; the CLI and the dashboard import this module without it
    from swapkl.measure.evaluate import get_evaluator

    ev = get_evaluator(evaluator)
    arch.check_context(model, ev.window, f"the '{ev.name}' evaluator's window of {ev.window} tokens",
                       "use an evaluator whose window is at most {limit} tokens", name=name)
