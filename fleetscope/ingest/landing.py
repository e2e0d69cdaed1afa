"""The landing zone (docs/CONTRACT.md section 1): find what landed, identify it by content, group it into
partitions, and tell new from already-seen, duplicate and still-being-written.

Partition kinds:
  file kinds   topology/, flows/, hw/, incidents/   one partition per file, key '<stem>-<sha10>'
  folder kinds traces/<capture>/, timings/<capture>/ one partition per capture (key = capture name,
               shared by traces and timings); stacks/<incident>/ one partition per incident
A file whose content was already registered under another name is a duplicate: it is not ingested
again and is reported (rejected_records) with the partition it duplicates."""
from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

FILE_KINDS = {
    "topology": (".csv", ".parquet", ".csv.gz"),
    "flows": (".parquet", ".csv", ".csv.gz"),
    "hw": (".parquet", ".csv", ".csv.gz"),
    "incidents": (".json",),
}
FOLDER_KINDS = {
    "traces": (".json", ".json.gz"),
    "timings": (".parquet", ".jsonl", ".jsonl.gz", ".yaml", ".json"),
    "stacks": (".txt", ".json", ".pkl"),
}
# folder files also accepted by name: torch's Flight Recorder dumps (TORCH_FR_DUMP_TEMP_FILE prefix + rank, no suffix)
FOLDER_NAMES = {"stacks": re.compile(r"rank_\d+$", re.I)}


def _accepted(kind: str, name: str) -> bool:
    suffixes = FILE_KINDS.get(kind) or FOLDER_KINDS[kind]
    rx = FOLDER_NAMES.get(kind)
    return name.lower().endswith(suffixes) or bool(rx and rx.search(name))


# Partition set each kind belongs to (Dagster dynamic partitions of the same name).
PARTITION_SET = {"topology": "topology_files", "flows": "flow_files", "hw": "hw_files",
                 "incidents": "incidents", "traces": "captures", "timings": "captures", "stacks": "incidents"}
IN_PROGRESS_SUFFIXES = (".tmp", ".part", ".partial", ".crdownload", ".filepart", ".inprogress")
_KEY_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def safe_key(name: str) -> str:
    return _KEY_SAFE.sub("_", name).strip("_") or "x"


def file_key(path: Path, sha: str) -> str:
    stem = path.name
    for suf in (".csv.gz", ".jsonl.gz", ".json.gz", ".parquet", ".csv", ".json", ".jsonl"):
        if stem.endswith(suf):
            stem = stem[: -len(suf)]
            break
    return f"{safe_key(stem)[:60]}-{sha[:10]}"


@dataclass
class LandedFile:
    kind: str
    path: Path
    rel: str
    size: int
    mtime_ns: int
    sha256: str = ""

    @property
    def signature(self) -> str:
        return f"{self.size}:{self.mtime_ns}"


@dataclass
class Partition:
    kind: str               # landing kind
    partition_set: str      # dynamic partition set
    key: str
    files: list[LandedFile] = field(default_factory=list)
    duplicate_of: str | None = None   # file kinds: an already registered partition with this content


@dataclass
class ScanResult:
    partitions: list[Partition]
    deferred: list[tuple[str, str]]   # (relative path, why) still being written: picked up later
    ignored: list[tuple[str, str]]    # (relative path, why) not a landing file at all


def _in_progress(p: Path, mtime_ns: int, now_ns: int, settle_s: float) -> str | None:
    if p.name.startswith(".") or p.name.lower().endswith(IN_PROGRESS_SUFFIXES):
        return "still being written (temporary name); it will be ingested once renamed to its final name"
    if settle_s > 0 and now_ns - mtime_ns < settle_s * 1e9:
        return f"modified less than {settle_s:g} s ago (possibly still being written); it will be ingested once it settles"
    return None


def scan_landing(landing: Path | str, settle_s: float = 2.0, now_ns: int | None = None,
                 known_signatures: dict[str, str] | None = None,
                 known_hashes: dict[str, str] | None = None) -> ScanResult:
    """Walk the landing folder. known_signatures (rel path -> 'size:mtime') skips hashing unchanged
    files; known_hashes (file sha256 -> partition key) marks same-content files as duplicates."""
    landing = Path(landing)
    now_ns = now_ns or time.time_ns()
    known_signatures = known_signatures or {}
    known_hashes = dict(known_hashes or {})
    parts: dict[tuple[str, str], Partition] = {}
    deferred, ignored = [], []
    for kind in list(FILE_KINDS) + list(FOLDER_KINDS):
        root = landing / kind
        if not root.is_dir():
            continue
        pattern = "*" if kind in FILE_KINDS else "*/*"
        for p in sorted(root.glob(pattern)):
            if not p.is_file():
                continue
            rel = str(p.relative_to(landing))
            st = p.stat()
            why = _in_progress(p, st.st_mtime_ns, now_ns, settle_s)
            if why:
                deferred.append((rel, why))
                continue
            suffixes = FILE_KINDS.get(kind) or FOLDER_KINDS[kind]
            if not _accepted(kind, p.name):
                ignored.append((rel, f"not a {kind} file (expected {', '.join(suffixes)})"))
                continue
            lf = LandedFile(kind, p, rel, st.st_size, st.st_mtime_ns)
            lf.sha256 = sha256_file(p)
            if kind in FILE_KINDS:
                key = file_key(p, lf.sha256)
                part = Partition(kind, PARTITION_SET[kind], key, [lf])
                prev = known_hashes.get(lf.sha256)
                if prev is not None and prev != key:
                    part.duplicate_of = prev
                else:
                    known_hashes[lf.sha256] = key
                parts[(kind, key)] = part
            else:
                key = safe_key(p.parent.name)
                parts.setdefault((kind, key), Partition(kind, PARTITION_SET[kind], key)).files.append(lf)
    return ScanResult(list(parts.values()), deferred, ignored)


def dedupe_folder_files(files: list[LandedFile]) -> tuple[list[LandedFile], list[tuple[LandedFile, LandedFile]]]:
    """Inside one capture/incident folder: the same content under two names is read once.
    Returns (unique files, [(duplicate, original)])."""
    seen: dict[str, LandedFile] = {}
    dups = []
    for f in sorted(files, key=lambda f: f.rel):
        if not f.sha256:
            f.sha256 = sha256_file(f.path)
        if f.sha256 in seen:
            dups.append((f, seen[f.sha256]))
        else:
            seen[f.sha256] = f
    return list(seen.values()), dups


def folder_files(landing: Path, kind: str, key: str) -> list[LandedFile]:
    """Current files of a folder partition (what an ingestion run reads)."""
    folder = Path(landing) / kind
    out = []
    if not folder.is_dir():
        return out
    for d in folder.iterdir():
        if d.is_dir() and safe_key(d.name) == key:
            for p in sorted(d.iterdir()):
                if p.is_file() and not _in_progress(p, p.stat().st_mtime_ns, time.time_ns(), 0) \
                        and _accepted(kind, p.name):
                    st = p.stat()
                    out.append(LandedFile(kind, p, str(p.relative_to(landing)), st.st_size, st.st_mtime_ns))
    return out
