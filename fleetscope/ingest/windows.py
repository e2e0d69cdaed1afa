"""Time windows over flows (LLMPrism analyses run per window; default 1 minute).

A window id names its length and start in UTC, e.g. 'w60s-20261121T120000Z', so windows of
different lengths never collide and ids sort by time. Windows that do not start on a whole
second or last a fractional number of seconds (analyses called by hand) keep their exact
nanoseconds: 'w2.5s-20261121T120000.000000123Z'. One format, read back by parse_window_id."""
from __future__ import annotations

import datetime as dt
import re

import numpy as np

_FMT = "%Y%m%dT%H%M%S"
NS = 1_000_000_000
_ID = re.compile(r"^w(?P<len>\d+(?:\.\d+)?)s-(?P<stamp>\d{8}T\d{6})(?:\.(?P<frac>\d{9}))?Z$")


def window_id(start_ns: int, length_s: float) -> str:
    sec, frac = divmod(int(start_ns), NS)
    stamp = dt.datetime.fromtimestamp(sec, tz=dt.timezone.utc).strftime(_FMT)
    length = f"{length_s:.9f}".rstrip("0").rstrip(".") if float(length_s) != int(length_s) else str(int(length_s))
    return f"w{length}s-{stamp}" + (f".{frac:09d}" if frac else "") + "Z"


def window_id_for(start_ns: int, end_ns: int) -> str:
    """The id of the window [start_ns, end_ns)."""
    return window_id(start_ns, (end_ns - start_ns) / NS)


def parse_window_id(wid: str) -> tuple[int, int]:
    """-> (start_ns, end_ns)."""
    m = _ID.match(wid)
    if m is None:
        raise ValueError(f"not a window id: {wid!r} (expected e.g. 'w60s-20261121T120000Z')")
    start = dt.datetime.strptime(m["stamp"], _FMT).replace(tzinfo=dt.timezone.utc)
    s = int(start.timestamp()) * NS + int(m["frac"] or 0)
    whole, _, dec = m["len"].partition(".")
    length_ns = int(whole) * NS + int((dec + "000000000")[:9] or 0)
    return s, s + length_ns


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
