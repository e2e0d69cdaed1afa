"""Record a real multi-tenant fleet: two PyTorch gloo jobs on six emulated hosts, captured at the
switches, written as a fleetscope landing folder plus ground truth from the jobs' own logs.

    python -m fleetscope.collectors.recorder --scenario healthy --out DIR [--seconds 35 --seed 0]   (root)

Fleet: hosts in network namespaces on two leaf bridges joined through a spine bridge
(fabric.py); a checkpoint store and a probing monitor on a seventh, infrastructure namespace
(services.py). Job A: PP2 x DP2 (1F1B, synchronous per-tensor gradient all-reduce), its DP pairs
across the leaves, its PP pairs inside one; job B: DP2 DDP with ~0.33 s steps, launched a little
after the capture starts, loading a checkpoint from the store, and finishing before it stops.
Scenarios add one fault at a seeded time and place (truth.FAULTS says what each is). Each leaf is captured with
tcpdump (headers only, ns stamps; each packet once, at its ingress leaf), converted to flow
records (collectors/flowcap) and the pcap deleted.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from fleetscope.collectors.recorder.fabric import Fabric, Host, clean_stale

SCENARIOS = ("healthy", "straggler", "slow_link", "congested_uplink")
STORE_PORT = 7070
now = time.time_ns


def _stamp(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y%m%dT%H%M%S")


@dataclass
class Job:
    job_id: str
    tenant: str
    pp: int
    dp: int
    hosts: list            # Host per rank (rank = stage * dp + dp_rank)
    args: list             # extra train.py arguments
    go_s: float            # when it launches, seconds after the capture starts
    stop_s: float | None   # when it is told to finish (None: at the capture's end, cut by it)
    profile1: int          # first profiled step (window 1)
    run_dir: Path = None
    procs: list = field(default_factory=list)
    control: dict = field(default_factory=dict)
    windows: list = field(default_factory=list)

    def write_control(self):
        tmp = self.run_dir / "control.json.tmp"
        tmp.write_text(json.dumps(self.control))
        os.replace(tmp, self.run_dir / "control.json")  # ranks never read half a file

    def progress(self) -> int:
        """Highest step any rank has finished (-1: none yet), from the ranks' own logs."""
        best = -1
        for r in range(len(self.hosts)):
            p = self.run_dir / f"rank{r}.jsonl"
            if p.exists():
                with open(p, "rb") as fh:
                    fh.seek(max(0, p.stat().st_size - 4096))
                    for line in fh.read().splitlines()[::-1]:
                        if b'"kind": "step"' in line:
                            try:
                                best = max(best, json.loads(line)["step"])
                            except ValueError:
                                continue
                            break
        return best

    def n_ready(self) -> int:
        return sum((self.run_dir / f"rank{r}.jsonl").exists() for r in range(len(self.hosts)))


# Layouts of the recorder matrix: the jobs of one recording, each (pp, dp, train.py arguments). The
# first job runs from the capture's start and is cut by its end (faults hit it); a second one
# launches a second in, loads a checkpoint and finishes before the capture ends. Step times (on an
# idle box): 1F1B ~ (micro + pp - 1) x (fwd + bwd), DDP ~ fwd + bwd. "shared" puts its two jobs on the
# same four hosts (two NICs per host, one per job), as a tenant's two jobs split by GPU.
LAYOUTS = {
    "pp2dp2+dp2": [(2, 2, ["--micro", "4", "--fwd-ms", "50", "--bwd-ms", "90"]),
                   (1, 2, ["--micro", "1", "--mb", "128", "--fwd-ms", "110", "--bwd-ms", "260"])],
    "dp2": [(1, 2, ["--micro", "1", "--mb", "64", "--fwd-ms", "50", "--bwd-ms", "120"])],
    "dp4": [(1, 4, ["--micro", "1", "--mb", "128", "--fwd-ms", "120", "--bwd-ms", "280"])],
    "pp2": [(2, 1, ["--micro", "4", "--fwd-ms", "15", "--bwd-ms", "30"])],
    "pp4": [(4, 1, ["--micro", "8", "--fwd-ms", "30", "--bwd-ms", "60"])],
    "pp2dp3": [(2, 3, ["--micro", "4", "--fwd-ms", "40", "--bwd-ms", "80"])],
    "shared": [(2, 2, ["--micro", "4", "--fwd-ms", "35", "--bwd-ms", "70"]),
               (1, 4, ["--micro", "1", "--mb", "96", "--fwd-ms", "90", "--bwd-ms", "200"])],
    "slow3s": [(2, 2, ["--micro", "4", "--fwd-ms", "280", "--bwd-ms", "480"])],
    # FSDP2: every unit's all-gathers and reduce-scatters spread over the step (no one quiet time
    # per step stands out the way a DDP job's forward pass does)
    "fsdp2": [(1, 2, ["--fsdp", "--micro", "1", "--mb", "64", "--width", "512", "--layers", "6",
                      "--fwd-ms", "90", "--bwd-ms", "180"])],
    "fsdp4": [(1, 4, ["--fsdp", "--micro", "2", "--mb", "64", "--width", "512", "--layers", "4",
                      "--fwd-ms", "70", "--bwd-ms", "140"])],
}


def make_plan(scenario: str, seconds: float, seed: int, layout: str = "pp2dp2+dp2"):
    """Names, addresses, placement, timing and the fault, all drawn from the seed (so nothing
    downstream can rely on an address pattern or a fixed fault place)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; one of {sorted(LAYOUTS)}")
    rng = random.Random(f"{scenario}-{seed}" if layout == "pp2dp2+dp2" else f"{scenario}-{layout}-{seed}")
    specs = LAYOUTS[layout]
    shared = layout == "shared"
    n_nics = sum(pp * dp for pp, dp, _ in specs)
    n_hosts = n_nics // 2 if shared else n_nics
    net = rng.randint(16, 250)
    octs = rng.sample(range(1, 250 * 250), n_nics + 2)
    ips = [f"10.{net}.{o // 250}.{o % 250 + 1}" for o in octs]
    names = [f"node{n:03d}" for n in rng.sample(range(1, 999), n_hosts)]
    leaves = [f"leaf{n:02d}" for n in sorted(rng.sample(range(1, 60), 2))]
    spine = f"spine{rng.randint(1, 9)}"
    half = -(-n_hosts // 2)
    host_leaf = [leaves[0] if i < half else leaves[1] for i in range(n_hosts)]
    # a NIC per rank; "shared": NIC k of host h serves job k
    nics = [Host(names[i % n_hosts] if shared else names[i], ips[i], host_leaf[i % n_hosts]) for i in range(n_nics)]
    if layout == "pp2dp2+dp2":
        # A's DP pairs cross the spine, its PP pairs stay in a leaf; B's DP pair crosses too
        l0, l1 = rng.sample(nics[:3], 3), rng.sample(nics[3:6], 3)
        placed = [[l0[0], l1[0], l0[1], l1[1]], [l0[2], l1[2]]]
    else:   # ranks placed across the leaves at random
        placed, used = [], 0
        for pp, dp, _ in specs:
            placed.append(rng.sample(nics[used:used + pp * dp], pp * dp))
            used += pp * dp
    svc = Host("infra01", ips[n_nics], rng.choice(leaves))
    svc.monitor_ip = ips[n_nics + 1]   # a second address on the infrastructure server: the monitor
    jobs = []
    for k, ((pp, dp, args), mine) in enumerate(zip(specs, placed)):
        first = k == 0
        job_id = f"job{rng.randint(1000, 9999)}"
        extra = (["--ckpt-save-step", str(max(7, int(0.2 * seconds / 0.8)))] if first and pp > 1 else []) + \
            ([] if first else ["--ckpt-load-s", f"{rng.uniform(3, 5):.2f}"])
        jobs.append(Job(job_id, f"tenant-{'ab'[k] if not shared else 'a'}", pp, dp, mine,
                        list(args) + extra, go_s=0.3 if first else 1.0,
                        stop_s=None if first else seconds - rng.uniform(3, 5), profile1=3 if first else 4))
    hosts = nics
    A = jobs[0]
    fault = None
    t0, t1 = rng.uniform(0.40, 0.48) * seconds, rng.uniform(0.78, 0.86) * seconds
    if scenario == "straggler":
        fault = {"rank": rng.randrange(len(A.hosts)), "extra_ms": 150.0}
    elif scenario == "slow_link":
        h = rng.choice(A.hosts)
        fault = {"host": h, "rate_bps": rng.choice([60e6, 80e6, 100e6]), "delay_ms": rng.choice([3.0, 4.0, 5.0])}
    elif scenario == "congested_uplink":
        fault = {"rate_bps": rng.choice([40e6, 50e6, 60e6])}
    return hosts, svc, leaves, spine, jobs, fault, (t0, t1)


class Recorder:
    def __init__(self, scenario: str, out: Path, seconds: float, seed: int, background: bool, stacks: bool = False, log=print,
                 layout: str = "pp2dp2+dp2"):
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; one of {SCENARIOS}")
        if seconds < 12:
            raise ValueError("--seconds must be >= 12 (two profile windows and a fault need room)")
        self.scenario, self.out, self.seconds, self.seed, self.background, self.log = scenario, out, seconds, seed, background, log
        self.stacks, self.layout = stacks, layout
        self.hosts, self.svc, self.leaves, self.spine, self.jobs, self.fault, self.fault_s = make_plan(scenario, seconds, seed, layout)
        self.landing, self.truth = out / "landing", out / "ground_truth"
        self.events: list[dict] = []       # what the recorder itself did, with times (fault injection)
        self.dumps: dict[str, subprocess.Popen] = {}
        self.aux: list[subprocess.Popen] = []
        self._fhs: list = []
        self.T0 = self.T1 = None

    # -- helpers -----------------------------------------------------------------------------
    def _popen(self, ns: str, args: list[str], out_name: str) -> subprocess.Popen:
        fh = open(self.tmp / out_name, "wb")
        self._fhs.append(fh)
        env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        return subprocess.Popen(["ip", "netns", "exec", ns, *args], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

    def _wait_line(self, name: str, text: str, proc: subprocess.Popen, timeout: float):
        t = time.monotonic() + timeout
        while time.monotonic() < t:
            if text in (self.tmp / name).read_text(errors="replace"):
                return
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"{name}: no `{text}` within {timeout:.0f} s: {(self.tmp / name).read_text(errors='replace')[-800:]}")

    def _event(self, what: str, **kw):
        self.events.append({"event": what, "t_ns": now(), **kw})
        self.log(f"[recorder] {(now() - (self.T0 or now())) / 1e9:6.1f} s  {what} {kw if kw else ''}")

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> dict:
        t_start = time.monotonic()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"fsrec{os.getpid()}-"))
        stale = clean_stale()
        if stale:
            self.log(f"[recorder] removed namespaces of dead recorders: {stale}")
        hosts = self.hosts + ([self.svc] if self.background else [])
        self.fab = Fabric(hosts, self.leaves, self.spine)
        old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}

        def bail(signum, _frame):
            raise SystemExit(128 + signum)
        for s in old:
            signal.signal(s, bail)
        ok = False
        try:
            self.fab.up()
            self._start_aux()
            self._launch()
            self._capture()
            ok = True
        finally:
            self._teardown()
            for s, h in old.items():
                signal.signal(s, h)
            if not ok:  # no half recording that looks valid; the logs stay for a post-mortem
                for pcap in self.tmp.glob("*.pcap"):
                    pcap.unlink()
                for sub in (self.landing, self.truth):
                    shutil.rmtree(sub, ignore_errors=True)
                self.log(f"[recorder] failed; logs kept in {self.tmp}")
        try:
            summary = self._write(time.monotonic() - t_start)
        except BaseException:
            for sub in (self.landing, self.truth):
                shutil.rmtree(sub, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
        return summary

    def _start_aux(self):
        if self.background:
            self.fab.add_address(self.svc.ns, self.svc_monitor_ip())
            p = self._popen(self.svc.ns, [sys.executable, "-m", "fleetscope.collectors.recorder.services",
                                          "--storage", f"{self.svc.ip}:{STORE_PORT}", "--monitor", self.svc_monitor_ip(),
                                          "--probe", ",".join(h.ip for h in self.hosts)], "services.out")
            self.aux.append(p)
            self._wait_line("services.out", "ready", p, 60)
        if self.scenario == "slow_link":
            p = self._popen(self.fab.sw, [sys.executable, "-m", "fleetscope.collectors.recorder.nfqdelay", "--queue", "0",
                                          "--delay-ms", str(self.fault["delay_ms"])], "nfqdelay.out")
            self.aux.append(p)
            self._wait_line("nfqdelay.out", "ready", p, 60)

    def addr_leaf(self) -> dict[str, str]:
        """Every address in the fabric and its leaf."""
        out = {h.ip: h.leaf for h in self.fab.hosts}
        return out | ({self.svc_monitor_ip(): self.svc.leaf} if self.background else {})

    def svc_monitor_ip(self) -> str:
        return self.svc.monitor_ip

    def _launch(self):
        deadline = now() + int((self.seconds + 240) * 1e9)   # ranks give up on their own after this
        stamp = _stamp(now())
        for j in self.jobs:
            j.run_dir = self.tmp / j.job_id
            j.run_dir.mkdir()
            j.windows = [{"capture": f"{j.job_id}-{stamp}-w1", "from_step": 0, "profile_step": j.profile1, "profile_steps": 3}]
            j.control = {"stop_step": None, "windows": j.windows, "straggle": None}
            j.write_control()
            for r, h in enumerate(j.hosts):
                args = [sys.executable, "-m", "fleetscope.collectors.recorder.train", "--job", j.job_id, "--rank", str(r),
                        "--world", str(len(j.hosts)), "--pp", str(j.pp), "--master", j.hosts[0].ip, "--host", h.name,
                        "--run-dir", str(j.run_dir), "--landing", str(self.landing), "--hard-deadline-ns", str(deadline), *j.args]
                if self.stacks:
                    args.append("--stacks")
                if self.background:
                    args += ["--storage", f"{self.svc.ip}:{STORE_PORT}"]
                j.procs.append(self._popen(h.ns, args, f"{j.job_id}-rank{r}.out"))
        # importing torch in six processes on a busy box takes a while: the capture starts after
        t = time.monotonic() + 240
        while sum(j.n_ready() for j in self.jobs) < sum(len(j.hosts) for j in self.jobs):
            self._check_procs()
            if time.monotonic() > t:
                raise RuntimeError("ranks not ready after 240 s")
            time.sleep(0.2)

    def _check_procs(self):
        """A rank that exits with an error, or at all before its job was told to stop, fails the run."""
        for j in self.jobs:
            for r, p in enumerate(j.procs):
                rc = p.poll()
                if rc is not None and (rc != 0 or j.control.get("stop_step") is None):
                    tail = (self.tmp / f"{j.job_id}-rank{r}.out").read_text(errors="replace")[-1500:]
                    raise RuntimeError(f"{j.job_id} rank {r} exited with {rc} (stop requested: "
                                       f"{j.control.get('stop_step') is not None}):\n{tail}")

    def _capture(self):
        for leaf in self.leaves:
            src = " or ".join(f"src host {ip}" for ip, lf in self.addr_leaf().items() if lf == leaf)
            # each packet once, where it enters the fabric: at its own leaf, from its own hosts
            args = ["tcpdump", "-i", leaf, "-w", str(self.tmp / f"{leaf}.pcap"), "-s", "96", "-U", "-n", "-B", "16384",
                    "--time-stamp-precision=nano", f"ip and ({src})"]
            self.dumps[leaf] = self._popen(self.fab.sw, args, f"tcpdump-{leaf}.out")
        for leaf, p in self.dumps.items():
            self._wait_line(f"tcpdump-{leaf}.out", "listening on", p, 30)
        self.T0 = now()
        self._event("capture_start")
        f0, f1 = self.fault_s
        plan = [(j.go_s, "go", j) for j in self.jobs] + [(f0, "fault_start", None), (f1, "fault_end", None)]
        plan += [(j.stop_s, "stop", j) for j in self.jobs if j.stop_s is not None] + [(self.seconds, "capture_end", None)]
        plan.sort(key=lambda x: x[0])
        hard = time.monotonic() + self.seconds + 150
        while plan:
            t, what, j = plan[0]
            if now() >= self.T0 + int(t * 1e9):
                plan.pop(0)
                getattr(self, f"_on_{what}")(j)
                continue
            self._check_procs()
            if time.monotonic() > hard:
                raise RuntimeError("recording ran far past its length; giving up")
            time.sleep(0.05)
        for j in self.jobs:   # the jobs finish a couple of steps after they were told to
            for r, p in enumerate(j.procs):
                try:
                    rc = p.wait(timeout=max(5.0, hard - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise RuntimeError(f"{j.job_id} rank {r} did not finish")
                if rc != 0:
                    self._check_procs()

    def _on_go(self, j: Job):
        (j.run_dir / "go").touch()
        self._event("launch", job_id=j.job_id)

    def _on_stop(self, j: Job):
        # a future step every rank reaches, so they agree; never before a window's profile is whole (a
        # profile cut short or never started leaves a capture the truth names without its trace)
        j.control["stop_step"] = max([j.progress() + 2] + [w["profile_step"] + w["profile_steps"] for w in j.windows])
        j.write_control()
        self._event("stop_requested", job_id=j.job_id, stop_step=j.control["stop_step"])

    def _on_fault_start(self, _):
        # window 2 of every running job opens with the fault (or at the same time when healthy)
        for j in self.jobs:
            cur = j.progress()
            if j.control.get("stop_step") is not None or cur < 0:
                continue
            first = max(cur + 2, j.profile1 + 4)
            j.windows.append({"capture": f"{j.job_id}-{_stamp(now())}-w2", "from_step": first, "profile_step": first + 1,
                              "profile_steps": 3})
            if self.scenario == "straggler" and j is self.jobs[0]:
                j.control["straggle"] = {"rank": self.fault["rank"], "from_step": first, "to_step": None,
                                         "extra_ms": self.fault["extra_ms"]}
            j.write_control()
            self._event("window2", job_id=j.job_id, from_step=first)
        f = self.fault
        if self.scenario == "slow_link":
            h = f["host"]
            self.fab.tbf(h.ns, "eth0", f["rate_bps"])              # host -> switch
            self.fab.tbf(self.fab.sw, h.port, f["rate_bps"])       # switch -> host
            self.fab.delay_rules(h.port, 0, add=True)
            self._event("fault_applied", kind="slow_link", host=h.name, ip=h.ip)
        elif self.scenario == "congested_uplink":
            for leaf in self.leaves:
                self.fab.tbf(self.fab.sw, self.fab.uplink(leaf), f["rate_bps"])
            self._event("fault_applied", kind="congested_uplink", switch=self.spine)

    def _on_fault_end(self, _):
        f = self.fault
        if self.scenario == "straggler":
            j = self.jobs[0]
            j.control["straggle"]["to_step"] = max(j.progress() + 2, j.control["straggle"]["from_step"] + 1)
            j.write_control()
            self._event("straggle_end_requested", to_step=j.control["straggle"]["to_step"])
        elif self.scenario == "slow_link":
            h = f["host"]
            self.fab.delay_rules(h.port, 0, add=False)
            self.fab.untbf(h.ns, "eth0")
            self.fab.untbf(self.fab.sw, h.port)
            self._event("fault_removed", kind="slow_link")
        elif self.scenario == "congested_uplink":
            for leaf in self.leaves:
                self.fab.untbf(self.fab.sw, self.fab.uplink(leaf))
            self._event("fault_removed", kind="congested_uplink")

    def _on_capture_end(self, _):
        self._stop_dumps()
        self.T1 = now()
        self._event("capture_end")
        for j in self.jobs:
            if j.control.get("stop_step") is None:
                self._on_stop(j)

    def _stop_dumps(self):
        for p in self.dumps.values():
            if p.poll() is None:
                p.send_signal(signal.SIGINT)   # flushes and closes the pcap
        for p in self.dumps.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    def _teardown(self):
        self._stop_dumps()
        procs = [p for j in self.jobs for p in j.procs] + self.aux
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        self.fab.down()
        for fh in self._fhs:
            fh.close()

    # -- outputs -------------------------------------------------------------------------------
    def _write(self, wall_s: float) -> dict:
        from fleetscope.collectors.recorder import truth

        if self.T1 is None:
            raise RuntimeError("the capture did not complete")
        flows, stats = self._flows()
        summary = truth.write(self, flows)
        summary |= {"seconds_wall": round(wall_s, 1), "capture": stats}
        (self.truth / "recording.json").write_text(json.dumps(summary, indent=2, default=str))
        return summary

    def _flows(self) -> tuple[pl.DataFrame, dict]:
        from fleetscope.collectors.flowcap import packets_to_flows, read_pcap

        leaf_of = self.addr_leaf()
        leaf_df = pl.DataFrame({"ip": list(leaf_of), "leaf": list(leaf_of.values())})
        parts, stats = [], {}
        (self.landing / "flows").mkdir(parents=True, exist_ok=True)
        for leaf in self.leaves:
            pcap = self.tmp / f"{leaf}.pcap"
            err = (self.tmp / f"tcpdump-{leaf}.out").read_text(errors="replace")
            stats[leaf] = {"pcap_bytes": pcap.stat().st_size,
                           "tcpdump": " / ".join(x.strip() for x in err.splitlines() if "packets" in x)}
            t = time.perf_counter()
            pk = read_pcap(pcap)
            stats[leaf]["packets"] = pk.height
            stats[leaf]["read_pcap_s"] = round(time.perf_counter() - t, 2)
            pcap.unlink()   # ~100 MB a minute: only the flow records are kept
            f = packets_to_flows(pk, idle_gap_ns=1_000_000)
            # path: the ingress leaf, then the spine and the egress leaf when it leaves the leaf
            f = (f.join(leaf_df.rename({"ip": "src_ip", "leaf": "ls"}), on="src_ip", how="left")
                 .join(leaf_df.rename({"ip": "dst_ip", "leaf": "ld"}), on="dst_ip", how="left")
                 .with_columns(path=pl.when(pl.col("ld").is_null() | (pl.col("ld") == pl.col("ls")))
                               .then(pl.concat_list(pl.col("ls")))
                               .otherwise(pl.concat_list("ls", pl.lit(self.spine), "ld")))
                 .drop("ls", "ld").sort("start_ns"))
            f.write_parquet(self.landing / "flows" / f"{leaf}-{_stamp(self.T0)}.parquet", compression="zstd")
            stats[leaf]["flows"] = f.height
            parts.append(f)
        nfq = self.tmp / "nfqdelay.out"
        if nfq.exists():   # how many frames the delay queue held (0 would mean no delay took effect)
            stats["nfqdelay"] = nfq.read_text(errors="replace").strip().splitlines()[-1]
        return pl.concat(parts).sort("start_ns"), stats


def record(scenario: str, out, seconds: float = 35.0, seed: int = 0, background: bool = True,
           overwrite: bool = False, stacks: bool = False, log=print, layout: str = "pp2dp2+dp2") -> dict:
    """Run one recording into `out` (landing/ and ground_truth/); returns the summary."""
    if os.geteuid() != 0:
        raise PermissionError("the recorder needs root (network namespaces, tcpdump, tc, iptables)")
    need = ["ip", "tcpdump", "ethtool", "tc"] + (["iptables"] if scenario == "slow_link" else [])
    missing = [b for b in need if shutil.which(b) is None]
    if missing:
        raise FileNotFoundError(f"missing tools: {missing} (Debian: apt-get install -y iproute2 tcpdump ethtool iptables)")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty (pass overwrite=True / --overwrite to replace it)")
        for sub in ("landing", "ground_truth"):
            shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    return Recorder(scenario, out, seconds, seed, background, stacks, log, layout).run()
