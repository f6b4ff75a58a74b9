"""Command-line entry point: ``python -m swapkl COMMAND ...``.

Each command lives in ``swapkl/commands/<name>.py`` and exposes ``register(subparsers)``, which adds its
parser and sets ``func`` (a callable taking the parsed args and returning an exit code).  User errors
(:class:`swapkl.errors.SwapklError`) print as one line on stderr with exit code 2, never a traceback; warnings
(a corrupt or unwritable cache) print as one ``warning: ...`` line each.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import warnings

from swapkl.errors import SwapklError, is_oom
import swapkl.commands as pkg

# the order commands are listed in --help; any other module in swapkl/commands/ with register() follows
PREFERRED_ORDER = ("score", "curves", "prune", "trajectory", "report")


def command_modules() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name not in ("common", "cli")]
    names.sort(key=lambda n: (PREFERRED_ORDER.index(n) if n in PREFERRED_ORDER else len(PREFERRED_ORDER), n))
    return [f"swapkl.commands.{n}" for n in names]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m swapkl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in command_modules():
        mod = importlib.import_module(name)
        if hasattr(mod, "register"):
            mod.register(sub)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings show as one ``warning: ...`` line on stderr (not Python's two-line file:line format)."""
    print(f"warning: {str(message).strip().splitlines()[0] if str(message).strip() else category.__name__}",
          file=sys.stderr if file is None else file, flush=True)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        return _run(args)


def _run(args) -> int:
    try:
        return int(args.func(args) or 0)
    except SwapklError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; finished work is kept in the cache", file=sys.stderr)
        return 130
    except Exception as e:
        if not is_oom(e):
            raise
        print("error: out of memory; try fewer prompts or tokens, or --dtype bfloat16", file=sys.stderr)
        return 2
