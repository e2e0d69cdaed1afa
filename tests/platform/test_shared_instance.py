"""Several warehouses, one Dagster instance: the warehouse's landed_files decides what each one
ingests, so runs of one never touch (or fail on) the partitions of another. Both ways users get
there: one DAGSTER_HOME for warehouses over different landing folders, and two warehouses in one
folder (the default instance is <folder>/.dagster). Real recordings (tests/data/recordings), whose
capture folders are renamed to the same key in both landings, and whose windows overlap."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from dagster import DagsterInstance, DagsterRunStatus

from fleetscope.jobs.runner import run_all
from fleetscope.resources import WAREHOUSE_TAG, warehouse_id
from fleetscope.warehouse import Warehouse
from tests.paths import REPO

RECORDINGS = REPO / "tests" / "data" / "recordings"
CAPTURE = "cap-1"  # the same capture key in both landing folders, with different content


def _landing(root: Path, recording: str) -> Path:
    src = RECORDINGS / recording / "landing"
    landing = root / "landing"
    for kind in ("topology", "flows"):
        shutil.copytree(src / kind, landing / kind)
    first = sorted((src / "timings").iterdir())[0]
    shutil.copytree(first, landing / "timings" / CAPTURE)
    old = time.time() - 60
    for p in landing.rglob("*"):
        os.utime(p, (old, old))
    return landing


def _runs(home: Path):
    with DagsterInstance.from_config(str(home)) as instance:
        return instance.get_runs()


def test_warehouses_sharing_an_instance_each_run_clean(tmp_path, monkeypatch):
    for var in ("DAGSTER_HOME", "FLEETSCOPE_LANDING", "FLEETSCOPE_WAREHOUSE"):  # restored after the test
        monkeypatch.setenv(var, "unset")
    a, b = _landing(tmp_path / "a", "healthy"), _landing(tmp_path / "b", "straggler")
    quiet = dict(settle_s=0, log=lambda *_: None)
    # one DAGSTER_HOME, two warehouses over different landing folders
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    wa, wb = tmp_path / "wa" / "a.duckdb", tmp_path / "wb" / "b.duckdb"
    reports = [run_all(a, wa, **quiet), run_all(b, wb, **quiet)]
    again = run_all(a, wa, **quiet)  # after b: nothing of b's is a's to run, nothing of a's is due
    assert again.runs == [], again.runs
    # two warehouses in one folder, no DAGSTER_HOME: both use <folder>/.dagster
    for landing, name in ((b, "w5"), (a, "w7")):
        monkeypatch.delenv("DAGSTER_HOME")
        reports.append(run_all(landing, tmp_path / "w" / f"{name}.duckdb", **quiet))
    for r in reports:
        assert r.runs and not r.failed, r.failed
    for h, whs in ((home, [wa, wb]), (tmp_path / "w" / ".dagster", [tmp_path / "w" / "w5.duckdb", tmp_path / "w" / "w7.duckdb"])):
        runs = _runs(h)
        assert runs and all(r.status == DagsterRunStatus.SUCCESS for r in runs), \
            [(r.job_name, r.tags.get("dagster/partition"), r.status) for r in runs if r.status != DagsterRunStatus.SUCCESS]
        assert {r.tags.get(WAREHOUSE_TAG) for r in runs} == {warehouse_id(w) for w in whs}
    # each warehouse holds its own landing's data, under the shared capture key too
    for wh_path, landing in ((wa, a), (wb, b), (tmp_path / "w" / "w5.duckdb", b), (tmp_path / "w" / "w7.duckdb", a)):
        wh = Warehouse(wh_path)
        flows = wh.read("flows", columns=["source_file"])
        assert set(flows["source_file"]) == {f"flows/{p.name}" for p in (landing / "flows").iterdir()}
        timings = wh.read("timings", where=f"capture_id = '{CAPTURE}'", columns=["source_file"])
        assert set(timings["source_file"]) == {f"timings/{CAPTURE}/{p.name}" for p in (landing / "timings" / CAPTURE).glob("*.parquet")}
