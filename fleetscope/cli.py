"""fleetscope command line (docs/CONTRACT.md section 3): run, demo, simulate, sql, ui."""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from fleetscope.project import SQL_DIR



def _die(msg: str, code: int = 2) -> None:
    print(f"fleetscope: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def _defaults(args) -> tuple[Path, Path]:
    landing = Path(getattr(args, "landing", None) or os.environ.get("FLEETSCOPE_LANDING", "data/landing"))
    warehouse = Path(getattr(args, "warehouse", None) or os.environ.get("FLEETSCOPE_WAREHOUSE", "data/warehouse.duckdb"))
    return landing, warehouse


def _summary(warehouse: Path, report, seconds: float) -> int:
    from fleetscope.warehouse import Warehouse

    wh = Warehouse(warehouse)
    counts = wh.row_counts()
    print(f"\nfleetscope run finished in {seconds:.1f} s: {len(report.runs)} Dagster runs, {len(report.failed)} failed")
    reg = report.registration
    if reg is not None:
        for rel, why in reg.deferred:
            print(f"  deferred  {rel}: {why}")
        for rel, dup in reg.duplicates:
            print(f"  duplicate {rel}: same content as {dup}, ingested once")
        for rel, why in reg.ignored:
            print(f"  ignored   {rel}: {why}")
    print("\ntables (rows):")
    for t, n in counts.items():
        print(f"  {t:<28} {n:>12,}")
    if counts.get("rejected_records"):
        rej = wh.sql("SELECT source_kind, count(*) AS n, count(DISTINCT source_file) AS files FROM rejected_records GROUP BY 1 ORDER BY 1")
        print("\nquarantined (rejected_records):")
        for kind, n, files in rej.iter_rows():
            print(f"  {kind:<12} {n:>8} rows/files in {files} file(s)")
    if counts.get("anomaly_verdicts"):
        v = wh.sql("""SELECT severity, team, scope, subject, metric, explanation FROM anomaly_verdicts
                      WHERE severity <> 'info' ORDER BY CASE severity WHEN 'critical' THEN 0 ELSE 1 END, team, scope LIMIT 15""")
        print(f"\nverdicts ({counts['anomaly_verdicts']} in all; warning/critical first):")
        for sev, team, scope, subject, metric, expl in v.iter_rows():
            subj = subject if len(subject) <= 48 else subject[:45] + "..."
            print(f"  {sev:<8} {team:<14} {scope}:{subj}  {metric}\n           {expl[:150]}")
        inc = counts.get("problems") and wh.sql("SELECT severity, title, teams, n_verdicts FROM problems LIMIT 8")
        if inc is not None and inc is not False and inc.height:
            print("\ngrouped into problems (table problems):")
            for sev, title, teams, n in inc.iter_rows():
                print(f"  {sev:<8} {title[:90]}  [{teams}; {n} verdicts]")
    print(f"\nwhere to look:\n  warehouse  {warehouse}   (duckdb -readonly {warehouse}; or `fleetscope sql \"SELECT ...\"`)"
          f"\n  UI         fleetscope ui --warehouse {warehouse}   (assets, runs, metadata at http://127.0.0.1:3000)")
    for j, k in report.failed:
        print(f"  FAILED run {j} [{k}]: see its logs in the UI")
    return 1 if report.failed else 0


def cmd_run(args) -> int:
    landing, warehouse = _defaults(args)
    if not landing.is_dir():
        _die(f"landing folder {landing} does not exist (set --landing or FLEETSCOPE_LANDING); see docs/CONTRACT.md section 1 for its layout")
    if warehouse.exists():
        import duckdb
        try:
            duckdb.connect(str(warehouse), read_only=True).close()
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                _die(f"warehouse {warehouse} is not a readable DuckDB file ({exc}); move it away or point --warehouse elsewhere")
        except duckdb.Error as exc:
            _die(f"warehouse {warehouse} is not a readable DuckDB file ({exc}); move it away or point --warehouse elsewhere")
    from fleetscope.jobs.runner import run_all

    t0 = time.perf_counter()
    report = run_all(landing, warehouse, settle_s=args.settle_seconds)
    return _summary(warehouse, report, time.perf_counter() - t0)


def cmd_simulate(args) -> int:
    from fleetscope.sim import simulate

    out = Path(args.out)
    t0 = time.perf_counter()
    summary = simulate(out, gpus=args.gpus, jobs=args.jobs, minutes=args.minutes, faults=args.faults or "", seed=args.seed)
    print(f"simulated into {out}/landing (ground truth in {out}/ground_truth) in {time.perf_counter() - t0:.1f} s")
    for k, v in (summary or {}).items():
        if not isinstance(v, (list, dict)):
            print(f"  {k}: {v}")
    return 0


def cmd_demo(args) -> int:
    out = Path(args.out)
    warehouse = Path(args.warehouse or os.environ.get("FLEETSCOPE_WAREHOUSE", "data/warehouse.duckdb"))
    print(f"[1/2] simulating a {args.gpus}-GPU demo fleet ({args.minutes} min, faults: {args.faults}) into {out}")
    ns = argparse.Namespace(out=str(out), gpus=args.gpus, jobs=None, minutes=args.minutes, faults=args.faults, seed=args.seed)
    cmd_simulate(ns)
    print(f"[2/2] fleetscope run --landing {out / 'landing'} --warehouse {warehouse}")
    rc = cmd_run(argparse.Namespace(landing=str(out / "landing"), warehouse=str(warehouse), settle_seconds=0.0))
    truth = out / "ground_truth" / "faults.csv"
    if truth.exists():
        print(f"\nthe simulator's injected faults (ground truth, never read by the analyses): {truth}")
        print("".join("  " + line for line in truth.read_text().splitlines(True)[:12]))
    return rc


_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _resolve_sql(query: str) -> str:
    name = query.strip()
    if name.lower().endswith(".sql"):
        name = name[:-4]
    if _NAME.match(name) and (SQL_DIR / f"{name}.sql").exists():  # only a bare name can be a saved query
        return (SQL_DIR / f"{name}.sql").read_text()
    if " " in query.strip() or query.strip().lower().startswith(("select", "with", "from", "describe", "show", "summarize", "pivot")):
        return query
    saved = sorted(p.stem for p in SQL_DIR.glob("*.sql"))
    _die(f"unknown saved query {query!r}; saved queries: {', '.join(saved) or '(none)'}; or pass SQL in quotes")
    return ""


def cmd_sql(args) -> int:
    import duckdb
    import polars as pl

    from fleetscope.warehouse import Warehouse

    _, warehouse = _defaults(args)
    wh = Warehouse(warehouse)
    if not wh.tables_dir.exists():
        _die(f"warehouse {warehouse} has no tables yet ({wh.tables_dir} is missing): run `fleetscope run` or `fleetscope demo` first")
    sql = _resolve_sql(args.query)
    for var in args.var or []:  # --var k=v -> SET VARIABLE k = 'v' (saved queries read getvariable('k'))
        k, sep, v = var.partition("=")
        if not sep or not _NAME.match(k):
            _die(f"--var expects NAME=VALUE, got {var!r}")
        sql = f"SET VARIABLE {k} = '{v.replace(chr(39), chr(39) * 2)}';\n" + sql
    try:
        df = wh.sql(sql)
    except duckdb.Error as exc:
        _die(f"query failed: {exc}")
    if args.format == "csv":
        sys.stdout.write(df.write_csv())
    elif args.format == "json":
        sys.stdout.write(df.write_json() + "\n")
    else:
        with pl.Config(tbl_rows=args.limit, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=200):
            print(df)
    return 0


def cmd_ui(args) -> int:
    landing, warehouse = _defaults(args)
    from fleetscope.jobs.runner import prepare_environment

    prepare_environment(landing, warehouse)
    from fleetscope.warehouse import Warehouse
    Warehouse(warehouse).init()
    cmd = [sys.executable, "-m", "dagster", "dev", "-m", "fleetscope.definitions",
           "-h", args.host, "-p", str(args.port)]
    print(f"fleetscope ui: Dagster UI on http://{args.host}:{args.port} over {warehouse} (DAGSTER_HOME={os.environ['DAGSTER_HOME']})", flush=True)
    os.execv(sys.executable, cmd)  # replace this process: signals go straight to dagster dev
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fleetscope", description="Performance diagnosis for LLM training fleets.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="ingest what landed and materialize every asset (through Dagster)")
    r.add_argument("--landing")
    r.add_argument("--warehouse")
    r.add_argument("--settle-seconds", type=float, default=2.0, help="files modified more recently are deferred (still being written)")
    r.set_defaults(fn=cmd_run)
    d = sub.add_parser("demo", help="simulate the embedded demo fleet and run everything on it")
    d.add_argument("--out", default="data/demo")
    d.add_argument("--warehouse")
    d.add_argument("--gpus", type=int, default=64)
    d.add_argument("--minutes", type=float, default=2.0)
    d.add_argument("--faults", default="congested_switch:1,slow_gpu:1")
    d.add_argument("--seed", type=int, default=7)
    d.set_defaults(fn=cmd_demo)
    s = sub.add_parser("simulate", help="write a simulated landing folder and its ground truth")
    s.add_argument("--out", required=True)
    s.add_argument("--gpus", type=int, default=64)
    s.add_argument("--jobs", type=int)
    s.add_argument("--minutes", type=float, default=1.0)
    s.add_argument("--faults", default="")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(fn=cmd_simulate)
    q = sub.add_parser("sql", help="run a saved query from sql/ (by name) or any SQL over the warehouse")
    q.add_argument("query")
    q.add_argument("--warehouse")
    q.add_argument("--format", choices=["table", "csv", "json"], default="table")
    q.add_argument("--limit", type=int, default=50)
    q.add_argument("--var", action="append", metavar="NAME=VALUE", help="set a variable a saved query reads (repeatable)")
    q.set_defaults(fn=cmd_sql)
    u = sub.add_parser("ui", help="the Dagster UI (and daemon: sensors, schedules, automation) over the same warehouse")
    u.add_argument("--host", default="127.0.0.1")
    u.add_argument("--port", type=int, default=3000)
    u.add_argument("--landing")
    u.add_argument("--warehouse")
    u.set_defaults(fn=cmd_ui)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
