"""Registration of landed files: what the landing sensor and `fleetscope run` share.

scan -> decide which partitions are new or changed -> record them in `landed_files`, quarantine
same-content duplicates in `rejected_records` -> return the partition keys to (re)materialize."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from fleetscope.ingest.landing import ScanResult, scan_landing
from fleetscope.schemas.landing import LANDED, REJECTED
from fleetscope.schemas.base import conform
from fleetscope.warehouse import Warehouse


@dataclass
class Registration:
    to_run: dict[str, list[str]] = field(default_factory=dict)   # partition set -> keys to (re)materialize
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (rel path, duplicate of partition)
    deferred: list[tuple[str, str]] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    signatures: dict[str, str] = field(default_factory=dict)     # rel path -> size:mtime of every file seen

    @property
    def n_to_run(self) -> int:
        return sum(len(v) for v in self.to_run.values())


def known_state(wh: Warehouse) -> tuple[dict[str, str], dict[str, str]]:
    """(rel path -> signature, sha256 -> partition key) from landed_files."""
    df = wh.read("landed_files")
    if df.height == 0:
        return {}, {}
    # a path rewritten with new content (a collector's file replaced, a demo simulated again into its
    # landing folder) is a new partition whose rows join the old one's: its signature is the latest
    # registered. Whichever partition the table read last won before, and a path whose old row came
    # last was registered again every round (`fleetscope run` looped on two demo files)
    if "registered_ns" in df.columns:
        df = df.sort("registered_ns", maintain_order=True).unique("path", keep="last", maintain_order=True)
    sigs = dict(zip(df["path"].to_list(), (df["size_bytes"].cast(pl.Utf8) + ":" + df["mtime_ns"].cast(pl.Utf8)).to_list())) if "mtime_ns" in df.columns else {}
    reg = df.filter(pl.col("status") == "registered")
    hashes = {s: k for s, k, kind in zip(reg["content_sha256"], reg["partition_key"], reg["kind"]) if kind in ("topology", "flows", "hw", "incidents")}
    return sigs, hashes


def register_landing(landing: Path | str, wh: Warehouse, settle_s: float = 2.0,
                     known_signatures: dict[str, str] | None = None) -> Registration:
    sigs, hashes = known_state(wh)
    if known_signatures is not None:
        sigs = {**sigs, **known_signatures}
    scan: ScanResult = scan_landing(landing, settle_s=settle_s, known_hashes=hashes)
    reg = Registration(deferred=scan.deferred, ignored=scan.ignored)
    now = time.time_ns()
    landed_rows, rejected_rows = [], []
    for part in scan.partitions:
        changed = [f for f in part.files if sigs.get(f.rel) != f.signature]
        for f in part.files:
            reg.signatures[f.rel] = f.signature
        if not changed:
            continue
        status = "duplicate" if part.duplicate_of else "registered"
        for f in part.files:
            landed_rows.append(dict(path=f.rel, kind=part.kind, partition_key=part.key, content_sha256=f.sha256,
                                    size_bytes=f.size, mtime_ns=f.mtime_ns, status=status,
                                    duplicate_of=part.duplicate_of, registered_ns=now, partition_set=part.partition_set))
        if part.duplicate_of:
            reg.duplicates.append((part.files[0].rel, part.duplicate_of))
            rejected_rows.append(dict(source_file=part.files[0].rel, source_kind=part.kind, row_number=None,
                                      reason=f"same content (sha256 {part.files[0].sha256[:12]}) already landed as partition {part.duplicate_of}: ingested once, this copy skipped",
                                      partition_key=part.duplicate_of, content_sha256=part.files[0].sha256, detected_ns=now))
            continue
        keys = reg.to_run.setdefault(part.partition_set, [])
        if part.key not in keys:
            keys.append(part.key)
    if landed_rows:
        df = pl.DataFrame(landed_rows, infer_schema_length=None)
        for (pset, key), grp in df.group_by(["partition_set", "partition_key"], maintain_order=True):
            # one registry file per partition; a changed folder partition replaces its rows
            # file partitions are immutable (the key holds the content hash); folders can grow
            prev = wh.read("landed_files", partitions=[f"{pset}__{key}"]) if pset in ("captures", "incidents") else None
            merged = conform(grp, LANDED)
            if prev is not None and prev.height:
                merged = pl.concat([conform(prev, LANDED), merged]).unique("path", keep="last", maintain_order=True)
            wh.write_partition("landed_files", f"{pset}__{key}", LANDED.validate(merged))
    if rejected_rows:
        rej = REJECTED.validate(conform(pl.DataFrame(rejected_rows, infer_schema_length=None), REJECTED))
        for (src,), grp in rej.group_by(["source_file"], maintain_order=True):
            wh.write_partition("rejected_records", f"registration__{src}", grp)
    return reg
