"""critical_verdict_sensor: a new critical verdict about a job files an incident request
(landing/incidents/auto-*.json); the landing and incident sensors then run its scoped analyses and
write its report."""
import json
from pathlib import Path

import polars as pl
from dagster import DefaultSensorStatus, SensorEvaluationContext, SensorResult, SkipReason, sensor

from fleetscope.jobs.sensors.settings import INTERVAL_S
from fleetscope.resources import landing_path, warehouse_path
from fleetscope.warehouse import Warehouse


@sensor(name="critical_verdict_sensor", minimum_interval_seconds=max(INTERVAL_S, 60), default_status=DefaultSensorStatus.RUNNING,
        description="A new critical verdict about a job files an incident request (landing/incidents/auto-*.json): the "
                    "landing and incident sensors then run its scoped analyses and write its report.")
def critical_verdict_sensor(context: SensorEvaluationContext):
    seen = set(json.loads(context.cursor)) if context.cursor else None
    wh = Warehouse(warehouse_path())
    if not wh.has_table("anomaly_verdicts"):
        return SkipReason("no verdicts yet")
    crit = wh.read("anomaly_verdicts", where="severity = 'critical' AND job_id IS NOT NULL",
                   columns=["verdict_id", "job_id", "start_ns", "end_ns", "explanation"])
    ids = set(crit["verdict_id"].to_list())
    if seen is None:  # first evaluation: today's state is the baseline, file only what is new from now on
        return SensorResult(skip_reason=SkipReason(f"baseline of {len(ids)} critical verdicts"), cursor=json.dumps(sorted(ids)))
    new = crit.filter(~pl.col("verdict_id").is_in(list(seen)))
    folder = Path(landing_path()) / "incidents"
    filed = []
    for r in new.unique("job_id").iter_rows(named=True):
        folder.mkdir(parents=True, exist_ok=True)
        req = {"kind": "slow", "job_id": r["job_id"], "from_ns": r["start_ns"], "to_ns": r["end_ns"],
               "note": f"filed by critical_verdict_sensor for verdict {r['verdict_id']}: {r['explanation'][:200]}"}
        tmp = folder / f".auto-{r['verdict_id']}.json.tmp"
        tmp.write_text(json.dumps(req))
        tmp.rename(folder / f"auto-{r['verdict_id']}.json")
        filed.append(r["job_id"])
    cursor = json.dumps(sorted(ids | seen)[-20000:])
    if not filed:
        return SensorResult(skip_reason=SkipReason("no new critical verdicts"), cursor=cursor)
    context.log.info(f"{new.height} new critical verdict(s): incident requests filed for job(s) {', '.join(filed)}")
    return SensorResult(cursor=cursor)
