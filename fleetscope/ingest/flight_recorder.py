"""Reader of collective-progress dumps in landing/stacks/<incident>/ (docs/CONTRACT.md 1.6): PyTorch
Flight Recorder dumps and the fleetscope tracer's progress, which uses the same JSON layout.

- `fr_rank<R>.json`: what torch.distributed's `_dump_fr_trace_json()` returns (the collectors add
  `rank`), or the tracer's ring buffer of collective calls;
- `<prefix>rank_<R>` (optionally `.pkl`): torch's own dump files (TORCH_FR_DUMP_TEMP_FILE prefix +
  rank, pickles written by the NCCL watchdog on a timeout), read with an unpickler that builds plain
  containers only (a pickle from the landing zone never runs code).
`entries_frame` flattens the dumps into the collective_progress table's rows."""
from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path

import polars as pl

_FR_NAME = re.compile(r"(?:^fr_rank|trace_rank_|(?<![a-z])rank_)(\d+)(?:\.json|\.pkl)?$", re.I)
_P2P = {"send": "send", "isend": "send", "recv": "recv", "irecv": "recv", "recv_": "recv"}


class FlightRecorderError(ValueError):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """Flight Recorder pickles hold dicts, lists, strings and numbers only; refuse anything else."""

    def find_class(self, module, name):
        raise FlightRecorderError(f"refusing to load {module}.{name} from a Flight Recorder pickle (only plain data is read)")


def is_dump_name(name: str) -> bool:
    return bool(_FR_NAME.search(name)) and not name.endswith(".txt")


def read_dump(path: str | Path) -> dict:
    """One rank's dump -> dict with 'rank', 'entries', 'pg_config' (raises FlightRecorderError)."""
    p = Path(path)
    raw = p.read_bytes()
    try:
        d = json.loads(raw) if raw.lstrip()[:1] in (b"{", b"[") else _PlainUnpickler(io.BytesIO(raw)).load()
    except FlightRecorderError:
        raise
    except Exception as exc:
        raise FlightRecorderError(f"{p.name}: not a Flight Recorder dump (JSON or pickle): {exc}") from exc
    if not isinstance(d, dict) or not isinstance(d.get("entries"), list):
        raise FlightRecorderError(f"{p.name}: no 'entries' list: not a Flight Recorder dump")
    if not isinstance(d.get("rank"), int):
        m = _FR_NAME.search(p.name)
        if not m:
            raise FlightRecorderError(f"{p.name}: the rank is neither in the dump nor in the name (fr_rank<R>.json)")
        d["rank"] = int(m.group(1))
    return d


def dump_files(folder: str | Path) -> list[Path]:
    d = Path(folder)
    return sorted(p for p in d.iterdir() if p.is_file() and is_dump_name(p.name)) if d.is_dir() else []


def _sizes(v) -> str:
    return json.dumps(v, separators=(",", ":")) if v is not None else ""


def _op(name: str) -> str:
    """'nccl:all_reduce', 'gloo:all_reduce', 'nccl:send 0->1', 'allreduce_base' -> all_reduce / send / recv."""
    n = name.split(":", 1)[-1].split(" ")[0].strip().lower()
    n = _P2P.get(n, n)
    return {"allreduce": "all_reduce", "allgather": "all_gather", "_allgather_base": "all_gather",
            "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
            "_reduce_scatter_base": "reduce_scatter", "reducescatter": "reduce_scatter"}.get(n, n)


def entries_frame(dumps: list[dict]) -> tuple[pl.DataFrame, dict[str, list[int]]]:
    """All ranks' entries as one frame, and the members of each process group where the dumps say."""
    rows, members = [], {}
    for d in dumps:
        r = int(d["rank"])
        for pg, cfg in (d.get("pg_config") or {}).items():
            try:
                ranks = json.loads(cfg.get("ranks", "[]")) if isinstance(cfg.get("ranks"), str) else list(cfg.get("ranks") or [])
            except ValueError:
                ranks = []
            if ranks:
                members.setdefault(str(cfg.get("name", pg)), sorted(int(x) for x in ranks))
        for e in d["entries"]:
            pgv = e.get("process_group") or [e.get("pg_id"), ""]
            op = _op(str(e.get("profiling_name", "")))
            is_p2p = bool(e.get("is_p2p")) or op in ("send", "recv")
            peer = e.get("peer")
            if peer is None and is_p2p:  # torch's p2p names carry the pair: 'nccl:send 0->1'
                m = re.search(r"(\d+)->(\d+)", str(e.get("profiling_name", "")))
                if m:
                    peer = int(m.group(2)) if op == "send" else int(m.group(1))
            completed = e.get("time_discovered_completed_ns") or None
            rows.append({"rank": r, "pg": str(pgv[0]), "pg_desc": str(pgv[1] if len(pgv) > 1 else ""),
                         "seq": int(e.get("p2p_seq_id" if is_p2p else "collective_seq_id") or 0),
                         "is_p2p": is_p2p, "peer": int(peer) if peer is not None else None, "collective": op,
                         "sizes": _sizes(e.get("input_sizes")), "state": str(e.get("state", "")),
                         "created_ns": int(e.get("time_created_ns") or 0), "completed_ns": int(completed) if completed else None,
                         "source": str(d.get("source", "torch.flight_recorder"))})
    return pl.DataFrame(rows, schema=PROGRESS_SCHEMA), members


PROGRESS_SCHEMA = {"rank": pl.Int32, "pg": pl.Utf8, "pg_desc": pl.Utf8, "seq": pl.Int64, "is_p2p": pl.Boolean, "peer": pl.Int32,
              "collective": pl.Utf8, "sizes": pl.Utf8, "state": pl.Utf8, "created_ns": pl.Int64, "completed_ns": pl.Int64,
              "source": pl.Utf8}


