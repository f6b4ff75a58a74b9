"""The dashboard's export button in every format: a mergekit YAML in demo mode (a download below cache/exports,
naming no path of the server) and a pruned GGUF of a GGUF model on a local server (it loads back in
transformers with one block fewer).  AppTest, on stories260K and the tiny Llama GGUF of tests/support/gguf_tiny.py."""
from __future__ import annotations


import yaml
from streamlit.testing.v1 import AppTest

from support.app_util import APP, ROOT, STORIES_REL, TIMEOUT, wait_export
from support.gguf_tiny import write_tiny_llama_gguf

from swapkl.surgery.mergekit import kept_from_config


def _run_job(at, budget: int = 1):
    at.number_input(key="w_prompts").set_value(4)
    at.number_input(key="w_tokens").set_value(16)
    at.number_input(key="w_budget").set_value(budget)
    at.run()
    at.button(key="compute").click().run()
    assert not at.exception, at.exception
    from dashboard import common

    job = common.manager().get(at.session_state["job_analysis"])
    assert job is not None and job.wait(180) and job.status == "done", job.summary()
    at.switch_page("pages/curves.py").run()
    assert not at.exception
    return job


def test_demo_exports_a_mergekit_yaml_as_a_download(cache, monkeypatch, tmp_path):
    import streamlit as st

    monkeypatch.setenv("SWAPKL_DEMO", "1")
    monkeypatch.setenv("SWAPKL_DEMO_MODELS", f"default,{STORIES_REL}")
    st.cache_resource.clear()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT).run()
    at.selectbox(key="w_demo_model").set_value(STORIES_REL)
    job = _run_job(at)
    fmt = at.radio(key="w_export_fmt")
    assert list(fmt.options) == ["Hugging Face folder (safetensors)", "mergekit passthrough YAML"]  # no GGUF here
    fmt.set_value("mergekit").run()
    assert not [t for t in at.text_input if t.label.startswith("output")]   # no path typed in the browser
    at.button(key="export").click().run()
    wait_export(at)
    assert not at.exception and not at.error, [e.value for e in at.error]
    made = sorted((cache / "exports").iterdir())
    assert len(made) == 1 and made[0].suffix == ".yaml" and made[0].is_file()
    text = made[0].read_text()
    method = at.selectbox(key="w_exp_method").value
    removed = job.curves.methods[method][0]["removed"]
    assert kept_from_config(yaml.safe_load(text)) == [i for i in range(5) if i not in removed]
    assert f"# chosen by: {method}, n=1 (removal curves)" in text and "# measured on: " in text
    assert "model: ./stories260K" in text
    assert str(ROOT.parent) not in text and str(tmp_path) not in text     # no server path in a download
    assert any(b.label == f"⬇ {made[0].name}" for b in at.get("download_button"))


def test_local_exports_a_pruned_gguf_of_a_gguf_model(cache, tmp_path):
    src = write_tiny_llama_gguf(tmp_path / "tiny-llama.gguf", n_layers=5)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["model"] = str(src)
    at.run()
    assert not at.exception
    job = _run_job(at)
    at.radio(key="w_export_fmt").set_value("gguf").run()
    out = tmp_path / "cut.gguf"
    [t for t in at.text_input if t.label == "output file"][0].set_value(str(out)).run()
    at.button(key="export").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=out.name)  # load time: benchmarks/timings.py
    assert m.config.num_hidden_layers == 4
    # pressing it again is refused (the file exists) until "replace" is ticked; the file is unchanged
    before = out.read_bytes()
    at.button(key="export").click().run()
    assert any("exists" in e.value for e in at.error) and out.read_bytes() == before
    assert job.curves is not None
