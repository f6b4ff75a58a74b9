"""A study across models (swapkl.study, docs/study.md): a study's per-model numbers are the single-model commands'
numbers for the same contract (curves, evidence, the verdict), a study interrupted after its first model computes
nothing for it again when restarted, shares merge into the whole study only under one contract, and bad input is
one line."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from support.cli_run import run_swapkl

WIKI = "tests/fixtures/data/wikitext-2-raw/wiki.test.raw"
STORIES = "tests/fixtures/models/stories260K"
#: the small contract every test here runs: 4 prompts x 32 tokens, adjacent pairs, 600 held-out words, n = 1..2
CONTRACT = ["--prompts", "4", "--tokens", "32", "--corpus", WIKI, "--eval-text", WIKI, "--max-words", "600",
            "--budget", "2"]
STUDY = [*CONTRACT, "--n-boot", "50", "--seeds", "5"]


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    """stories260K with every weight perturbed (seeded): another model of the same depth, as a local folder."""
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("models") / "stories-b"
    model = AutoModelForCausalLM.from_pretrained(STORIES)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * p.std().nan_to_num(0.0) * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copy(f"{STORIES}/{f}", out / f)
    return str(out)


def swapkl(cache, *argv):
    r = run_swapkl(*argv, env={"SWAPKL_CACHE": str(cache)})
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_a_study_row_equals_the_single_model_commands(tmp_path):
    """One model studied, then the same model through `curves` and `evidence` in a fresh cache: the same ΔPPL per
    protocol and n, the same I/R ratio, the same baseline, the same ρ with the same CIs, the same verdict."""
    out = tmp_path / "study.json"
    swapkl(tmp_path / "c1", "study", STORIES, *STUDY, "--n-boot", "200", "--json", out)
    row = json.loads(out.read_text())["rows"][0]
    assert row["status"] == "done" and row["layers"] == 5
    curves, evidence = tmp_path / "curves.json", tmp_path / "ev.json"
    fresh = tmp_path / "c2"  # nothing shared with the study: every number is computed again
    swapkl(fresh, "curves", STORIES, *CONTRACT, "--methods", "replacement,interchange,random,bi", "--seeds", "5",
           "--json", curves)
    swapkl(fresh, "evidence", STORIES, *CONTRACT[:-2], "--budget", "1", "--boot", "10", "--boot-agreement", "200",
           "--regions", "1", "--no-sets", "--json", evidence)
    c, e = json.loads(curves.read_text()), json.loads(evidence.read_text())
    assert row["removal"]["baseline_ppl"] == pytest.approx(c["baseline_ppl"], rel=1e-9)
    for x in row["removal"]["rows"]:
        for p in ("replacement", "interchange"):
            single = c["methods"][p][x["n"] - 1]
            assert x[p]["delta_pct"] == pytest.approx(single["delta_pct"], rel=1e-9)
            assert x[p]["removed"] == single["removed"]
        ratio = next(r for r in c["delta_ratio"] if r["n"] == x["n"])["ratio"]
        assert x["ratio"] == pytest.approx(ratio, rel=1e-9)
        assert x["ratio_ci"][0] <= x["ratio"] <= x["ratio_ci"][1]
    assert row["verdict"]["regime"] == c["verdict"]["regime"]
    assert row["gap"]["median"] == pytest.approx(c["verdict"]["evidence"]["kl_ratio_median"], rel=1e-9)
    for p in ("replacement", "interchange"):
        assert row["evidence"]["raw"][p]["rho"] == pytest.approx(e["agreement"]["spearman"][p]["ground_truth_ppl"])
        assert row["evidence"]["raw"][p]["ci"] == pytest.approx(e["agreement"]["spearman_ci"][p]["ground_truth_ppl"])
    assert row["evidence"]["raw"]["best"] == e["comparison"]["ground_truth_ppl"]["best"]


def test_an_interrupted_study_resumes_at_the_next_model_computing_nothing_again(tmp_path, monkeypatch,
                                                                                 second_model):
    """Killed while the second model runs, restarted: the first model's row is read back (no analysis, no swap-KL
    scoring, no perplexity evaluation of it), the second is computed, and the first row's numbers are unchanged."""
    import swapkl.scoring.score as S
    import swapkl.study.analyze as A

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    calls, scored = [], []
    real_analyze, real_score = A.analyze_model, S.score

    def counting(ck, plan, *a, **kw):
        calls.append(ck.identity.get("display"))
        if len(calls) == 2 and kill[0]:
            raise KeyboardInterrupt  # the kill, while the second model runs
        return real_analyze(ck, plan, *a, **kw)

    def counting_score(ck, *a, **kw):
        scored.append(ck.identity.get("display"))
        return real_score(ck, *a, **kw)

    monkeypatch.setattr(A, "analyze_model", counting)
    monkeypatch.setattr(S, "score", counting_score)
    kill = [True]
    out = tmp_path / "s.json"
    argv = ["study", STORIES, second_model, *STUDY, "--no-evidence", "--json", out]
    from swapkl.commands.cli import main

    assert main([str(a) for a in argv]) == 130  # interrupted: finished work is kept
    assert len(calls) == 2 and len(scored) == 1 and not out.exists()
    first = calls[0]
    kill[0] = False
    calls.clear(), scored.clear()
    assert main([str(a) for a in argv] + ["--quiet"]) == 0
    assert first not in calls and len(calls) == 1  # only the second model was analysed
    assert first not in scored and len(scored) == 1
    rows = json.loads(out.read_text())["rows"]
    assert [r["cached"] for r in rows] == [True, False]
    assert all(r["status"] == "done" for r in rows)
    # a third run computes nothing at all
    calls.clear(), scored.clear()
    assert main([str(a) for a in argv] + ["--quiet"]) == 0
    assert calls == [] and scored == []
    again = json.loads(out.read_text())["rows"]
    assert again[0]["removal"] == rows[0]["removal"] and again[1]["gap"] == rows[1]["gap"]


def test_shares_merge_into_the_whole_study_and_other_contracts_are_refused(tmp_path, second_model):
    cache = tmp_path / "c"
    base = ["study", STORIES, second_model, *STUDY, "--no-evidence"]
    whole, s1, s2 = tmp_path / "whole.json", tmp_path / "s1.json", tmp_path / "s2.json"
    swapkl(cache, *base, "--shard", "1/2", "--json", s1)
    swapkl(cache, *base, "--shard", "2/2", "--json", s2)
    swapkl(cache, *base, "--json", whole)
    merged = tmp_path / "m.json"
    r = swapkl(cache, "study", "--merge", s1, s2, "--json", merged)
    m, w = json.loads(merged.read_text()), json.loads(whole.read_text())
    assert [x["model"] for x in m["rows"]] == [x["model"] for x in w["rows"]]
    assert [x["removal"] for x in m["rows"]] == [x["removal"] for x in w["rows"]]
    assert m["complete"] and "rank agreement" in r.stdout  # one depth: the orderings are compared
    other = tmp_path / "other.json"
    swapkl(cache, "study", second_model, *STUDY, "--no-evidence", "--seed", "1", "--json", other)
    bad = run_swapkl("study", "--merge", s1, other, env={"SWAPKL_CACHE": str(cache)})
    assert bad.returncode == 2 and "another contract" in bad.stderr and "scoring" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    dup = run_swapkl("study", "--merge", s1, s1, env={"SWAPKL_CACHE": str(cache)})
    assert dup.returncode == 2 and "is in both" in dup.stderr


def test_bad_input_is_one_line(tmp_path):
    cache = tmp_path / "c"
    for argv, words in ((["study", STORIES, *STUDY, "--shard", "3/2"], "1 <= K <= N"),
                        (["study", STORIES, *STUDY, "--shard", "x"], "K/N"),
                        (["study", STORIES, *STUDY, "--budget", "0"], "--budget"),
                        (["study", STORIES, *STUDY, "--methods", "nope"], "nope"),
                        (["study", *STUDY], "give the models"),
                        (["study", STORIES, *STUDY, "--seeds", "2"], "--seeds"),
                        (["study", str(tmp_path / "missing"), *STUDY], "no such file")):
        r = run_swapkl(*argv, env={"SWAPKL_CACHE": str(cache)})
        assert r.returncode == 2 and words in r.stderr, (argv, r.stderr)
        assert "Traceback" not in r.stderr
    # a folder whose model cannot be loaded is a failed row with its reason; the study goes on and says so
    out = tmp_path / "s.json"
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text('{"model_type": "no-such-type"}')
    r = swapkl(cache, "study", str(tmp_path / "empty"), STORIES, *STUDY, "--no-evidence", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["status"] == "failed" and "\n" not in rows[0]["error"] and "failed:" in r.stdout
    assert rows[1]["status"] == "done"


def test_a_corrupt_cached_row_is_recomputed_with_a_warning(tmp_path, monkeypatch):
    from swapkl.study.plan import StudyModel
    from swapkl.study.run import cached_row, row_path

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    from swapkl.commands.cli import build_parser
    from swapkl.commands.study import build_plan

    plan = build_plan(build_parser().parse_args(["study", STORIES, *STUDY, "--no-evidence"]))
    path = row_path(plan, StudyModel(STORIES))
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="corrupt study cache entry"):
        assert cached_row(plan, StudyModel(STORIES)) is None


def test_model_lists_yaml_toml_and_text(tmp_path):
    from swapkl.errors import SwapklError
    from swapkl.study.plan import read_model_list, shard

    (tmp_path / "m.yaml").write_text("models:\n  - gpt2\n  - {spec: EleutherAI/pythia-160m, revision: step1000, "
                                     "label: P160@1k}\n")
    (tmp_path / "m.toml").write_text('[[models]]\nspec = "gpt2"\nlabel = "GPT-2"\n')
    (tmp_path / "m.txt").write_text("gpt2  # the small one\n\nfacebook/opt-350m@main\n")
    y = read_model_list(tmp_path / "m.yaml")
    assert [(m.spec, m.revision, m.label) for m in y] == [("gpt2", None, "gpt2"),
                                                          ("EleutherAI/pythia-160m", "step1000", "P160@1k")]
    assert read_model_list(tmp_path / "m.toml")[0].label == "GPT-2"
    assert [m.name for m in read_model_list(tmp_path / "m.txt")] == ["gpt2", "facebook/opt-350m@main"]
    (tmp_path / "bad.yaml").write_text("models: [a, {spec: b, colour: red}]")
    with pytest.raises(SwapklError, match="colour"):
        read_model_list(tmp_path / "bad.yaml")
    assert shard(list("abcde"), 2, 2) == ["b", "d"] and shard(list("abcde"), 1, 2) == ["a", "c", "e"]


def test_statements_count_the_words_of_the_paired_cis():
    from swapkl.study.across import removal_statements, table_rows
    from swapkl.study.result import StudyResult

    def row(label, word, ratio):
        return {"model": {"spec": label, "label": label, "revision": None}, "status": "done", "layers": 4,
                "params": 1e6, "verdict": {"regime": "tied"}, "gap": {"median": 0.5, "ci": [0.4, 0.6]},
                "removal": {"rows": [{"n": 3, "replacement": {"delta_pct": 10.0}, "interchange": {"delta_pct": 10 * ratio},
                                      "ratio": ratio, "ratio_ci": [ratio - 0.1, ratio + 0.1], "diff": 0.0,
                                      "diff_ci": [0, 0], "word": word,
                                      "best_baseline": {"method": "bi", "delta_pct": 1.0}}]}}

    words = ["better", "better", "better", "better", "tie", "tie"]
    res = StudyResult(contract={}, rows=[row(f"m{k}", w, 0.5 if w == "better" else 1.0) for k, w in enumerate(words)])
    s = removal_statements(res)[0]
    assert "cheaper at n = 3 on 4 of 6 models; tie on 2; costlier on 0" in s
    assert "below both guided sets on 6" in s
    t = table_rows(res)
    assert t[0]["n=3 I vs R"] == "cheaper" and t[4]["n=3 I vs R"] == "tie"
    assert np.isclose(t[0]["n=3 ΔPPL% I"], 5.0)


def test_a_study_file_round_trips_and_a_malformed_one_is_one_line(tmp_path):
    from swapkl.errors import UploadError
    from swapkl.study.result import StudyResult

    row = {"model": {"spec": "m", "label": "m", "revision": None}, "status": "done", "layers": 4, "params": 10,
           "verdict": {"regime": "tied"}, "gap": {"median": 0.5, "ci": [0.4, 0.6]},
           "removal": {"rows": [{"n": 1, "replacement": {"delta_pct": 2.0}, "interchange": {"delta_pct": 1.0},
                                 "ratio": 0.5, "ratio_ci": [0.3, 0.8], "diff": -1.0, "diff_ci": [-2.0, -0.1],
                                 "word": "better"}]},
           "evidence": {"raw": {"replacement": {"rho": 0.5, "ci": [0.1, 0.9]}, "interchange": {"rho": 0.7,
                                                                                          "ci": [0.2, 0.95]}},
                        "bridged": None}}
    res = StudyResult(contract={"budget": 1}, rows=[row, {"model": {"spec": "x", "label": "x", "revision": None},
                                                          "status": "failed", "error": "no such model"}])
    path = tmp_path / "s.json"
    res.to_json(path)
    back = StudyResult.from_json(path)
    assert back.to_dict() == res.to_dict() and [r["model"]["label"] for r in back.done()] == ["m"]
    for bad, words in (({**res.to_dict(), "format": "x"}, "format"),
                       ({**res.to_dict(), "rows": [dict(row, status="maybe")]}, "status"),
                       ({**res.to_dict(), "rows": [{k: v for k, v in row.items() if k != "removal"}]}, "removal"),
                       ({**res.to_dict(), "rows": [dict(row, evidence={"raw": {"replacement": {"rho": 3, "ci": [0, 1]},
                                                                               "interchange": row["evidence"]["raw"]
                                                                               ["interchange"]}})]}, "rho")):
        path.write_text(json.dumps(bad))
        with pytest.raises(UploadError, match=words) as e:
            StudyResult.from_json(path)
        assert "\n" not in str(e.value)


def test_report_study_html_is_self_contained_with_the_grid_and_figures(tmp_path, cli):
    from swapkl.study.result import StudyResult

    def row(label, ratio, rho_r, rho_i):
        return {"model": {"spec": label, "label": label, "revision": None}, "status": "done", "layers": 6,
                "params": 2e6, "verdict": {"regime": "divergent"}, "gap": {"median": 0.3, "ci": [0.2, 0.4]},
                "removal": {"rows": [{"n": n, "replacement": {"delta_pct": 10.0 * n}, "interchange":
                                      {"delta_pct": 10.0 * n * ratio}, "ratio": ratio, "ratio_ci": [ratio - .1, ratio + .1],
                                      "diff": -1.0, "diff_ci": [-2.0, -0.5], "word": "better", "best_baseline": None}
                                     for n in (1, 2)]},
                "evidence": {"raw": {"replacement": {"rho": rho_r, "ci": [rho_r - .2, rho_r + .1]},
                                     "interchange": {"rho": rho_i, "ci": [rho_i - .2, rho_i + .1]},
                                     "best": "interchange", "best_rho": rho_i, "best_ci": [rho_i - .2, rho_i + .1],
                                     "pick": {"winner": None, "by": "overlap", "diff_ci": [None, None]}},
                             "bridged": None},
                "order": {p: {"values": [0.1, 0.3, 0.2, 0.5, 0.4], "replicates": [[0.1, 0.3, 0.2, 0.5, 0.4]] * 20}
                          for p in ("replacement", "interchange")},
                "cost": {"seconds": 3.0, "peak_bytes": 2**30}}

    study = tmp_path / "study.json"
    StudyResult(contract={"budget": 2, "scoring": {"pairs": "adjacent", "prompts": 4, "tokens": 8}, "n_boot": 20},
                rows=[row("A", 0.5, 0.6, 0.8), row("B", 0.9, 0.7, 0.4)]).to_json(study)
    out = tmp_path / "study.html"
    code, _, err = cli("report", str(study), "--html", "--out", str(out))
    assert code == 0, err
    html = out.read_text()
    assert "2 figures" in err and html.count("Plotly.newPlot(") == 2 and "<script src=" not in html
    assert "cheaper at n = 2 on 2 of 2 models" in html and "study.csv" in html
    assert "rank agreement" in html.lower() and "budget 2" in html


def test_the_paper_preset_is_the_papers_models_at_its_contract_and_sets_the_papers_figures_beside():
    from swapkl.commands.cli import build_parser
    from swapkl.commands.study import build_plan
    from swapkl.study.presets import PAPER_FIGURES, against_paper
    from swapkl.study.result import StudyResult

    plan = build_plan(build_parser().parse_args(["study", "--preset", "paper"]))
    labels = [m.label for m in plan.models]
    assert len(labels) == 14 and {"GPT-2-XL", "OPT-350M", "BLOOM-560M", "Pythia-2.8B", "Qwen3-8B", "Llama-3.1-8B",
                                  "Mistral-7B"} <= set(labels)
    c = plan.contract
    assert (c.pairs, c.prompts, c.tokens, c.positions, c.dtype, plan.budget) == ("adjacent", 100, 128, "all",
                                                                                "bfloat16", 5)
    assert build_plan(build_parser().parse_args(["study", "--preset", "paper", "--prompts", "8"])).contract.prompts == 8
    row = {"model": {"spec": "Qwen/Qwen3-8B", "label": "Qwen3-8B", "revision": None}, "status": "done",
           "verdict": {"regime": "divergent"}, "gap": {"median": 0.4, "ci": [0.3, 0.5]},
           "removal": {"rows": [{"n": n, "replacement": {"delta_pct": 10.0, "delta_pct_ci": [8, 12]},
                                 "interchange": {"delta_pct": 3.0, "delta_pct_ci": [2, 4]}, "ratio": 0.3,
                                 "ratio_ci": [0.2, 0.4]} for n in (1, 3, 5)]},
           "evidence": {"raw": {"replacement": {"rho": 0.7, "ci": [0.5, 0.9]},
                                "interchange": {"rho": 0.5, "ci": [0.2, 0.8]}}}}
    side = against_paper(StudyResult(contract={}, rows=[row]))
    ratio = [x for x in side if x["measure"] == "I/R"]
    assert [(x["n"], x["paper"], x["here"]) for x in ratio] == [(n, PAPER_FIGURES["Qwen3-8B"]["ratio"][n], 0.3)
                                                               for n in (1, 3, 5)]
    assert {"regime", "ρ replacement", "ρ interchange"} <= {x["measure"] for x in side}
