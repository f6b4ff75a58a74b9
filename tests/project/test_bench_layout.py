"""benchmarks/ and experiments/ (issue 52): modules run from the root with no import-path patch, every experiment
has its CONFIG, the runner stamps provenance on what it writes, and the docs cite only paths that exist (no
``bench/`` left).  Nothing here runs a benchmark: the one run is ``recommend --table`` (renders a committed file)."""
from __future__ import annotations

import json
import py_compile
import re
import subprocess
import sys

from conftest import ROOT

PACKAGES = ("benchmarks", "experiments")


def _modules():
    return [p for pkg in PACKAGES for p in sorted((ROOT / pkg).glob("*.py"))]


def test_no_module_patches_the_import_path_and_every_one_compiles():
    for p in _modules():
        assert "sys.path" not in p.read_text(), p
        py_compile.compile(str(p), doraise=True)
    assert not (ROOT / "bench").exists()


def test_every_experiment_has_its_config():
    out = subprocess.run([sys.executable, "-m", "experiments", "list"], cwd=ROOT, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    names = [p.stem for p in (ROOT / "experiments").iterdir() if p.suffix in (".py", ".sh") and not p.stem.startswith("_")]
    assert sorted(line.split()[0] for line in out.splitlines()) == sorted(names)
    for p in (ROOT / "experiments").glob("[!_]*.py"):
        assert re.search(r"^CONFIG(: dict)? = \{", p.read_text(), re.M), p


def test_config_and_overrides():
    from benchmarks._run import with_config

    eff, argv = with_config({"budget": 4, "tokens": 32, "quick": True}, ["model", "--tokens", "8", "--x=1.5"])
    assert argv == ["--budget", "4", "--quick", "model", "--tokens", "8", "--x=1.5"]
    assert eff == {"budget": 4, "tokens": 8, "quick": True, "x": 1.5, "_positional": ["model"]}


def test_the_experiment_runner_stamps_provenance(tmp_path):
    table = ROOT / "experiments" / "results" / "recommend-smollm2-135m.json"
    record = tmp_path / "run.json"
    p = subprocess.run([sys.executable, "-m", "experiments", "run", "recommend", "--record", str(record),
                        "--table", str(table)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    d = json.loads(record.read_text())
    prov = d["provenance"]
    assert {"commit", "host", "command", "date", "machine"} <= prov.keys() and prov["commit"]
    assert prov["command"].startswith("python -m experiments run recommend")
    assert d["config"]["budget"] == 4 and d["config"]["table"] == str(table) and d["rc"] == 0
    assert "| " in d["stdout"] and d["stdout"] == p.stdout


def test_docs_cite_only_paths_that_exist():
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md",
             ROOT / "benchmarks" / "README.md"]
    missing = []
    for f in texts:
        text = f.read_text()
        if f.parent.name not in PACKAGES:  # the two READMEs say where their old results came from
            assert not re.search(r"(?<![\w-])bench/", text), f"{f.name} names bench/"
        for m in re.finditer(r"(?:benchmarks|experiments|tests/gpu)/[\w./{},-]+\.(?:py|sh|json|txt|md)", text):
            ref = m.group(0)
            if "{" in ref:  # a.{json,txt}
                head, alts = ref.split("{", 1)
                refs = [head + a for a in alts.rstrip("}").split("}")[0].split(",")]
            else:
                refs = [ref]
            missing += [f"{f.name}: {r}" for r in refs
                        if "NAME" not in r and not re.search(r"results/[^/]+/[0-9a-f]{7}", r) and not (ROOT / r).exists()]
        for m in re.finditer(r"-m (benchmarks|experiments) run ([a-z_]+)", text):
            pkg, name = m.groups()
            if not any((ROOT / pkg / f"{name}{ext}").is_file() for ext in (".py", ".sh")):
                missing.append(f"{f.name}: {m.group(0)}")
    assert not missing, missing
