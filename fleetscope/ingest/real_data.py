"""Lay out the real traces made by others (shared/data/real) as a landing folder, so they go
through exactly the path users' files take. Symlinks, not copies."""
from __future__ import annotations

import re
from pathlib import Path

# HTA test-suite files that are ranks of one job share a capture; every other file is its own.
SAME_JOB = {"timeline_analysis__sampled_rank-0.json.gz": "hta-sampled-128rank",
            "trace_filter__sampled_rank-1.json.gz": "hta-sampled-128rank"}


def capture_name(file_name: str) -> str:
    if file_name in SAME_JOB:
        return SAME_JOB[file_name]
    parts = file_name.split("__")
    stem = "-".join(parts[:2]) if len(parts) >= 3 else parts[0]  # folder__case__file: one job per case
    return "hta-" + re.sub(r"[^A-Za-z0-9]+", "-", stem).strip("-")


def rank_file_name(file_name: str) -> str:
    """Keep a rank hint the parser can use when distributedInfo is missing."""
    m = re.search(r"rank[-_]?(\d+)", file_name)
    suffix = ".json.gz" if file_name.endswith(".gz") else ".json"
    return f"rank{m.group(1)}{suffix}" if m else file_name


def layout_real_landing(real: Path, landing: Path) -> list[tuple[str, str]]:
    """-> [(source file, landing path)]."""
    real, landing = Path(real).resolve(), Path(landing)
    placed = []
    for f in sorted((real / "hta").glob("*.json*")):
        cap = capture_name(f.name)
        dest = landing / "traces" / cap / (rank_file_name(f.name) if cap == "hta-sampled-128rank" else f.name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            dest.symlink_to(f)
        placed.append((str(f.relative_to(real)), str(dest.relative_to(landing))))
    sa = real / "straggler_analysis"
    if sa.is_dir():
        dest_dir = landing / "timings" / "straggler-ST"
        dest_dir.mkdir(parents=True, exist_ok=True)
        for f in sorted(list(sa.glob("trace-*.parquet")) + list(sa.glob("meta-*.yaml"))):
            d = dest_dir / f.name
            if not d.exists():
                d.symlink_to(f)
            placed.append((str(f.relative_to(real)), str(d.relative_to(landing))))
    return placed
