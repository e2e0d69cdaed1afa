"""The platform's backstop for hangs, against the current time: a real 4-rank job whose rank 2 stops
for 150 s (the in-job watchdog left out: its bound is set to an hour), its timings ingested while it
hangs (`fleetscope run` also files and analyses an incident request for the critical problem it finds,
so the hang lasts long enough for that on a loaded machine), and the degradation sensor evaluated then: it files a hang incident and a stack request,
which the hung job's own watchers serve, and the hang diagnosis names rank 2. Once the job has
finished (every rank's last row is tracer.stop), the same check files nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.collectors.conftest import COMMON, REPO


@pytest.mark.slow
def test_a_job_hung_right_now_gets_an_incident(fleet_env, monkeypatch):
    from dagster import DagsterInstance, build_sensor_context

    from fleetscope.definitions import defs
    from fleetscope.jobs.runner import run_all
    from fleetscope.jobs import settings
    from fleetscope.jobs.sensors import degradation_sensor
    from fleetscope.xputimer.hang import diagnose_hang

    landing, warehouse, _ = fleet_env
    marker = landing.parent / "hang.marker"
    code = ("from fleetscope.collectors import demo_train; "
            f"demo_train.run({[*COMMON, '--steps', '20', '--landing', str(landing), '--capture', 'bn', '--job-id', 'bn', '--flush-s', '1', '--hang-rank', '2', '--hang-step', '14', '--hang-s', '150', '--hang-marker', str(marker)]!r})")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, FLEETSCOPE_HANG_MIN_S="3600"))
    try:
        t0 = time.time()
        while not marker.exists() and time.time() - t0 < 120:
            time.sleep(0.2)
        assert marker.exists(), "the hang was never reached"
        time.sleep(3)  # the tracers' last rows before the hang land (1 s flushes)
        assert not run_all(landing, warehouse, settle_s=0, log=lambda *_: None).failed
        monkeypatch.setattr(settings, "BLOCKED_MIN_IDLE_S", 5.0)
        with DagsterInstance.get() as instance:
            res = degradation_sensor(build_sensor_context(instance=instance, cursor=None, definitions=defs))
            assert p.poll() is None, "the job finished before the check: the hang was not caught while it lasted"
            incs = list((landing / "incidents").glob("bn-hang-*.json"))
            assert len(incs) == 1
            body = json.loads(incs[0].read_text())
            assert body["kind"] == "hang" and body["job_id"] == "bn" and body["capture"] == "bn"
            assert json.loads((landing / "requests" / "bn.stacks.json").read_text())["incident"] == incs[0].stem
            # the hung job's own watchers answer the request while it hangs
            folder = landing / "stacks" / incs[0].stem
            t1 = time.time()
            while len(list(folder.glob("rank*.txt"))) < 4 and time.time() - t1 < 20:
                time.sleep(0.2)
            time.sleep(0.5)
            h = diagnose_hang(folder, job_id="bn")
            assert h.verdicts.select("scope", "subject", "team").rows() == [("rank", "2", "operations")]
            assert p.wait(timeout=300) == 0
            # finished: every rank stopped the tracer; the same check, later, files nothing new
            assert not run_all(landing, warehouse, settle_s=0, log=lambda *_: None).failed
            degradation_sensor(build_sensor_context(instance=instance, cursor=res.cursor, definitions=defs))
            degradation_sensor(build_sensor_context(instance=instance, cursor=None, definitions=defs))
            assert len(list((landing / "incidents").glob("bn-hang-*.json"))) == 1
    finally:
        if p.poll() is None:
            p.kill()
