"""The recorded sets under tests/data (each `<set>/<recording>/` with `ground_truth/`), analysed as
the wiring does (benchmarks.flows_accuracy.run_folder), for the tests that score them."""
from pathlib import Path

import pytest

from benchmarks.flows_accuracy import run_folder


def recorded_runs(root: Path, at_least: int) -> dict:
    """{"<set>/<recording>": run_folder's scores} for every recording under root; fails (never
    skips) when fewer than at_least are there."""
    folders = sorted(p for p in root.glob("*/*") if (p / "ground_truth").is_dir())
    if len(folders) < at_least:
        pytest.fail(f"recordings missing under {root}: {len(folders)} of at least {at_least}")
    return {f"{p.parent.name}/{p.name}": run_folder(p, tail_ns=0) for p in folders}
