"""Per-seed conventions of the simulated fleet: every way real fleets, frameworks and exporters
differ that a flow detector could silently come to depend on is a seeded random draw here.

`draw_conventions(seed, n_gpus)` returns a plain JSON-able dict (written to
ground_truth/conventions.json) so a failing test can say which convention broke it. Job-level
choices (parallelism, DP style, buckets, NCCL channels and queue pairs, life events) are drawn per
job in jobs.py from the `jobs` / `life` sections here and land in job_layout.csv.

Nothing depends on the seed's value other than through numpy's seeded generator (no parity, no
ranges): held-out seeds are ordinary seeds. `overrides` (a nested dict) pins any draw, e.g.
{"collectors": {"cutting": "flowlet"}} to isolate one convention in a test.
"""
from __future__ import annotations

import copy

import numpy as np

# columns real exporters add beside the CONTRACT ones (ignored by a correct reader)
FLOW_EXTRA_COLUMNS = ["exporter", "vlan", "dscp", "ip_proto", "tcp_flags", "ingress_if", "sampling_rate", "ttl"]
TOPOLOGY_EXTRA_COLUMNS = ["serial", "nic", "mac", "status", "switch_port", "asset_tag", "gpu_model", "os_image"]
PARQUET_CODECS = ["zstd", "snappy", "gzip", "lz4", "uncompressed"]
CUTTINGS = ["bucket", "message", "flowlet", "active_timeout"]
FILE_NAMINGS = ["erspan-{c}-{t:%Y%m%dT%H%M%S}", "flows_{c}_{epoch}", "{c}.{t:%Y-%m-%dT%H-%M-%SZ}", "mirror-{t:%Y%m%d-%H%M%S}-{c}"]


# keys that are fixed by design (not conventions): every fleet has a late and a resent file; the
# message cap is an upper bound the record budget lowers; the TP weights are a realistic prior
FIXED = {"collectors.late_file", "collectors.duplicate_file", "collectors.message_cap", "life.first_step_factor",
         "jobs.tp_weights.8", "jobs.tp_weights.4", "jobs.tp_weights.2", "jobs.tp_weights.1"}


# overrides that pin the simplest conventions (one parquet format, no loss, no skew, per-transfer
# records, no probes): a baseline to add one convention at a time to, e.g.
# simulate(..., conventions=merge(PLAIN, {"collectors": {"cutting": "flowlet"}}))
PLAIN = {
    "fabric": {"routing": "static"},
    "topology": {"format": "csv", "dialect": {"header_quoted": False, "quote_style": "necessary", "line_terminator": "\n",
                                             "bom": False}, "codec": None, "extra_columns": [], "shuffle_columns": False,
                 "service_hosts": False, "has_gpu": True, "has_rail": True, "has_rack_pod": True, "has_spine": True},
    "collectors": {"cutting": "bucket", "mirror": "ingress", "loss_rate": 0.0, "retrans_rate": 0.0,
                   "per_collector": {"format": "parquet", "codec": "zstd", "dialect": None, "time_columns": "duration",
                                     "path_style": "list", "extra_columns": [], "shuffle_columns": False,
                                     "optional_columns": ["packets", "src_port", "dst_port", "src_qp", "dst_qp"],
                                     "row_order": "start", "time_resolution_ns": 1, "skew_ns": 0, "drift_ppm": 0.0}},
    "background": {"probe_peers": 0, "monitor_on_gpu_nics": False, "storage_reads_per_host_min": 0.0},
}


def _pick(rng: np.random.Generator, options, p=None):
    i = int(rng.choice(len(options), p=p))
    return options[i]


def csv_dialect(rng: np.random.Generator) -> dict:
    """An RFC 4180 dialect as exporters write it."""
    return {
        "header_quoted": bool(rng.random() < 0.5),
        "quote_style": _pick(rng, ["necessary", "always", "non_numeric"], [0.4, 0.35, 0.25]),
        "line_terminator": _pick(rng, ["\n", "\r\n"]),
        "bom": bool(rng.random() < 0.35),
    }


def _collector(rng: np.random.Generator, idx: int, cutting: str, naming: str) -> dict:
    fmt = _pick(rng, ["parquet", "csv", "csv.gz"], [0.45, 0.2, 0.35])
    c = {
        "collector": idx,
        "name": f"c{idx:02d}" if rng.random() < 0.5 else f"coll-{idx}",
        "format": fmt,
        "codec": _pick(rng, PARQUET_CODECS) if fmt == "parquet" else None,
        "dialect": csv_dialect(rng) if fmt != "parquet" else None,
        # which of duration_ns / end_ns the exporter writes
        "time_columns": _pick(rng, ["duration", "end", "both"], [0.4, 0.4, 0.2]),
        "path_style": (_pick(rng, ["list", "string"]) if fmt == "parquet" else "string"),
        "extra_columns": sorted(rng.choice(FLOW_EXTRA_COLUMNS, size=int(rng.integers(0, 4)), replace=False).tolist()),
        "shuffle_columns": bool(rng.random() < 0.5),
        "optional_columns": sorted(rng.choice(["packets", "src_port", "dst_port", "src_qp", "dst_qp"],
                                              size=int(rng.integers(2, 6)), replace=False).tolist()),
        "file_span_s": int(_pick(rng, [10, 30, 60, 120, 300], [0.15, 0.25, 0.3, 0.15, 0.15])),
        "naming": naming,
        "cutting": cutting if cutting != "mixed" else _pick(rng, CUTTINGS),
        # rows in first-packet order, or in the order flows expired (exporters write at flow end,
        # and roll files by that time)
        "row_order": _pick(rng, ["start", "end"]),
        "time_resolution_ns": int(_pick(rng, [1, 1000], [0.7, 0.3])),   # hardware or software timestamps
        "skew_ns": 0,
        "drift_ppm": 0.0,
    }
    return c


def draw_conventions(seed: int, n_gpus: int, overrides: dict | None = None) -> dict:
    rng = np.random.default_rng([seed, 101])
    n_hosts = max(1, n_gpus // 8)
    if n_hosts <= 16:
        hpl, spines = [2, 4], [2, 4]
    elif n_hosts <= 64:
        hpl, spines = [4, 8], [4, 8]
    else:
        hpl, spines = [8, 16, 32], [8, 16]
    routing = _pick(rng, ["static", "ecmp"])
    fabric = {
        "addressing": _pick(rng, ["pod_host_rail", "rail_subnet", "shuffled", "ipv6"], [0.3, 0.35, 0.2, 0.15]),
        "host_naming": _pick(rng, ["short", "rack_slot", "fqdn"]),
        "switch_naming": _pick(rng, ["plain", "tiered", "serial"]),
        "hosts_per_leaf": int(_pick(rng, hpl)),
        "n_spines": int(_pick(rng, spines)),
        "routing": routing,                      # ecmp: the spine depends on each queue pair's 5-tuple hash
        "n_monitors": int(rng.integers(1, 4)),
        "storage_per_host": float(_pick(rng, [1 / 32, 1 / 16, 1 / 8])),
    }
    topo_fmt = _pick(rng, ["csv", "parquet"], [0.6, 0.4])
    topology = {
        "format": topo_fmt,
        "codec": _pick(rng, PARQUET_CODECS) if topo_fmt == "parquet" else None,
        "dialect": csv_dialect(rng) if topo_fmt == "csv" else None,
        "extra_columns": sorted(rng.choice(TOPOLOGY_EXTRA_COLUMNS, size=int(rng.integers(0, 4)), replace=False).tolist()),
        "shuffle_columns": bool(rng.random() < 0.5),
        "service_hosts": bool(rng.random() < 0.5),   # storage / monitoring servers listed beside the GPU hosts
        "service_file": _pick(rng, ["same", "separate"]),
        "has_gpu": bool(rng.random() < 0.7),
        "has_rail": bool(rng.random() < 0.8),
        "has_rack_pod": bool(rng.random() < 0.7),
        "has_spine": bool(routing == "static" and rng.random() < 0.85),
    }
    jobs = {
        # weights over the choices each job draws from
        "tp_weights": {"8": 0.5, "4": 0.25, "2": 0.15, "1": 0.1},
        "zero_share": float(_pick(rng, [0.0, 0.2, 0.4])),       # Megatron distributed optimizer (RS + AG)
        "fsdp_share": float(_pick(rng, [0.0, 0.15, 0.3])),      # FSDP: per-unit all-gathers in forward and backward
        "tree_share": float(_pick(rng, [0.0, 0.2, 0.4])),       # NCCL double binary tree instead of rings
        "qps_per_connection": _pick(rng, [[1], [1, 2], [2, 4], [1, 2, 3, 4]]),   # NCCL_IB_QPS_PER_CONNECTION
        "channels_per_nic": _pick(rng, [[1, 2], [2], [2, 4]]),
        "cross_rail_share": float(_pick(rng, [0.0, 0.25])),     # ring exits a host on another rail than it entered
        "bidir_share": float(_pick(rng, [0.0, 0.5, 1.0])),      # channels alternate ring direction
        "restricted_nic_share": float(_pick(rng, [0.1, 0.3])),  # DP rings use only some of the group's NICs
        "variable_seq_share": float(_pick(rng, [0.0, 0.25, 0.5])),
        "ddp_bucket_mb": _pick(rng, [[25], [25, 50], [25, 100, 200]]),
        "megatron_single_bucket_share": float(_pick(rng, [0.0, 0.3])),
        "padded_bucket_share": float(_pick(rng, [0.0, 0.2])),
        "p2p_channels": _pick(rng, [[1], [1, 2], [2]]),
        "placement": _pick(rng, ["contiguous", "fragmented"], [0.6, 0.4]),
        "tcp_share": float(_pick(rng, [0.0, 0.1, 0.2])),         # jobs on NCCL's socket transport (no RDMA, no QPs)
    }
    life = {
        "shared_host_pair": bool(rng.random() < 0.75),  # one tenant, two jobs on the same hosts, split by GPU
        "n_launch": int(rng.integers(0, 3)),             # jobs that start inside the window (after a checkpoint load)
        "n_finish": int(rng.integers(0, 3)),
        "n_crash": int(rng.integers(0, 2)),
        "n_checkpoint": int(rng.integers(0, 4)),         # checkpoint save pauses inside the window
        "n_dataloader_stall": int(rng.integers(0, 5)),
        "first_step_factor": [1.5, 4.0],
        "checkpoint_writers": _pick(rng, ["all_ranks", "dp_rank0"]),
    }
    cutting = _pick(rng, CUTTINGS + ["mixed"], [0.25, 0.2, 0.2, 0.15, 0.2])
    n_leaf_groups = -(-n_hosts // fabric["hosts_per_leaf"])
    n_coll = int(rng.integers(2, 5)) if n_leaf_groups * 8 <= 64 else int(rng.integers(4, 17))
    naming = _pick(rng, FILE_NAMINGS)
    skew_max = int(rng.integers(10_000, 80_001))
    drift_max = float(_pick(rng, [0.0, 0.2, 1.0]))
    colls = []
    for i in range(n_coll):
        c = _collector(rng, i, cutting, naming)
        c["skew_ns"] = int(rng.integers(-skew_max, skew_max + 1))
        c["drift_ppm"] = round(float(rng.uniform(-drift_max, drift_max)), 3)
        colls.append(c)
    # at least one parquet and one csv-family collector, so every fleet exercises both readers
    fams = {c["format"] == "parquet" for c in colls}
    if len(fams) == 1:
        c = colls[int(rng.integers(0, n_coll))]
        if c["format"] == "parquet":
            c.update(format=_pick(rng, ["csv", "csv.gz"]), codec=None, dialect=csv_dialect(rng), path_style="string")
        else:
            c.update(format="parquet", codec=_pick(rng, PARQUET_CODECS), dialect=None)
    collectors = {
        "n": n_coll,
        "assignment": _pick(rng, ["leaf_block", "rail", "hash"]),  # which leaves each collector mirrors
        "mirror": _pick(rng, ["ingress", "both"], [0.85, 0.15]),   # both: a flow crossing two leaves is exported twice
        "cutting": cutting,
        "flowlet_idle_ns": int(np.exp(rng.uniform(np.log(50e3), np.log(5e6)))),
        "active_timeout_ns": int(np.exp(rng.uniform(np.log(1e6), np.log(50e6)))),
        "message_bytes": int(_pick(rng, [256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20])),
        "message_cap": 16,     # lowered by the record budget on big fleets (simulate.py)
        "loss_rate": round(float(rng.uniform(0.003, 0.02)), 4),
        "retrans_rate": round(float(rng.uniform(0.001, 0.01)), 4),
        "skew_max_ns": skew_max,
        "drift_ppm_max": drift_max,
        "late_file": True,
        "duplicate_file": True,
        "duplicate_naming": _pick(rng, ["{stem}-resent{ext}", "{stem} (1){ext}", "{stem}.retry1{ext}"]),
        "per_collector": colls,
    }
    background = {
        "probe_transport": _pick(rng, ["rdma_ud", "udp", "tcp"]),   # R-Pingmesh-style RoCE probes use port 4791 and QPs
        "probe_period_s": float(_pick(rng, [1.0, 2.0, 5.0, 10.0])),
        "probe_peers": int(_pick(rng, [0, 1, 2, 3])),               # GPU-NIC peers each NIC probes (pingmesh)
        "probe_bytes": int(_pick(rng, [64, 512, 1024, 4096])),
        "monitor_period_s": float(_pick(rng, [5.0, 10.0, 15.0, 30.0])),
        "monitor_on_gpu_nics": bool(rng.random() < 0.7),
        "storage_reads_per_host_min": float(_pick(rng, [0.5, 2.0, 6.0])),
        "storage_read_mb": float(_pick(rng, [4.0, 32.0, 256.0])),
        "control_heartbeat_s": float(_pick(rng, [5.0, 15.0, 30.0])),
    }
    out = {"seed": int(seed), "n_gpus": int(n_gpus), "fabric": fabric, "topology": topology, "jobs": jobs,
           "life": life, "collectors": collectors, "background": background}
    if overrides:
        out = merge(out, overrides)
    return out


def merge(base: dict, over: dict) -> dict:
    """Deep merge: dicts merge key by key, everything else replaces. `per_collector` overrides given
    as a dict apply to every collector."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if k == "per_collector" and isinstance(v, dict) and isinstance(out.get(k), list):
            out[k] = [merge(c, v) for c in out[k]]
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    oc = over.get("collectors", {}) if isinstance(over.get("collectors"), dict) else {}
    pc = oc.get("per_collector")
    cols = out.get("collectors", {}).get("per_collector")
    if "cutting" in oc and oc["cutting"] != "mixed" and not (isinstance(pc, dict) and "cutting" in pc) and isinstance(cols, list):
        for c in cols:
            c["cutting"] = oc["cutting"]
    return out


def flat_values(conv: dict, prefix: str = "") -> dict[str, object]:
    """Scalar leaves as 'section.key' -> value (lists of scalars become tuples); per-collector
    entries are summarised as the tuple of their values. Used to check conventions vary."""
    out: dict[str, object] = {}
    for k, v in conv.items():
        key = f"{prefix}{k}"
        if k in ("seed", "n_gpus") or (v is None and k == "dialect"):   # parquet: no dialect (its keys vary when csv)
            continue
        if isinstance(v, dict):
            out.update(flat_values(v, key + "."))
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            keys = sorted({kk for d in v for kk in d})
            for kk in keys:
                vals = [d.get(kk) for d in v]
                vals = [tuple(sorted(x.items())) if isinstance(x, dict) else (tuple(x) if isinstance(x, list) else x) for x in vals]
                out[f"{key}[].{kk}"] = tuple(sorted(set(map(repr, vals))))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out
