"""Host sampler (docs/CONTRACT.md 1.5): GPU counters from NVML, NIC counters from the kernel's
interface statistics and CPU utilization, into landing/hw/<host>-<start>-<n>.parquet.

    python -m fleetscope.collectors.nvml_sampler --landing /shared/landing [--rate-hz 100] [--flush-s 60]
        [--duration-s 0] [--nic-map gpu0=mlx5_0,gpu1=mlx5_1]

Per GPU and sample: SM clock and its max, power and limit, temperature, GPU / memory utilization,
SM activity where NVML's GPM metrics exist (Hopper and later: the share of SM cycles active, the
utilization PerfTracker's mu wants; util_gpu_pct is only "a kernel was running"), the clocks-event
(throttle) reasons bitmask, PCIe and NVLink TX/RX (bytes/s), and the TX/RX of the NIC that GPU
sends through (nic_tx_bps / nic_rx_bps from /sys/class/net/<nic>/statistics), plus the host's CPU
utilization (cpu_util_pct, /proc/stat).

Rates: NVML's utilization is the driver's own average over its sample period, so polling faster
adds nothing; the sampler reads the driver's buffered utilization samples (nvmlDeviceGetSamples)
and uses the mean of those new since the last tick. Counters (NVLink, NIC, CPU) are cumulative, so
any rate works; the default 100 Hz keeps a sampler to a few % of one core on an 8-GPU host, and
`--rate-hz 1000` (PerfTracker samples at 1 kHz) is accepted; the achieved rate is printed.

NIC to GPU: `--nic-map`; else, when the host has as many RDMA NICs (/sys/class/net/*/device/infiniband)
as GPUs, GPU i and NIC i in PCI bus order (rail-optimized servers put them under one PCIe switch);
else every GPU row carries the host's total over its physical NICs (a shared NIC: its utilization
is what each GPU's collectives see). On a host without a usable NVIDIA GPU it still samples NICs and
CPU, one row per sample with gpu = "<host>/cpu" (CPU training jobs: gloo over the host's NIC).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

SCHEMA_COLS = ["ts_ns", "host", "gpu", "sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w", "temp_c",
               "util_gpu_pct", "util_mem_pct", "sm_active_pct", "throttle_reasons", "pcie_tx_bps", "pcie_rx_bps",
               "nvlink_tx_bps", "nvlink_rx_bps", "nic_tx_bps", "nic_rx_bps", "cpu_util_pct"]
_INT_COLS = {"ts_ns", "throttle_reasons"}
_STR_COLS = {"host", "gpu"}


def _try(fn, *a, default=None):
    try:
        return fn(*a)
    except Exception:
        return default


class HostCounters:
    """Cumulative NIC byte counters and CPU time of this host (its network namespace: run the
    sampler in the namespace whose NICs the job uses)."""

    def __init__(self, sysfs: str | os.PathLike = "/sys/class/net", procstat: str | os.PathLike = "/proc/stat",
                 nics: list[str] | None = None):
        self.sysfs, self.procstat = Path(sysfs), Path(procstat)
        self.nics = nics if nics is not None else self.physical_nics()
        self.prev: tuple | None = None

    def physical_nics(self) -> list[str]:
        """Interfaces backed by a device (PCI, virtio), else every interface but loopback (a veth in
        a container or network namespace has no device link)."""
        names = sorted(p.name for p in self.sysfs.iterdir() if p.name != "lo") if self.sysfs.is_dir() else []
        dev = [n for n in names if (self.sysfs / n / "device").exists()]
        return dev or names

    def rdma_nics(self) -> list[str]:
        """NICs with an RDMA device, in PCI bus order."""
        out = [n for n in self.physical_nics() if (self.sysfs / n / "device" / "infiniband").exists()]
        return sorted(out, key=lambda n: os.path.basename(os.path.realpath(self.sysfs / n / "device")))

    def _nic_bytes(self, n: str) -> tuple[int, int] | None:
        try:
            st = self.sysfs / n / "statistics"
            return int((st / "tx_bytes").read_text()), int((st / "rx_bytes").read_text())
        except (OSError, ValueError):
            return None

    def _cpu(self) -> tuple[int, int] | None:
        try:
            f = self.procstat.read_text().splitlines()[0].split()[1:]
            v = [int(x) for x in f]
            idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
            return sum(v) - idle, sum(v)
        except (OSError, ValueError, IndexError):
            return None

    def sample(self) -> dict:
        """Rates since the previous call: {"nic": {name: (tx_bps, rx_bps)}, "cpu_util_pct": float|None}."""
        t = time.monotonic()
        cur = (t, {n: self._nic_bytes(n) for n in self.nics}, self._cpu())
        prev, self.prev = self.prev, cur
        out = {"nic": {}, "cpu_util_pct": None}
        if prev is None or t <= prev[0]:
            return out
        dt = t - prev[0]
        for n, b in cur[1].items():
            a = prev[1].get(n)
            if a is not None and b is not None:
                out["nic"][n] = (max(0, b[0] - a[0]) / dt, max(0, b[1] - a[1]) / dt)
        if cur[2] and prev[2] and cur[2][1] > prev[2][1]:
            out["cpu_util_pct"] = 100.0 * (cur[2][0] - prev[2][0]) / (cur[2][1] - prev[2][1])
        return out


class NvmlSampler:
    def __init__(self, landing_dir, host: str | None = None, nic_map: dict[int, str] | None = None,
                 counters: HostCounters | None = None, use_nvml: bool = True):
        self.host = host or socket.gethostname()
        self.N = None
        self.handles = []
        if use_nvml:
            try:
                import pynvml as N
                N.nvmlInit()
                self.N = N
                self.handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
            except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded / no device
                self.no_gpu_reason = f"{type(exc).__name__}: {exc}"
        if not self.handles and not hasattr(self, "no_gpu_reason"):
            self.no_gpu_reason = "NVML found no GPU" if use_nvml else "NVML not used"
        self.counters = counters or HostCounters()
        self.nic_of = self._nic_map(nic_map)
        self.out = Path(landing_dir) / "hw"
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[tuple] = []
        self.n_files = 0
        self.n_samples = 0
        self.start_tag = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        # cumulative NVLink counters and the driver's utilization buffer: the previous reading per GPU
        self._nvl_prev: dict[int, tuple[float, float, float]] = {}
        self._util_ts: dict[int, int] = {}
        self._gpm_prev: dict[int, object] = {}

    def _nic_map(self, given: dict[int, str] | None) -> dict[int, str | None]:
        """GPU index -> the NIC it sends through (None: the host's total)."""
        if given:
            return {i: given.get(i) for i in range(len(self.handles))}
        rdma = self.counters.rdma_nics()
        if self.handles and len(rdma) == len(self.handles):
            return dict(enumerate(rdma))
        return {i: None for i in range(len(self.handles))}

    # -- NVML ---------------------------------------------------------------------------------
    def _nvlink(self, i, h):
        N = self.N
        ids = [getattr(N, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None), getattr(N, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)]
        if None in ids:
            return None, None
        vals = _try(N.nvmlDeviceGetFieldValues, h, ids)
        if not vals or any(v.nvmlReturn != 0 for v in vals):
            return None, None
        tx, rx = (float(v.value.ullVal) * 1024 for v in vals)  # KiB counters
        now = time.monotonic()
        prev = self._nvl_prev.get(i)
        self._nvl_prev[i] = (now, tx, rx)
        if prev is None or now <= prev[0]:
            return None, None
        dt = now - prev[0]
        return max(0.0, (tx - prev[1]) / dt), max(0.0, (rx - prev[2]) / dt)

    def _util(self, i, h):
        """GPU utilization: the mean of the driver's buffered samples since the last tick (its own
        sample period), else the current reading."""
        N = self.N
        st = getattr(N, "NVML_GPU_UTILIZATION_SAMPLES", None)
        if st is not None:
            res = _try(N.nvmlDeviceGetSamples, h, st, self._util_ts.get(i, 0))
            if res:
                _, samples = res
                new = [s for s in samples if s.timeStamp > self._util_ts.get(i, 0)]
                if new:
                    self._util_ts[i] = max(s.timeStamp for s in new)
                    return sum(float(s.sampleValue.uiVal) for s in new) / len(new), None
        u = _try(N.nvmlDeviceGetUtilizationRates, h)
        return (u.gpu, u.memory) if u else (None, None)

    def _sm_active(self, i, h):
        """SM activity (% of SM cycles active) from NVML's GPU performance monitoring (Hopper and
        later) between the previous tick's GPM sample and this one; None where unsupported."""
        N = self.N
        if not hasattr(N, "nvmlGpmSampleAlloc") or self._gpm_prev.get(i, True) is None:
            return None
        try:
            if i not in self._gpm_prev:
                sup = N.nvmlGpmQueryDeviceSupport(h)
                if not sup.isSupportedDevice:
                    self._gpm_prev[i] = None
                    return None
            cur = N.nvmlGpmSampleAlloc()
            N.nvmlGpmSampleGet(h, cur)
            prev, self._gpm_prev[i] = self._gpm_prev.get(i), cur
            if prev is None:
                return None
            mg = N.c_nvmlGpmMetricsGet_t()
            mg.version, mg.numMetrics, mg.sample1, mg.sample2 = N.NVML_GPM_METRICS_GET_VERSION, 1, prev, cur
            mg.metrics[0].metricId = N.NVML_GPM_METRIC_SM_UTIL
            N.nvmlGpmMetricsGet(mg)
            N.nvmlGpmSampleFree(prev)
            return float(mg.metrics[0].value) if mg.metrics[0].nvmlReturn == 0 else None
        except Exception:
            self._gpm_prev[i] = None
            return None

    # -- sampling ------------------------------------------------------------------------------
    def sample(self):
        ts = time.time_ns()
        host = self.counters.sample()
        nic, cpu = host["nic"], host["cpu_util_pct"]
        total = (sum(v[0] for v in nic.values()), sum(v[1] for v in nic.values())) if nic else (None, None)
        self.n_samples += 1
        if not self.handles:
            self.rows.append((ts, self.host, f"{self.host}/cpu", *([None] * 13), total[0], total[1], cpu))
            return
        N = self.N
        for i, h in enumerate(self.handles):
            util, mem = self._util(i, h)
            if mem is None:
                u = _try(N.nvmlDeviceGetUtilizationRates, h)
                mem = u.memory if u else None
            power = _try(N.nvmlDeviceGetPowerUsage, h)
            limit = _try(N.nvmlDeviceGetEnforcedPowerLimit, h)
            reasons = _try(getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", N.nvmlDeviceGetCurrentClocksThrottleReasons), h)
            tx = _try(N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_TX_BYTES)  # KB/s
            rx = _try(N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_RX_BYTES)
            nvtx, nvrx = self._nvlink(i, h)
            n = self.nic_of.get(i)
            ntx, nrx = nic.get(n, (None, None)) if n else total
            self.rows.append((
                ts, self.host, f"{self.host}/gpu{i}",
                _try(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM), _try(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_SM),
                power / 1000 if power is not None else None, limit / 1000 if limit is not None else None,
                _try(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU),
                util, mem, self._sm_active(i, h), reasons,
                tx * 1000 if tx is not None else None, rx * 1000 if rx is not None else None, nvtx, nvrx, ntx, nrx, cpu,
            ))

    def flush(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.rows:
            return None
        cols = list(zip(*self.rows))
        self.rows = []
        table = pa.table({c: pa.array(v, pa.int64() if c in _INT_COLS else pa.string() if c in _STR_COLS else pa.float64())
                          for c, v in zip(SCHEMA_COLS, cols)})
        path = self.out / f"{self.host}-{self.start_tag}-{self.n_files:05d}.parquet"
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
        self.n_files += 1
        return path


def _parse_nic_map(s: str) -> dict[int, str]:
    out = {}
    for part in filter(None, s.split(",")):
        g, _, n = part.partition("=")
        out[int(g.strip().removeprefix("gpu"))] = n.strip()
    return out


def run(landing, rate_hz: float = 100.0, flush_s: float = 60.0, duration_s: float = 0.0, nic_map: dict | None = None,
        host: str | None = None, use_nvml: bool = True) -> dict:
    s = NvmlSampler(landing, host=host, nic_map=nic_map, use_nvml=use_nvml)
    period = 1.0 / rate_hz
    t_start = time.monotonic()
    t_end = t_start + duration_s if duration_s else None
    last_flush = t_start
    next_t = t_start
    try:
        while t_end is None or time.monotonic() < t_end:
            s.sample()
            now = time.monotonic()
            if now - last_flush >= flush_s:
                s.flush()
                last_flush = now
            next_t += period
            time.sleep(max(0.0, next_t - time.monotonic()))
    except KeyboardInterrupt:
        pass
    finally:
        p = s.flush()
    elapsed = max(time.monotonic() - t_start, 1e-9)
    return {"gpus": len(s.handles), "no_gpu_reason": getattr(s, "no_gpu_reason", None) if not s.handles else None,
            "nics": s.counters.nics, "samples": s.n_samples, "achieved_hz": s.n_samples / elapsed, "files": s.n_files,
            "dir": str(s.out), "last": str(p) if p else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landing", default=os.environ.get("FLEETSCOPE_LANDING", "data/landing"))
    ap.add_argument("--rate-hz", type=float, default=100.0)
    ap.add_argument("--flush-s", type=float, default=60.0)
    ap.add_argument("--duration-s", type=float, default=0.0, help="stop after this long (0: run until killed)")
    ap.add_argument("--nic-map", default="", help="gpuI=NIC,... (default: RDMA NICs in PCI order when one per GPU, else the host total)")
    ap.add_argument("--host", default=None, help="host name written on the rows (default: this machine's)")
    ap.add_argument("--no-nvml", action="store_true", help="NICs and CPU only")
    a = ap.parse_args(argv)
    res = run(a.landing, a.rate_hz, a.flush_s, a.duration_s, _parse_nic_map(a.nic_map), a.host, not a.no_nvml)
    if not res["gpus"]:
        print(f"nvml_sampler: no NVIDIA GPU here ({res['no_gpu_reason']}); sampled NICs {res['nics']} and CPU only")
    print(f"nvml_sampler: {res['gpus']} GPU(s), NICs {res['nics']}, {res['samples']} samples at {res['achieved_hz']:.1f} Hz, "
          f"{res['files']} file(s) in {res['dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
