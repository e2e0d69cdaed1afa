"""`fleetscope run`: register what landed, then materialize every asset through Dagster, one
in-process run per partition, recorded in the same Dagster instance the UI shows."""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleetscope.project import INSTANCE_YAML


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
    registration: object = None
    notes: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (partition, warning) -> assets that said it

    @property
    def failed(self) -> list[tuple[str, str]]:
        return [(j, k) for j, k, ok, _ in self.runs if not ok]


# Dagster's console logger at WARNING: the CLI prints one line per run; full logs are in the UI.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_all(landing: str | Path, warehouse: str | Path, settle_s: float = 2.0, log=print,
            only_new: bool = False) -> RunReport:
    prepare_environment(landing, warehouse)
    from dagster import DagsterInstance

    from fleetscope.assets.partitions import flow_windows
    from fleetscope.definitions import defs
    from fleetscope.jobs.jobs import JOB_FOR_SET, fleet_analysis
    from fleetscope.jobs.windows import touched_windows
    from fleetscope.registry import register_landing
    from fleetscope.warehouse import Warehouse

    instance = DagsterInstance.get()
    wh = Warehouse(warehouse)
    wh.init()
    reg = register_landing(landing, wh, settle_s=settle_s)
    report = RunReport(registration=reg)
    log(f"landing {landing}: {reg.n_to_run} partition(s) to ingest, {len(reg.duplicates)} duplicate file(s), "
        f"{len(reg.deferred)} still being written, {len(reg.ignored)} ignored")
    to_run = {k: list(v) for k, v in reg.to_run.items()}
    if not only_new:  # re-run everything registered before as well: `run` means "materialize everything"
        for pset in JOB_FOR_SET:
            if pset == flow_windows.name:
                continue
            keys = to_run.setdefault(pset, [])
            keys += [k for k in instance.get_dynamic_partitions(pset) if k not in keys]
    for pset, keys in to_run.items():
        new = [k for k in keys if not instance.has_dynamic_partition(pset, k)]
        if new:
            instance.add_dynamic_partitions(pset, new)

    def execute(job_name: str, key: str | None) -> bool:
        job = defs.resolve_job_def(job_name)
        t0 = time.perf_counter()
        res = job.execute_in_process(instance=instance, partition_key=key, raise_on_error=False,
                                     tags={"fleetscope/trigger": "cli"}, run_config=QUIET)
        dt = time.perf_counter() - t0
        report.runs.append((job_name, key or "-", res.success, dt))
        for ev in res.all_events:
            if ev.is_step_materialization:
                m = ev.event_specific_data.materialization
                if "warnings" in m.metadata:
                    report.notes.setdefault((key or "-", m.metadata["warnings"].value), []).append(m.asset_key.to_user_string())
        n = len(report.runs)
        status = "ok" if res.success else "FAILED"
        log(f"  [{n:3d}] {job_name:<22} {key or '':<44} {status:>6} {dt:6.1f}s")
        if not res.success:
            for ev in res.all_events:
                if ev.is_failure and ev.event_specific_data is not None:
                    err = getattr(ev.event_specific_data, "error", None)
                    if err is not None:
                        log("        " + err.message.strip().splitlines()[-1][:300])
        return res.success

    for pset in ("topology_files", "flow_files", "hw_files", "captures"):
        for key in sorted(to_run.get(pset, [])):
            execute(JOB_FOR_SET[pset].name, key)
    # windows touched by the flow files ingested now (or every window when re-running everything)
    windows = set(touched_windows(instance, flow_partitions=to_run.get("flow_files", []))[0])
    if not only_new:
        windows.update(instance.get_dynamic_partitions(flow_windows.name))
    for w in sorted(windows):
        execute(JOB_FOR_SET[flow_windows.name].name, w)
    # incidents last: their reports summarize what the analyses above found in their scope
    for key in sorted(to_run.get("incidents", [])):
        execute(JOB_FOR_SET["incidents"].name, key)
    execute(fleet_analysis.name, None)
    wh.publish_views()
    return report
