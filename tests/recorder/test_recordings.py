"""The committed real recordings (tests/data/recordings/<scenario>/, made by
`python -m fleetscope.collectors.recorder`, see their README): each is a valid landing folder
whose ground truth is consistent with itself and with the capture. No analysis runs here: the
recordings are data nobody tuned on, for the analyses' own tests."""
from __future__ import annotations

import json

import polars as pl
import pytest

from tests.paths import REPO
from tests.recorder.validate import check_recording

RECORDINGS = REPO / "tests" / "data" / "recordings"
SCENARIOS = ["healthy", "straggler", "slow_link", "congested_uplink"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_recording_is_a_valid_landing_folder_with_consistent_truth(scenario):
    root = RECORDINGS / scenario
    assert (root / "ground_truth" / "recording.json").is_file(), f"{root} is missing: regenerate it (see README)"
    d = check_recording(root)
    assert d["rec"]["scenario"] == scenario
    # both jobs trained inside the capture, and the fast one's steps are about a third of a second
    per_job = d["steps"].group_by("job_id").agg(n=pl.col("step").n_unique(), med=(pl.col("end_ns") - pl.col("start_ns")).median())
    assert per_job.height == 2 and per_job["n"].min() >= 15
    assert 0.25e9 < per_job["med"].min() < 0.45e9


def test_recordings_readme_names_the_command_of_each():
    text = (RECORDINGS / "README.md").read_text()
    for s in SCENARIOS:
        cmd = json.loads((RECORDINGS / s / "ground_truth" / "recording.json").read_text())["command"]
        assert cmd.replace(" --out DIR", "") in text, cmd


@pytest.mark.parametrize("scenario", ["straggler", "slow_link", "congested_uplink"])
def test_the_fault_shows_in_the_jobs_own_step_times(scenario):
    """The truth names a fault only where the affected job's own logged steps slowed down while it
    was on (so a fault that silently failed to apply cannot pass as a recording)."""
    d = check_recording(RECORDINGS / scenario)
    f = d["faults"].row(0, named=True)
    st = d["steps"].with_columns(dur=pl.col("end_ns") - pl.col("start_ns"))
    for job in f["affected_jobs"].split("|"):
        s = st.filter(pl.col("job_id") == job)
        during = s.filter((pl.col("compute_start_ns") >= f["start_ns"]) & (pl.col("end_ns") <= f["end_ns"]))["dur"].median()
        before = s.filter(pl.col("end_ns") < f["start_ns"])["dur"].median()
        assert during > 1.2 * before, (job, during / 1e6, before / 1e6)


def _csv_edit(path, fn):
    fn(pl.read_csv(path, infer_schema_length=None)).write_csv(path)


def _retitle_profiler_step(root):
    import gzip

    p = sorted((root / "landing" / "traces").glob("*/*.json.gz"))[0]
    t = json.loads(gzip.decompress(p.read_bytes()))
    for e in t["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'][13:]) + 1}"   # this rank's steps no longer match its peers'
            break
    p.write_bytes(gzip.compress(json.dumps(t).encode()))


MUTATIONS = {
    "pp_pair_labelled_dp": lambda r: _csv_edit(r / "ground_truth" / "pairs.csv", lambda d: d.with_columns(
        comm_type=pl.when(pl.col("comm_type") == "PP").then(pl.lit("DP")).otherwise("comm_type"))),
    "fault_before_capture": lambda r: _csv_edit(r / "ground_truth" / "faults.csv", lambda d: d.with_columns(
        start_ns=pl.col("start_ns") - 60_000_000_000)),
    "step_missing": lambda r: _csv_edit(r / "ground_truth" / "steps.csv", lambda d: d.filter(
        ~((pl.col("ip") == d["ip"][0]) & (pl.col("step") == d["step"][0] + 3)))),
    "profiler_steps_misaligned": _retitle_profiler_step,
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_checks_catch_a_broken_recording(tmp_path, mutation):
    import shutil

    root = tmp_path / "rec"
    shutil.copytree(RECORDINGS / "straggler", root)
    check_recording(root)
    MUTATIONS[mutation](root)
    with pytest.raises(AssertionError):
        check_recording(root)
