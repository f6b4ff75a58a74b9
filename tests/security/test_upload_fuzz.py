"""Property test of the upload validators (issue 51): a few hundred generated files -- real result, curves, bundle,
evidence, study and transfer-table files mutated in their tree and their bytes (:func:`test_schema.hostile_files`),
and random bytes -- fed through the functions the dashboard's uploaders call, behind demo mode's size check.  Each is
refused in one line (a :class:`~swapkl.errors.SwapklError` without a newline) or opened (and what the page then
reads from it works); never another exception, and nothing is written outside the test's cache folder."""
from __future__ import annotations

import json
import os
import subprocess

import pytest
from hypothesis import HealthCheck, event, given, settings

from swapkl.compare.result import CompareResult
from swapkl.errors import SwapklError
from support.app_util import ROOT
from test_compare import synthetic
from test_schema import hostile_files

BENCH = ROOT / "experiments" / "results"
# ~60 files per kind, six kinds: a few hundred in all, about 20 s on 2 shared cores; SWAPKL_FUZZ_EXAMPLES for more
EXAMPLES = int(os.environ.get("SWAPKL_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _bundle() -> dict:
    return json.loads((BENCH / "bundle-stories260k.json").read_text())


def _study() -> str:
    """The study file of three models, each row's layer order with 3 of its bootstrap replicates (of 1000)."""
    d = json.loads((BENCH / "study-cpu.json").read_text())
    for r in d["rows"]:
        for p in r["order"].values():
            p["replicates"] = p["replicates"][:3]
    return json.dumps(d)


def _pair():
    """Two opened analyses (synthetic, 6 layers) and a comparison file of them with a transfer table."""
    from swapkl.jobs.comparisons import compare_jobs
    from swapkl.jobs.opened import opened_job

    a, b = synthetic(seed=0, noise=0.05), synthetic(seed=1, noise=0.05)
    ja, jb = opened_job(a.to_json(), owner="fuzz"), opened_job(b.to_json(), owner="fuzz")
    d = CompareResult(a={"model": {"display": "m0"}, "contract": a.contract},
                      b={"model": {"display": "m1", "num_layers": 6}, "contract": b.contract},
                      agreement=compare_jobs(ja, jb, n_boot=20).agreement,
                      transfer={"baseline_ppl": 20.0, "n_windows": 8, "protocols": {"interchange": [
                          {"n": 1, "set_a": [2], "set_b": [3], "diff": 1.5, "ci": [0.5, 2.5], "word": "worse",
                           "delta_a": 3.0, "delta_b": 1.5}]}}).to_json()
    return ja, jb, d


def _open_result(ctx, raw):  # app.py "result JSON or bundle", the Compare page's "score JSON or bundle"
    return ctx["mgr"].open_files(raw, owner="fuzz")


def _open_curves(ctx, raw):  # app.py "curves JSON (optional)" beside a real result
    return ctx["mgr"].open_files(ctx["scores"], raw, owner="fuzz")


def _open_evidence(ctx, raw):  # the Evidence page's "evidence JSON"; then what its results() reads first
    from swapkl.evidence.report import caption
    from swapkl.evidence.section import opened_evidence

    d = opened_evidence(raw, "evidence file fuzz.json")
    return caption(d), d["headline"]


def _open_transfer(ctx, raw):  # the Compare page's transfer table; then the table and the caption it draws
    from swapkl.compare.figures import transfer_rows
    from swapkl.jobs import comparisons as C

    cmp = C.compare_jobs(ctx["a"], ctx["b"], C.transfer_file(raw), n_boot=20)
    t = cmp.transfer
    return transfer_rows(cmp), f"{t['baseline_ppl']:.4g} {t['n_windows']}"


def _open_study(ctx, raw):  # a study file as `swapkl report STUDY.json` reads it; then what its report draws
    from swapkl.schema import parse_json
    from swapkl.study.across import statements, table_rows
    from swapkl.study.figures import agreement_frame, ratio_multiples, rho_dots
    from swapkl.study.result import StudyResult

    study = StudyResult.from_dict(parse_json(raw, "study file", keep_constants=True))
    return table_rows(study), statements(study), agreement_frame(study), ratio_multiples(study, ""), rho_dots(study, "")


KINDS = {"result": _open_result, "bundle": _open_result, "curves": _open_curves, "evidence": _open_evidence,
         "transfer": _open_transfer, "study": _open_study}


def _seed(kind: str, ctx) -> str:
    parts = _bundle()["parts"]
    return {"result": lambda: json.dumps(parts["scores"]), "bundle": lambda: json.dumps(_bundle()),
            "curves": lambda: json.dumps(parts["curves"]),
            "evidence": lambda: json.dumps(json.loads((BENCH / "evidence-default-256.json").read_text())),
            "transfer": lambda: ctx["transfer"], "study": _study}[kind]()


def _tree(*roots, skip=None) -> dict:
    """Every file below ``roots`` (outside ``skip``) with its size and mtime."""
    out = {}
    for root in roots:
        for dirpath, _, files in os.walk(root):
            if skip is not None and os.path.realpath(dirpath).startswith(os.path.realpath(skip)):
                continue
            for f in files:
                p = os.path.join(dirpath, f)
                st = os.stat(p)
                out[p] = (st.st_size, st.st_mtime_ns)
    return out


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.parametrize("kind", list(KINDS))
def test_hostile_uploads_are_refused_in_one_line_or_opened(kind, tmp_path, monkeypatch):
    from swapkl.jobs import JobManager
    from swapkl.jobs.policy import Policy

    cache = tmp_path / "cache"
    monkeypatch.setenv("SWAPKL_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)  # a relative path written by mistake would land here, and be seen
    policy = Policy(demo=True)
    ctx = {"mgr": JobManager(policy=policy, use_snapshots=False), "scores": json.dumps(_bundle()["parts"]["scores"])}
    ctx["a"], ctx["b"], ctx["transfer"] = _pair()
    seed_text, outcome = _seed(kind, ctx), {"opened": 0, "refused": 0}
    KINDS[kind](ctx, seed_text.encode())  # the unmutated file opens
    outside, repo, status = _tree(tmp_path, skip=cache), _tree(ROOT / "cache"), _git_status()

    @FUZZ
    @given(raw=hostile_files(seed_text))
    def one(raw: bytes) -> None:
        try:
            policy.check_upload(len(raw))  # what every uploader asks first (dashboard/uploads.py)
            KINDS[kind](ctx, raw)
        except SwapklError as e:
            msg = str(e)
            assert msg and "\n" not in msg and "Traceback" not in msg, msg
            outcome["refused"] += 1
            event("refused")
        else:
            outcome["opened"] += 1
            event("opened")
        assert _tree(tmp_path, skip=cache) == outside  # nothing written beside the cache folder
        assert len(ctx["mgr"].jobs(viewer="fuzz")) <= policy.max_opened

    one()
    assert _tree(ROOT / "cache") == repo and _git_status() == status  # nor in the checkout
    assert outcome["refused"] > 0 and sum(outcome.values()) >= min(EXAMPLES, 50), outcome
    print(f"{kind}: {outcome['opened']} opened, {outcome['refused']} refused in one line")


def _edit(path: str, edit):
    def make():
        d = json.loads(_study() if path == "study" else (BENCH / path).read_text())
        edit(d)
        return json.dumps(d).encode()
    return make


FOUND = {  # what the fuzzing found, kept as plain cases: each was a traceback before
    "study row without its word": ("study", _edit("study", lambda d: d["rows"][0]["removal"]["rows"][0].pop("word")),
                                   "is missing"),
    "study set without its ΔPPL": ("study", _edit("study", lambda d: d["rows"][1]["removal"]["rows"][2]
                                                  ["interchange"].pop("delta_pct")), "delta_pct is missing"),
    "study CI of one number": ("study", _edit("study", lambda d: d["rows"][2]["removal"]["rows"][0].update(
        ratio_ci=[0.5])), "is not a [low, high] pair"),
    "evidence without a headline": ("evidence", _edit("evidence-default-256.json", lambda d: d.pop("headline")),
                                    "the headline a string"),
    "evidence contract of a number": ("evidence", _edit("evidence-default-256.json",
                                                        lambda d: d["contract"].update(model=5)), "contract.model"),
}


@pytest.mark.parametrize("case", list(FOUND))
def test_what_the_fuzzing_found_is_refused_in_one_line(case, tmp_path, monkeypatch):
    kind, make, words = FOUND[case]
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SwapklError) as e:
        KINDS[kind]({}, make())
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_study_ci_open_at_one_end_is_drawn(tmp_path):
    """A CI with one end null (a bootstrap that failed on one side) is drawn without its error bar."""
    d = json.loads(_study())
    d["rows"][0]["removal"]["rows"][0]["ratio_ci"] = [0.5, None]
    d["rows"][0]["evidence"]["raw"]["replacement"]["ci"] = [0.5, None]
    table, _, _, ratio, dots = _open_study({}, json.dumps(d).encode())
    assert ratio.data[0].error_y.array[0] == 0.0 and dots.data[0].error_x.array[0] == 0.0
    assert table[0]["n=1 I/R"] == "0.763 [0.500, –]"
