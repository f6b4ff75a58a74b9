"""One-off experiments whose printed tables are quoted in the docs (index: ``experiments/README.md``).

Each module has its configuration at the top (``CONFIG``: the options of the run the docs quote) and runs through
one runner that stamps every result it writes::

    python -m experiments list
    python -m experiments run NAME [--key value ...]      # CONFIG, overridden by the options given

The runner writes ``experiments/results/runs/NAME.json`` (``provenance``: commit, host, command, date; ``config``:
the effective options; the child's stdout, wall/CPU seconds, peak memory; ``result``: what it wrote with
``--json``) and adds the same ``provenance`` block to the ``--json`` file itself.  The committed files directly
under ``experiments/results/`` are the earlier measured runs, kept as they were written."""
