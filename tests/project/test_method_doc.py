"""The method document ships with the project and every citation of it in the code points at a section."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_method_citation_names_a_section_of_docs_method_md():
    doc = (ROOT / "docs" / "method.md").read_text()
    sections = set(re.findall(r"^## §(\d+) ", doc, flags=re.M))
    assert sections == {str(i) for i in range(1, 9)}
    cited = {}
    for f in list((ROOT / "swapkl").rglob("*.py")) + list((ROOT / "tests").rglob("*.py")):
        if f.name == Path(__file__).name:
            continue
        text = f.read_text()
        assert "METHOD §" not in text, f"{f} cites the unshipped METHOD document"
        for n in re.findall(r"docs/method\.md §(\d+)", text):
            cited.setdefault(n, []).append(f.name)
    assert cited, "the code cites docs/method.md"
    missing = {n: fs for n, fs in cited.items() if n not in sections}
    assert not missing, missing
