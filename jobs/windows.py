"""Which flow windows the ingested flow files touched: the `flows` asset records them in its
materialization metadata; the flow-window sensor and `fleetscope run` both read them here."""
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance


def touched_windows(instance: DagsterInstance, after_storage_id: int | None = None,
                    flow_partitions: list[str] | None = None, limit: int = 200) -> tuple[dict[str, int], int]:
    """-> ({window id: storage id of the newest flows materialization touching it}, newest storage id
    seen). Either the materializations after a cursor (the sensor) or those of given partitions."""
    if flow_partitions is not None:
        records = [r for k in flow_partitions for r in instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("flows"), asset_partitions=[k]), limit=1).records]
    else:
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("flows"), after_storage_id=after_storage_id or 0), limit=limit, ascending=True).records
    windows, last = {}, after_storage_id or 0
    for rec in records:
        last = max(last, rec.storage_id)
        md = rec.asset_materialization.metadata if rec.asset_materialization else {}
        for w in (md["windows"].value if "windows" in md else None) or []:
            windows[w] = max(windows.get(w, 0), rec.storage_id)
    return windows, last


def analysed_since(instance: DagsterInstance, window: str, storage_id: int) -> bool:
    """Whether the window's analysis (its `jobs` partition) ran after the flows materialization with
    this storage id: `fleetscope run` or an earlier sensor tick already covered those flows."""
    recs = instance.fetch_materializations(AssetRecordsFilter(asset_key=AssetKey("jobs"), asset_partitions=[window]),
                                           limit=1).records
    return bool(recs) and recs[0].storage_id > storage_id
