"""Peak memory of a process tree, as a user's machine feels it: the sum of the resident memory of
this process and all its descendants, sampled every few milliseconds (ru_maxrss of children is
the largest single child, not what parallel workers hold together)."""
from __future__ import annotations

import os
import threading
from pathlib import Path


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").glob("*"))
    except OSError:   # (the process ended while the tree was walked)
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_mib(pid: int | None = None) -> float:
    """Resident memory of a process and every descendant now, MiB."""
    todo, total, seen = [pid or os.getpid()], 0, set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _rss_kib(p)
        todo += _children(p)
    return total / 1024


class PeakTreeRSS:
    """with PeakTreeRSS() as m: ...; m.peak_mib  (sampled every `interval_s`)."""

    def __init__(self, interval_s: float = 0.02, pid: int | None = None):
        self.interval_s, self.pid, self.peak_mib = interval_s, pid, 0.0
        self._stop = threading.Event()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, tree_rss_mib(self.pid))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PeakTreeRSS":
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak_mib = max(self.peak_mib, tree_rss_mib(self.pid))


class PeakPerProcess:
    """with PeakPerProcess(pid) as m: ...; m.peaks: {pid: (peak MiB, command line)} for the process
    and every descendant seen (sampled every `interval_s`): what each worker of a pool holds."""

    def __init__(self, pid: int, interval_s: float = 0.05):
        self.pid, self.interval_s = pid, interval_s
        self.peaks: dict[int, tuple[float, str]] = {}
        self.total_peak_mib = 0.0   # the largest sum over the tree at one sample
        self._stop = threading.Event()

    def _sample(self) -> None:
        todo, seen, total = [self.pid], set(), 0.0
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            mib = _rss_kib(p) / 1024
            total += mib
            if mib:
                old = self.peaks.get(p)
                if old is None:
                    try:
                        cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    except OSError:
                        cmd = "?"
                    self.peaks[p] = (mib, cmd)
                elif mib > old[0]:
                    self.peaks[p] = (mib, old[1])
            todo += _children(p)
        self.total_peak_mib = max(self.total_peak_mib, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PeakPerProcess":
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
