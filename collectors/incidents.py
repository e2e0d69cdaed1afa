"""Incident requests (docs/CONTRACT.md 1.7), filed the same way whoever files them: the tracer's
watchdog inside a job (a collective outstanding past its learned bound), the platform's blocked
check (fleetscope.xputimer.degradation), the planner for a critical problem (jobs/planner.py).

One id format, `<subject>-<kind>-<when>`: the job, host or address the request is about, what
filed it (`hang`, `critical`), and when: the filing's UTC time to the millisecond, or the id of the
problem that filed it (then the same problems give the same request however they were reached).
Standard library only: this runs inside training jobs."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from fleetscope.collectors import stacks
from fleetscope.collectors.stacks import write_json


def incident_id(subject: str, kind: str, when: int | str) -> str:
    """`when`: nanoseconds since the epoch (a UTC time stamp) or a string kept as is."""
    if not isinstance(when, str):
        when = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(when / 1e9))}-{when % 1_000_000_000 // 1_000_000:03d}"
    return "-".join(re.sub(r"[^A-Za-z0-9._-]+", "_", str(p)) for p in (subject, kind, when))


def file_incident(landing_dir: str | os.PathLike, incident: str, request: dict, stacks_of: str | None = None) -> bool:
    """Write landing/incidents/<incident>.json (atomically; an existing request is kept) and, when
    `stacks_of` names a job, ask its ranks for their stacks and collective progress into
    landing/stacks/<incident>/ (landing/requests/<job>.stacks.json, served by collectors.stacks).
    Returns whether the request was new."""
    land = Path(landing_dir)
    target = land / "incidents" / f"{incident}.json"
    new = not target.exists()
    if new:
        write_json(target, request)
    if stacks_of is not None:
        stacks.request(land, stacks_of, incident)
    return new
