"""fleetscope command line (docs/CONTRACT.md section 3): run, demo, simulate, sql, ui."""
from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
import time
from pathlib import Path

from fleetscope.findings.queries import saved_queries, variables_used

DEFAULT_LANDING, DEFAULT_WAREHOUSE = "data/landing", "data/warehouse.duckdb"
LANDING_KINDS = ("topology", "flows", "traces", "timings", "hw", "stacks", "incidents")


def _die(msg: str, code: int = 2) -> None:
    print(f"fleetscope: error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def _warn(msg: str) -> None:
    print(f"fleetscope: warning: {msg}", file=sys.stderr)


def _defaults(args) -> tuple[Path, Path]:
    landing = Path(getattr(args, "landing", None) or os.environ.get("FLEETSCOPE_LANDING", DEFAULT_LANDING))
    warehouse = Path(getattr(args, "warehouse", None) or os.environ.get("FLEETSCOPE_WAREHOUSE", DEFAULT_WAREHOUSE))
    return landing, warehouse


def _landing_files(landing: Path) -> int:
    return sum(1 for k in LANDING_KINDS if (landing / k).is_dir() for p in (landing / k).rglob("*") if p.is_file())


def _check_landing(landing: Path) -> None:
    if not landing.is_dir():
        _die(f"landing folder {landing} does not exist (set --landing or FLEETSCOPE_LANDING; create it with "
             f"`mkdir -p {landing}/flows {landing}/topology`); docs/CONTRACT.md section 1 gives its layout")


# -- the run summary ---------------------------------------------------------------------------------
def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, width=110, initial_indent=indent, subsequent_indent=indent)


def _summary(landing: Path, warehouse: Path, report, seconds: float) -> int:
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
    if counts.get("captures"):  # the layouts found in trace-only captures (capture.json overrides them)
        caps = wh.read("captures", columns=["capture_id", "tp", "pp", "dp", "world_size", "layout_source"])
        caps = caps.filter(caps["layout_source"].str.starts_with("traces").fill_null(False))
        if caps.height:
            print("\nlayouts from the traces (table `captures`, each rank's place in `capture_ranks`):")
            for c in caps.sort("capture_id").iter_rows(named=True):
                print(f"  {c['capture_id']}: tp {c['tp']} x pp {c['pp']} x dp {c['dp']} = world {c['world_size']}")
    if report.notes:  # what an analysis could not do, and why: said loudly, not buried in metadata
        print("\nwhat the analyses could not do (and why):")
        for (key, note), assets in sorted(report.notes.items()):
            print(_wrap(f"[{key}] {note}", "  ") + f"\n      (assets: {', '.join(sorted(set(assets)))})")
    if counts.get("problems"):
        from fleetscope.findings.reports import problems_text
        print("\n" + problems_text(wh.read("problems"), limit=10))
    elif counts.get("anomaly_verdicts") is not None:
        print("\nno warning or critical findings.")
    if counts.get("rejected_records"):
        rej = wh.sql("SELECT source_kind, count(*) AS n, count(DISTINCT source_file) AS files FROM rejected_records "
                     "GROUP BY 1 ORDER BY 1")
        print("\nquarantined (rejected_records; `fleetscope sql rejected_today` says why):")
        for kind, n, files in rej.iter_rows():
            print(f"  {kind:<12} {n:>8} rows/files in {files} file(s)")
    nonzero = {t: n for t, n in counts.items() if n}
    print("\ntables with rows: " + ", ".join(f"{t} {n:,}" for t, n in nonzero.items()))
    exports = wh.exports_dir()
    print(f"\nwhere to look:"
          f"\n  warehouse  {warehouse}   (`fleetscope sql NAME`, `fleetscope sql --help` for the saved queries; "
          f"or duckdb -readonly {warehouse})"
          f"\n  UI         fleetscope ui --landing {landing} --warehouse {warehouse}   (fleet health, problems, assets at http://127.0.0.1:3000)"
          f"\n  files      {exports}/"
          f"\n               reports/  fleet health and incident reports (markdown + plots)"
          f"\n               perfetto/ reconstructed job timelines with verdict markers (open in ui.perfetto.dev)"
          f"\n               replays/  simulated profiler timelines;  prism/  step-time plots and ideal timelines")
    for j, k in report.failed:
        print(f"  FAILED run {j} [{k}]: see its logs in the UI")
    return 1 if report.failed else 0


def cmd_run(args) -> int:
    landing, warehouse = _defaults(args)
    _check_landing(landing)
    if warehouse.exists():
        import duckdb
        try:
            duckdb.connect(str(warehouse), read_only=True).close()
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower():
                _die(f"warehouse {warehouse} is not a readable DuckDB file ({exc}); move it away or point --warehouse elsewhere")
        except duckdb.Error as exc:
            _die(f"warehouse {warehouse} is not a readable DuckDB file ({exc}); move it away or point --warehouse elsewhere")
    if _landing_files(landing) == 0:
        _warn(f"landing folder {landing} holds no files under {', '.join(f'{k}/' for k in LANDING_KINDS)}: nothing to "
              "analyse. Point --landing at the folder your collectors write to (docs/CONTRACT.md section 1).")
        return 0
    from fleetscope.jobs.runner import run_all

    t0 = time.perf_counter()
    report = run_all(landing, warehouse, settle_s=args.settle_seconds, executor=getattr(args, "executor", None),
                     workers=getattr(args, "workers", 2), full=getattr(args, "full", False))
    return _summary(landing, warehouse, report, time.perf_counter() - t0)


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
    warehouse = Path(args.warehouse or os.environ.get("FLEETSCOPE_WAREHOUSE", DEFAULT_WAREHOUSE))
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


# -- sql ---------------------------------------------------------------------------------------------
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _resolve_sql(query: str) -> tuple[str, str | None]:
    """-> (SQL text, saved query name or None)."""
    name = query.strip()
    if name.lower().endswith(".sql"):
        name = name[:-4]
    saved = saved_queries()
    if _NAME.match(name) and name in saved:  # only a bare name can be a saved query
        return saved[name].sql, name
    if " " in query.strip() or query.strip().lower().startswith(("select", "with", "from", "describe", "show", "summarize", "pivot")):
        return query, None
    _die(f"unknown saved query {query!r}; saved queries: {', '.join(saved) or '(none)'} (`fleetscope sql --help`); "
         "or pass SQL in quotes")
    return "", None


def humanize(df):
    """For people (table output): epoch-ns columns as UTC timestamps, *_ns durations in ms."""
    import polars as pl

    out = []
    for name, dtype in df.schema.items():
        col = pl.col(name)
        if name.endswith("_ns") and dtype.is_integer() and df.height:
            hi = df[name].abs().max()
            if hi is not None and hi > 10**17:  # after 1973: a point in time
                out.append(pl.from_epoch(col, time_unit="ns").dt.replace_time_zone("UTC").alias(name[:-3] + "_utc"))
                continue
            out.append((col / 1e6).round(3).alias(name[:-3] + "_ms"))
            continue
        out.append(col)
    return df.select(out)


def cmd_sql(args) -> int:
    import duckdb
    import polars as pl

    from fleetscope.warehouse import Warehouse

    _, warehouse = _defaults(args)
    wh = Warehouse(warehouse)
    if not wh.tables_dir.exists():
        _die(f"warehouse {warehouse} has no tables yet ({wh.tables_dir} is missing): run `fleetscope run` or `fleetscope demo` first")
    sql, name = _resolve_sql(args.query)
    known = variables_used(sql)
    for var in args.var or []:  # --var k=v -> SET VARIABLE k = 'v' (saved queries read getvariable('k'))
        k, sep, v = var.partition("=")
        if not sep or not _VAR.match(k):
            _die(f"--var expects NAME=VALUE, got {var!r}")
        if k not in known:
            what = f"saved query {name}" if name else "this SQL"
            _die(f"{what} reads no variable {k!r}; its variables: {', '.join(known) or '(none)'}")
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
        shown = humanize(df.head(args.limit))
        with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=120, tbl_width_chars=240, fmt_float="full",
                       tbl_hide_dataframe_shape=True):
            print(shown)
        more = df.height - shown.height
        print(f"{df.height} row(s)" + (f"; {more} more not shown (--limit {df.height} shows all, --format csv for every "
                                        "value as stored)" if more > 0 else ""))
    return 0


# -- ui ----------------------------------------------------------------------------------------------
def cmd_ui(args) -> int:
    landing, warehouse = _defaults(args)
    _check_landing(landing)
    if _landing_files(landing) == 0:
        _warn(f"landing folder {landing} is empty: the sensors will pick up files as they land there")
    from fleetscope.jobs.runner import prepare_environment

    prepare_environment(landing, warehouse)
    from fleetscope.warehouse import Warehouse
    Warehouse(warehouse).init()
    cmd = [sys.executable, "-m", "dagster", "dev", "-m", "fleetscope.definitions",
           "-h", args.host, "-p", str(args.port)]
    print(f"fleetscope ui: Dagster UI on http://{args.host}:{args.port} over {warehouse}, watching {landing} "
          f"(DAGSTER_HOME={os.environ['DAGSTER_HOME']})", flush=True)
    os.execv(sys.executable, cmd)  # replace this process: signals go straight to dagster dev
    return 0


# -- the parser --------------------------------------------------------------------------------------
class _Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _sql_epilog() -> str:
    lines = ["saved queries (fleetscope sql NAME [--var name=value ...]):"]
    for q in saved_queries().values():
        lines.append(textwrap.fill(f"{q.name}: {q.question}", width=100, initial_indent="  ", subsequent_indent="      "))
        for v, doc in q.variables.items():
            lines.append(textwrap.fill(f"--var {v}=...  {doc}", width=100, initial_indent="      ", subsequent_indent="          "))
    lines += ["", "examples:",
              "  fleetscope sql slow_jobs_now",
              "  fleetscope sql job_timeline --var job_id=job-62f6d3586443 --format csv > steps.csv",
              "  fleetscope sql \"SELECT scope, subject, severity, team, explanation FROM anomaly_verdicts WHERE severity = 'critical'\""]
    return "\n".join(lines)


def _fault_kinds() -> str:
    try:
        from fleetscope.sim.faults import KINDS
        return ", ".join(sorted(KINDS))
    except ImportError:  # pragma: no cover - the simulator ships with the package
        return "see fleetscope/sim/faults.py"


def _fill_epilog_on_help(parser: argparse.ArgumentParser, mark: str, text) -> None:
    """Fill `mark` in the parser's epilog with text() only when its help is shown: the fault kinds come
    from the simulator, whose import (~2 s) every other command would otherwise pay."""
    show = parser.format_help

    def format_help() -> str:
        parser.epilog = (parser.epilog or "").replace(mark, text())
        return show()
    parser.format_help = format_help


def build_parser() -> argparse.ArgumentParser:
    env_l = f"default: $FLEETSCOPE_LANDING, else {DEFAULT_LANDING}"
    env_w = f"default: $FLEETSCOPE_WAREHOUSE, else {DEFAULT_WAREHOUSE}"
    p = argparse.ArgumentParser(prog="fleetscope", formatter_class=_Help,
                                description="Performance diagnosis for LLM training fleets: which jobs are slow, why, and "
                                            "whose problem it is.",
                                epilog="examples:\n  fleetscope demo\n  fleetscope run --landing /data/fleet/landing --warehouse "
                                       "/data/fleet/warehouse.duckdb\n  fleetscope sql --help\n  fleetscope ui --landing "
                                       "/data/fleet/landing --warehouse /data/fleet/warehouse.duckdb")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{run,demo,simulate,sql,ui}")
    r = sub.add_parser("run", formatter_class=_Help, help="ingest what landed and materialize every asset (through Dagster)",
                       description="Register what landed, ingest it, run every analysis through Dagster (the runs show in "
                                   "the UI) and print what was found.",
                       epilog="example:\n  fleetscope run --landing /data/fleet/landing --warehouse /data/fleet/warehouse.duckdb")
    r.add_argument("--landing", metavar="DIR", help=f"the landing folder (docs/CONTRACT.md section 1); {env_l}")
    r.add_argument("--warehouse", metavar="FILE", help=f"the DuckDB warehouse file; {env_w}")
    r.add_argument("--settle-seconds", type=float, default=2.0, metavar="S",
                   help="files modified less than S seconds ago are still being written: deferred to the next run")
    r.add_argument("--executor", choices=["in_process", "dask"], default="in_process",
                   help="where runs execute: in this process, or their steps on Dask (a LocalCluster of --workers "
                        "processes, or the scheduler at FLEETSCOPE_DASK_ADDRESS), --workers runs at a time")
    r.add_argument("--workers", type=int, default=2, metavar="N", help="Dask worker processes (with --executor dask)")
    r.add_argument("--full", action="store_true",
                   help="re-run every partition and window this warehouse registered, not only what is due")
    r.set_defaults(fn=cmd_run)
    d = sub.add_parser("demo", formatter_class=_Help, help="simulate a small fleet with faults and run everything on it",
                       description="Simulate a small fleet with injected faults, run every analysis on it, and print what "
                                   "was found next to the simulator's ground truth.")
    d.add_argument("--out", default="data/demo", metavar="DIR", help="where the simulated landing folder and ground truth go")
    d.add_argument("--warehouse", metavar="FILE", help=f"the DuckDB warehouse file; {env_w}")
    d.add_argument("--gpus", type=int, default=64, help="GPUs in the simulated fleet (a multiple of 8)")
    d.add_argument("--minutes", type=float, default=2.0, help="minutes of simulated training")
    d.add_argument("--faults", default="congested_switch:1,slow_gpu:1", metavar="SPEC", help="faults to inject (see `simulate --help`)")
    d.add_argument("--seed", type=int, default=7, help="random seed (fault places, conventions, noise)")
    d.set_defaults(fn=cmd_demo)
    s = sub.add_parser("simulate", formatter_class=_Help, help="write a simulated landing folder and its ground truth",
                       description="Write a simulated fleet's landing folder (DIR/landing) and its ground truth "
                                   "(DIR/ground_truth: jobs, pairs, steps, faults), with conventions drawn per seed.",
                       epilog="fault SPEC: comma-separated KIND:COUNT, e.g. congested_switch:1,slow_gpu:2; `random:N` draws N "
                              "kinds; empty, `none` or `healthy` injects nothing.\nkinds: {kinds}\n\nexample:\n"
                              "  fleetscope simulate --out /tmp/fleet --gpus 256 --minutes 2 --faults degraded_nic:1 --seed 3")
    _fill_epilog_on_help(s, "{kinds}", _fault_kinds)
    s.add_argument("--out", required=True, metavar="DIR", help="an empty folder (or one a previous simulate wrote)")
    s.add_argument("--gpus", type=int, default=64, help="GPUs in the fleet (a multiple of 8)")
    s.add_argument("--jobs", type=int, help="number of training jobs (default: drawn from the fleet size)")
    s.add_argument("--minutes", type=float, default=1.0, help="minutes of simulated training")
    s.add_argument("--faults", default="", metavar="SPEC", help="faults to inject (see below)")
    s.add_argument("--seed", type=int, default=0, help="random seed")
    s.set_defaults(fn=cmd_simulate)
    q = sub.add_parser("sql", formatter_class=_Help, help="run a saved query (by name) or any SQL over the warehouse",
                       description="Run a saved query from sql/ by name, or any SQL (in quotes) over the warehouse's tables "
                                   "(docs/CONTRACT.md section 2).", epilog=_sql_epilog())
    q.add_argument("query", help="a saved query's name, or SQL text in quotes")
    q.add_argument("--warehouse", metavar="FILE", help=f"the DuckDB warehouse file; {env_w}")
    q.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="table: for people (times in UTC, durations in ms); csv / json: every value as stored")
    q.add_argument("--limit", type=int, default=50, help="rows shown in table format (csv and json print every row)")
    q.add_argument("--var", action="append", metavar="NAME=VALUE", help="set a variable the saved query reads (repeatable)")
    q.set_defaults(fn=cmd_sql)
    u = sub.add_parser("ui", formatter_class=_Help, help="the Dagster UI and daemon (sensors, schedules) over the same warehouse",
                       description="Start the Dagster UI and daemon: sensors ingest what lands and analyse it, schedules "
                                   "run the nightly analyses, and the pages show problems, fleet health and every asset.",
                       epilog="example:\n  fleetscope ui --landing /data/fleet/landing --warehouse /data/fleet/warehouse.duckdb")
    u.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only unless you say otherwise)")
    u.add_argument("--port", type=int, default=3000, help="port to listen on")
    u.add_argument("--landing", metavar="DIR", help=f"the landing folder the sensors watch; {env_l}")
    u.add_argument("--warehouse", metavar="FILE", help=f"the DuckDB warehouse file; {env_w}")
    u.set_defaults(fn=cmd_ui)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
