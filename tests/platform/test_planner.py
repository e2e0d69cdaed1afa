"""The planner's answers stage on a real warehouse (parquet partitions and their modification
times), with run histories given directly: the fleet answers wait for the verdicts to be quiet, no
longer than their maximum wait, and for the analyses still due; an incident's report is due only
when a verdict of its scope changed after it was written."""
from __future__ import annotations

import os

import polars as pl

from fleetscope.jobs.planner import FLEET_JOB, INCIDENT_JOB, REPORT_JOB, WINDOW_JOB, LastRun, Timing, plan
from fleetscope.schemas.base import conform
from fleetscope.tables import TABLES
from fleetscope.findings.verdicts import VERDICTS, make_verdicts
from fleetscope.warehouse import Warehouse

S = 1_000_000_000
T0 = 1_795_262_400 * S            # 2026-11-21 12:00:00 UTC: the data's time
W1, W2 = "w60s-20261121T120000Z", "w60s-20261121T120100Z"
DAEMON = Timing(quiet_s=20, max_wait_s=60, hold_s=300, loops_hold_s=300)
BUILT = 1_000 * S                  # when the last answers were built (wall clock of the test's world)


def _touch(path, ns: int) -> None:
    os.utime(path, ns=(ns, ns))


def _warehouse(tmp_path) -> Warehouse:
    wh = Warehouse(tmp_path / "w.duckdb")
    wh.init()
    flows = pl.DataFrame({"start_ns": [T0 + S, T0 + 61 * S], "end_ns": [T0 + 2 * S, T0 + 62 * S]})
    _touch(wh.write_partition("flows", "f1", conform(flows, TABLES["flows"])), BUILT - 100 * S)
    inc = pl.DataFrame([dict(incident_id="inc1", kind="slow", from_ns=T0, to_ns=T0 + 59 * S),
                        dict(incident_id="inc2", kind="slow", from_ns=T0 + 65 * S, to_ns=T0 + 119 * S)])
    for k in ("inc1", "inc2"):
        wh.write_partition("incidents", k, conform(inc.filter(pl.col("incident_id") == k), TABLES["incidents"]))
    for p in (wh.tables_dir / "anomaly_verdicts").glob("*.parquet"):
        _touch(p, BUILT - 100 * S)
    return wh


def _verdicts(wh: Warehouse, window: str, at_ns: int) -> None:
    v = make_verdicts([dict(detector="flows", scope="gpu", subject="10.0.0.1", metric="m", severity="warning", team="operations",
                            explanation="x", start_ns=T0, end_ns=T0 + S, window_id=window)])
    _touch(wh.write_partition("anomaly_verdicts", f"flows__{window}", VERDICTS.validate(conform(v, VERDICTS))), at_ns)


def _history(extra: dict | None = None) -> dict:
    done = LastRun(BUILT, in_flight=False, ok=True)
    h = {(FLEET_JOB, None): done, (INCIDENT_JOB, "inc1"): done, (INCIDENT_JOB, "inc2"): done,
         (WINDOW_JOB, W1): done, (WINDOW_JOB, W2): done}
    h.update(extra or {})
    return h


def _due(p) -> set:
    return {(r.job, r.key) for r in p.runs}


def test_answers_wait_for_quiet_verdicts_and_rebuild_only_the_reports_they_touch(tmp_path):
    wh = _warehouse(tmp_path)
    changed = BUILT + 30 * S
    _verdicts(wh, W1, changed)  # a verdict of window 1 changed after the answers were built
    kw = dict(register=False, file_requests=False)
    p = plan(wh, tmp_path / "landing", _history(), DAEMON, now_ns=changed + 5 * S, **kw)
    assert not p.runs and {(w.job, w.key) for w, _ in p.waiting} == {(FLEET_JOB, None), (REPORT_JOB, "inc1")}
    assert all("debounce" in why for _, why in p.waiting)
    # quiet for 20 s: the fleet answers and inc1's report (its window changed), not inc2's
    p = plan(wh, tmp_path / "landing", _history(), DAEMON, now_ns=changed + 21 * S, **kw)
    assert _due(p) == {(FLEET_JOB, None), (REPORT_JOB, "inc1")}
    # built after the change: nothing due
    after = LastRun(changed + 22 * S, in_flight=False, ok=True)
    assert not plan(wh, tmp_path / "landing", _history({(FLEET_JOB, None): after, (REPORT_JOB, "inc1"): after}), DAEMON,
                    now_ns=changed + 40 * S, **kw).runs
    # the command line waits for nothing once nothing else is due
    assert _due(plan(wh, tmp_path / "landing", _history(), Timing(), now_ns=changed + 1, **kw)) == \
        {(FLEET_JOB, None), (REPORT_JOB, "inc1")}


def test_answers_are_never_later_than_their_maximum_wait(tmp_path):
    wh = _warehouse(tmp_path)
    first = BUILT + 10 * S
    _verdicts(wh, W1, first)
    _verdicts(wh, W2, first + 59 * S)            # verdicts keep changing: never 20 s quiet ...
    # ... and window 2's flows changed again, so its analysis is due: the answers wait for it
    _touch(wh.tables_dir / "flows" / "f1.parquet", first + 50 * S)
    kw = dict(register=False, file_requests=False)
    p = plan(wh, tmp_path / "landing", _history(), DAEMON, now_ns=first + 59 * S + 1, **kw)
    assert (WINDOW_JOB, W2) in _due(p) and (FLEET_JOB, None) not in _due(p)
    assert any(w.job == FLEET_JOB and "waits for" in why for w, why in p.waiting)
    # 60 s after the first change they do not show, the answers are rebuilt all the same
    p = plan(wh, tmp_path / "landing", _history(), DAEMON, now_ns=first + 61 * S, **kw)
    assert {(FLEET_JOB, None), (REPORT_JOB, "inc1"), (REPORT_JOB, "inc2")} <= _due(p)
    # while a fleet analysis runs, none is planned
    running = LastRun(first + 60 * S, in_flight=True, ok=False)
    p = plan(wh, tmp_path / "landing", _history({(FLEET_JOB, None): running}), DAEMON, now_ns=first + 90 * S, **kw)
    assert (FLEET_JOB, None) not in _due(p) and (FLEET_JOB, None) in p.running
