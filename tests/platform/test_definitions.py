"""The code location as a whole: the definitions load, every job resolves, every asset key is the
table it writes, every asset materializes on empty inputs, and the imports run one way
(landing -> ingest -> analyses -> findings -> wiring), with no import cycle between any two files."""
from __future__ import annotations

import ast
import json
import tomllib
from pathlib import Path

from dagster import AssetKey, DagsterInstance

from fleetscope.definitions import defs
from fleetscope.tables import TABLES
from tests.paths import REPO

# assets that are not tables: reports people read, and each analysis' slice of anomaly_verdicts
NOT_TABLES = {"incident_report", "fleet_health", "flows_verdicts", "traces_verdicts", "perftracker_verdicts",
              "xputimer_verdicts", "prism_verdicts", "hang_verdicts"}
# tables without an asset of their name: written in slices by every ingest asset, or by
# the landing registration (no Dagster step)
NO_ASSET = {"rejected_records", "landed_files"}


def _asset_keys() -> set[str]:
    return {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}


def test_definitions_load_and_every_job_resolves():
    defs.validate_loadable(defs)
    repo = defs.get_repository_def()
    jobs = {j.name for j in repo.get_all_jobs()} - {"__ASSET_JOB"}
    assert {"ingest_topology", "ingest_flows", "ingest_hw", "capture_analysis", "incident_analysis",
            "flow_window_analysis", "fleet_analysis", "incident_report_job"} <= jobs
    for name in jobs:
        assert defs.resolve_job_def(name).name == name
    assert {s.name for s in repo.sensor_defs} - {"default_automation_condition_sensor"} == {"landing_sensor", "flow_window_sensor", "incident_sensor",
                                                  "problems_sensor", "critical_verdict_sensor", "degradation_sensor"}
    assert {s.name for s in repo.schedule_defs} == {"nightly_window_schedule", "nightly_fleet_schedule"}


def test_every_asset_is_the_table_it_writes():
    keys = _asset_keys()
    assert keys - NOT_TABLES <= set(TABLES), f"assets that are no table: {sorted(keys - NOT_TABLES - set(TABLES))}"
    assert set(TABLES) - NO_ASSET <= keys, f"tables without an asset: {sorted(set(TABLES) - NO_ASSET - keys)}"


def test_tables_are_declared_once_and_everything_follows():
    """The registry, every table's asset (description, partitions) and docs/TABLES.md all come from
    the one declaration of each table (fleetscope.tables.DECLARED)."""
    from fleetscope.tables import DECLARED, markdown

    assert set(DECLARED) == set(TABLES) and all(TABLES[n] is t.schema for n, t in DECLARED.items())
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        name = key.to_user_string()
        if name in DECLARED:
            node = graph.get(key)
            assert node.description == DECLARED[name].description, name
            parts = node.partitions_def.name if node.partitions_def is not None else None
            assert parts == (DECLARED[name].partitions if DECLARED[name].partitions not in ("all", "slices") else None), name
            # the asset waits for no table its declaration does not say it reads (the analyses'
            # verdict slices that anomaly_verdicts gathers are its own rows)
            upstream = {k.to_user_string() for k in node.parent_keys} - NOT_TABLES
            assert upstream <= set(DECLARED[name].reads), (name, sorted(upstream - set(DECLARED[name].reads)))
    assert (REPO / "docs" / "TABLES.md").read_text() == markdown(), "docs/TABLES.md is stale: python -m fleetscope.tables > docs/TABLES.md"


def _empty_landing(landing: Path) -> None:
    """One file of every landing kind, each with a header and no rows (quarantined: nothing to
    ingest), a capture folder with only its capture.json, and an incident request with no stacks."""
    for kind, header in (("topology", "ip,host\n"), ("flows", "start_ns,duration_ns,src_ip,dst_ip,bytes\n"),
                         ("hw", "ts_ns,host,gpu\n")):
        (landing / kind).mkdir(parents=True)
        (landing / kind / f"{kind}.csv").write_text(header)
    (landing / "traces" / "cap0").mkdir(parents=True)
    (landing / "traces" / "cap0" / "capture.json").write_text(json.dumps({"job_id": "job0"}))
    (landing / "incidents").mkdir()
    (landing / "incidents" / "inc0.json").write_text(json.dumps({"kind": "hang", "job_id": "job0"}))


def test_every_asset_materializes_on_empty_inputs(fleet_env):
    landing, warehouse, _ = fleet_env
    _empty_landing(landing)
    from fleetscope.jobs.runner import run_all
    from fleetscope.warehouse import Warehouse

    report = run_all(landing, warehouse, settle_s=0, log=lambda *_: None)
    with DagsterInstance.get() as instance:  # a window no flow falls into: its analysis has nothing to do
        instance.add_dynamic_partitions("flow_windows", ["w60s-20261121T120000Z"])
        assert defs.resolve_job_def("flow_window_analysis").execute_in_process(
            instance=instance, partition_key="w60s-20261121T120000Z", raise_on_error=False).success
    assert report.runs and not report.failed, report.failed
    with DagsterInstance.get() as instance:
        unmaterialized = [k for k in _asset_keys() if instance.get_latest_materialization_event(AssetKey(k)) is None]
    assert not unmaterialized, f"assets never materialized on empty inputs: {unmaterialized}"
    wh = Warehouse(warehouse)
    for table in TABLES:  # everything written validates against its schema, and holds no invented rows
        df = wh.read(table)
        TABLES[table].validate(df)
    assert wh.read("jobs").height == 0 and wh.read("anomaly_verdicts").height == 0
    assert set(wh.read("rejected_records")["source_kind"].to_list()) >= {"topology", "flows", "hw"}


# -- the imports run one way ---------------------------------------------------------------------
WIRING = ("fleetscope.assets", "fleetscope.jobs", "fleetscope.resources", "fleetscope.definitions", "fleetscope.cli")
ANALYSES = ("flows", "traces", "perftracker", "xputimer", "prism")


def module_files(root: Path, package_dirs: dict[str, str]) -> dict[str, Path]:
    """Every module installed from the checkout, by its import name (a folder mapped to a package
    of its own, like assets/ -> fleetscope.assets, counts under that package only)."""
    out = {}
    for pkg, folder in package_dirs.items():
        nested = [f for p, f in package_dirs.items() if p != pkg and f != folder]
        for p in (root / folder).rglob("*.py"):
            rel = p.relative_to(root / folder)
            if any(p.is_relative_to(root / f) for f in nested):
                continue
            parts = list(rel.with_suffix("").parts)
            out[".".join([pkg, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = p
    return out


def import_graph(files: dict[str, Path], prefix: str = "fleetscope") -> dict[str, set[str]]:
    """module -> the modules it imports, at any depth of the file (an import inside a function is
    still an import: deferring one only hides a cycle), plus the packages whose __init__ that import
    runs (except the module's own, which ran before it)."""
    mods = set(files)

    def resolve(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, p in files.items():
        deps = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module and n.module.startswith(prefix):
                for a in n.names:
                    full = f"{n.module}.{a.name}"
                    deps.add(full if full in mods else resolve(n.module))
            elif isinstance(n, ast.Import):
                deps.update(resolve(a.name) for a in n.names if a.name.startswith(prefix))
        own = {name.rsplit(".", i)[0] for i in range(name.count(".") + 1)}
        inits = {".".join(d.split(".")[:i]) for d in deps for i in range(1, d.count(".") + 1)}
        graph[name] = ((deps | (inits & mods)) - own - {""}) | (deps & own - {name})
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next((w for w in it if w in graph), None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _module_imports() -> dict[str, set[str]]:
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return import_graph(module_files(REPO, dirs))


def test_no_module_imports_itself_through_others():
    """No import cycle between any two files of the library, the wiring or the collectors."""
    graph = _module_imports()
    assert len(graph) > 100 and "fleetscope.jobs.sensors.landing" in graph and "fleetscope.collectors.recorder.truth" in graph
    assert import_cycles(graph) == []


def test_the_cycle_check_sees_deferred_and_package_cycles(tmp_path):
    """The checker itself: a cycle closed by an import inside a function, and one closed through a
    package's __init__, are both found; a package importing its own submodules is not a cycle."""
    pkg = tmp_path / "fleetscope"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from fleetscope.a.x import f\n")
    (pkg / "a" / "x.py").write_text("from fleetscope.a import y\ndef f():\n    return y\n")
    (pkg / "a" / "y.py").write_text("X = 1\n")
    files = module_files(tmp_path, {"fleetscope": "fleetscope"})
    assert import_cycles(import_graph(files)) == []
    (pkg / "a" / "y.py").write_text("def g():\n    from fleetscope.a.x import f\n    return f\n")
    assert import_cycles(import_graph(files)) == [["fleetscope.a.x", "fleetscope.a.y"]]
    (pkg / "a" / "y.py").write_text("X = 1\n")
    (pkg / "b.py").write_text("from fleetscope.a.y import X\n")
    (pkg / "a" / "x.py").write_text("from fleetscope.b import X\ndef f():\n    return X\n")
    files = module_files(tmp_path, {"fleetscope": "fleetscope"})
    assert import_cycles(import_graph(files)) == [["fleetscope.a", "fleetscope.a.x", "fleetscope.b"]]


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_imports_run_one_way():
    imports = _module_imports()
    bad = []
    for mod, deps in imports.items():
        wiring = mod.startswith(WIRING)
        for dep in deps:
            if not wiring and dep.startswith(WIRING):
                bad.append(f"library {mod} imports the wiring {dep}")
            if _area(mod) in ANALYSES and _area(dep) in ANALYSES + ("sim",) and _area(dep) != _area(mod):
                bad.append(f"analysis {mod} imports another analysis or the simulator: {dep}")
            if _area(mod) in ("ingest", "warehouse", "schemas", "common", "findings") \
                    and _area(dep) in ANALYSES:
                bad.append(f"{mod} (below the analyses) imports the analysis {dep}")
            # what runs inside training jobs imports nothing of the platform; the real-fleet recorder (a
            # harness a person runs as root, not inside a job) writes ground truth with the simulator's
            # schemas and reads its recorded timings with the platform's reader
            if mod.startswith("fleetscope.collectors") and not dep.startswith("fleetscope.collectors") \
                    and not (mod.startswith("fleetscope.collectors.recorder") and dep.startswith(("fleetscope.sim", "fleetscope.ingest"))):
                bad.append(f"collector {mod} (runs inside training jobs) imports the platform: {dep}")
    assert not bad, "\n".join(bad)


def test_every_package_is_installed():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = set()
    for pkg, folder in dirs.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            name = ".".join([pkg, *rel.parts]) if rel.parts else pkg
            if not any(name.startswith(p + ".") or name == p for p in dirs if p != pkg and len(p) > len(pkg)):
                found.add(name)
    assert found <= listed, f"packages not in pyproject's list (not installed): {sorted(found - listed)}"
