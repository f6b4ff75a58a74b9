"""swapkl.jobs.policy: what a dashboard visitor may ask for (demo mode), tested without a server."""
from __future__ import annotations

import pytest

from swapkl.contract import Contract
from swapkl.jobs import AnalysisRequest, TrajectoryRequest
from swapkl.jobs.policy import Policy, PolicyError

DEMO = Policy(demo=True, models=("default", "EleutherAI/pythia-160m@step*", "Qwen/Qwen3-0.6B@main",
                                 "tests/fixtures/models/stories260K"))


def test_local_policy_allows_everything():
    p = Policy()
    p.check_model("/etc/passwd")
    p.check_request(AnalysisRequest(model="../anything", contract=Contract(prompts=4096, tokens=8192), budget=60))


@pytest.mark.parametrize("spec, rev", [("default", None), ("builtin", None),
                                       ("EleutherAI/pythia-160m@step1000", None), ("EleutherAI/pythia-160m", "step0"),
                                       ("Qwen/Qwen3-0.6B@main", None), ("Qwen/Qwen3-0.6B", "main"),
                                       ("tests/fixtures/models/stories260K", None)])
def test_demo_allow_list(spec, rev):
    DEMO.check_model(spec, rev)


@pytest.mark.parametrize("spec, rev", [("/etc/passwd", None), ("tests/fixtures/models", None), ("./cache", None),
                                       ("gpt2", None), ("EleutherAI/pythia-1.4b", None), ("Qwen/Qwen3-0.6B@v2", None),
                                       ("Qwen/Qwen3-0.6B", "other"), ("default", "step1"),
                                       ("tests/fixtures/models/stories260K/../stories260K", None),
                                       ("tests/fixtures/models/stories260K", "main"), ("", None)])
def test_demo_refuses_everything_else_without_touching_disk(spec, rev, monkeypatch):
    import os
    import pathlib

    touched = []

    def boom(*a, **k):  # a visitor's text must never reach the filesystem
        touched.append(a)
        return False

    err = None
    with monkeypatch.context() as m:
        m.setattr(os.path, "exists", boom)
        m.setattr(pathlib.Path, "exists", boom)
        m.setattr(pathlib.Path, "resolve", boom)
        try:
            DEMO.check_model(spec, rev)
        except PolicyError as e:
            err = e
    assert not touched
    assert err is not None and ("offers only these checkpoints" in str(err) or "has no revisions" in str(err)
                                or "does not offer that revision" in str(err))


def test_demo_contract_and_budget_bounds():
    ok = AnalysisRequest(model="default", contract=Contract(prompts=16, tokens=128), budget=4)
    DEMO.check_request(ok)
    with pytest.raises(PolicyError, match=r"at most 4096 prompt tokens .* 64 x 128 = 8192"):
        DEMO.check_request(AnalysisRequest(model="default", contract=Contract(prompts=64, tokens=128)))
    with pytest.raises(PolicyError, match="pair sets adjacent, gap:2, gap:3; got all"):
        DEMO.check_request(AnalysisRequest(model="default", contract=Contract(pairs="all")))
    with pytest.raises(PolicyError, match="removes at most 6 layers; budget 7"):
        DEMO.check_request(AnalysisRequest(model="default", contract=Contract(), budget=7))
    with pytest.raises(PolicyError, match="corpus path cannot be chosen"):
        DEMO.check_request(AnalysisRequest(model="default", contract=Contract(corpus="/etc/hosts")))


def test_demo_trajectory_lists():
    DEMO.check_request(TrajectoryRequest("EleutherAI/pythia-160m@step0, @step1000 @step143000", Contract()))
    from swapkl.store import cache_root

    DEMO.check_request(TrajectoryRequest(str(cache_root() / "demo-trajectory"), Contract(), train_demo=True))
    for bad in ("/etc", "EleutherAI/pythia-160m@step0 /tmp/x", "@step1", "gpt2@main"):
        with pytest.raises(PolicyError):
            DEMO.check_request(TrajectoryRequest(bad, Contract()))


def test_export_dir_stays_below_cache_exports(tmp_path):
    root = (tmp_path / "exports").resolve()
    for name in ("model-minus-3", "../../etc/x", "/abs/path", "..", "a/b\\c", "", "é" * 200):
        out = DEMO.export_dir(name, tmp_path)
        assert out.parent == root and out.name and not out.name.startswith(".")


def test_policy_from_config_file_and_environment(tmp_path):
    f = tmp_path / "swapkl.toml"
    f.write_text('[demo]\nenabled = true\nmodels = ["default", "EleutherAI/pythia-70m"]\nmax_jobs_per_session = 1\n'
                 'max_prompt_tokens = 512\nupload_mb = 2\n')
    p = Policy.from_env({}, f)
    assert p.demo and p.models == ("default", "EleutherAI/pythia-70m") and p.max_jobs_per_session == 1
    assert p.max_prompt_tokens == 512 and p.upload_mb == 2
    p2 = Policy.from_env({"SWAPKL_DEMO": "0"}, f)
    assert not p2.demo
    p3 = Policy.from_env({"SWAPKL_DEMO": "1", "SWAPKL_DEMO_MODELS": "default,Qwen/Qwen3-0.6B", "SWAPKL_DEMO_MAX_JOBS": "3"},
                         tmp_path / "missing.toml")
    assert p3.demo and p3.models == ("default", "Qwen/Qwen3-0.6B") and p3.max_jobs_per_session == 3
    assert not Policy.from_env({}, tmp_path / "missing.toml").demo
    with pytest.raises(PolicyError, match="must be an integer"):
        Policy.from_env({"SWAPKL_DEMO_MAX_JOBS": "many"}, tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("[demo\n")
    with pytest.raises(PolicyError, match="cannot read"):
        Policy.from_env({}, tmp_path / "bad.toml")
    with pytest.raises(PolicyError):
        DEMO.check_upload(17 * 1024 * 1024)
    DEMO.check_upload(1024)
