"""What every per-capture analysis reads: the capture's rows of a table, its layout, its job id,
and the hw samples covering its time span."""
import polars as pl

from fleetscope.warehouse import Warehouse


def capture_info(wh: Warehouse, key: str) -> dict:
    cap = wh.read("captures", partitions=[key])
    info = cap.to_dicts()[0] if cap.height else {"capture_id": key}
    layout = {k: info[k] for k in ("dp", "pp", "tp", "vpp", "world_size") if info.get(k) is not None}
    return {"job_id": info.get("job_id") or key, "layout": layout or None}


def capture_hw(wh: Warehouse, frame: pl.DataFrame, start_col: str, end_col: str) -> pl.DataFrame | None:
    """hw samples within the capture's time span (+/- 1 s); None when there are none."""
    if frame.height == 0 or not wh.partitions("hw"):
        return None
    lo, hi = frame[start_col].min(), frame[end_col].max()
    hw = wh.read("hw", where=f"ts_ns BETWEEN {lo - 1_000_000_000} AND {hi + 1_000_000_000}")
    return hw if hw.height else None
