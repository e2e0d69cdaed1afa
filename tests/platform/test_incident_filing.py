"""One way to file an incident request (fleetscope.collectors.incidents), used by the tracer's
watchdog, the platform's blocked check and the planner: one id format, written atomically, an
existing request kept, the job's ranks asked for their stacks under the same id."""
from __future__ import annotations

import json
import re

from fleetscope.collectors.incidents import file_incident, incident_id
from fleetscope.xputimer.degradation import write_hang_incident

NS = 1_795_000_000_123_456_789  # 2026-11-18T11:06:40.123 UTC


def test_the_id_names_subject_kind_and_when():
    assert incident_id("job-7", "hang", NS) == "job-7-hang-20261118T110640-123"
    assert incident_id("job-7", "critical", "p-3f2a") == "job-7-critical-p-3f2a"
    # addresses and odd characters become safe file and partition names
    assert re.fullmatch(r"[A-Za-z0-9._-]+", incident_id("fd00:a3::5", "critical", "p/1"))


def test_filing_is_once_and_asks_the_job_for_stacks(tmp_path):
    inc = incident_id("job-7", "hang", NS)
    assert file_incident(tmp_path, inc, {"kind": "hang", "job_id": "job-7"}, stacks_of="job-7")
    assert not file_incident(tmp_path, inc, {"kind": "hang", "job_id": "job-7", "note": "again"})
    assert json.loads((tmp_path / "incidents" / f"{inc}.json").read_text()) == {"kind": "hang", "job_id": "job-7"}
    assert json.loads((tmp_path / "requests" / "job-7.stacks.json").read_text())["incident"] == inc
    assert not list((tmp_path / "incidents").glob(".*"))  # no temporary file left behind


def test_the_platforms_blocked_check_files_the_same_way(tmp_path):
    inc = write_hang_incident(tmp_path, "job-9", "cap-1", 5, "blocked for 200 s", now_ns=NS)
    assert inc == incident_id("job-9", "hang", NS)
    body = json.loads((tmp_path / "incidents" / f"{inc}.json").read_text())
    assert body == {"kind": "hang", "job_id": "job-9", "capture": "cap-1", "from_ns": 5, "note": "blocked for 200 s"}
    assert json.loads((tmp_path / "requests" / "job-9.stacks.json").read_text())["incident"] == inc
