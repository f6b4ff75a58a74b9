"""Shared fixtures: tiny random models of every supported family, and the fixtures the repository ships under
``tests/fixtures/`` (the stories260K model and the WikiText-2 test text; their licences and provenance are in
``tests/fixtures/README.md``).  No test reads the reference folder beside the checkout, which a user's clone does not have."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from support.skip_gate import NO_GPU
from support.skip_gate import pytest_collectreport, pytest_runtest_logreport, pytest_sessionfinish  # noqa: F401  (CI's rule)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# Tiny models run as fast on one intra-op thread as on two, and two spinning OpenMP threads collapse (10-150x
# slower) whenever another process shares the cores: the README's command runs two workers on this machine's two,
# beside the servers, browsers and subprocesses they start.
# One intra-op thread here and in every process a test starts (CLI subprocesses, torchrun ranks, the dashboard
# servers, which inherit the environment).
_THREADS = os.environ.get("SWAPKL_TEST_THREADS", "1")
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, _THREADS)
torch.set_num_threads(int(_THREADS))

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"
# Tests live in one folder per concern (tests/scoring, tests/removal, ...; no __init__.py, basenames unique across
# the tree) and a few import a helper from another folder's test module (``from test_removal import scores5``): every
# test folder is importable by basename, whichever subset pytest collects and in whichever order.
for _folder in sorted(TESTS.iterdir()):
    if _folder.is_dir() and any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.append(str(_folder))
STORIES = FIXTURES / "models" / "stories260K"
WIKITEXT = FIXTURES / "data" / "wikitext-2-raw" / "wiki.test.raw"
# The automatic corpus of every test (and of the CLI subprocesses and servers the tests start, which inherit the
# environment) is the shipped WikiText-2 copy, so that results do not depend on what lies beside the checkout.
os.environ.setdefault("SWAPKL_CORPUS", str(WIKITEXT))
# The dashboard's "Local folder" choices include the shipped models (swapkl.jobs.defaults.local_model_folders).
os.environ.setdefault("SWAPKL_MODEL_DIRS", str(FIXTURES / "models"))

#: the opt-in gate of the tests marked ``slow`` (CI sets it: .ci/run)
SLOW_ENV = "SWAPKL_SLOW_TESTS"


def pytest_configure(config):
    """``SWAPKL_CPU_TIMES=PREFIX`` records CPU seconds per test (support.cpu_times; benchmarks/suite_cpu.py sums them)."""
    from support import cpu_times

    if os.environ.get(cpu_times.ENV):
        config.pluginmanager.register(cpu_times, "swapkl_cpu_times")


def pytest_collection_modifyitems(config, items):
    """Markers by folder, the slow gate and the order of files.  Every test of ``tests/browser/`` drives Chromium
    against a served app: ``browser`` and ``server``.  A test marked ``slow(reason=...)`` is skipped unless
    ``$SWAPKL_SLOW_TESTS`` is 1, with the reason and the variable that runs it (``-m "not slow"`` deselects it).
    A test marked ``gpu`` (tests/gpu/) is skipped without a CUDA device, a skip CI accepts (support.skip_gate)."""
    run_slow = os.environ.get(SLOW_ENV) == "1"
    for item in items:
        if item.path.parent.name == "browser":
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.server)
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason=NO_GPU))
        slow = item.get_closest_marker("slow")
        if slow is not None and not run_slow:
            item.add_marker(pytest.mark.skip(reason=f"{slow.kwargs.get('reason', 'a slow test')}: {SLOW_ENV}=1"))
    # The files that hold the long tests (a server, a browser, a slow test that runs) go first, each file still whole
    # and in its own order: under ``-n N --dist loadfile --no-loadscope-reorder`` (README) the workers start on them
    # and fill the rest of the time with the many short files, instead of ending on a lone browser test.
    first = {item.path for item in items if item.get_closest_marker("server") is not None
             or (run_slow and item.get_closest_marker("slow") is not None)}
    items.sort(key=lambda item: item.path not in first)


FAMILY_NAMES = ("llama", "qwen3", "gpt_neox", "gpt2")


def family_sizes(kind: str, vocab: int = 96, hidden: int = 32) -> dict:
    """The sizes of the suite's family models, as :func:`swapkl.model.tiny.tiny_config` takes them (``"L"``: the
    layer count): width ``hidden``, 4 heads (2 KV heads where the family groups them), MLP width ``2 * hidden``
    (GPT-2's default 4x), ``vocab`` tokens, 256 positions, token ids 0, GPT-NeoX's rotary on a quarter of each head,
    Qwen3's head width ``hidden / 4``."""
    sizes = {"num_hidden_layers": "L", "hidden_size": hidden, "num_attention_heads": 4, "vocab_size": vocab,
             "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0}
    if kind == "gpt_neox":
        sizes.update(intermediate_size=2 * hidden, rotary_pct=0.25)
    elif kind != "gpt2":
        sizes.update(num_key_value_heads=2, intermediate_size=2 * hidden, pad_token_id=0)
        sizes.update({"head_dim": hidden // 4} if kind == "qwen3" else {})
    return sizes


def tiny_config(kind: str, num_layers: int = 4, vocab: int = 96, hidden: int = 32):
    """A small random config of each supported family (float32): :func:`swapkl.model.tiny.tiny_config` with
    :func:`family_sizes`, transformers' default attention."""
    from swapkl.model.tiny import tiny_config as build

    return build(kind, num_layers, sizes=family_sizes(kind, vocab, hidden), attention=None)


def tiny_model(kind: str, num_layers: int = 4, seed: int = 0, vocab: int = 96, hidden: int = 32):
    """A random-initialised causal LM of family ``kind`` in eval mode, float32 (:func:`swapkl.model.tiny.tiny_model`
    with :func:`family_sizes`, transformers' default attention, no dtype in its config): weights scaled up (x3) so that blocks differ enough for swap-KLs to be well above float32
    noise."""
    from swapkl.model.tiny import tiny_model as build

    return build(kind, num_layers, seed=seed, sizes=family_sizes(kind, vocab, hidden), attention=None, dtype=None)


def builtin_float32():
    """The built-in default model (SmolLM2-135M-Instruct Q4_1 GGUF) as transformers dequantises it, float32, eval
    mode, read from its converted folder (``swapkl.model.builtin.default_model_dir``: converted once per cache, the
    weights of ``from_pretrained(..., gguf_file=...)`` saved bit for bit; test_gguf_builtin.py checks the folder
    against the GGUF).  Loading the folder takes ~0.05 s of CPU, dequantising the GGUF again ~10 s."""
    import transformers as tf

    from swapkl.model.builtin import default_model_dir

    return tf.AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()


@pytest.fixture(params=FAMILY_NAMES)
def family_model(request):
    return request.param, tiny_model(request.param)


@pytest.fixture(scope="session")
def stories_path() -> Path:
    assert (STORIES / "model.safetensors").is_file(), f"the shipped fixture {STORIES} is missing"
    return STORIES


@pytest.fixture(scope="session")
def wikitext_path() -> Path:
    assert WIKITEXT.is_file(), f"the shipped fixture {WIKITEXT} is missing"
    return WIKITEXT


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium (browser tests only: their module calls ``browser_util.need_browser()`` first)."""
    from support.browser_util import chrome_session

    with chrome_session(tmp_path) as drv:
        yield drv


@pytest.fixture
def fresh_url(tmp_path):
    """The URL of a fresh dashboard server of this tree (offline, empty cache under ``tmp_path``)."""
    from support.browser_util import fresh_server

    with fresh_server(tmp_path) as url:
        yield url


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """``swapkl`` in process (``support.cli_run.run_swapkl``) with its cache under ``tmp_path``:
    ``cli(*argv) -> (exit code, stdout, stderr)``; an argparse error is its exit code 2, as in a process."""
    from support.cli_run import run_swapkl

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "c"))

    def run(*argv):
        r = run_swapkl(*argv)
        return r.returncode, r.stdout, r.stderr
    return run


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private swapkl cache for one test (``$SWAPKL_CACHE``); the project's cache/ is never touched."""
    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def stories(stories_path):
    """The stories260K checkpoint loaded on the CPU (shared by a module; never mutated by the library)."""
    from swapkl.model.checkpoints import load_checkpoint

    return load_checkpoint(str(stories_path), device="cpu")


@pytest.fixture(scope="module")
def stories_hf(stories_path, wikitext_path):
    """``(model, tokenizer, corpus)``: stories260K as plain transformers objects (no swapkl loader) and the shipped
    WikiText-2 test text (one per module)."""
    import transformers as tf

    from swapkl.scoring.corpora import from_file

    return (tf.AutoModelForCausalLM.from_pretrained(stories_path).eval(),
            tf.AutoTokenizer.from_pretrained(stories_path), from_file(wikitext_path))


@pytest.fixture(scope="module")
def corpus(wikitext_path):
    """The shipped WikiText-2 test text as a swapkl corpus (one per module)."""
    from swapkl.scoring.corpora import from_file

    return from_file(wikitext_path)


@pytest.fixture(scope="module")
def small_corpus(wikitext_path):
    """12,000 words of WikiText: 6,000 evaluation words, then 4,000 calibration words and 2,000 training words (the
    healing tests' corpus, one per module)."""
    from swapkl.scoring.corpora import from_file, from_text

    words = from_file(wikitext_path).words[:12_000]
    return from_text(" ".join(words), name="wiki12k", label="WikiText-2 test, first 12,000 words")


@pytest.fixture(scope="module")
def tasks_env(tmp_path_factory):
    """A module's private swapkl cache for lm-eval task tests, datasets offline, the checkout as working directory
    (the fixture task's data file path is relative to it); returns the cache folder."""
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("tasks-cache")
    mp.setenv("SWAPKL_CACHE", str(cache))
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    mp.chdir(ROOT)
    yield cache
    mp.undo()


@pytest.fixture
def cache(tmp_path, monkeypatch, stories_path):
    """The dashboard tests' cache (test_app.py, test_security.py): a private cache and a fresh job manager
    (st.cache_resource outlives an AppTest).  test_jobs.py has its own."""
    import streamlit as st

    monkeypatch.setenv("SWAPKL_CACHE", str(tmp_path / "cache"))
    st.cache_resource.clear()
    yield tmp_path / "cache"
    from dashboard import common

    common.manager().shutdown()
    st.cache_resource.clear()
