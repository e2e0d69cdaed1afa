"""Paths the tests share (import as `from tests.paths import REPO, REAL`)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "data" / "real"
