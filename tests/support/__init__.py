"""What the tests share besides fixtures (those are in ``tests/conftest.py``): the AppTest constants (``app_util``),
served apps and headless Chromium (``browser_util``, ``visitors``), GGUF writers (``gguf_tiny``, ``gguf_from_hf``),
llama.cpp runs (``llamacpp_util``), the torchrun entry point of the distributed test (``dist_rank``), ``python -m
swapkl`` in process or as a real subprocess (``cli_run``) and CI's rule on skips (``skip_gate``).  Imported as ``support.<module>``: ``tests/`` is on ``sys.path`` (pytest puts the folder
of the root ``conftest.py`` there; ``python -m benchmarks`` / ``python -m experiments`` put it on ``PYTHONPATH`` for their children)."""
