"""Stack dumps of every rank during a hang, into landing/stacks/<incident>/rank<R>.txt (docs/CONTRACT.md 1.6),
with each rank's collective progress beside them (fr_rank<R>.json, the PyTorch Flight Recorder's JSON:
torch's own recorder when TORCH_FR_BUFFER_SIZE is set, else the fleetscope tracer's ring buffer).

In the job (started by fleetscope.collectors.tracer.start, or `fleetscope.collectors.stacks.install(landing, rank)`):
a daemon thread polls `landing/requests/<job_id>.stacks.json` = {"incident": "inc-7"} and, for each
new incident, writes a faulthandler dump of all its threads. It works while the training thread is
blocked inside a collective (torch releases the GIL while it waits). SIGUSR1 dumps too (incident
"sig<n>").

From outside the job (no cooperation needed, py-spy if installed):

    python -m fleetscope.collectors.stacks --landing L --incident inc-7 --pid 0:4242 --pid 1:4243
    python -m fleetscope.collectors.stacks --landing L --incident inc-7 --job job42      # ask the ranks' watchers
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


_DUMPERS: list = []   # more dumps written beside the stacks: fn(incident folder, rank)


def add_dumper(fn) -> None:
    if fn not in _DUMPERS:
        _DUMPERS.append(fn)


def flight_recorder_json(rank: int) -> dict | None:
    """torch's Flight Recorder buffer (recorded by ProcessGroupNCCL and, since torch 2.6, gloo, when
    TORCH_FR_BUFFER_SIZE > 0) as JSON, with this rank added (torch's dump does not carry it)."""
    torch = sys.modules.get("torch")
    size = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0"
    if torch is None or not size.isdigit() or int(size) <= 0:
        return None
    try:
        if not torch.distributed.is_initialized():
            return None
        d = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=True, onlyActive=False))
    except Exception:
        return None
    d.update(rank=int(rank), source="torch.flight_recorder", time_ns=time.time_ns())
    return d


def dump_now(landing_dir, incident: str, rank: int) -> Path:
    out = Path(landing_dir) / "stacks" / incident
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank{rank}.txt"
    tmp = out / f".rank{rank}.txt.tmp"
    with open(tmp, "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    os.replace(tmp, path)
    fr = flight_recorder_json(rank)
    if fr is not None:
        tmp = out / f".fr_rank{rank}.json.tmp"
        tmp.write_text(json.dumps(fr, default=str))
        os.replace(tmp, out / f"fr_rank{rank}.json")
    for fn in list(_DUMPERS):
        try:
            fn(out, rank)
        except Exception as exc:  # a dump must never take the job down
            print(f"[fleetscope.stacks] rank {rank}: extra dump failed: {exc!r}", flush=True)
    return path


def dump_once(landing_dir, incident: str, rank: int) -> Path | None:
    """dump_now unless this process's watcher already served (or is serving) that incident."""
    w = _WATCHER
    if w is not None:
        with w.lock:
            if incident in w.served:
                return None
            w.served.add(incident)
    return dump_now(landing_dir, incident, rank)


class _Watcher:
    def __init__(self, landing_dir, rank, job_id, poll_s):
        self.landing, self.rank, self.poll_s = Path(landing_dir), int(rank), poll_s
        self.req = self.landing / "requests" / f"{job_id}.stacks.json"
        self.served: set[str] = set()
        self.lock = threading.Lock()
        self.n_signals = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="fleetscope-stacks-watch", daemon=True)

    def _loop(self):
        while not self._stop.wait(self.poll_s):
            try:
                inc = str(json.loads(self.req.read_text()).get("incident", ""))
            except (OSError, ValueError):
                continue
            with self.lock:
                new = bool(inc) and inc not in self.served
                self.served.add(inc)
            if new:
                dump_now(self.landing, inc, self.rank)

    def on_signal(self, signum, frame):
        self.n_signals += 1
        dump_now(self.landing, f"sig{self.n_signals}", self.rank)


_WATCHER = None


def install(landing_dir, rank: int, job_id: str | None = None, poll_s: float = 0.5):
    global _WATCHER
    if _WATCHER is not None:
        return _WATCHER
    job_id = job_id or os.environ.get("FLEETSCOPE_JOB_ID", "job")
    w = _Watcher(landing_dir, rank, job_id, poll_s)
    if threading.current_thread() is threading.main_thread():
        try:
            signal.signal(signal.SIGUSR1, w.on_signal)
        except (ValueError, OSError):
            pass
    w.thread.start()
    _WATCHER = w
    return w


def write_json(path: Path, obj) -> None:
    """Write JSON so that a reader never sees half a file (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, default=str, sort_keys=True))
    os.replace(tmp, path)


def request(landing_dir, job_id: str, incident: str) -> Path:
    """Ask the job's ranks (their watchers) for stacks and collective progress into stacks/<incident>/."""
    p = Path(landing_dir) / "requests" / f"{job_id}.stacks.json"
    write_json(p, {"incident": incident, "created_ns": time.time_ns()})
    return p


def pyspy_dump(landing_dir, incident: str, rank_pids: dict[int, int]) -> list[Path]:
    exe = shutil.which("py-spy")
    if exe is None:
        raise RuntimeError("py-spy is not installed; use --job to ask the ranks' own watchers instead")
    out = Path(landing_dir) / "stacks" / incident
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, pid in rank_pids.items():
        res = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        p = out / f"rank{rank}.txt"
        p.write_text(res.stdout if res.returncode == 0 else f"py-spy failed: {res.stderr}")
        paths.append(p)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(description="dump the Python stacks of a hung job's ranks into landing/stacks/<incident>/")
    ap.add_argument("--landing", required=True)
    ap.add_argument("--incident", required=True)
    ap.add_argument("--pid", action="append", default=[], help="RANK:PID (py-spy)")
    ap.add_argument("--job", help="job id: ask the ranks' watchers via a request file")
    a = ap.parse_args(argv)
    if a.pid:
        pids = {int(r): int(p) for r, p in (x.split(":") for x in a.pid)}
        for p in pyspy_dump(a.landing, a.incident, pids):
            print(p)
    elif a.job:
        print(request(a.landing, a.job, a.incident))
    else:
        ap.error("give --pid RANK:PID ... or --job JOB_ID")
    return 0


if __name__ == "__main__":
    sys.exit(main())
