"""Start the dashboard server with the heavy modules already imported: ``python serve.py [streamlit options]``
(what ``./run.sh`` runs; the same as ``streamlit run app.py [options]`` otherwise).

torch's and transformers' first import holds the interpreter for seconds at a time (loading torch's C extension,
building torch._dynamo's classes): done inside a running server, it stalled every thread -- health answers took
over a second while a room of visitors arrived -- and it raced the first job's own imports.  Here it happens
before the server listens, in the main thread, behind the one import lock (:mod:`swapkl.heavy`); the imported
modules' objects are then frozen out of the garbage collector's sight.  The page's own warm-up then finds
everything imported.  Streamlit's discovery of the ``pages/`` folder is turned off before the first visit
(:mod:`dashboard.navigation`): every address, the first of a fresh server included, runs ``app.py``'s navigation.
"""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    os.chdir(HERE)
    sys.path.insert(0, str(HERE))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from swapkl import heavy
    from swapkl.jobs.manager import import_job_modules

    with heavy.exclusive():
        import_job_modules()
    gc.freeze()
    from streamlit.web import cli

    from dashboard.navigation import discovery_off

    discovery_off()  # pages/ holds pages, not Streamlit's folder of discovered pages: app.py's navigation lists them

    sys.argv = ["streamlit", "run", str(HERE / "app.py"), *sys.argv[1:]]
    sys.exit(cli.main())


if __name__ == "__main__":
    main()
