"""Hostile input at the command line and in the library: every user error is one ``error: ...`` line on stderr
with exit code 2 (never a traceback), checked before any computation where it can be, and nothing already
computed is lost or silently overwritten.

The commands run in process (``support.cli_run``: ``swapkl.commands.cli.main`` with stdout and stderr captured; an
exception escaping it fails the test, where a real process would print a traceback).
``test_malicious_pickle_is_refused_and_never_run`` runs ``python -m swapkl`` as a real subprocess: the entry point and
a fresh interpreter's stderr stay covered, and a pickle that did run would run outside the test process.  The tests
run as root, so "a folder nobody may write" cannot be made with chmod: an unwritable cache is a cache root whose
parent is a regular file (NotADirectoryError).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from support.cli_run import run_swapkl


def run_cli(*args, cache: Path, process: bool = False, timeout: int = 300):
    """``python -m swapkl *args`` with its cache at ``cache``: in process, or a real subprocess if ``process``."""
    return run_swapkl(*args, env={"SWAPKL_CACHE": str(cache)}, process=process, timeout=timeout)


def one_error_line(stderr: str, pattern: str) -> str:
    """stderr is exactly one line, ``error: ...`` matching ``pattern`` (a regex searched in the line)."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


def assert_user_error(r, pattern: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    return one_error_line(r.stderr, pattern)


def tree_digest(folder: Path) -> dict:
    """``{relative path: sha256}`` of every file under ``folder`` (to show that nothing changed)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def model_copy(stories_path: Path, dest: Path) -> Path:
    shutil.copytree(stories_path, dest)
    for p in [dest, *dest.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # the shared fixture is read-only
    return dest


# ============================================================================== 1. damaged or hostile model files
def test_config_not_json(stories_path, tmp_path):
    m = model_copy(stories_path, tmp_path / "m")
    (m / "config.json").write_text('{"model_type": "llama", ')
    before = tree_digest(m)
    r = run_cli("score", m, "--prompts", "2", "--tokens", "8", cache=tmp_path / "c")
    assert_user_error(r, rf"^error: {re.escape(str(m / 'config.json'))} is not valid JSON \(.* at line 1 column \d+\)$")
    assert tree_digest(m) == before and not (tmp_path / "c" / "scores").exists()


def test_truncated_safetensors(stories_path, tmp_path):
    m = model_copy(stories_path, tmp_path / "m")
    data = (m / "model.safetensors").read_bytes()
    (m / "model.safetensors").write_bytes(data[: len(data) // 2])
    before = tree_digest(m)
    r = run_cli("score", m, "--prompts", "2", "--tokens", "8", cache=tmp_path / "c")
    assert_user_error(r, rf"^error: model\.safetensors in {re.escape(str(m))} is truncated or corrupt: its header "
                         r"describes [\d,]+ bytes of tensor data, the file holds [\d,]+ after the header")
    assert tree_digest(m) == before and not (tmp_path / "c" / "scores").exists()


def test_malicious_pickle_is_refused_and_never_run(stories_path, tmp_path):
    """A folder with only ``pytorch_model.bin``: loaded with ``torch.load(weights_only=True)`` or refused; a pickle
    that would run code is refused in one line and the code never runs."""
    m = model_copy(stories_path, tmp_path / "m")
    (m / "model.safetensors").unlink()
    marker = tmp_path / "PWNED"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import pickle

    (m / "pytorch_model.bin").write_bytes(pickle.dumps(Evil(), protocol=2))
    before = tree_digest(m)
    r = run_cli("score", m, "--prompts", "2", "--tokens", "8", cache=tmp_path / "c", process=True)
    assert_user_error(r, rf"^error: cannot load the model in {re.escape(str(m))}: pytorch_model\.bin holds pickled "
                         r"objects other than tensors, refused by torch\.load\(weights_only=True\); swapkl never runs")
    assert not marker.exists() and tree_digest(m) == before


def test_plain_tensor_pickle_loads(stories_path, tmp_path):
    """The other side of the decision: an honest ``.bin`` of plain tensors (older hub checkpoints) still loads."""
    import torch
    from safetensors.torch import load_file

    from swapkl.model.checkpoints import load_checkpoint

    m = model_copy(stories_path, tmp_path / "m")
    torch.save(load_file(m / "model.safetensors"), m / "pytorch_model.bin")
    (m / "model.safetensors").unlink()
    assert load_checkpoint(str(m), device="cpu").num_layers == 5


# ============================================================================== 2. output paths, checked up front
def test_prune_out_is_a_file(stories_path, tmp_path):
    out = tmp_path / "taken"
    out.write_text("keep me")
    r = run_cli("prune", stories_path, "--remove", "1", "--out", out, cache=tmp_path / "c")
    assert_user_error(r, rf"^error: --out {re.escape(str(out))} exists and is not a folder$")
    assert out.read_text() == "keep me"


def test_score_json_is_a_folder_fails_before_computing(stories_path, tmp_path):
    out = tmp_path / "a-folder"
    out.mkdir()
    r = run_cli("score", stories_path, "--prompts", "2", "--tokens", "8", "--json", out, cache=tmp_path / "c")
    assert_user_error(r, rf"^error: --json {re.escape(str(out))} is a folder; give a file name$")
    assert not (tmp_path / "c" / "scores").exists()  # nothing was computed (no cache entry was started)
    assert list(out.iterdir()) == []


def test_report_out_is_a_folder(tmp_path):
    out = tmp_path / "a-folder"
    out.mkdir()
    r = run_cli("report", "--scores", tmp_path / "missing.json", "--out", out, cache=tmp_path / "c")
    assert_user_error(r, rf"^error: --out {re.escape(str(out))} is a folder; give a file name$")


@pytest.mark.parametrize("case", ["under-a-file", "input-file", "model-file", "device"])
def test_output_file_paths_in_process(stories_path, tmp_path, capsys, monkeypatch, case):
    """The other file-output refusals, through ``main`` (each fails before the model is loaded)."""
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    blocker = tmp_path / "plain-file"
    blocker.write_text("x")
    m = model_copy(stories_path, tmp_path / "m")
    before = tree_digest(m)
    scores = tmp_path / "scores.json"
    scores.write_text("{}")
    argv, pattern = {
        "under-a-file": (["score", m, "--json", blocker / "s.json"],
                         rf"cannot write --json {re.escape(str(blocker / 's.json'))}: {re.escape(str(blocker))} is a "
                         "file, not a folder$"),
        "input-file": (["curves", m, "--budget", "1", "--scores", scores, "--json", scores],
                       rf"--json {re.escape(str(scores))} would overwrite the input {re.escape(str(scores))}"),
        "model-file": (["score", m, "--json", m / "config.json"],
                       rf"--json {re.escape(str(m / 'config.json'))} would overwrite config\.json of the input "
                       rf"folder {re.escape(str(m))}"),
        "device": (["score", m, "--json", "/dev/null"], r"--json /dev/null exists and is not a regular file$"),
    }[case]
    assert main([str(x) for x in argv]) == 2
    one_error_line(capsys.readouterr().err, pattern)
    assert tree_digest(m) == before and scores.read_text() == "{}" and blocker.read_text() == "x"
    assert not (tmp_path / "c" / "scores").exists()


# ============================================================================== 4. no silent overwrite of a model
def test_prune_into_the_source_folder_is_refused(stories_path, tmp_path):
    m = model_copy(stories_path, tmp_path / "m")
    (tmp_path / "link").symlink_to(m)
    before = tree_digest(m)
    for out, where in ((m, "is the source model folder"), (tmp_path / "link", f"is the source model folder {m}"),
                       (m / "sub", f"is inside the source model folder {m}")):
        r = run_cli("prune", m, "--remove", "1", "--out", out, cache=tmp_path / "c")
        assert_user_error(r, rf"^error: --out {re.escape(str(out))} {re.escape(where)}; writing there would "
                             "overwrite the model: choose another folder$")
    assert tree_digest(m) == before and not (m / "sub").exists()


def test_prune_source_folder_library(stories_path, tmp_path):
    """The library entry point (the dashboard's export) refuses the same, through the model's own path."""
    from swapkl.model.checkpoints import load_checkpoint
    from swapkl.errors import OutputPathError
    from swapkl.surgery.prune import save_pruned

    m = model_copy(stories_path, tmp_path / "m")  # a copy: a regression must not damage the shared fixture
    ck = load_checkpoint(str(m), device="cpu")
    before = tree_digest(m)
    with pytest.raises(OutputPathError, match="is the source model folder"):
        save_pruned(ck.model, [1], m, tokenizer=ck.tokenizer)
    with pytest.raises(OutputPathError, match="is inside the source model folder"):
        save_pruned(ck.model, [1], m / "pruned", tokenizer=ck.tokenizer, force=True)
    assert tree_digest(m) == before


def test_prune_non_empty_out_needs_force_and_leaves_no_stale_weights(stories_path, tmp_path):
    out = tmp_path / "old-model"
    out.mkdir()
    stale = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
             "pytorch_model.bin", "pytorch_model.bin.index.json"]
    for name in stale:
        (out / name).write_bytes(b"old weights")
    (out / "notes.txt").write_text("mine")
    before = tree_digest(out)
    r = run_cli("prune", stories_path, "--remove", "1", "--out", out, cache=tmp_path / "c")
    assert_user_error(r, rf"^error: --out {re.escape(str(out))} is not empty \(6 entries\); choose a new or empty "
                         r"folder, or --force to replace the model files in it$")
    assert tree_digest(out) == before  # refused: untouched

    r = run_cli("prune", stories_path, "--remove", "1", "--out", out, "--force", "--verify", cache=tmp_path / "c")
    assert r.returncode == 0, r.stderr
    names = {p.name for p in out.iterdir()}
    assert not names & set(stale) and "model.safetensors" in names and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left


# ============================================================================== 3. a cache that cannot be written
@pytest.fixture
def blocked_cache(tmp_path) -> Path:
    """A cache root that cannot be created: its parent is a regular file (NotADirectoryError).  chmod would not
    do, the tests run as root."""
    (tmp_path / "not-a-folder").write_text("x")
    return tmp_path / "not-a-folder" / "cache"


WARN_UNWRITABLE = r"^warning: cannot write the cache under .*not-a-folder/cache \(NotADirectoryError: .*\); " \
                  r"computing without caching \(set SWAPKL_CACHE to a writable folder\)$"


def test_unwritable_cache_computes_and_warns_once(stories_path, tmp_path, blocked_cache):
    """Score cache and perplexity memo both fail to write: the run completes, says so in one line, and writes its
    result."""
    out = tmp_path / "curves.json"
    r = run_cli("curves", stories_path, "--budget", "1", "--methods", "replacement,interchange", "--prompts", "2",
                "--tokens", "8", "--max-words", "300", "--quiet", "--json", out, cache=blocked_cache)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and re.search(WARN_UNWRITABLE, lines[0]), r.stderr
    assert json.loads(out.read_text())["methods"]["replacement"][0]["ppl"] > 1


def test_unwritable_cache_library(stories, blocked_cache, monkeypatch):
    """In the library: the warning is a CacheWarning, issued once, and recorded in the result's cache_problems
    (what the dashboard can show)."""
    import swapkl.store as cache_mod
    from swapkl.scoring.score import score
    from swapkl.store import CacheWarning
    from swapkl.contract import Contract

    monkeypatch.setenv("SWAPKL_CACHE", str(blocked_cache))
    monkeypatch.setattr(cache_mod, "_WARNED_UNWRITABLE", set())
    with pytest.warns(CacheWarning, match="computing without caching") as rec:
        res = score(stories, Contract(prompts=2, tokens=8, device="cpu"))
        again = score(stories, Contract(prompts=2, tokens=8, device="cpu", seed=1))
    assert len([w for w in rec if issubclass(w.category, CacheWarning)]) == 1
    assert len(res.pairs) == 4 and len(again.pairs) == 4 and again.meta["cached_pairs"] == 0
    assert any("cannot write the cache" in p for p in res.meta["cache_problems"])


def test_unwritable_cache_gguf_conversion(tmp_path, blocked_cache, monkeypatch, stories_path):
    """The GGUF conversion goes to a temporary folder for this process (once), not a traceback."""
    import transformers as tf

    import swapkl.store as cache_mod
    from swapkl.model import gguf
    from swapkl.store import CacheWarning

    from conftest import tiny_model

    fake = tmp_path / "tiny.gguf"
    fake.write_bytes(gguf.GGUF_MAGIC + b"\0" * 64)
    calls = []

    def fake_load(path, with_tokenizer=True):  # the real dequantiser needs a real GGUF (tested elsewhere)
        calls.append(path)
        return tiny_model("llama", vocab=512), tf.AutoTokenizer.from_pretrained(stories_path)

    monkeypatch.setattr(gguf, "load_gguf", fake_load)
    monkeypatch.setattr(cache_mod, "_WARNED_UNWRITABLE", set())
    with pytest.warns(CacheWarning, match="cannot write the cache under .*not-a-folder"):
        folder = gguf.gguf_to_hf_folder(fake, cache_root=blocked_cache)
    try:
        assert gguf.is_complete(folder) and not str(folder).startswith(str(blocked_cache))
        assert gguf.gguf_to_hf_folder(fake, cache_root=blocked_cache) == folder and len(calls) == 1
        assert tf.AutoModelForCausalLM.from_pretrained(folder).config.num_hidden_layers == 4
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ============================================================================== 5. one report from two models
def test_report_refuses_scores_and_curves_of_two_models(stories_path, tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file, save_file

    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    other = model_copy(stories_path, tmp_path / "other")  # same architecture, different weights
    sd = load_file(other / "model.safetensors")
    sd = {k: (v * 1.01 if v.dim() == 2 else v).contiguous() for k, v in sd.items()}
    save_file(sd, other / "model.safetensors", metadata={"format": "pt"})
    scores, curves = tmp_path / "a-scores.json", tmp_path / "b-curves.json"
    small = ["--prompts", "2", "--tokens", "8", "--device", "cpu", "--quiet"]
    assert main(["score", str(stories_path), *small, "--json", str(scores)]) == 0
    assert main(["curves", str(other), "--budget", "1", "--methods", "replacement", "--max-words", "300", "--no-kl",
                 *small, "--json", str(curves)]) == 0
    capsys.readouterr()
    out = tmp_path / "report.html"
    r = run_cli("report", "--scores", scores, "--curves", curves, "--out", out, cache=tmp_path / "c")
    assert_user_error(r, rf"^error: --scores {re.escape(str(scores))} and --curves {re.escape(str(curves))} are for "
                         r"different models \(stories260K; fingerprint [0-9a-f]+ != [0-9a-f]+\)$")
    assert not out.exists()
    # the dashboard's upload refuses the same pair through the same check
    from swapkl.errors import SwapklError
    from swapkl.jobs import JobManager

    with pytest.raises(SwapklError, match="are for different models"):
        JobManager(root=tmp_path / "dash").open_files(scores.read_text(), curves.read_text())
    # and one model's files still make one report
    r = run_cli("report", "--scores", scores, "--out", out, "--quiet", cache=tmp_path / "c")
    assert r.returncode == 0 and out.is_file(), r.stderr


# ============================================================================== 6. a corrupt meta.json is rewritten
def test_corrupt_meta_is_rewritten(stories_path, tmp_path, monkeypatch, capsys):
    from swapkl.commands.cli import main

    cache = tmp_path / "c"
    monkeypatch.setenv("SWAPKL_CACHE", str(cache))
    args = ["score", str(stories_path), "--prompts", "2", "--tokens", "8", "--device", "cpu"]
    assert main([*args, "--quiet"]) == 0
    (meta,) = (cache / "scores").glob("*/meta.json")
    pairs_before = tree_digest(meta.parent / "pairs")
    good = json.loads(meta.read_text())["data"]
    meta.write_text('{"noise_floor": 0.0, "prompt_tok')  # a torn write from some other tool

    r = run_cli(*args, "--json", tmp_path / "1.json", cache=cache)
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and re.search(rf"^warning: corrupt cache entry {re.escape(str(meta))}: unreadable .*; "
                                        "it will be recomputed$", warn[0]), r.stderr
    assert "from cache: 4" in r.stdout and "noise floor nan" not in r.stdout
    assert json.loads((tmp_path / "1.json").read_text())["noise_floor"] is not None
    fixed = json.loads(meta.read_text())["data"]  # rewritten, whole
    assert fixed["noise_floor"] == good["noise_floor"] and fixed["prompt_token_ids"] == good["prompt_token_ids"]
    assert tree_digest(meta.parent / "pairs") == pairs_before  # the cached pairs were kept, not recomputed

    capsys.readouterr()
    assert main([*args, "--json", str(tmp_path / "2.json")]) == 0  # the second run reads a valid meta
    assert "warning" not in capsys.readouterr().err
    assert json.loads((tmp_path / "2.json").read_text())["noise_floor"] == good["noise_floor"]
    assert json.loads((tmp_path / "2.json").read_text())["meta"]["cache_problems"] == []


# ============================================================================== 7. longer than the model's context
def short_context_copy(stories_path: Path, dest: Path, positions: int = 256) -> Path:
    """stories260K with a smaller ``max_position_embeddings`` (rotary: the weights do not depend on it)."""
    m = model_copy(stories_path, dest)
    cfg = json.loads((m / "config.json").read_text())
    cfg["max_position_embeddings"] = positions
    (m / "config.json").write_text(json.dumps(cfg))
    return m


def test_tokens_beyond_the_context(stories_path, tmp_path):
    """stories260K has 2,048 positions: --tokens 2100 is refused at once (it used to run past the context)."""
    r = run_cli("score", stories_path, "--prompts", "2", "--tokens", "2100", cache=tmp_path / "c")
    assert_user_error(r, r"^error: --tokens 2100 \(tokens per prompt\) is more than the model's context: stories260K "
                         r"has 2048 positions \(max_position_embeddings in its config\); use at most 2048$")
    assert not (tmp_path / "c" / "scores").exists()


def test_tokens_beyond_the_context_library(stories, cache_dir):
    from swapkl.scoring.score import score
    from swapkl.contract import Contract
    from swapkl.errors import ContractError

    with pytest.raises(ContractError, match=r"--tokens 100000 .* has 2048 positions .*use at most 2048$"):
        score(stories, Contract(prompts=16, tokens=100_000, device="cpu"))
    assert not (cache_dir / "scores").exists()  # refused before the corpus was even tokenised


def test_evaluator_window_beyond_the_context(stories_path, tmp_path, monkeypatch, capsys):
    """A 256-position model and the 'matched' evaluator (window 512): refused before the scores are computed."""
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    m = short_context_copy(stories_path, tmp_path / "m256")
    rc = main(["curves", str(m), "--budget", "1", "--methods", "replacement", "--prompts", "2", "--tokens", "8",
               "--device", "cpu", "--json", str(tmp_path / "c.json")])
    assert rc == 2
    one_error_line(capsys.readouterr().err,
                   r"^error: the 'matched' evaluator's window of 512 tokens is more than the model's context: m256 "
                   r"has 256 positions \(max_position_embeddings in its config\); use an evaluator whose window is "
                   r"at most 256 tokens$")
    assert not (tmp_path / "c" / "scores").exists() and not (tmp_path / "c.json").exists()


def test_context_length_per_family():
    from conftest import tiny_config

    from swapkl.model.architectures import context_length, known_family

    assert context_length(tiny_config("gpt2"), known_family("gpt2")) == (256, "n_positions")
    for kind in ("llama", "qwen3", "gpt_neox"):
        assert context_length(tiny_config(kind), known_family(kind)) == (256, "max_position_embeddings")


# ============================================================================== 8. a corpus that is not text
def test_binary_corpus(stories_path, tmp_path):
    r = run_cli("score", stories_path, "--corpus", "/bin/ls", "--prompts", "2", "--tokens", "8", cache=tmp_path / "c")
    assert_user_error(r, r"^error: /bin/ls is not a text file \(it contains NUL bytes\); give a UTF-8 text file$")
    assert not (tmp_path / "c" / "scores").exists()


@pytest.mark.parametrize("content,pattern", [
    (bytes(range(128, 256)) * 20, r"is not a text file \(100 % of it is not valid UTF-8\)"),
    (b"  \n\n \t\n", r"^error: corpus '.*corpus\.txt' is empty \(no words\)$"),
    (b"only a handful of words here", r"^error: corpus .*corpus\.txt is too short: its prompt region has \d+ tokens, "
                                     r"room for [01] windows of 8 tokens; 2 prompts were asked for$"),
])
def test_corpus_not_text_or_too_short(stories_path, tmp_path, monkeypatch, capsys, content, pattern):
    from swapkl.commands.cli import main

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    assert main(["score", str(stories_path), "--corpus", str(corpus), "--prompts", "2", "--tokens", "8",
                 "--device", "cpu"]) == 2
    one_error_line(capsys.readouterr().err, pattern)


def test_latin1_accents_are_still_text(tmp_path):
    from swapkl.scoring.corpora import from_file

    f = tmp_path / "latin1.txt"
    f.write_bytes("Le café était très animé ce jour-là, et personne ne parlait. ".encode("latin-1") * 50)
    assert len(from_file(f).words) == 550


# ============================================================================== the dashboard's job manager
def test_job_manager_turns_hostile_requests_into_user_errors(stories_path, tmp_path, monkeypatch):
    from swapkl.contract import Contract
    from swapkl.jobs import ERROR, AnalysisRequest, JobManager

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))
    manager = JobManager()
    try:
        too_long = manager.submit(AnalysisRequest(model=str(stories_path),
                                                  contract=Contract(prompts=2, tokens=2100, device="cpu")))
        binary = manager.submit(AnalysisRequest(model=str(stories_path),
                                                contract=Contract(prompts=2, tokens=8, corpus="/bin/ls", device="cpu")))
        for job, msg in ((too_long, "--tokens 2100 (tokens per prompt) is more than the model's context: "
                                    "stories260K has 2048 positions"),
                         (binary, "/bin/ls is not a text file (it contains NUL bytes)")):
            assert job.wait(60) and job.status == ERROR
            assert job.error_kind == "user" and job.error.startswith(msg) and "\n" not in job.error
            assert job.result is None  # failed before any pair was computed
    finally:
        manager.shutdown()
    assert not (tmp_path / "c" / "scores").exists()
