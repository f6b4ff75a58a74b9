"""Benchmarks a maintainer reruns (timings and memory of the engine, KL, curves, the served app, the suite...).

    python -m benchmarks list
    python -m benchmarks run NAME [ARGS...]                 # one run, recorded per machine and commit
    python -m benchmarks compare BASE HEAD NAME [--rounds N] [-- ARGS...]   # two commits, interleaved, one run

``run`` appends {name, args, wall and CPU seconds, peak resident memory, provenance, the ``--json`` result} to
``benchmarks/results/<machine>/<commit>.json``.  ``compare`` extracts BASE and HEAD (``git archive``) into a
temporary folder, puts this checkout's ``benchmarks/`` (and ``experiments/``) into each, runs NAME there
alternately for ``--rounds`` rounds, and prints median wall / CPU seconds and peak memory of each side with the
ratios HEAD / BASE, and the largest difference between the two sides' result numbers (timings left out): what
the hand-written before/after scripts did (engine_before_after.py, repair_before_after.sh).  The files directly
under ``benchmarks/results/`` are the earlier measured runs, kept as they were written.  None of this runs in
``python -m pytest tests/``."""
