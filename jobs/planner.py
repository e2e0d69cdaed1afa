"""The one planner: what to run next for one warehouse. The sensors request its runs and
`fleetscope run` executes them wave by wave until nothing is left, so the daemon and the command
line cannot disagree about order or scope.

What it reads decides, not what a sensor remembers: the warehouse says what landed (`landed_files`)
and what each stage wrote (its parquet files and their modification times); the Dagster instance
says which runs of *this* warehouse (tag `fleetscope/warehouse`) ran or are running. So warehouses
can share one instance, a restarted daemon picks up where it was, and a run that failed or was
killed is planned again once its inputs change (a worker killed under Dask is re-run by Dask itself).

A run is due when its inputs changed after its last run started. Stages, in order; a stage waits
while an earlier one it reads from has work due or running, so every result is built from
complete inputs (in the daemon a wait ends after its hold time, so a busy fleet never starves):
  0 ingest     ingest_topology, ingest_flows, ingest_hw: registered in landed_files since the last run
  1 analyse    capture_analysis (after topology, hw and the same job's earlier captures);
               flow_window_analysis for each window the ingested flows touch (after topology, flows)
  2 incidents  incident_analysis (after every analysis its report could cite)
  3 answers    fleet_analysis (anomaly_verdicts, problems, problem_members, fleet_health) when any
               verdict changed, and incident_report_job for the incidents whose scope's verdicts
               changed; debounced: after the verdicts were quiet a while, at most max_wait late
  4 loops      a critical problem files an incident request, once (landing/incidents/<job or host>-critical-<problem>.json)
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from fleetscope.collectors.incidents import file_incident, incident_id
from fleetscope.findings.incidents import incident_scope
from fleetscope.ingest.timings import read_capture_layout
from fleetscope.ingest.registry import Registration, register_landing
from fleetscope.warehouse import EMPTY, Warehouse
from fleetscope.ingest.windows import windows_touched
from fleetscope.jobs import settings

INGEST_JOBS = {"topology_files": "ingest_topology", "flow_files": "ingest_flows", "hw_files": "ingest_hw"}
CAPTURE_JOB, WINDOW_JOB, INCIDENT_JOB = "capture_analysis", "flow_window_analysis", "incident_analysis"
FLEET_JOB, REPORT_JOB = "fleet_analysis", "incident_report_job"
PARTITION_SET = {**{j: s for s, j in INGEST_JOBS.items()}, CAPTURE_JOB: "captures", WINDOW_JOB: "flow_windows",
                 INCIDENT_JOB: "incidents", REPORT_JOB: "incidents", FLEET_JOB: None}
STAGE = {**{j: 0 for j in INGEST_JOBS.values()}, CAPTURE_JOB: 1, WINDOW_JOB: 1, INCIDENT_JOB: 2, FLEET_JOB: 3, REPORT_JOB: 3}


@dataclass(frozen=True)
class Planned:
    job: str
    key: str | None          # partition key (None: the fleet-wide job)
    changed_ns: int          # when its inputs last changed
    reason: str

    @property
    def stage(self) -> int:
        return STAGE[self.job]

    @property
    def partition_set(self) -> str | None:
        return PARTITION_SET[self.job]

    @property
    def run_key(self) -> str:  # one run per state of its inputs
        return f"{self.job}:{self.key or 'fleet'}:{self.changed_ns}"


@dataclass(frozen=True)
class LastRun:
    start_ns: int       # when it started (when it was created, while it waits in the queue)
    in_flight: bool
    ok: bool


@dataclass(frozen=True)
class Timing:
    """The daemon's waits; `fleetscope run` (the default) waits for nothing: its waves finish."""
    quiet_s: float = 0.0          # answers: after the verdicts were quiet this long ...
    max_wait_s: float = math.inf  # ... or this long after their first unanswered change
    hold_s: float = math.inf      # a stage waits for earlier stages at most this long after its own input changed
    loops_hold_s: float = math.inf  # incident requests wait for quiet answers at most this long


def daemon_timing() -> Timing:
    """The daemon's waits, from its settings (FLEETSCOPE_* environment variables)."""
    return Timing(quiet_s=settings.ANSWERS_QUIET_S, max_wait_s=settings.ANSWERS_MAX_WAIT_S, hold_s=settings.HOLD_S,
                  loops_hold_s=settings.HOLD_S)


@dataclass
class Plan:
    runs: list[Planned] = field(default_factory=list)                  # due now, in order
    waiting: list[tuple[Planned, str]] = field(default_factory=list)   # due, held back (why)
    running: list[tuple[str, str | None]] = field(default_factory=list)
    registration: Registration | None = None
    filed: list[str] = field(default_factory=list)                     # incident requests written

    def of(self, *jobs: str) -> list[Planned]:
        return [p for p in self.runs if p.job in jobs]


# -- what the warehouse says --------------------------------------------------------------------
def _mtimes(wh: Warehouse, table: str) -> dict[str, int]:
    """partition file stem -> modification time (ns) of a table's partitions (not its placeholder)."""
    return {p.stem: p.stat().st_mtime_ns for p in wh.files(table) if p.stem != EMPTY}


def registered_partitions(wh: Warehouse) -> dict[tuple[str, str], int]:
    """(partition set, key) -> when it was last registered, for every partition registered (not a
    duplicate) in landed_files: the one list of what landed."""
    df = wh.read("landed_files", columns=["partition_set", "partition_key", "status", "registered_ns"])
    if df.height == 0:
        return {}
    df = df.filter(pl.col("status") == "registered").group_by("partition_set", "partition_key").agg(pl.col("registered_ns").max())
    return {(s, k): int(t) for s, k, t in df.iter_rows()}


_WINDOWS_CACHE: dict[tuple[str, int, int], list[str]] = {}


def flow_windows(wh: Warehouse, window_s: int) -> dict[str, int]:
    """window id -> newest modification time of the flows partitions touching it (a flows partition
    is immutable: its windows are read once per process)."""
    out: dict[str, int] = {}
    for p in wh.files("flows"):
        if p.stem == EMPTY:
            continue
        m = p.stat().st_mtime_ns
        ck = (str(p), m, window_s)
        if ck not in _WINDOWS_CACHE:
            t = pq.read_table(p, columns=["start_ns", "end_ns"])
            _WINDOWS_CACHE[ck] = windows_touched(t["start_ns"].to_numpy(), t["end_ns"].to_numpy(), window_s) if t.num_rows else []
        for w in _WINDOWS_CACHE[ck]:
            out[w] = max(out.get(w, 0), m)
    return out


def window_seconds() -> int:
    return int(os.environ.get("FLEETSCOPE_WINDOW_SECONDS", "60"))


def _capture_job(landing: Path, key: str, wh: Warehouse) -> str:
    """A capture's job (capture.json / StragglerAnalysis meta, else its ingested row): captures of
    one job are analysed in key order, since each learns from the job's earlier captures."""
    for kind in ("timings", "traces"):
        folder = landing / kind / key
        if folder.is_dir():
            try:
                job = read_capture_layout(folder).get("job_id")
            except Exception:  # a bad capture.json is the ingestion's to report, with its reason
                job = None
            if job:
                return str(job)
    return key


# -- the plan -----------------------------------------------------------------------------------
def plan(wh: Warehouse, landing: str | Path, history: dict[tuple[str, str | None], LastRun], timing: Timing = Timing(),
         settle_s: float = 2.0, now_ns: int | None = None, register: bool = True, file_requests: bool = True) -> Plan:
    """Register what landed, then everything due for this warehouse given its run history
    ((job, partition key) -> its latest run)."""
    landing = Path(landing)
    out = Plan(registration=register_landing(landing, wh, settle_s=settle_s) if register else None)
    now_ns = now_ns or time.time_ns()
    due: list[Planned] = []

    def consider(job: str, key: str | None, changed_ns: int, reason: str) -> None:
        last = history.get((job, key))
        if last is not None and last.in_flight:
            out.running.append((job, key))
        elif last is None or last.start_ns < changed_ns:
            due.append(Planned(job, key, changed_ns, reason))

    registered = registered_partitions(wh)
    for (pset, key), t in sorted(registered.items()):
        if pset in INGEST_JOBS:
            consider(INGEST_JOBS[pset], key, t, "landed")
        elif pset == "captures":
            consider(CAPTURE_JOB, key, t, "landed")
        elif pset == "incidents":
            consider(INCIDENT_JOB, key, t, "landed")
    windows = flow_windows(wh, window_seconds())
    for w, t in sorted(windows.items()):
        consider(WINDOW_JOB, w, t, "new flows")

    verdicts = _mtimes(wh, "anomaly_verdicts")
    answer_inputs = {**{f"v/{k}": t for k, t in verdicts.items()}, **{f"t/{k}": t for k, t in _mtimes(wh, "topology").items()}}
    placeholder = wh.tables_dir / "anomaly_verdicts" / f"{EMPTY}.parquet"
    if placeholder.exists():  # a warehouse with no verdict yet still gets its (healthy) fleet page once
        answer_inputs["v/"] = placeholder.stat().st_mtime_ns
    fleet_last = history.get((FLEET_JOB, None))
    if answer_inputs:
        consider(FLEET_JOB, None, max(answer_inputs.values()), "verdicts changed")
    _consider_reports(wh, verdicts, windows, history, consider)

    busy = {p.job for p in due} | {j for j, _ in out.running}
    busy_keys = {(p.job, p.key) for p in due} | set(out.running)

    def held(p: Planned, blockers: set[str], hold_s: float) -> str | None:
        pending = sorted(blockers & busy)
        if pending and (now_ns - p.changed_ns) < hold_s * 1e9:
            return "waits for " + ", ".join(pending)
        return None

    job_of = {}
    for p in due:
        why = None
        if p.job == CAPTURE_JOB:
            why = held(p, {"ingest_topology", "ingest_hw"}, timing.hold_s)
            job = job_of.setdefault(p.key, _capture_job(landing, p.key, wh))
            earlier = [k for j, k in busy_keys if j == CAPTURE_JOB and k < p.key and
                       job_of.setdefault(k, _capture_job(landing, k, wh)) == job]
            if why is None and earlier and (now_ns - p.changed_ns) < timing.hold_s * 1e9:
                why = f"waits for the job's earlier capture {min(earlier)}"
        elif p.job == WINDOW_JOB:
            why = held(p, {"ingest_topology", "ingest_flows"}, timing.hold_s)
        elif p.job == INCIDENT_JOB:
            why = held(p, {j for j, s in STAGE.items() if s < 2}, timing.hold_s)
        elif p.stage == 3:
            why = _answers_wait(p, due, fleet_last, answer_inputs, busy, timing, now_ns)
        if why:
            out.waiting.append((p, why))
        else:
            out.runs.append(p)
    out.runs.sort(key=lambda p: (p.stage, p.job, p.key or ""))
    if file_requests and ((not due and not out.running) or _loops_released(due, timing, now_ns)):
        out.filed = file_incident_requests(wh, landing)
    return out


def _answers_wait(p: Planned, due: list[Planned], fleet_last: LastRun | None, inputs: dict[str, int], busy: set[str],
                  timing: Timing, now_ns: int) -> str | None:
    """Debounce: the answers are rebuilt once the verdicts were quiet for quiet_s and nothing they
    are built from is due, or at the latest max_wait_s after the first change they do not show."""
    since = fleet_last.start_ns if fleet_last is not None else 0
    unanswered = [t for t in inputs.values() if t > since] or [p.changed_ns]
    first, last = min(unanswered), max(unanswered)
    overdue = (now_ns - first) >= timing.max_wait_s * 1e9
    pending = sorted(busy & {j for j, s in STAGE.items() if s < 3})
    if pending and not overdue:
        return "waits for " + ", ".join(pending)
    if (now_ns - last) < timing.quiet_s * 1e9 and not overdue:
        return f"debounce: verdicts changed {(now_ns - last) / 1e9:.0f} s ago"
    return None


def _loops_released(due: list[Planned], timing: Timing, now_ns: int) -> bool:
    """Incident requests wait for answers built from complete inputs; on a fleet never quiet, at
    most loops_hold_s after the oldest due work."""
    oldest = min((p.changed_ns for p in due), default=now_ns)
    return (now_ns - oldest) >= timing.loops_hold_s * 1e9


def _consider_reports(wh: Warehouse, verdicts: dict[str, int], windows: dict[str, int],
                      history: dict[tuple[str, str | None], LastRun], consider) -> None:
    """An incident's report is rebuilt when a verdict partition in its scope (its windows and
    captures, or the incident itself) changed after the report was last written."""
    keys = wh.partitions("incidents")
    if not keys or not verdicts:
        return
    requests = wh.read("incidents")
    if requests.height == 0:
        return
    jobs = wh.read("jobs", columns=["window_id", "job_id"])
    caps = wh.read("captures", columns=["capture_id", "job_id"])
    by_key: dict[str, list[tuple[str, int]]] = {}
    for stem, t in verdicts.items():
        _, _, k = stem.partition("__")
        by_key.setdefault(k, []).append((stem, t))
    for req in requests.drop("source_file", strict=False).to_dicts():
        key = req["incident_id"]
        last = [r for r in (history.get((INCIDENT_JOB, key)), history.get((REPORT_JOB, key))) if r is not None]
        if not last or any(r.in_flight for r in last):
            continue  # not analysed yet (its own run writes the report) or being written now
        built = max(r.start_ns for r in last)
        ws, cs = incident_scope(req, sorted(windows), jobs, caps)
        changed = [t for k in (*ws, *cs, key) for _, t in by_key.get(k, []) if t > built]
        if changed:
            consider(REPORT_JOB, key, max(changed), "verdicts in its scope changed")


def file_incident_requests(wh: Warehouse, landing: Path) -> list[str]:
    """A critical problem files an incident request for its job (or its host), once per problem: the
    landing sensor ingests it, its analyses and report follow. The content is what the problem says
    (no filing time), so the same problems give the same requests however they were reached."""
    if "problems" not in wh.table_names():
        return []
    crit = wh.read("problems", where="severity = 'critical'")
    filed = []
    for r in crit.sort("problem_id").iter_rows(named=True):
        jobs = [j for j in (r["job_ids"] or "").split(",") if j]
        inc = incident_id(jobs[0] if len(jobs) == 1 else r["host"] or r["ip"] or "fleet", "critical", r["problem_id"])
        req = {"kind": "slow", "from_ns": r["start_ns"], "to_ns": r["end_ns"],
               "note": f"filed by fleetscope for critical problem {r['problem_id']}: {r['title'][:300]}"}
        if len(jobs) == 1:
            req["job_id"] = jobs[0]
        elif r["host"]:
            req["hosts"] = [r["host"]]
        elif r["ip"]:
            req["ips"] = [r["ip"]]
        if file_incident(landing, inc, req):  # once per problem: an existing request is kept
            filed.append(f"{inc}.json")
    return filed


# -- Dagster: the run history, and the plan as run requests --------------------------------------
def run_history(instance, warehouse_tag: str, since_ns: int = 0) -> dict[tuple[str, str | None], LastRun]:
    """(job, partition key) -> the latest run of this warehouse (created after since_ns)."""
    from dagster import DagsterRunStatus, RunsFilter

    from fleetscope.resources import WAREHOUSE_TAG

    finished = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
    out: dict[tuple[str, str | None], LastRun] = {}
    for rec in instance.get_run_records(filters=RunsFilter(tags={WAREHOUSE_TAG: warehouse_tag}), order_by="create_timestamp",
                                        ascending=True):
        run = rec.dagster_run
        created = int(rec.create_timestamp.timestamp() * 1e9)
        if created < since_ns:
            continue
        start = int(rec.start_time * 1e9) if rec.start_time else created
        out[(run.job_name, run.tags.get("dagster/partition"))] = LastRun(start, run.status not in finished,
                                                                        run.status == DagsterRunStatus.SUCCESS)
    return out


def run_tags(p: Planned, warehouse_tag: str, trigger: str) -> dict[str, str]:
    from fleetscope.resources import WAREHOUSE_TAG
    return {WAREHOUSE_TAG: warehouse_tag, "fleetscope/trigger": trigger, "fleetscope/reason": p.reason}


def sensor_result(context, jobs: set[str], trigger: str, register: bool = False, file_requests: bool = False,
                  timing: Timing | None = None):
    """What a sensor returns: the planner's due runs of its jobs (with the partitions they need
    added to the instance), or why there is nothing to do."""
    from dagster import AddDynamicPartitionsRequest, RunRequest, SensorResult, SkipReason

    from fleetscope.resources import landing_path, warehouse_id, warehouse_path

    wh = Warehouse(warehouse_path())
    wh.init()
    tag = warehouse_id()
    p = plan(wh, landing_path(), run_history(context.instance, tag), timing or daemon_timing(),
             settle_s=settings.SETTLE_S, register=register, file_requests=file_requests)
    mine = [r for r in p.runs if r.job in jobs]
    adds: dict[str, list[str]] = {}
    for r in mine:
        if r.partition_set and not context.instance.has_dynamic_partition(r.partition_set, r.key):
            adds.setdefault(r.partition_set, []).append(r.key)
    requests = [RunRequest(run_key=r.run_key, job_name=r.job, partition_key=r.key, tags=run_tags(r, tag, trigger)) for r in mine]
    for name in p.filed:
        context.log.info(f"incident request filed: incidents/{name}")
    if p.registration is not None and p.registration.duplicates:
        context.log.info(f"{len(p.registration.duplicates)} duplicate file(s) quarantined: {p.registration.duplicates[:5]}")
    if not requests:
        held = [f"{w.job}[{w.key or 'fleet'}] {why}" for w, why in p.waiting if w.job in jobs]
        msg = "; ".join(held[:5]) or ("filed " + ", ".join(p.filed) if p.filed else "nothing to do")
        if p.registration is not None and p.registration.deferred:
            msg += f"; {len(p.registration.deferred)} landed file(s) still being written"
        return SensorResult(skip_reason=SkipReason(msg))
    return SensorResult(run_requests=requests, dynamic_partitions_requests=[
        AddDynamicPartitionsRequest(partitions_def_name=s, partition_keys=sorted(set(k))) for s, k in adds.items()])
