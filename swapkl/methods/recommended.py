"""Registers the "recommend" method, which lives in :mod:`swapkl.recommend` (a search, with its own result type
and command), so the registry's auto-discovery finds it like every other method."""
from swapkl import recommend as _recommend  # noqa: F401  (registers "recommend")
