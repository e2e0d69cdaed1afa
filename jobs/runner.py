"""`fleetscope run`: the planner the sensors use (fleetscope.jobs.planner), executed wave by wave
until nothing is due, each run recorded in the same Dagster instance the UI shows and tagged with
its warehouse. Runs execute in this process (the default) or their steps on a Dask cluster
(`executor="dask"`: a LocalCluster of `workers` processes started here, or the scheduler at
FLEETSCOPE_DASK_ADDRESS), several runs at once so every worker has a partition to work on."""
from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from fleetscope.project import INSTANCE_YAML
from fleetscope.ingest.registry import Registration


def prepare_environment(landing: str | Path, warehouse: str | Path) -> Path:
    """Point resources, the code location and the Dagster instance at these paths (before any
    Dagster definitions are imported)."""
    landing, warehouse = Path(landing).resolve(), Path(warehouse).resolve()
    os.environ["FLEETSCOPE_LANDING"] = str(landing)
    os.environ["FLEETSCOPE_WAREHOUSE"] = str(warehouse)
    home = Path(os.environ.get("DAGSTER_HOME") or (warehouse.parent / ".dagster")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["DAGSTER_HOME"] = str(home)
    if not (home / "dagster.yaml").exists():
        shutil.copy(INSTANCE_YAML, home / "dagster.yaml")
    return home


@dataclass
class RunReport:
    runs: list[tuple[str, str, bool, float]] = field(default_factory=list)  # job, partition, ok, seconds
    registration: Registration | None = None
    notes: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (partition, warning) -> assets that said it
    filed: list[str] = field(default_factory=list)                        # incident requests the planner wrote
    waves: int = 0

    @property
    def failed(self) -> list[tuple[str, str]]:
        return [(j, k) for j, k, ok, _ in self.runs if not ok]


# Dagster's console logger at WARNING: the CLI prints one line per run; full logs are in the UI.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
MAX_SETTLE_WAITS = 5  # files written while we run (our own incident requests) are waited for this many times


def _merge(into: Registration | None, reg: Registration | None) -> Registration | None:
    """What this invocation registered, over every wave: new partitions and duplicates add up; what is
    still being written or ignored is the last wave's word."""
    if reg is None or into is None:
        return into or reg
    for pset, keys in reg.to_run.items():
        into.to_run.setdefault(pset, []).extend(k for k in keys if k not in into.to_run[pset])
    into.duplicates += [d for d in reg.duplicates if d not in into.duplicates]
    into.deferred, into.ignored = reg.deferred, reg.ignored
    into.signatures.update(reg.signatures)
    return into


def run_all(landing: str | Path, warehouse: str | Path, settle_s: float = 2.0, log=print, executor: str | None = None,
            workers: int = 2, full: bool = False, only_new: bool | None = None) -> RunReport:
    """Execute what the planner says is due until nothing is. `full`: every partition this warehouse
    registered and every window once more (the nightly rebuild's scope). `only_new` is the old name of
    the default (only what is due) and is ignored."""
    prepare_environment(landing, warehouse)
    executor = (executor or "in_process").lower()
    if executor not in ("in_process", "dask"):
        raise ValueError(f"executor {executor!r} is not one of in_process, dask")
    from dagster import DagsterInstance

    from fleetscope.jobs.planner import plan, run_history, run_tags
    from fleetscope.resources import warehouse_id
    from fleetscope.warehouse import Warehouse

    instance = DagsterInstance.get()
    wh = Warehouse(warehouse)
    wh.init()
    tag = warehouse_id(warehouse)
    started_ns = time.time_ns()
    report = RunReport()
    attempted: set[str] = set()
    settle_waits = 0
    with ExitStack() as stack:
        execute = _in_process(instance, report, log) if executor == "in_process" else \
            _on_dask(instance, report, log, workers, stack)
        while True:
            p = plan(wh, landing, run_history(instance, tag, since_ns=started_ns if full else 0), settle_s=settle_s)
            report.registration = _merge(report.registration, p.registration)
            if report.waves == 0 and p.registration is not None:
                reg = p.registration
                log(f"landing {landing}: {reg.n_to_run} partition(s) newly registered, {len(reg.duplicates)} duplicate file(s), "
                    f"{len(reg.deferred)} still being written, {len(reg.ignored)} ignored")
            for name in p.filed:
                log(f"  incident request filed for a critical problem: incidents/{name}")
            report.filed += p.filed
            todo = [r for r in p.runs if r.run_key not in attempted]
            if not todo:
                # our own incident requests (and files landing meanwhile) settle before they register
                recent = [rel for rel, why in (p.registration.deferred if p.registration else [])
                          if "settles" in why and _mtime_ns(Path(landing) / rel) >= started_ns]
                if (p.filed or recent) and settle_waits < MAX_SETTLE_WAITS:
                    settle_waits += 1
                    time.sleep(max(settle_s, 0.2))
                    continue
                for r, why in p.waiting:
                    log(f"  still due, not run: {r.job} [{r.key or '-'}] {why}")
                break
            report.waves += 1
            for r in todo:
                attempted.add(r.run_key)
                if r.partition_set and not instance.has_dynamic_partition(r.partition_set, r.key):
                    instance.add_dynamic_partitions(r.partition_set, [r.key])
            execute([(r, run_tags(r, tag, "cli")) for r in todo])
    wh.publish_views()
    return report


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _record(report: RunReport, log, job_name: str, key: str | None, ok: bool, dt: float, notes: list[tuple[str, str]],
            errors: list[str]) -> None:
    report.runs.append((job_name, key or "-", ok, dt))
    for note, asset in notes:
        report.notes.setdefault((key or "-", note), []).append(asset)
    status = "ok" if ok else "FAILED"
    log(f"  [{len(report.runs):3d}] {job_name:<22} {key or '':<44} {status:>6} {dt:6.1f}s")
    for err in errors:
        log("        " + err)


def _summarize(events) -> tuple[list[tuple[str, str]], list[str]]:
    """(warning, asset) of each materialization that said one, and the last line of each error."""
    notes, errors = [], []
    for ev in events:
        if ev.is_step_materialization:
            m = ev.event_specific_data.materialization
            if "warnings" in m.metadata:
                notes.append((m.metadata["warnings"].value, m.asset_key.to_user_string()))
        elif ev.is_failure and ev.event_specific_data is not None:
            err = getattr(ev.event_specific_data, "error", None)
            if err is not None:
                errors.append(err.message.strip().splitlines()[-1][:300])
    return notes, errors


def _in_process(instance, report: RunReport, log):
    from fleetscope.definitions import defs

    def execute(batch):
        for r, tags in batch:
            t0 = time.perf_counter()
            res = defs.resolve_job_def(r.job).execute_in_process(instance=instance, partition_key=r.key, raise_on_error=False,
                                                                tags=tags, run_config=QUIET)
            _record(report, log, r.job, r.key, res.success, time.perf_counter() - t0, *_summarize(res.all_events))
    return execute


def _execute_on_dask(job: str, key: str | None, tags: dict) -> tuple[bool, float, list, list]:
    """One run through the Dask executor, in a process of the runner's pool (Dagster's logging setup
    is not thread-safe: runs started from threads of one process deadlock)."""
    from dagster import DagsterInstance, execute_job
    from dagster._core.definitions.reconstruct import ReconstructableRepository

    t0 = time.perf_counter()
    recon = ReconstructableRepository.for_module("fleetscope.definitions", "defs", working_directory=os.getcwd())
    tags = {**tags, **({"dagster/partition": key} if key else {})}
    with DagsterInstance.get() as instance, \
            execute_job(recon.get_reconstructable_job(job), instance=instance, tags=tags, run_config=QUIET,
                        raise_on_error=False) as res:
        return res.success, time.perf_counter() - t0, *_summarize(res.all_events)


def _on_dask(instance, report: RunReport, log, workers: int, stack: ExitStack):
    """Each run through the Dask executor (fleetscope.resources.dask_executor) against one cluster
    for the whole invocation; `workers` runs at a time (each driven from a process of a pool, its
    steps on the cluster), so independent partitions (windows, captures) run side by side."""
    address = os.environ.get("FLEETSCOPE_DASK_ADDRESS")
    if not address:
        from dask.distributed import LocalCluster
        # workers are processes started from here: they read the same FLEETSCOPE_* environment
        cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                   dashboard_address=None))
        address = cluster.scheduler_address
        log(f"dask: LocalCluster of {workers} worker processes at {address}")
    os.environ["FLEETSCOPE_EXECUTOR"] = "dask"
    os.environ["FLEETSCOPE_DASK_ADDRESS"] = address
    pool = stack.enter_context(ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn")))

    def execute(batch):
        futures = [(r, pool.submit(_execute_on_dask, r.job, r.key, tags)) for r, tags in batch]
        for r, f in futures:
            _record(report, log, r.job, r.key, *f.result())
    return execute
