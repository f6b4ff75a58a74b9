"""Swap-KL scoring: the engine, the ``score`` entry point, its cache entries, the result type, the prompt corpora,
the naive reference and the rank logic of a distributed sweep."""
