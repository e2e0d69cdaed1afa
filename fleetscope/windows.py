"""Time windows over flows (LLMPrism analyses run per window; default 1 minute).

A window id names its length and start in UTC, e.g. 'w60s-20261121T120000Z', so windows of
different lengths never collide and sort by time."""
from __future__ import annotations

import datetime as dt

import numpy as np

_FMT = "%Y%m%dT%H%M%SZ"
NS = 1_000_000_000


def window_id(start_ns: int, window_s: int) -> str:
    t = dt.datetime.fromtimestamp(start_ns / NS, tz=dt.timezone.utc)
    return f"w{window_s}s-{t.strftime(_FMT)}"


def parse_window_id(wid: str) -> tuple[int, int]:
    """-> (start_ns, end_ns)."""
    head, stamp = wid.split("-", 1)
    length = int(head[1:-1])
    start = dt.datetime.strptime(stamp, _FMT).replace(tzinfo=dt.timezone.utc)
    s = int(start.timestamp()) * NS
    return s, s + length * NS


def windows_touched(start_ns: np.ndarray, end_ns: np.ndarray, window_s: int) -> list[str]:
    """Every window that any [start, end] interval overlaps."""
    if len(start_ns) == 0:
        return []
    w = window_s * NS
    lo = int(np.min(start_ns)) // w
    hi = int(np.max(end_ns)) // w
    first = np.unique(np.asarray(start_ns) // w)
    last = np.unique(np.asarray(end_ns) // w)
    idx = np.union1d(first, last)
    if hi - lo < 10_000:  # fill gaps between long flows' start and end windows
        idx = np.arange(lo, hi + 1) if len(idx) and (hi - lo + 1) <= 4 * len(idx) else idx
    return [window_id(int(i) * w, window_s) for i in idx]


def day_of(wid: str) -> str:
    return wid.split("-", 1)[1][:8]
