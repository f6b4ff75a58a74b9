"""Cold and cached timings of the dashboard's default analysis (built-in SmolLM2-135M-Instruct, default contract).

    HF_HUB_OFFLINE=1 python bench/default_cold_cached.py [--device cpu] [--convert] [--json out.json]

Cold: a fresh cache (a temporary ``SWAPKL_CACHE``; the converted float32 model folder is linked from the
project's cache unless ``--convert``, so the one-time GGUF conversion is not counted), one
:class:`swapkl.jobs.JobManager` job = load + both protocols on the adjacent pairs + removal curves up to
``DEFAULT_BUDGET`` (replacement-, interchange-guided, random with 5 seeds) with ``default_evaluator``.  Prints
when the first pair, the verdict (all adjacent pairs), the first curve and everything were ready.

Cached: a new job manager (a restarted server) and ``streamlit.testing.v1.AppTest``: the script run after
pressing Compute (the result comes from the snapshot), then the Heatmaps and Removal curves pages.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--cache", default=None, help="cache folder to use (default: a fresh temporary one)")
    ap.add_argument("--convert", action="store_true", help="count the one-time GGUF conversion as well")
    ap.add_argument("--json", default=None, help="write the timings here")
    a = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    cache = Path(a.cache) if a.cache else Path(tempfile.mkdtemp(prefix="swapkl-bench-"))
    real_models = ROOT / "cache" / "models"
    if not a.convert and real_models.is_dir() and not (cache / "models").exists():
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "models").symlink_to(real_models, target_is_directory=True)
    os.environ["SWAPKL_CACHE"] = str(cache)
    sys.path.insert(0, str(ROOT))

    t_import = time.perf_counter()
    import torch

    from swapkl.defaults import DEFAULT_BUDGET, DEFAULT_METHODS, default_contract, default_evaluator
    from swapkl.jobs import AnalysisRequest, JobManager

    t_import = time.perf_counter() - t_import
    contract = default_contract(a.device)
    ev = default_evaluator(contract.device)
    req = AnalysisRequest("default", contract=contract, budget=DEFAULT_BUDGET, methods=DEFAULT_METHODS,
                          evaluator=ev)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"machine: {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load average {load:.2f}")
    print(f"request: {req.label()}; evaluator {ev.to_dict()}; cache {cache}")
    print(f"imports: {t_import:.1f} s")

    mgr = JobManager()
    t0 = time.perf_counter()
    job = mgr.submit(req)
    marks: dict = {}
    last_line = 0.0
    L = None
    while not job.wait(0.25):
        now = time.perf_counter() - t0
        res = job.result
        if res is not None and res.pairs and "first_pair" not in marks:
            marks["first_pair"] = now
        if job.checkpoint is not None and L is None:
            L = job.checkpoint.num_layers
            marks["loaded"] = now
        if res is not None and L and len(res.pairs) >= L - 1 and "verdict" not in marks:
            marks["verdict"] = now
        if job.curves is not None and job.curves.methods and "first_curve" not in marks:
            marks["first_curve"] = now
        if now - last_line > 15:
            p = job.progress()
            print(f"  {now:6.1f} s  step {p.step}/{p.steps} {p.phase}: {p.done}/{p.total} {p.what[:50]}", flush=True)
            last_line = now
    cold = time.perf_counter() - t0
    if job.status != "done":
        print(f"cold run ended as {job.status}: {job.error}")
        return 1
    marks["done"] = cold
    print("cold run (s): " + ", ".join(f"{k} {v:.1f}" for k, v in marks.items()))
    print(f"verdict: {job.curves.verdict['regime'] if job.curves.verdict else None}; "
          f"baseline PPL {job.curves.baseline_ppl:.3f}; curves: " + "; ".join(
              f"{m} " + " ".join(f"{e['delta_pct']:+.1f}%" for e in v) for m, v in job.curves.methods.items()))
    mgr.shutdown()

    # ------------------------------------------------------------------ cached reopen, through the real app
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_resource.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    t = time.perf_counter()
    at.run()
    first_run = time.perf_counter() - t
    t = time.perf_counter()
    at.button(key="compute").click().run()
    cached = time.perf_counter() - t
    ok = any("loaded from the cache" in s.value for s in at.success) and not at.exception
    t = time.perf_counter()
    at.switch_page("pages/heatmaps.py").run()
    heat = time.perf_counter() - t
    t = time.perf_counter()
    at.switch_page("pages/curves.py").run()
    curv = time.perf_counter() - t
    print(f"cached reopen (AppTest): first script run {first_run:.2f} s (imports, widgets); Compute -> summary "
          f"rendered from the cache in {cached:.2f} s ({'ok' if ok else 'NOT from cache'}); heatmaps page "
          f"{heat:.2f} s; curves page {curv:.2f} s")
    out = {"load_average": load, "contract": contract.to_dict(), "evaluator": ev.to_dict(), "budget": DEFAULT_BUDGET,
           "methods": list(DEFAULT_METHODS), "cold_s": marks, "cached_render_s": cached, "heatmaps_page_s": heat,
           "curves_page_s": curv, "cached_ok": ok}
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
