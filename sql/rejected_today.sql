-- rejected_today: what did ingestion quarantine in the last 24 hours, and why?
-- One row per landed file with rejections (rejected_records), most rejected rows first:
-- whole-file rejections (row_number is null: unreadable, empty, duplicate content, ...) and
-- row rejections (schema breaks, negative durations, ...), with the distinct reasons.
-- "Today" is the 24 hours before the time this query runs (detected_ns is the ingestion time).
-- Variables (`fleetscope sql NAME --var name=value`; in the duckdb shell `SET VARIABLE name = value;`):
--   hours  how far back to look from now, in hours (default: 24)
SELECT source_kind,
       source_file,
       count(*) FILTER (WHERE row_number IS NULL) > 0 AS whole_file_rejected,
       count(*) FILTER (WHERE row_number IS NOT NULL) AS rows_rejected,
       min(row_number) AS first_bad_row,
       count(DISTINCT reason) AS distinct_reasons,
       string_agg(DISTINCT left(reason, 160), ' | ' ORDER BY left(reason, 160)) AS reasons,
       any_value(partition_key) AS partition_key,
       make_timestamp_ns(max(detected_ns)) AS last_detected
FROM rejected_records
WHERE detected_ns > epoch_ns(now()) - CAST(coalesce(getvariable('hours')::DOUBLE, 24) * 3600e9 AS BIGINT)
GROUP BY source_kind, source_file
ORDER BY whole_file_rejected DESC, rows_rejected DESC, source_kind, source_file;
