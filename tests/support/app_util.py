"""What the AppTest suites (test_app.py, test_security.py) share: the app's path, the model they compute on and the
run timeout (their ``cache`` fixture, a private cache and a fresh job manager, is in conftest.py)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
STORIES_REL = "tests/fixtures/models/stories260K"
TIMEOUT = 60
