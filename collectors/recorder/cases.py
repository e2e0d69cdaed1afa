"""Real straggler cases for the what-if analysis (fleetscope.prism.stragglers) and the step-time
forecast: a real gloo PP x DP job (collectors/recorder/train.py, token model, 1F1B, the
fleetscope tracer's op rows) run in network namespaces (one emulated host per pipeline stage), with
one cause of straggling made for real, and the same job re-run without it:

- ``healthy``: nothing (also the re-run without the cause of the others);
- ``slow_worker``: one rank (seeded stage and replica) gets a CPU quota (cgroup v1 cpu controller,
  ``--quota-pct`` of one core, granted every 50 ms): its real matmuls, its Python and its gloo transfers
  run slower, the way a worker on a loaded or throttled host does;
- ``seq``: every microbatch has its own sequence length (log-normal, ``--seq-sigma``, same mean):
  all its compute on every stage scales with its tokens;
- ``heavy_stage``: an uneven layer split (the last stage holds half of the 12 layers: 2,2,2,6 at
  PP4, 4,8 at PP2) against the even split (3,3,3,3 or 6,6) of the re-run.

The truth comes from the ranks' own logs (rank<R>.jsonl: steps, microbatch lengths) and the
runner's own actions (which rank was throttled, by how much); the analysis reads only the op
timings. A case folder holds ``ops.parquet`` (the tracer's op rows, compact: microsecond start
and duration; ``case_timings`` gives them back as the tracer's timings files read through
fleetscope's ingest), ``steps.parquet`` (every rank's step start/end from its log),
``microbatches.parquet`` (seq: tokens per microbatch) and ``truth.json`` (case, layout, cause,
capture.json, machine load before and after, CPU seconds per rank).

    sudo .venv/bin/python -m fleetscope.collectors.recorder.cases --out DIR [--cases healthy,slow_worker,seq,heavy_stage]
        [--steps 400] [--repeats 1] [--seed 0] [--pp 4]

Each case runs at the same time as its own healthy re-run (``<case>-rerun``, same machine load)
unless --no-rerun."""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import polars as pl

from fleetscope.collectors.recorder.fabric import PREFIX, Fabric, Host, clean_stale

KINDS = ("healthy", "slow_worker", "seq", "heavy_stage")
# the job: 8 ranks (PP4 x DP2, or PP2 x DP4), 4 microbatches of 256 tokens, 12 layers of 256 x 256
# split evenly over the stages, 6 / 12 ms emulated forward / backward per layer and 256 tokens
# (about 0.45 s steps at PP4); heavy_stage: the last stage holds half of the layers
JOB_ARGS = ["--micro", "4", "--tokens", "256", "--width", "256", "--layer-fwd-ms", "6", "--layer-bwd-ms", "12", "--clip-grad"]
WORLD, LAYERS = 8, 12
EVEN_LAYERS = {4: "3,3,3,3", 2: "6,6"}
HEAVY_LAYERS = {4: "2,2,2,6", 2: "4,8"}
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
now = time.time_ns


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


class CpuQuota:
    """A cgroup (v1 cpu controller) that lets its processes use `pct` % of one core, granted per
    `period_ms` (the kernel's smallest grant is 1 ms)."""

    def __init__(self, name: str, pct: float, period_ms: float = 50.0):
        self.path = CGROUP_CPU / name
        self.pct, self.period_us = pct, int(period_ms * 1000)

    def __enter__(self):
        if not (CGROUP_CPU / "cpu.cfs_quota_us").exists():
            raise RuntimeError(f"no cgroup v1 cpu controller at {CGROUP_CPU}: cannot throttle a worker for real")
        self.path.mkdir(exist_ok=True)
        (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
        (self.path / "cpu.cfs_quota_us").write_text(str(max(1000, int(self.pct / 100 * self.period_us))))
        return self

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def stats(self) -> dict:
        try:
            return dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        except OSError:
            return {}

    def __exit__(self, *exc):
        for pid in (self.path / "cgroup.procs").read_text().split() if self.path.exists() else []:
            try:  # anything still inside goes back to the root group, so the group can go
                (CGROUP_CPU / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        for _ in range(50):
            try:
                self.path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def case_args(kind: str, pp: int, seq_sigma: float, data_seed: int) -> list[str]:
    layers = HEAVY_LAYERS[pp] if kind == "heavy_stage" else EVEN_LAYERS[pp]
    out = JOB_ARGS + ["--pp", str(pp), "--stage-layers", layers, "--data-seed", str(data_seed)]
    if kind == "seq":
        out += ["--seq-sigma", str(seq_sigma)]
    return out


def record(out: Path, name: str, kind: str, steps: int, seed: int, pp: int = 4, warmup: int = 5, quota_pct: float = 5.0,
           seq_sigma: float = 0.4, timeout_s: float = 1200, slot: int = 0, nice: int = -10) -> Path:
    """Run one case (module doc) in fresh namespaces (`slot` tells concurrent runs of this process
    apart); its folder is out/name."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    rng = random.Random(seed)
    dp = WORLD // pp
    slow = None
    if kind == "slow_worker":
        s, d = rng.randrange(pp), rng.randrange(dp)
        slow = {"rank": s * dp + d, "stage": s, "dp_rank": d, "quota_pct": quota_pct}
    hosts = [Host(f"node{i}", f"10.96.0.{i + 1}", "leaf0") for i in range(pp)]   # one host per stage
    fab = Fabric(hosts, ["leaf0"], "spine0", prefix_len=24, tag=f"{PREFIX}{os.getpid()}-{slot}")
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"fsprism-{name}-"))
    run_dir, landing = tmp / "run", tmp / "landing"
    run_dir.mkdir()
    cap = f"{name}-s{seed}"
    (run_dir / "control.json").write_text(json.dumps({"stop_step": warmup + steps, "straggle": None,
                                                      "windows": [{"capture": cap, "from_step": warmup}]}))
    truth = {"case": name, "kind": kind, "seed": seed, "world": WORLD, "pp": pp, "dp": dp, "tp": 1, "microbatches": 4,
             "capture_id": cap, "warmup_steps": warmup, "steps": steps, "job_args": case_args(kind, pp, seq_sigma, seed),
             "slow_worker": slow, "seq_sigma": seq_sigma if kind == "seq" else 0.0,
             "stage_layers": HEAVY_LAYERS[pp] if kind == "heavy_stage" else EVEN_LAYERS[pp],
             "nice": nice, "uptime_before": _uptime(), "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    procs = []
    quota = CpuQuota(f"fsprism{os.getpid()}-{slot}", quota_pct) if slow else None
    deadline = now() + int((timeout_s + 120) * 1e9)
    try:
        fab.up()
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
        for r in range(WORLD):
            h = hosts[r // dp]
            cmd = ["nice", "-n", str(nice), "ip", "netns", "exec", h.ns, sys.executable, "-m", "fleetscope.collectors.recorder.train", "--job", name,
                   "--rank", str(r), "--world", str(WORLD), "--master", hosts[0].ip, "--port", "29511", "--host", h.name,
                   "--run-dir", str(run_dir), "--landing", str(landing), "--hard-deadline-ns", str(deadline),
                   *truth["job_args"]]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / f"rank{r}.err", "w")))  # noqa: SIM115
        t_end = time.monotonic() + 300
        while sum(1 for r in range(WORLD) if '"ready"' in _read(run_dir / f"rank{r}.jsonl")) < WORLD:
            _check(procs, tmp, done_ok=False)
            if time.monotonic() > t_end:
                raise RuntimeError(f"{name}: ranks not ready after 300 s")
            time.sleep(0.2)
        if quota:
            quota.__enter__()
            quota.add(procs[slow["rank"]].pid)   # nice and ip netns exec exec the rank: same pid
        (run_dir / "go").touch()
        t_end = time.monotonic() + timeout_s
        for p in procs:
            while p.poll() is None:
                _check(procs, tmp, done_ok=True)
                if time.monotonic() > t_end:
                    raise RuntimeError(f"{name}: did not finish in {timeout_s} s")
                time.sleep(0.5)
        _check(procs, tmp, done_ok=True)
        if quota:
            truth["slow_worker"]["cpu_stat"] = quota.stats()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        fab.down()
        if quota:
            quota.__exit__(None, None, None)
    truth["uptime_after"] = _uptime()
    truth["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _collect(tmp, run_dir, landing, cap, d, truth)
    shutil.rmtree(tmp, ignore_errors=True)
    return d


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def _check(procs, tmp: Path, done_ok: bool) -> None:
    for r, p in enumerate(procs):
        rc = p.poll()
        if rc is not None and (rc != 0 or not done_ok):
            raise RuntimeError(f"rank {r} exited with {rc}:\n{_read(tmp / f'rank{r}.err')[-1500:]}")


def _collect(tmp: Path, run_dir: Path, landing: Path, cap: str, d: Path, truth: dict) -> None:
    """The op rows (compact), the ranks' logs as tables, the truth."""
    src = landing / "timings" / cap
    truth["capture_json"] = json.loads((src / "capture.json").read_text())
    raw = pl.concat([pl.read_parquet(p) for p in sorted(src.glob("*.parquet"))], how="diagonal_relaxed")
    compact_ops(raw.filter(pl.col("kind") == "op")).write_parquet(d / "ops.parquet", compression="zstd", compression_level=19)
    rows = [json.loads(line) for r in range(truth["world"]) for line in _read(run_dir / f"rank{r}.jsonl").splitlines()]
    steps = pl.DataFrame([{k: x[k] for k in ("rank", "step", "start_ns", "end_ns")} for x in rows if x["kind"] == "step"])
    steps.write_parquet(d / "steps.parquet", compression="zstd")
    mbs = [x for x in rows if x["kind"] == "microbatch"]
    if mbs:
        pl.DataFrame([{k: x[k] for k in ("step", "dp_rank", "microbatch", "tokens")} for x in mbs]).unique().sort(
            "step", "dp_rank", "microbatch").write_parquet(d / "microbatches.parquet", compression="zstd")
    truth["cpu_s_per_rank"] = {str(x["rank"]): x.get("cpu_s") for x in rows if x["kind"] == "event" and x.get("event") == "finish"}
    truth["op_rows"] = raw.filter(pl.col("kind") == "op").height
    truth["measured_step_ns"] = step_time_ns(steps, truth["warmup_steps"])
    (d / "truth.json").write_text(json.dumps(truth, indent=1))


# the tracer's op rows, kept small: microsecond start and duration (the ops last milliseconds; a
# fused slot's names keep their identical start and end), only the columns ops fill
COMPACT = ("rank", "name", "step", "microbatch", "stage", "dp_rank", "start_us", "dur_us")


def compact_ops(ops: pl.DataFrame) -> pl.DataFrame:
    return (ops.sort("rank", "start_ns", "name")
            .with_columns(start_us=pl.col("start_ns") // 1000, dur_us=((pl.col("end_ns") // 1000) - (pl.col("start_ns") // 1000)).cast(pl.Int32))
            .select(pl.col("rank").cast(pl.Int16), "name", pl.col("step").cast(pl.Int32), pl.col("microbatch").cast(pl.Int8),
                    pl.col("stage").cast(pl.Int8), pl.col("dp_rank").cast(pl.Int8), "start_us", "dur_us"))


def case_timings(d: Path | str, out: Path | str | None = None) -> pl.DataFrame:
    """A case's op rows as the tracer wrote them (the contract's timings files), read back through
    fleetscope's own timings ingest: written to `out` (a temporary folder by default) first."""
    from fleetscope.ingest.timings import read_timings

    d = Path(d)
    truth = json.loads((d / "truth.json").read_text())
    c = pl.read_parquet(d / "ops.parquet")
    full = c.with_columns(start_ns=pl.col("start_us") * 1000, end_ns=(pl.col("start_us") + pl.col("dur_us")) * 1000).select(
        pl.col("rank").cast(pl.Int32), pl.lit("op").alias("kind"), "name", pl.col("start_ns").alias("issue_ns"), "start_ns", "end_ns",
        pl.col("step").cast(pl.Int64), pl.col("microbatch").cast(pl.Int32), pl.col("stage").cast(pl.Int32),
        pl.col("dp_rank").cast(pl.Int32))
    tmp = None
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="fsprism-case-")
        out = tmp.name
    folder = Path(out) / truth["capture_id"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "capture.json").write_text(json.dumps(truth["capture_json"]))
    full.write_parquet(folder / "rank-all-ops.parquet")
    try:
        return read_timings(folder)
    finally:
        if tmp is not None:
            tmp.cleanup()


def step_time_ns(steps: pl.DataFrame, first_step: int) -> float:
    """Mean step time by the ranks' own clocks over the captured steps: per step, the last rank's
    end minus the first rank's start."""
    s = steps.filter(pl.col("step") >= first_step).group_by("step").agg(
        (pl.col("end_ns").max() - pl.col("start_ns").min()).alias("T"))
    return float(s["T"].mean())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(KINDS))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="first seed (repeat k uses seed + k)")
    ap.add_argument("--pp", type=int, default=4, choices=sorted(EVEN_LAYERS))
    ap.add_argument("--quota-pct", type=float, default=5.0)
    ap.add_argument("--seq-sigma", type=float, default=0.4)
    ap.add_argument("--no-rerun", action="store_true")
    ap.add_argument("--nice", type=int, default=-10, help="the ranks' CPU priority (a dedicated host: other people's jobs on a "
                    "shared box then slow them less)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    clean_stale()
    for k in range(a.repeats):
        seed = a.seed + k
        for kind in a.cases.split(","):
            # the case and its re-run without the cause run at the same time: the machine's load
            # (other people's jobs on a shared box) is then the same for both
            runs = [(f"{kind}-s{seed}", kind)]
            if kind != "healthy" and not a.no_rerun:
                runs.append((f"{kind}-s{seed}-rerun", "healthy"))
            t0 = time.monotonic()
            res: dict = {}

            def one(i, name, kd):
                try:
                    res[name] = record(out, name, kd, a.steps, seed, pp=a.pp, quota_pct=a.quota_pct, seq_sigma=a.seq_sigma,
                                       slot=i, nice=a.nice)
                except Exception as exc:  # reported below, after both finished
                    res[name] = exc
            threads = [threading.Thread(target=one, args=(i, n, kd)) for i, (n, kd) in enumerate(runs)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            for name, _ in runs:
                if isinstance(res[name], Exception):
                    raise res[name]
                tr = json.loads((res[name] / "truth.json").read_text())
                print(f"{name}: {tr['measured_step_ns'] / 1e6:.1f} ms/step, {tr['op_rows']} op rows, "
                      f"{time.monotonic() - t0:.0f} s; {tr['uptime_after']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
