"""Every warehouse table of `fleetscope run`, one checkout against another, row by row (issue 23's rule
for a speed change: the outputs stay the same, or the commit says which changed and why).

The same landing folders go through `fleetscope run` of this checkout and of a reference checkout (its
own virtualenv's python: `--ref-python`), each into its own warehouse; then every partition file of
every table is compared: the same columns, dtypes and rows in the same order. Run-specific values are
blanked first (the warehouse's and landing's own paths, the run's clock, ids made from them; see
VOLATILE). Rows that are the same but in another order are reported apart and do not count: a
table's row order means nothing in SQL, and several analyses group without keeping order (the
reference differs from itself there). Each landing is run twice with the reference when --noise is given, so differences the
reference has with itself (nondeterminism) are told apart from what the change did.

Landing sets (--sets, default all):
  hta16    the 16-rank HTA capture of benchmarks/traces_vs_hta.py (trace-only)
  small    tests/data/whatif, tests/data/heldout and the traces of tests/data/recordings, one capture each
  real     the real traces in ../shared/data/real laid out by fleetscope.ingest.real_data
  flows    tests/data/recordings/healthy's whole landing (flows, topology and traces)

    .venv/bin/python -m benchmarks.compare_outputs --ref-python ../ref/.venv/bin/python [--sets small,real] [--work DIR]
        [--noise] [--keep]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

REPO = Path(__file__).resolve().parents[1]
# columns whose values belong to the run, not to the analysis (compared after blanking)
VOLATILE = {"registered_ns", "detected_ns", "mtime_ns", "run_id"}  # the run's clock, the files it wrote


def _landings(work: Path, sets: list[str]) -> dict[str, Path]:
    out = {}
    if "hta16" in sets:
        from benchmarks.traces_vs_hta import build_capture
        landing, _ = build_capture(work / "hta16-capture", 16, 2)
        out["hta16"] = landing
    if "small" in sets:
        land = work / "small" / "landing"
        if not land.exists():
            for group in ("whatif", "heldout"):
                for cap in sorted((REPO / "tests" / "data" / group).iterdir()):
                    files = sorted(cap.glob("*.json*"))
                    if not files:
                        continue
                    dest = land / "traces" / f"{group}-{cap.name}"
                    dest.mkdir(parents=True, exist_ok=True)
                    for f in files:
                        (dest / f.name).symlink_to(f.resolve())
            for rec in sorted((REPO / "tests" / "data" / "recordings").iterdir()):
                tr = rec / "landing" / "traces"
                if not tr.is_dir():
                    continue
                for cap in sorted(tr.iterdir()):
                    dest = land / "traces" / f"rec-{rec.name}-{cap.name}"
                    dest.mkdir(parents=True, exist_ok=True)
                    for f in sorted(cap.iterdir()):
                        (dest / f.name).symlink_to(f.resolve())
        out["small"] = land
    if "real" in sets:
        land = work / "real" / "landing"
        if not land.exists():
            from fleetscope.ingest.real_data import layout_real_landing
            layout_real_landing(REPO.parent / "shared" / "data" / "real", land)
        out["real"] = land
    if "flows" in sets:
        land = work / "flows" / "landing"
        if not land.exists():
            src = REPO / "tests" / "data" / "recordings" / "healthy" / "landing"
            shutil.copytree(src, land, symlinks=False)
        out["flows"] = land
    return out


def run(python: str, landing: Path, out: Path) -> dict:
    """`fleetscope run` of the checkout whose python this is, into out/w.duckdb; wall and CPU seconds."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.rmtree(landing / "incidents", ignore_errors=True)  # incident requests an earlier run filed
    exe = str(Path(python).parent / "fleetscope")
    env = {**os.environ, "DAGSTER_HOME": str(out / ".dagster")}
    t = time.perf_counter()
    r0 = os.times()
    p = subprocess.run([exe, "run", "--landing", str(landing), "--warehouse", str(out / "w.duckdb"), "--settle-seconds", "0"],
                       env=env, capture_output=True, text=True)
    r1 = os.times()
    shutil.rmtree(landing / "incidents", ignore_errors=True)
    (out / "run.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"{exe} run failed (rc {p.returncode}), see {out / 'run.log'}:\n{(p.stdout + p.stderr)[-2000:]}")
    return {"s": time.perf_counter() - t, "cpu_s": (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)}


def _normalize(df: pl.DataFrame, roots: list[str]) -> pl.DataFrame:
    """Blank what belongs to the run: its folders in text, VOLATILE columns."""
    exprs = []
    for c, dt in df.schema.items():
        if c in VOLATILE:
            exprs.append(pl.lit(None).cast(dt).alias(c))
        elif dt == pl.Utf8:
            e = pl.col(c)
            for i, r in enumerate(roots):
                e = e.str.replace_all(r, f"<root{i}>", literal=True)
            exprs.append(e.alias(c))
    return df.with_columns(exprs) if exprs else df


def compare(a_dir: Path, b_dir: Path, a_roots: list[str], b_roots: list[str]) -> list[str]:
    """Differences between two warehouses' tables (empty: the same)."""
    diffs, order = [], []
    ta, tb = a_dir / "w.tables", b_dir / "w.tables"
    tables = sorted({p.name for p in ta.iterdir()} | {p.name for p in tb.iterdir()})
    for t in tables:
        fa = {p.name for p in (ta / t).glob("*.parquet")} if (ta / t).is_dir() else set()
        fb = {p.name for p in (tb / t).glob("*.parquet")} if (tb / t).is_dir() else set()
        if fa != fb:
            diffs.append(f"{t}: partitions differ: only in reference {sorted(fa - fb)[:5]}, only in this checkout {sorted(fb - fa)[:5]}")
        for f in sorted(fa & fb):
            x = _normalize(pl.read_parquet(ta / t / f), a_roots)
            y = _normalize(pl.read_parquet(tb / t / f), b_roots)
            where = f"{t}/{f}"
            if x.columns != y.columns:
                diffs.append(f"{where}: columns differ: {x.columns} vs {y.columns}")
                continue
            if x.schema != y.schema:
                diffs.append(f"{where}: dtypes differ: {[(c, x.schema[c], y.schema[c]) for c in x.columns if x.schema[c] != y.schema[c]]}")
                continue
            if x.height != y.height:
                diffs.append(f"{where}: {x.height} rows vs {y.height}")
                continue
            if x.equals(y):
                continue
            same_set = x.sort(x.columns, nulls_last=True).equals(y.sort(y.columns, nulls_last=True)) if x.height else False
            cols = [c for c in x.columns if not x[c].equals(y[c])]
            (order if same_set else diffs).append(f"{where}: {'same rows in another order' if same_set else 'rows differ'}; "
                                                  f"columns differing by position: {cols[:8]}")
    return diffs, order


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref-python", required=True, help="python of the reference checkout's virtualenv")
    ap.add_argument("--python", default=sys.executable, help="python of the checkout under test (default: this one)")
    ap.add_argument("--sets", default="hta16,small,real,flows")
    ap.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "fleetscope-compare"))
    ap.add_argument("--noise", action="store_true", help="also run the reference twice, to tell nondeterminism apart")
    ap.add_argument("--reuse-ref", action="store_true", help="keep an earlier reference run of a set when it is there")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    total = 0
    for name, landing in _landings(work, [s.strip() for s in a.sets.split(",") if s.strip()]).items():
        ref, new = work / f"{name}-ref", work / f"{name}-new"
        if not (a.reuse_ref and (ref / "w.tables").is_dir()):
            m = run(a.ref_python, landing, ref)
            print(f"{name}: reference run {m['s']:.1f} s, {m['cpu_s']:.1f} CPU-s", flush=True)
        m = run(a.python, landing, new)
        print(f"{name}: this checkout    {m['s']:.1f} s, {m['cpu_s']:.1f} CPU-s", flush=True)
        roots = lambda d: [str(d.resolve()), str(landing.resolve()), str(landing)]
        noise = set()
        if a.noise:
            ref2 = work / f"{name}-ref2"
            run(a.ref_python, landing, ref2)
            noise = {d.split(":")[0] for d in compare(ref, ref2, roots(ref), roots(ref2))[0]}
        diffs, order = compare(ref, new, roots(ref), roots(new))
        if order:
            print(f"  {len(order)} partition(s) hold the same rows in another order (not counted), e.g. {order[0]}")
        for d in diffs:
            tag = " (the reference differs from itself here too)" if d.split(":")[0] in noise else ""
            print(f"  DIFF {d}{tag}")
        real = [d for d in diffs if d.split(":")[0] not in noise]
        total += len(real)
        print(f"{name}: {len(diffs)} difference(s), {len(real)} beyond the reference's own nondeterminism", flush=True)
    print(f"RESULT {'identical' if total == 0 else f'{total} difference(s)'}")
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
