"""NVML hardware sampler (docs/CONTRACT.md 1.5) into landing/hw/<host>-<start>-<n>.parquet.

    python -m fleetscope.collectors.nvml_sampler --landing /shared/landing [--rate-hz 10] [--flush-s 60] [--duration-s 0]

Per GPU and sample: SM clock and its max, power and limit, temperature, GPU / memory utilization,
the clocks-event (throttle) reasons bitmask, PCIe TX/RX and NVLink TX/RX throughput (bytes/s).
On a machine without an NVIDIA GPU or driver it prints why and exits 0. Runs as a sidecar beside
the training job (PerfTracker runs it in a privileged container sharing an emptyDir with the job).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

SCHEMA_COLS = ["ts_ns", "host", "gpu", "sm_clock_mhz", "sm_clock_max_mhz", "power_w", "power_limit_w", "temp_c",
               "util_gpu_pct", "util_mem_pct", "throttle_reasons", "pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps",
               "nvlink_rx_bps"]


def _try(fn, *a, default=None):
    try:
        return fn(*a)
    except Exception:
        return default


class NvmlSampler:
    def __init__(self, landing_dir, host: str | None = None):
        import pynvml as N

        self.N = N
        N.nvmlInit()
        self.host = host or socket.gethostname()
        self.handles = [N.nvmlDeviceGetHandleByIndex(i) for i in range(N.nvmlDeviceGetCount())]
        self.out = Path(landing_dir) / "hw"
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[tuple] = []
        self.n_files = 0
        self.start_tag = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        # NVLink throughput comes from cumulative byte counters: keep the previous reading per GPU
        self._nvl_prev: dict[int, tuple[int, float, float]] = {}

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

    def sample(self):
        N = self.N
        ts = time.time_ns()
        for i, h in enumerate(self.handles):
            util = _try(N.nvmlDeviceGetUtilizationRates, h)
            power = _try(N.nvmlDeviceGetPowerUsage, h)
            limit = _try(N.nvmlDeviceGetEnforcedPowerLimit, h)
            reasons = _try(getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", N.nvmlDeviceGetCurrentClocksThrottleReasons), h)
            tx = _try(N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_TX_BYTES)  # KB/s
            rx = _try(N.nvmlDeviceGetPcieThroughput, h, N.NVML_PCIE_UTIL_RX_BYTES)
            nvtx, nvrx = self._nvlink(i, h)
            self.rows.append((
                ts, self.host, f"{self.host}/gpu{i}",
                _try(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM), _try(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_SM),
                power / 1000 if power is not None else None, limit / 1000 if limit is not None else None,
                _try(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU),
                util.gpu if util else None, util.memory if util else None, reasons,
                tx * 1000 if tx is not None else None, rx * 1000 if rx is not None else None, nvtx, nvrx,
            ))

    def flush(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.rows:
            return None
        cols = list(zip(*self.rows))
        self.rows = []
        types = [pa.int64(), pa.string(), pa.string(), pa.float64(), pa.float64(), pa.float64(), pa.float64(), pa.float64(),
                 pa.float64(), pa.float64(), pa.int64(), pa.float64(), pa.float64(), pa.float64(), pa.float64()]
        table = pa.table({c: pa.array(v, t) for c, v, t in zip(SCHEMA_COLS, cols, types)})
        path = self.out / f"{self.host}-{self.start_tag}-{self.n_files:05d}.parquet"
        tmp = path.with_suffix(".tmp")
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
        self.n_files += 1
        return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landing", default=os.environ.get("FLEETSCOPE_LANDING", "data/landing"))
    ap.add_argument("--rate-hz", type=float, default=10.0)
    ap.add_argument("--flush-s", type=float, default=60.0)
    ap.add_argument("--duration-s", type=float, default=0.0, help="stop after this long (0: run until killed)")
    a = ap.parse_args(argv)
    try:
        s = NvmlSampler(a.landing)
    except Exception as exc:  # pynvml.NVMLError_LibraryNotFound / DriverNotLoaded / no device
        print(f"nvml_sampler: no NVIDIA GPU available here ({type(exc).__name__}: {exc}); nothing to sample, exiting.")
        return 0
    if not s.handles:
        print("nvml_sampler: NVML found no GPU; nothing to sample, exiting.")
        return 0
    period = 1.0 / a.rate_hz
    t_end = time.monotonic() + a.duration_s if a.duration_s else None
    last_flush = time.monotonic()
    try:
        while t_end is None or time.monotonic() < t_end:
            t0 = time.monotonic()
            s.sample()
            if t0 - last_flush >= a.flush_s:
                s.flush()
                last_flush = t0
            time.sleep(max(0.0, period - (time.monotonic() - t0)))
    except KeyboardInterrupt:
        pass
    finally:
        p = s.flush()
    print(f"nvml_sampler: {len(s.handles)} GPU(s), {s.n_files} file(s) in {s.out}" + (f", last {p}" if p else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
