"""The demo trajectory (a tiny, short run) and the trajectory command on it."""
from __future__ import annotations

import json
import time

import pytest
import torch

from swapkl.trajectory import demo
from swapkl import trajectory as tr
from swapkl.errors import ComputeInterrupted, SwapklError

TINY = dict(steps=20, seconds=120, checkpoints=3, seed=3, layers=4, hidden=32, heads=2, vocab=320, seq_len=32,
            batch_size=8, lr=3e-3, warmup=5, heldout_windows=8, threads=1)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one torch thread is as fast as two and does not collapse when other processes share the
    cores (two spinning OpenMP threads on a loaded 2-core machine can be 50x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, one_thread):
    """The TINY run (its wall time is not a test, a loaded machine is slow)."""
    out = tmp_path_factory.mktemp("demo") / "traj"
    demo.train_demo_trajectory(out, **TINY)
    return out, None


@pytest.fixture()
def score_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_checkpoint_schedule():
    assert demo.checkpoint_steps(2000, 7) == [0, 2, 8, 32, 126, 502, 2000]
    assert demo.checkpoint_steps(20, 3) == [0, 2, 20]
    assert demo.checkpoint_steps(5, 10) == [0, 2, 3, 4, 5]
    assert demo.checkpoint_steps(1, 5) == [0, 1]


def test_demo_manifest_and_checkpoints_load(demo_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = demo_run
    m = json.loads((out / demo.MANIFEST).read_text())
    assert m["format"] == demo.FORMAT and m["steps"] == [0, 2, 20] and m["final_step"] == 20
    assert not m["stopped_early"] and m["settings"]["seed"] == 3
    assert [c["folder"] for c in m["checkpoints"]] == ["step0", "step2", "step20"]
    for c in m["checkpoints"]:
        model = AutoModelForCausalLM.from_pretrained(out / c["folder"])
        tok = AutoTokenizer.from_pretrained(out / c["folder"])
        cfg = model.config
        assert cfg.model_type == "gpt_neox" and cfg.use_parallel_residual
        assert cfg.rope_parameters["partial_rotary_factor"] == 0.25
        assert cfg.num_hidden_layers == 4 and cfg.vocab_size == len(tok) == 320
        ids = tok("def f(x): return x + 1  # any text tokenizes")["input_ids"]
        assert tok.decode(ids) == "def f(x): return x + 1  # any text tokenizes"
    # the parser reads the manifest
    specs = tr.parse_checkpoints(str(out))
    assert [(s.step, s.label) for s in specs] == [(0, "step0"), (2, "step2"), (20, "step20")]


def test_step0_is_the_initialisation(demo_run):
    from transformers import AutoModelForCausalLM

    out, _ = demo_run
    s = demo.DemoSettings(**TINY)
    fresh = demo.init_model(s, 320).state_dict()
    saved = AutoModelForCausalLM.from_pretrained(out / "step0").state_dict()
    assert fresh.keys() == saved.keys()
    for k in fresh:
        assert torch.equal(fresh[k], saved[k]), k
    later = AutoModelForCausalLM.from_pretrained(out / "step20").state_dict()
    assert not torch.equal(fresh["gpt_neox.embed_in.weight"], later["gpt_neox.embed_in.weight"])


def test_heldout_loss_decreases(demo_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = demo_run
    s = demo.DemoSettings(**TINY)
    windows = demo.heldout_ids(AutoTokenizer.from_pretrained(out / "step0"), s)
    m = json.loads((out / demo.MANIFEST).read_text())
    losses = {}
    for c in m["checkpoints"]:
        model = AutoModelForCausalLM.from_pretrained(out / c["folder"])
        losses[c["step"]] = demo.heldout_loss(model, windows)
        assert losses[c["step"]] == pytest.approx(c["heldout_loss"], abs=1e-4)
    assert losses[0] == pytest.approx(torch.log(torch.tensor(320.0)).item(), abs=0.3)  # ~uniform at init
    assert losses[20] < losses[2] < losses[0]
    assert losses[0] - losses[20] > 0.5


def test_deterministic_and_reused(demo_run, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    out, _ = demo_run
    again = demo.train_demo_trajectory(tmp_path / "again", **TINY)
    a = load_file(out / "step20" / "model.safetensors")
    b = load_file(again / "step20" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    # same settings: reused without training
    before = (again / demo.MANIFEST).stat().st_mtime_ns
    with monkeypatch.context() as m:
        m.setattr(demo, "_train_into", lambda *a, **k: pytest.fail("trained again"))
        assert demo.train_demo_trajectory(again, **TINY) == again
    assert (again / demo.MANIFEST).stat().st_mtime_ns == before
    # a foreign folder is never overwritten
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(demo.DemoTrajectoryError, match="not a demo trajectory"):
        demo.train_demo_trajectory(foreign, **TINY)
    assert (foreign / "notes.txt").read_text() == "keep me"
    with pytest.raises(ComputeInterrupted, match="stopped at step 3"):
        steps = iter(range(100))
        demo.train_demo_trajectory(again, force=True, should_stop=lambda: next(steps) >= 3, **TINY)
    assert (again / demo.MANIFEST).stat().st_mtime_ns == before and not list(tmp_path.glob(".again*"))
    with pytest.raises(SwapklError, match="--layers"):
        demo.train_demo_trajectory(tmp_path / "x", **{**TINY, "layers": 1})


def test_compute_trajectory_on_demo(demo_run, score_cache, tmp_path):
    from swapkl.contract import Contract

    out, _ = demo_run
    contract = Contract(pairs="adjacent", prompts=4, tokens=16, corpus="builtin", seed=0)
    seen = []
    traj = tr.compute_trajectory(str(out), contract, on_checkpoint=lambda k, sp, res: seen.append((k, sp.step)))
    assert seen == [(0, 0), (1, 2), (2, 20)]
    df = traj.summary()
    assert list(df["step"]) == [0, 2, 20] and list(df["pairs"]) == [3, 3, 3]
    assert df[["gap_mean", "gap_median", "gap_p75", "gap_max", "ratio_mean"]].notna().all().all()
    for row, res in zip(df.itertuples(), traj.results):
        s = res.summary(ci=False)
        assert row.gap_mean == pytest.approx(s["gap"]["mean"]) and row.gap_max == pytest.approx(s["gap"]["max"])
    dep = traj.depth()
    assert dep["depth"].tolist() == pytest.approx([1 / 6, 3 / 6, 5 / 6])
    # stopping: partial trajectory with what finished
    calls = iter([False, True])
    with pytest.raises(ComputeInterrupted) as ei:
        tr.compute_trajectory(str(out), contract, should_stop=lambda: next(calls, True))
    assert len(ei.value.partial.results) == 1

    # the CLI on the same checkpoints: everything comes from the cache now
    from swapkl.commands.cli import main

    js = tmp_path / "traj.json"
    rc = main(["trajectory", str(out), "--prompts", "4", "--tokens", "16", "--corpus", "builtin",
               "--json", str(js), "--quiet"])
    assert rc == 0
    data = json.loads(js.read_text())
    assert [c["step"] for c in data["checkpoints"]] == [0, 2, 20]
    assert data["summary"][2]["gap_mean"] == pytest.approx(df.iloc[2]["gap_mean"])
    assert all(r["meta"]["computed_pairs"] == 0 for r in data["results"])


def test_cli_demo_and_errors(tmp_path, capsys, score_cache):
    from swapkl.commands.cli import main

    out = tmp_path / "cli-demo"
    rc = main(["demo-trajectory", "--out", str(out), "--steps", "4", "--checkpoints", "2", "--layers", "2",
               "--hidden", "32", "--heads", "2", "--vocab", "300", "--seconds", "60", "--quiet"])
    assert rc == 0 and json.loads((out / demo.MANIFEST).read_text())["steps"] == [0, 4]
    assert main(["trajectory", "@step0"]) == 2
    assert "no model before it" in capsys.readouterr().err
    assert main(["trajectory", str(out), "--pairs", "gap:0"]) == 2
    assert main(["demo-trajectory", "--out", str(tmp_path / "y"), "--vocab", "100"]) == 2
    assert "--vocab" in capsys.readouterr().err


class _VirtualTime:
    """The demo module's ``time`` with a virtual ``perf_counter`` that moves only when the trainer works: a step
    takes ``step_s(k)`` seconds, a checkpoint ``SAVE_S`` (a loaded machine cannot change what a test sees)."""
    SAVE_S = 0.2

    def __init__(self, step_s):
        self.t, self.step_s = 1000.0, step_s

    def perf_counter(self) -> float:
        return self.t

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture
def virtual_time(monkeypatch):
    """Install :class:`_VirtualTime`; returns a setter for the step duration."""
    clock = _VirtualTime(lambda k: 0.5)
    monkeypatch.setattr(demo, "time", clock)
    step, save = demo._Trainer.train_step, demo._Trainer.save

    def train_step(self, k, planned):
        step(self, k, planned)
        self.step_times[-1] = clock.step_s(k)
        clock.t += clock.step_s(k)

    def timed_save(self, k):
        save(self, k)
        clock.t += clock.SAVE_S
        return clock.SAVE_S

    monkeypatch.setattr(demo._Trainer, "train_step", train_step)
    monkeypatch.setattr(demo._Trainer, "save", timed_save)
    return clock


def test_time_budget_plans_the_run(tmp_path, virtual_time):
    """After two steps the run plans its step count to fill PLAN_MARGIN of the time left (checkpoints and 1 s of
    slack set aside) and ends within the budget."""
    s = {**TINY, "steps": 10**6, "seconds": 20}
    out = demo.train_demo_trajectory(tmp_path / "budget", **s)
    m = json.loads((out / demo.MANIFEST).read_text())
    S, step = _VirtualTime.SAVE_S, 0.5
    left = s["seconds"] - (S + 2 * step) - (s["checkpoints"] + 1) * S - 1.0  # at step 2: step 0 saved, 2 steps
    assert m["planned_steps"] == int(demo.PLAN_MARGIN * left / step) == 28
    assert m["final_step"] == 28 and not m["stopped_early"]
    assert m["steps"] == demo.checkpoint_steps(28, s["checkpoints"])
    assert m["seconds_total"] == pytest.approx(len(m["steps"]) * S + 28 * step) and m["seconds_total"] <= s["seconds"]


def test_time_budget_stops_a_run_that_slows_down(tmp_path, virtual_time):
    """Steps that become slower after the plan: the run stops before the budget runs out and saves the step it
    reached as the final checkpoint."""
    virtual_time.step_s = lambda k: 0.5 if k <= 2 else 2.0
    s = {**TINY, "steps": 10**6, "seconds": 20}
    m = json.loads((demo.train_demo_trajectory(tmp_path / "slow", **s) / demo.MANIFEST).read_text())
    assert m["planned_steps"] == 28 and m["stopped_early"]
    assert 2 < m["final_step"] < 28 and m["steps"][-1] == m["final_step"]
    # the rule: after each step, stop when (elapsed + a save + the mean of the last 20 steps) passes the budget
    S, times, elapsed, k = _VirtualTime.SAVE_S, [], 2 * _VirtualTime.SAVE_S, 0  # step 0 and step 2 are saved
    while True:
        k += 1
        times.append(virtual_time.step_s(k))
        elapsed += times[-1]
        if elapsed + S + sum(times[-20:]) / len(times[-20:]) > s["seconds"]:
            break
    assert m["final_step"] == k == 11
    assert m["seconds_total"] == pytest.approx(elapsed + S) and m["seconds_total"] <= s["seconds"]
