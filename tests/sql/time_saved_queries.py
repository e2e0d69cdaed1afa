"""Time every saved query in sql/ over a warehouse, both ways: `fleetscope sql` (Warehouse.sql: an
in-memory DuckDB with a view per table) and plain DuckDB on the warehouse file (read-only), median
of 3 runs each, checking both return the same number of rows. (Lives beside the SQL tests because
benchmarks/ belongs to the platform lead; move it to benchmarks/ops_sql.py at will.)

    .venv/bin/python tests/sql/time_saved_queries.py data/warehouse.duckdb"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import duckdb

REPO = Path(__file__).resolve().parents[2]
from fleetscope.warehouse import Warehouse  # noqa: E402


def main(path: str) -> None:
    if not Path(path).exists():
        raise SystemExit(f"no warehouse file at {path}: run `fleetscope run` or `fleetscope demo` first")
    wh = Warehouse(path)
    counts = wh.row_counts()
    print("rows:", {t: counts.get(t, 0) for t in ("flows", "step_timelines", "anomaly_verdicts", "rejected_records", "topology")})
    print(f"{'query':<26} {'rows':>5} {'fleetscope sql (ms)':>20} {'duckdb file (ms)':>17}")
    for f in sorted((REPO / "sql").glob("*.sql")):
        q = f.read_text()
        t_fs, t_db = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            a = wh.sql(q)
            t_fs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with duckdb.connect(path, read_only=True) as con:
                b = con.sql(q).fetchall()
            t_db.append(time.perf_counter() - t0)
        assert a.height == len(b), f"{f.stem}: {a.height} rows through fleetscope, {len(b)} on the file"
        print(f"{f.stem:<26} {a.height:>5} {statistics.median(t_fs) * 1e3:>20.0f} {statistics.median(t_db) * 1e3:>17.0f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/warehouse.duckdb")
