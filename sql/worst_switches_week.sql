-- worst_switches_week: which switches had the most and the most severe findings in the last 7 days?
-- One row per switch with switch-scope verdicts (anomaly_verdicts.scope = 'switch'), ordered by
-- critical count, then warning count, then all verdicts. The 7 days end at the newest verdict time
-- in the warehouse (a verdict's time is its end_ns, else its start_ns; verdicts without a time
-- span cannot be placed in a week and are left out here; see verdicts_by_team for all of them).
-- hosts_below: hosts cabled to the switch (leaf or spine) in the topology table.
-- Variables (`fleetscope sql NAME --var name=value`; in the duckdb shell `SET VARIABLE name = value;`):
--   days      how many days back (default: 7)
--   as_of_ns  the week ends at this time, ns since the epoch (default: the newest verdict time)
WITH v AS (
    SELECT *, coalesce(end_ns, start_ns) AS t_ns FROM anomaly_verdicts WHERE scope = 'switch'
),
params AS (
    SELECT coalesce(getvariable('as_of_ns')::BIGINT, max(t_ns)) AS as_of_ns,
           CAST(coalesce(getvariable('days')::DOUBLE, 7) * 86400e9 AS BIGINT) AS span_ns
    FROM v
),
week AS (
    SELECT v.* FROM v, params p WHERE v.t_ns > p.as_of_ns - p.span_ns AND v.t_ns <= p.as_of_ns
),
below AS (
    SELECT sw, count(DISTINCT host) AS hosts_below
    FROM (SELECT leaf AS sw, host FROM topology UNION ALL SELECT spine AS sw, host FROM topology)
    WHERE sw IS NOT NULL
    GROUP BY sw
)
SELECT w.subject AS switch,
       count(*) FILTER (WHERE severity = 'critical') AS critical,
       count(*) FILTER (WHERE severity = 'warning') AS warning,
       count(*) AS verdicts,
       count(DISTINCT coalesce(window_id, capture_id, CAST(t_ns // 3600000000000 AS VARCHAR))) AS windows,
       string_agg(DISTINCT metric, ', ' ORDER BY metric) AS metrics,
       string_agg(DISTINCT detector, ', ' ORDER BY detector) AS detectors,
       any_value(b.hosts_below) AS hosts_below,
       make_timestamp_ns(min(coalesce(start_ns, t_ns))) AS first_seen,
       make_timestamp_ns(max(t_ns)) AS last_seen,
       arg_max(explanation, (t_ns, explanation)) AS latest_explanation
FROM week w LEFT JOIN below b ON b.sw = w.subject
GROUP BY w.subject
ORDER BY critical DESC, warning DESC, verdicts DESC, switch;
