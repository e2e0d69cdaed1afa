"""On-demand torch.profiler capture (PerfTracker 4.1's loop, closed by a request file or a signal).

A background thread polls `landing/requests/<job_id>.json` (written by the platform, e.g.
fleetscope.xputimer.degradation.write_profile_request):

    {"kind": "profile", "id": "deg-3-1763750000", "steps": 3, "capture": "job42-prof-deg-3", "note": "..."}

Each new `id` is served once per process: at the next step boundary (the end of optimizer.step,
on the training thread, where CUPTI-based profiling must run) the job starts torch.profiler, keeps
it for `steps` steps (default 3), then writes landing/traces/<capture>/rank<R>.json.gz and
capture.json ({"job_id", "note", "request_id"}). SIGUSR2 does the same without a file
(capture "<job_id>-prof-sig<n>", n counting signals, so every rank signalled together agrees).
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import torch


class ProfilerCapture:
    def __init__(self, tracer, poll_s: float = 0.5):
        self.tr = tracer
        self.req_file = tracer.landing / "requests" / f"{tracer.job_id}.json"
        self.poll_s = poll_s
        self.served: set[str] = set()
        self.wanted: dict | None = None     # request waiting for the next step boundary
        self.active = None                  # (profiler, request, steps left)
        self.n_signals = 0
        self.done: list[Path] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fleetscope-profiler-watch", daemon=True)

    def _watch(self):
        while not self._stop.wait(self.poll_s):
            try:
                if not self.req_file.exists():
                    continue
                req = json.loads(self.req_file.read_text())
            except (OSError, ValueError):
                continue  # half-written file: read it again next time
            rid = str(req.get("id", ""))
            if req.get("kind", "profile") == "profile" and rid and rid not in self.served and self.wanted is None:
                self.served.add(rid)
                self.wanted = req

    def _on_signal(self, signum, frame):
        self.n_signals += 1
        if self.wanted is None and self.active is None:
            self.wanted = {"id": f"sig{self.n_signals}", "steps": 3, "note": "requested by SIGUSR2"}

    def on_step_end(self, step: int):
        """Runs on the training thread after each optimizer.step."""
        if self.active is not None:
            prof, req, left = self.active
            left -= 1
            if left > 0:
                self.active = (prof, req, left)
                return
            self.active = None
            prof.stop()
            self._export(prof, req)
            return
        if self.wanted is not None:
            req, self.wanted = self.wanted, None
            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            prof = torch.profiler.profile(activities=acts, record_shapes=True)
            prof.start()
            self.active = (prof, req, max(1, int(req.get("steps", 3))))

    def _export(self, prof, req):
        capture = req.get("capture") or f"{self.tr.job_id}-prof-{req['id']}"
        out = self.tr.landing / "traces" / capture
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".rank{self.tr.rank}.json.tmp"
        prof.export_chrome_trace(str(tmp))
        final = out / f"rank{self.tr.rank}.json.gz"
        with open(tmp, "rb") as src, gzip.open(str(final) + ".tmp", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(str(final) + ".tmp", final)
        tmp.unlink()
        cj = out / "capture.json"
        if not cj.exists():
            cj.write_text(json.dumps({"job_id": self.tr.job_id, "note": req.get("note", ""),
                                      "request_id": req["id"], "created_ns": time.time_ns()}))
        self.done.append(final)

    def stop(self):
        self._stop.set()


def attach(tracer, poll_s: float = 0.5) -> ProfilerCapture:
    pc = ProfilerCapture(tracer, poll_s)
    tracer.on_step_end.append(pc.on_step_end)
    tracer.profiler_capture = pc
    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGUSR2, pc._on_signal)
        except (ValueError, OSError):
            pass
    pc._thread.start()
    return pc
