"""The Dagster UI in a real browser: `fleetscope ui` over a warehouse with data, driven by headless
Chromium (Debian's package) through the DevTools protocol (tests/ui/cdp.py).

One module-scoped server (it takes ~30-60 s to load the code location here): simulate a small fleet,
`fleetscope run` it, start `fleetscope ui` on a free loopback port in its own session, wait for
the code location through GraphQL, then check pages the way a person reads them (the rendered
text), against ground truth the UI never computes (row counts and columns of the parquet
partitions in the warehouse). Screenshots go to a temporary folder whose paths are printed
(`pytest -s` or -rA shows them) and kept for the run."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import polars as pl
import pytest

from tests.ui.cdp import Browser, find_chromium  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.browser, pytest.mark.slow]
CHROMIUM = find_chromium()
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
SHOTS: list[Path] = []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _listen_addresses(port: int) -> set[str]:
    """Local addresses with a LISTEN socket on this port, from /proc/net/tcp{,6} (no tools needed)."""
    out = set()
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        if not os.path.exists(name):
            continue
        for line in Path(name).read_text().splitlines()[1:]:
            parts = line.split()
            addr, hexport = parts[1].split(":")
            if int(hexport, 16) != port or parts[3] != "0A":  # 0A = LISTEN
                continue
            if width == 8:
                out.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
            else:
                raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8))
                out.add(socket.inet_ntop(socket.AF_INET6, raw))
    return out


def _graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(NO_PROXY.open(req, timeout=20).read())


def _cli(*args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "fleetscope.cli", *args], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"fleetscope {' '.join(args)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _stop_group(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM the whole session (dagster dev, webserver, daemon, code server), SIGKILL after a timeout."""
    try:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    try:  # children that outlived the parent
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium chromium-driver; scripts/setup.sh --with-system does it)")
    tmp = tmp_path_factory.mktemp("ui")
    out, warehouse, home = tmp / "sim", tmp / "wh" / "warehouse.duckdb", tmp / "dagster_home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSCOPE_")}
    env.update(DAGSTER_HOME=str(home), PYTHONPATH=str(REPO), FLEETSCOPE_LANDING=str(out / "landing"),
               FLEETSCOPE_WAREHOUSE=str(warehouse), FLEETSCOPE_SENSOR_INTERVAL_SECONDS="600")
    # a hang: its stack dumps make a critical finding certain (the failed asset check below needs one)
    _cli("simulate", "--out", str(out), "--gpus", "16", "--minutes", "1", "--faults", "congested_switch:1,hang:1", env=env)
    _cli("run", "--landing", str(out / "landing"), "--warehouse", str(warehouse), "--settle-seconds", "0", env=env, timeout=600)
    port = _free_port()
    log = open(tmp / "ui.log", "w")
    # no --host: the default must be loopback
    proc = subprocess.Popen([sys.executable, "-m", "fleetscope.cli", "ui", "--port", str(port), "--landing", str(out / "landing"),
                             "--warehouse", str(warehouse)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    shots = Path(os.environ.get("FLEETSCOPE_UI_SCREENSHOTS") or tmp / "screenshots")  # CI: keep them as artifacts
    shots.mkdir(parents=True, exist_ok=True)
    state = {"port": port, "proc": proc, "warehouse": warehouse, "shots": shots, "tmp": tmp, "log": tmp / "ui.log"}
    try:
        deadline, last = time.time() + 300, None
        while time.time() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"fleetscope ui exited with {proc.returncode}:\n{(tmp / 'ui.log').read_text()[-4000:]}")
            try:
                ws = _graphql(port, "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
                                    "locationOrLoadError { __typename ... on PythonError { message } } } } } }")
                entries = ws["data"]["workspaceOrError"]["locationEntries"]
                last = entries
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    errors = [e for e in entries if e["locationOrLoadError"]["__typename"] != "RepositoryLocation"]
                    assert not errors, f"code location failed to load: {errors}"
                    nodes = _graphql(port, "{ assetNodes { assetKey { path } groupName } }")["data"]["assetNodes"]
                    if nodes:
                        state["location"] = entries[0]["name"]
                        state["assets"] = {n["assetKey"]["path"][-1]: n["groupName"] for n in nodes}
                        break
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(2)
        else:
            raise AssertionError(f"code location not loaded within 300 s (last answer {last}):\n{(tmp / 'ui.log').read_text()[-4000:]}")
        browser = Browser(CHROMIUM, tmp / "chromium-profile")
        state["browser"] = browser
        yield state
    finally:
        if "browser" in state:
            state["browser"].close()
        _stop_group(proc)
        log.close()
        print("\nscreenshots:\n" + "\n".join(f"  {p}" for p in SHOTS))


def _dismiss_community_dialog(b: Browser) -> bool:
    """Dagster shows a "Join the Dagster community" dialog over the first pages of a new profile
    (sometimes a few seconds after the page renders); it blocks clicks. Skip it."""
    return bool(b.evaluate("(() => { if (!document.body.innerText.includes('Join the Dagster community')) return false;"
                           " const x = [...document.querySelectorAll('button')].find(e => e.innerText.trim() === 'Skip');"
                           " if (x) { x.click(); return true } return false })()"))


def _click_until(b: Browser, label: str, expect: list[str], tries: int = 4) -> str:
    """Click an element by its text until the page shows what the click should reveal (a dialog can
    be dismissed by a re-render when the daemon records a new materialization meanwhile)."""
    for _ in range(tries):
        _dismiss_community_dialog(b)
        assert b.click_text(label), f"nothing labelled {label!r} on the page"
        try:
            return b.wait_for_text(expect, timeout_s=10)
        except AssertionError:
            continue
    return b.wait_for_text(expect, timeout_s=1)


def _open(ui, path: str, needles: list[str], shot: str, height: int = 1000, absent: tuple[str, ...] = ("Loading...",)) -> str:
    b: Browser = ui["browser"]
    b.call("Emulation.setDeviceMetricsOverride", width=1600, height=height, deviceScaleFactor=1, mobile=False)
    b.goto(f"http://127.0.0.1:{ui['port']}{path}")
    text = b.wait_for_text(needles, timeout_s=120)
    time.sleep(1.0)
    if _dismiss_community_dialog(b):
        time.sleep(0.5)
    deadline = time.time() + 60  # placeholders ("Loading...") still waiting for their GraphQL answers
    while any(a in text for a in absent) and time.time() < deadline:
        time.sleep(0.5)
        text = b.text()
    time.sleep(1.0)  # let the last requests paint before the screenshot
    p = b.screenshot(ui["shots"] / f"{shot}.png", full_page=False)
    SHOTS.append(p)
    assert p.stat().st_size > 10_000, f"screenshot {p} looks empty"
    return b.text() or text


def _partition_truth(warehouse: Path, table: str) -> tuple[str, int, list[str]]:
    """The newest non-empty partition of a table straight from its parquet file: key, rows, columns."""
    files = [f for f in (warehouse.parent / (warehouse.stem + ".tables") / table).glob("*.parquet")
             if f.stem != "_empty" and pq.ParquetFile(f).metadata.num_rows > 0]
    assert files, f"{table} has no data in the warehouse: the run did not produce it"
    f = max(files, key=lambda p: p.stat().st_mtime)
    meta = pq.ParquetFile(f)
    return f.stem, meta.metadata.num_rows, meta.schema_arrow.names


def test_ui_binds_to_loopback_only(ui):
    addrs = _listen_addresses(ui["port"])
    assert addrs, f"nothing listens on port {ui['port']}"
    assert addrs <= {"127.0.0.1", "::1"}, f"the UI listens on {addrs}, not only on loopback"
    # and from a non-loopback address of this machine it cannot be reached
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            own = s.getsockname()[0]
    except OSError:
        own = None
    if own and not own.startswith("127."):
        with socket.socket() as s:
            s.settimeout(3)
            assert s.connect_ex((own, ui["port"])) != 0, f"the UI answers on {own}:{ui['port']}"


def test_asset_graph_shows_every_group_and_asset(ui):
    assets, groups = ui["assets"], sorted(set(ui["assets"].values()))
    for must in ("topology", "flows", "hw", "timings", "trace_events"):
        assert must in assets, f"ingest asset {must} missing from the code location: {sorted(assets)}"
    text = _open(ui, "/asset-groups", ["Global asset lineage", *groups], "01_global_asset_lineage")
    assert "Reload definitions" in text
    # one group's graph with its asset nodes (the graph only renders what fits: use a tall viewport)
    ingest = [a for a, g in assets.items() if g == "ingest"]
    # (the graph renders only the nodes inside the viewport, and the layout grows with the code
    # location: require the two nodes checked below; the catalog checks every asset)
    assert {"flows", "topology"} <= set(ingest), ingest
    text = _open(ui, f"/locations/{ui['location']}/asset-groups/ingest", ["flows", "topology", "Latest event"],
                 "02_ingest_group_graph", height=12000)
    assert "Latest event" in text and "Loading..." not in text
    n_flow_files = len([f for f in (ui["warehouse"].parent / (ui["warehouse"].stem + ".tables") / "flows").glob("*.parquet") if f.stem != "_empty"])
    assert f"{n_flow_files} partitions" in text, f"the flows node does not show its {n_flow_files} partitions"
    # the catalog lists every asset with its description
    text = _open(ui, "/assets", ["flows", "topology"], "03_asset_catalog", height=8000)
    missing = [a for a in assets if a not in text]
    assert not missing, f"assets not on the catalog page: {missing}"
    assert "Switch-mirrored flow records" in text  # the flows asset's description


def _value_after(text: str, label: str) -> str:
    """The first non-empty line after a metadata label in the rendered text (the value cell)."""
    lines = [ln.strip() for ln in text.splitlines()]
    assert label in lines, f"metadata {label} not on the page"
    return next(ln for ln in lines[lines.index(label) + 1:] if ln)


def test_latest_materialization_shows_row_count_schema_and_preview(ui):
    table = "step_timelines" if "step_timelines" in ui["assets"] else "flows"
    key, rows, columns = _partition_truth(ui["warehouse"], table)
    first = pq.read_table(ui["warehouse"].parent / (ui["warehouse"].stem + ".tables") / table / f"{key}.parquet").slice(0, 1).to_pylist()[0]
    b: Browser = ui["browser"]
    # the asset's latest materialization of that partition, in the Events view
    text = _open(ui, f"/assets/{table}?view=events&partition={key}", ["materialized in run", "dagster/row_count"],
                 f"04_{table}_latest_materialization")
    assert f"Partition {key} materialized in run" in text
    assert _value_after(text, "dagster/row_count").replace(",", "") == str(rows), f"row count differs from the parquet's {rows}"
    # the schema attached to the materialization: open it as a person would
    schema_label = next((ln for ln in ("dagster/column_schema", f"{table}/schema") if ln in text.splitlines()), None)
    assert schema_label, "no schema metadata on the materialization"
    shown = _click_until(b, "[Show Table Schema]", ["Column name"])
    dialog = shown[shown.rfind(schema_label):]
    missing = [c for c in columns if c not in dialog]
    assert not missing, f"columns of the parquet partition missing from the UI's schema: {missing}"
    SHOTS.append(b.screenshot(ui["shots"] / f"05_{table}_schema_dialog.png", full_page=False))
    # the preview: the first rows as written (compare with the parquet's first row)
    text = _open(ui, f"/assets/{table}?view=events&partition={key}", ["dagster/row_count"], f"06_{table}_events_again")
    _click_until(b, "[Show Markdown]", [str(first[c]) for c in columns[:3]])
    SHOTS.append(b.screenshot(ui["shots"] / f"07_{table}_preview_dialog.png", full_page=False))


def test_asset_overview_shows_columns_row_count_and_metadata_plots(ui):
    key, rows, columns = _partition_truth(ui["warehouse"], "flows")
    text = _open(ui, f"/assets/flows?view=events&partition={key}", ["rows_in", "rows_kept", "rows_rejected"], "08_flows_ingest_counts")
    assert _value_after(text, "rows_kept").replace(",", "") == str(rows), f"rows_kept vs {rows} rows in the parquet partition"
    assert int(_value_after(text, "rows_in").replace(",", "")) == rows + int(_value_after(text, "rows_rejected").replace(",", ""))
    # the overview: latest materialization, row count, the Columns table, then the metadata Plots
    text = _open(ui, "/assets/flows", ["Latest materialization", "Columns", "Metadata", "Plots"], "09_flows_overview", height=2400)
    missing = [c for c in columns if c not in text]
    assert not missing, f"columns missing from the flows overview: {missing}"
    b: Browser = ui["browser"]
    _click_until(b, "Plots", ["When graphing values by partition"])
    time.sleep(2)
    numeric = ["dagster/row_count", "files_in", "files_rejected", "rows_in", "rows_kept", "rows_rejected"]
    n_charts = b.evaluate("document.querySelectorAll('canvas').length") or 0
    SHOTS.append(b.screenshot(ui["shots"] / "10_flows_metadata_plots.png", full_page=False))
    assert n_charts >= len(numeric), f"{n_charts} charts for {len(numeric)} numeric metadata series"


def _problems(ui) -> pl.DataFrame:
    files = [f for f in (ui["warehouse"].parent / (ui["warehouse"].stem + ".tables") / "problems").glob("*.parquet")]
    return pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed") if files else pl.DataFrame()


def test_verdicts_page_lists_every_finding_worst_first(ui):
    """/assets/anomaly_verdicts: one page with every detector's warning and critical findings."""
    files = list((ui["warehouse"].parent / (ui["warehouse"].stem + ".tables") / "anomaly_verdicts").glob("*.parquet"))
    v = pl.concat([pl.read_parquet(f) for f in files], how="diagonal_relaxed").filter(pl.col("severity") != "info")
    assert v.height, "the fleet raised no warning or critical finding: nothing to show"
    crit = v.filter(pl.col("severity") == "critical").sort("start_ns").row(0, named=True)
    text = _open(ui, "/assets/anomaly_verdicts?view=events", ["aterialized in run", "warning_and_critical"], "13_verdicts_page",
                 height=2000)
    if "[Show Markdown]" in text:  # a long table is behind a link; a short one is shown inline
        _click_until(ui["browser"], "[Show Markdown]", ["critical"])
    text = ui["browser"].text()
    assert crit["subject"] in text and crit["detector"] in text, "the critical finding is not on the verdicts page"
    assert text.find("critical") < text.find("warning") or "warning" not in text  # worst first
    SHOTS.append(ui["browser"].screenshot(ui["shots"] / "13_verdicts_markdown.png", full_page=False))


def test_a_critical_problem_fails_its_asset_check(ui):
    probs = _problems(ui)
    assert (probs["severity"] == "critical").any(), probs.select("severity", "title")
    checks = _graphql(ui["port"], '{ assetNodeOrError(assetKey: {path: ["problems"]}) { ... on AssetNode { assetChecksOrError '
                                  '{ ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } } } } }')
    status = {c["name"]: (c["executionForLatestMaterialization"] or {}).get("status")
              for c in checks["data"]["assetNodeOrError"]["assetChecksOrError"]["checks"]}
    assert status.get("no_critical_problems") == "FAILED", status
    text = _open(ui, "/assets/problems?view=checks", ["no_critical_problems"], "14_failed_asset_check")
    assert "Failed" in text, "the checks page does not show the failed check"


def test_fleet_health_page_leads_with_the_open_problems(ui):
    probs = _problems(ui)
    assert probs.height
    top = probs.sort(probs["severity"].replace_strict({"critical": 0, "warning": 1}, default=2)).row(0, named=True)
    _open(ui, "/assets/fleet_health?view=events", ["aterialized in run", "report"], "15_fleet_health")
    text = _click_until(ui["browser"], "[Show Markdown]", ["Open problems"])
    assert top["title"][:60] in text and top["action"][:40] in text, "the worst problem and what to do are not on the page"
    SHOTS.append(ui["browser"].screenshot(ui["shots"] / "15_fleet_health_markdown.png", full_page=False))


def test_fleet_health_plots_when_materialized(ui):
    assert "fleet_health" in ui["assets"], "no fleet_health asset in the code location"
    recs = _graphql(ui["port"], '{ assetOrError(assetKey: {path: ["fleet_health"]}) { ... on Asset { assetMaterializations(limit: 1) '
                                 "{ metadataEntries { label } } } } }")["data"]["assetOrError"]["assetMaterializations"]
    assert recs, "fleet_health was not materialized by `fleetscope run`"
    labels = [e["label"] for e in recs[0]["metadataEntries"]]
    plots = [lb for lb in labels if lb.startswith("plot")]
    text = _open(ui, "/assets/fleet_health?view=events", ["aterialized in run", *labels[:1]], "11_fleet_health")
    missing = [lb for lb in labels if lb not in text]
    assert not missing, f"fleet_health metadata not shown: {missing}"
    assert plots, f"fleet_health has no plot metadata: {labels}"
    # the report itself, with its plots inlined: the browser must have decoded real images
    b: Browser = ui["browser"]
    if "report" in labels:
        _click_until(b, "[Show Markdown]", ["report"])
        deadline, n_img = time.time() + 30, 0
        while time.time() < deadline and not n_img:
            n_img = b.evaluate("[...document.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth > 100).length") or 0
            time.sleep(0.5)
        b.evaluate("(() => { const i = [...document.querySelectorAll('img')].find(i => i.naturalWidth > 100);"
                   " if (i) i.scrollIntoView({block: 'center'}); })()")
        time.sleep(0.5)
        SHOTS.append(b.screenshot(ui["shots"] / "12_fleet_health_plot.png", full_page=False))
        assert n_img >= 1, "the fleet health page shows no decoded plot image"


def _live_in_group(pgid: int) -> list[str]:
    """Processes of a session that are still alive (zombies waiting for a reaper do not count)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(stat.parent.name)
    return out


def test_stopping_the_ui_frees_the_port(ui):
    """Last in the module: SIGTERM to the session stops dagster dev and every child; the port is free."""
    port, proc = ui["port"], ui["proc"]
    assert _port_in_use(port)
    t0 = time.time()
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=90)
    deadline = time.time() + 30
    while (_port_in_use(port) or _live_in_group(proc.pid)) and time.time() < deadline:
        time.sleep(0.5)
    left = _live_in_group(proc.pid)
    _stop_group(proc)  # no-op when the SIGTERM did its job
    assert not left, f"processes {left} of the UI session survived SIGTERM"
    assert not _port_in_use(port), f"port {port} still in use after stopping the UI"
    print(f"\nUI stopped by SIGTERM in {time.time() - t0:.1f} s")
