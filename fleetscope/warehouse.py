"""The warehouse: one DuckDB file of views over parquet files kept beside it.

Why this shape (DESIGN.md): DuckDB allows one writer process, and even a read-only reader (a
person in the duckdb CLI) blocks writers. Dagster runs sensor-launched, scheduled and manual runs
in parallel processes. So no run writes table data into the .duckdb file: each asset partition is
one parquet file, written to a temporary name and renamed into place (atomic on POSIX: a run killed
halfway leaves the previous file readable). The .duckdb file only holds `CREATE VIEW t AS SELECT *
FROM read_parquet('<dir>/t/*.parquet')`; views over globs see new partitions without rewriting the
file, so it is written only when the set of tables changes, under a file lock, and skipped (with a
warning) while someone holds it open. Queries inside runs use an in-memory DuckDB over the same
parquet globs, so they never touch the .duckdb file at all.

Layout: <name>.duckdb and <name>.tables/<table>/<partition>.parquet (+ _empty.parquet with the
schema, so every view exists before its first row)."""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import duckdb
import polars as pl
import pyarrow.parquet as pq

from fleetscope.schemas.base import empty_frame

log = logging.getLogger(__name__)
EMPTY = "_empty"
STORAGE_VERSION = "v1.4.0"
_SAFE = re.compile(r"^[A-Za-z0-9._=-]+$")


def partition_filename(key: str) -> str:
    """A partition key as a file name: itself when safe, else sanitized plus a short hash (unique)."""
    if _SAFE.match(key) and not key.startswith("."):
        return key
    clean = re.sub(r"[^A-Za-z0-9._=-]+", "_", key).strip("._")[:80]
    return f"{clean}~{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def _registry() -> dict:
    # the table list names every analysis' schemas; imported when needed so that the warehouse
    # (storage) does not depend on the analyses at import time
    from fleetscope.tables import TABLES
    return TABLES


class Warehouse:
    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        self.tables_dir = self.path.with_name(self.path.stem + ".tables")

    # ---------- writing ----------
    def table_dir(self, table: str) -> Path:
        d = self.tables_dir / table
        d.mkdir(parents=True, exist_ok=True)
        return d

    def ensure_table(self, table: str, df: pl.DataFrame | None = None) -> None:
        """Create the table's schema placeholder so its view exists (and SQL works) with no data."""
        target = self.table_dir(table) / f"{EMPTY}.parquet"
        if target.exists():
            return
        if df is None:
            df = empty_frame(_registry()[table])
        self._atomic_write(df.clear(), target)

    def write_partition(self, table: str, key: str, df: pl.DataFrame) -> Path:
        """Replace one partition of a table atomically (the same key overwrites: reruns are idempotent)."""
        self.ensure_table(table, df)
        target = self.table_dir(table) / f"{partition_filename(key)}.parquet"
        self._atomic_write(df, target)
        return target

    def delete_partition(self, table: str, key: str) -> None:
        p = self.table_dir(table) / f"{partition_filename(key)}.parquet"
        p.unlink(missing_ok=True)

    @staticmethod
    def _atomic_write(df: pl.DataFrame, target: Path) -> None:
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            df.write_parquet(tmp, compression="zstd", statistics=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def exports_dir(self, *parts: str) -> Path:
        """Files for people beside the warehouse (reports, Perfetto/Chrome traces): <name>.exports/..."""
        d = self.path.with_name(self.path.stem + ".exports").joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        return d

    # ---------- reading ----------
    def files(self, table: str) -> list[Path]:
        d = self.tables_dir / table
        return sorted(d.glob("*.parquet")) if d.exists() else []

    def partitions(self, table: str) -> list[str]:
        return [p.stem for p in self.files(table) if p.stem != EMPTY]

    def has_table(self, table: str) -> bool:
        return bool(self.files(table))

    def glob(self, table: str) -> str:
        return str(self.tables_dir / table / "*.parquet")

    def read(self, table: str, where: str | None = None, columns: list[str] | None = None, partitions: list[str] | None = None) -> pl.DataFrame:
        """Read a table (optionally only some partitions, a SQL WHERE, some columns) as polars."""
        if partitions is not None:
            paths = [str(self.tables_dir / table / f"{partition_filename(k)}.parquet") for k in partitions]
            paths = [p for p in paths if os.path.exists(p)]
            placeholder = self.tables_dir / table / f"{EMPTY}.parquet"
            if placeholder.exists():
                paths.append(str(placeholder))
            if not paths:
                return self._empty(table)
            src = f"read_parquet({paths!r}, union_by_name=true)"
        else:
            if not self.has_table(table):
                return self._empty(table)
            src = f"read_parquet('{self.glob(table)}', union_by_name=true)"
        cols = ", ".join(f'"{c}"' for c in columns) if columns else "*"
        sql = f"SELECT {cols} FROM {src}" + (f" WHERE {where}" if where else "")
        for attempt in range(3):  # a partition replaced between glob and open: read again
            try:
                with duckdb.connect() as con:
                    return pl.from_arrow(con.sql(sql).fetch_arrow_table())
            except duckdb.IOException:
                if attempt == 2:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def _empty(self, table: str) -> pl.DataFrame:
        tables = _registry()
        return empty_frame(tables[table]) if table in tables else pl.DataFrame()

    def row_counts(self) -> dict[str, int]:
        out = {}
        for d in sorted(self.tables_dir.iterdir()) if self.tables_dir.exists() else []:
            files = sorted(d.glob("*.parquet"))
            if files:
                out[d.name] = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        return out

    @contextmanager
    def connect(self):
        """In-memory DuckDB with one view per table over its parquet files: SQL that never locks the
        .duckdb file (used by runs, `fleetscope sql` and tests)."""
        con = duckdb.connect()
        try:
            for name in self.table_names():
                con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM read_parquet(\'{self.glob(name)}\', union_by_name=true)')
            yield con
        finally:
            con.close()

    def sql(self, query: str) -> pl.DataFrame:
        with self.connect() as con:
            return pl.from_arrow(con.sql(query).fetch_arrow_table())

    def table_names(self) -> list[str]:
        if not self.tables_dir.exists():
            return []
        return sorted(d.name for d in self.tables_dir.iterdir() if d.is_dir() and any(d.glob("*.parquet")))

    # ---------- the .duckdb file ----------
    def init(self) -> None:
        """Create every registered table's placeholder and publish the views."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for t in _registry():
            self.ensure_table(t)
        self.publish_views()

    def publish_views(self, retries: int = 5, wait_s: float = 0.5) -> bool:
        """(Re)write the views in the .duckdb file when its set of tables differs from the parquet
        tables. Returns False (data stays visible through the existing views) when another process
        holds the file; never raises for a lock."""
        wanted = set(self.table_names())
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)  # serialize our own writers (pool of one)
            for attempt in range(retries):
                try:
                    if self.path.exists():
                        with duckdb.connect(str(self.path), read_only=True) as ro:
                            have = {r[0] for r in ro.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
                        if wanted <= have:
                            return True
                    with duckdb.connect() as con:
                        # an older storage format, so the duckdb CLI people install (duckdb-cli 1.5.x
                        # on PyPI) can open the file too; an existing file keeps its own format
                        opt = "" if self.path.exists() else f" (STORAGE_VERSION '{STORAGE_VERSION}')"
                        con.execute(f"ATTACH '{self.path}' AS w{opt}")
                        for name in sorted(wanted):
                            con.execute(f'CREATE OR REPLACE VIEW w."{name}" AS SELECT * FROM read_parquet(\'{self.glob(name)}\', union_by_name=true)')
                        con.execute("DETACH w")
                    return True
                except (duckdb.IOException, duckdb.ConnectionException) as exc:  # held by another process (e.g. a duckdb CLI)
                    if attempt == retries - 1:
                        log.warning("warehouse %s is held by another process (%s); views not refreshed now, data stays readable through the existing views", self.path, exc)
                        return False
                    time.sleep(wait_s * (attempt + 1))
        return False
