"""On-demand torch.profiler capture (PerfTracker 4.1's loop, closed by a request file or a signal),
aligned across the ranks of the job.

A background thread polls `landing/requests/<job_id>.json` (written by the platform, e.g.
fleetscope.xputimer.degradation.write_profile_request):

    {"kind": "profile", "id": "deg-3-1763750000", "steps": 3, "capture": "job42-prof-deg-3", "note": "..."}

Each new `id` is served once per process, on the same training steps on every rank: the ranks
agree on the first step through the job's c10d store (compare_set: the first rank to propose
`its step + margin` wins and every rank reads the same value; without torch.distributed, through an
exclusively created file beside the request). From that step boundary (the end of optimizer.step,
on the training thread, where CUPTI-based profiling must run) the job runs torch.profiler with
Python stacks and shapes for `steps` steps, calling prof.step() at every step end with the step
counter set to the training step, so `ProfilerStep#<n>` carries the same n on every rank. The
tracer's timings switch to the profile's capture id for those steps (then back), so traces,
timings and the host's hw samples of the window share one capture id and one time span. Output:
landing/traces/<capture>/rank<R>.json.gz and capture.json ({"job_id", "note", "request_id",
"first_step", "steps"}). SIGUSR2 does the same without a file (id "sig<n>", n counting signals).
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

MARGIN_STEPS = 3   # steps between a rank's proposal and the profile's first step: ranks of a job
                   # are within a step of each other (every step synchronizes), so all are before it,
                   # plus the steps that pass while every rank's watcher gets to see the request


class ProfilerCapture:
    def __init__(self, tracer, poll_s: float = 0.5, with_stack: bool = True):
        self.tr = tracer
        self.req_file = tracer.landing / "requests" / f"{tracer.job_id}.json"
        self.poll_s = poll_s
        self.with_stack = with_stack
        self.served: set[str] = set()
        self.wanted: dict | None = None     # request with its agreed first step, waiting for it
        self.active = None                  # (profiler, request, steps left)
        self.n_signals = 0
        self.done: list[Path] = []
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fleetscope-profiler-watch", daemon=True)

    # -- agreeing on the first step ----------------------------------------------------------
    def _agree(self, rid: str, proposal: int) -> int:
        """The first step of request `rid`, the same on every rank: the first proposal wins."""
        store = _default_store()
        if store is not None:
            try:
                key = f"fleetscope/profile/{rid}/first_step"
                return int(store.compare_set(key, "", str(proposal)))
            except Exception:
                pass
        path = self.tr.landing / "requests" / f".{self.tr.job_id}.{rid}.first_step"
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(str(proposal))
            return proposal
        except FileExistsError:
            for _ in range(50):  # the winner is writing it
                txt = path.read_text().strip()
                if txt:
                    return int(txt)
                time.sleep(0.01)
            return proposal

    def margin_steps(self) -> int:
        """MARGIN_STEPS plus the steps two watcher polls take (the ranks see a request up to one poll
        apart, and must all learn the agreed step before reaching it): with 50 ms steps and 0.5 s
        polls that is 23 steps, with multi-second LLM steps 4. At most MARGIN_STEPS + 20 (fast steps
        would otherwise push the profile past a short run; a rank that learns the step late profiles
        from its next step and says so in its notes)."""
        ends = list(self.tr.step_ends)
        if len(ends) < 3:
            return MARGIN_STEPS + 20
        steps = sorted(b - a for a, b in zip(ends[:-1], ends[1:]))
        med = max(steps[len(steps) // 2], 1)
        return MARGIN_STEPS + min(20, int(-(-2 * self.poll_s * 1e9 // med)))

    def _want(self, req: dict):
        req = dict(req)
        req["first_step"] = self._agree(str(req["id"]), self.tr.step + self.margin_steps())
        self.wanted = req

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
                try:
                    self._want(req)
                except Exception as exc:  # never take the job down
                    print(f"[fleetscope.profiler] rank {self.tr.rank}: request {rid} not served: {exc!r}", flush=True)

    def _on_signal(self, signum, frame):
        self.n_signals += 1
        if self.wanted is None and self.active is None:
            # the store is not safe to use inside a signal handler: agree from the watcher thread
            req = {"id": f"sig{self.n_signals}", "steps": 3, "note": "requested by SIGUSR2"}
            threading.Thread(target=self._want, args=(req,), daemon=True).start()

    # -- on the training thread ---------------------------------------------------------------
    def on_step_end(self, step: int):
        """Runs on the training thread after each optimizer.step; `step` is the next step's number."""
        if self.active is not None:
            prof, req, left = self.active
            left -= 1
            if left > 0:
                self.active = (prof, req, left)
                prof.step()      # closes ProfilerStep#n, opens #n+1
                return
            self.active = None
            t0 = time.time_ns()
            prof.stop()          # (a last step() would open an empty ProfilerStep)
            # the profile's steps end at t0; stopping it (seconds with stacks on) is the tracer's own cost
            self.tr.switch_capture(req["_previous_capture"], at_ns=t0)
            self.tr.add("api", "profiler.stop", t0, t0, time.time_ns())
            # exporting takes longer still, but stays on the training thread: tried on a thread
            # beside it, a rank missed a hang's stack dump during the export and a trace came out corrupt
            self._export(prof, req)
            return
        w = self.wanted
        if w is None or step < w["first_step"]:
            return
        self.wanted = None
        if step > w["first_step"]:
            self.notes.append(f"request {w['id']}: rank {self.tr.rank} reached step {step} after the agreed first step "
                              f"{w['first_step']}; profiled from {step}")
        w["capture"] = w.get("capture") or f"{self.tr.job_id}-prof-{w['id']}"
        w["_previous_capture"] = self.tr.capture
        w["_first"] = step
        self._capture_json(self.tr.landing / "timings" / w["capture"], w)
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        # a schedule that always records makes the profiler annotate ProfilerStep#<step_num>
        prof = torch.profiler.profile(activities=acts, record_shapes=True, with_stack=self.with_stack,
                                      schedule=lambda s: torch.profiler.ProfilerAction.RECORD)
        prof.step_num = step
        # flush first: the first flush imports pyarrow, and imports inside a profile with stacks
        # on get garbage frame names from torch's Python tracer (one with a quote broke the JSON)
        self.tr.flush()
        t0 = time.time_ns()
        prof.start()         # can take a second (stacks on): timed, and left out of the profile's capture
        t1 = time.time_ns()
        self.tr.add("api", "profiler.start", t0, t0, t1)
        self.tr.switch_capture(w["capture"], at_ns=t1)
        self.active = (prof, w, max(1, int(w.get("steps", 3))))

    def _export(self, prof, req):
        t0 = time.time_ns()
        capture = req["capture"]
        out = self.tr.landing / "traces" / capture
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".rank{self.tr.rank}.json.tmp"
        prof.export_chrome_trace(str(tmp))
        final = out / f"rank{self.tr.rank}.json.gz"
        with open(tmp, "rb") as src, gzip.open(str(final) + ".tmp", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(str(final) + ".tmp", final)
        tmp.unlink()
        self._capture_json(out, req)
        self.done.append(final)
        self.tr.add("api", "profiler.export", t0, t0, time.time_ns())

    def _capture_json(self, d: Path, req: dict):
        cj = d / "capture.json"
        if cj.exists():
            return
        d.mkdir(parents=True, exist_ok=True)
        meta = {"job_id": self.tr.job_id, "note": req.get("note", ""), "request_id": req["id"],
                "first_step": req["_first"], "steps": max(1, int(req.get("steps", 3))), "created_ns": time.time_ns()}
        tmp = d / f".capture.json.{self.tr.rank}"   # every rank writes the same content, atomically
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, cj)

    def stop(self):
        self._stop.set()


def _default_store():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.distributed_c10d._get_default_store()
    except Exception:
        return None
    return None


def attach(tracer, poll_s: float = 0.5, with_stack: bool = True) -> ProfilerCapture:
    pc = ProfilerCapture(tracer, poll_s, with_stack)
    tracer.on_step_end.append(pc.on_step_end)
    tracer.profiler_capture = pc
    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGUSR2, pc._on_signal)
        except (ValueError, OSError):
            pass
    pc._thread.start()
    return pc
