"""The progress file a page polls from the browser: every version a job writes has the same length, so the static
file server (which takes the length from one ``stat`` and streams the file it opens next) never meets a replaced
version of another length; the text is the job's progress as JSON."""
from __future__ import annotations

import json

from swapkl.jobs.job import PROGRESS_FILE_BYTES, Job, progress_json
from swapkl.jobs.requests import AnalysisRequest


def test_every_version_of_a_jobs_progress_file_has_one_length(tmp_path):
    job = Job("k1", AnalysisRequest("default"))
    job.progress_path = tmp_path / "k1.json"
    seen = []

    def snap():
        job.publish(force=True)
        raw = job.progress_path.read_bytes()
        seen.append(len(raw))
        assert json.loads(raw) == job.progress_dict() and raw.rstrip(b" ") == json.dumps(job.progress_dict()).encode()

    snap()                                     # queued
    job.queue_place = 3
    snap()                                     # queued behind three: a longer line
    job.start()
    job.phase(1, 3, "loading a model with a long name " + "x" * 200)
    job.tick(7, 29, "pair (3, 4)")
    snap()
    job.finish("done")
    snap()
    assert set(seen) == {PROGRESS_FILE_BYTES}


def test_a_longer_text_pads_to_the_next_multiple():
    short, long_ = progress_json({"text": "a"}), progress_json({"text": "é" * 1500})  # "\\u00e9": 6 bytes each
    assert len(short) == PROGRESS_FILE_BYTES and len(long_) == 3 * PROGRESS_FILE_BYTES
    assert long_.isascii() and json.loads(long_) == {"text": "é" * 1500}
