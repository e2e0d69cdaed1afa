-- recurring_hosts: which hosts (and which of their GPUs / NICs) keep coming back in verdicts?
-- Host-, gpu- and link-scope warning/critical verdicts are mapped to their host (gpu and link
-- subjects are IPs, mapped through the topology table; an IP missing there stands for itself)
-- and counted per host. An occurrence is one analysis window (or capture, or hour when a verdict
-- has neither); hosts with at least 2 occurrences are listed, most occurrences first.
-- info verdicts are left out (a healthy fleet only raises info).
-- Variables (`fleetscope sql NAME --var name=value`; in the duckdb shell `SET VARIABLE name = value;`):
--   min_occurrences  list hosts with at least this many occurrences (default: 2)
WITH topo AS (
    SELECT ip, any_value(host) AS host, any_value(gpu) AS gpu FROM topology GROUP BY ip
),
v AS (
    SELECT v.*, coalesce(v.end_ns, v.start_ns) AS t_ns,
           CASE WHEN v.scope = 'host' THEN v.subject ELSE coalesce(t.host, v.subject) END AS host,
           CASE WHEN v.scope IN ('gpu', 'link') THEN v.subject END AS ip,
           CASE WHEN v.scope IN ('gpu', 'link') THEN t.gpu END AS gpu,
           coalesce(v.window_id, v.capture_id,
                    CAST(coalesce(v.end_ns, v.start_ns) // 3600000000000 AS VARCHAR)) AS occurrence
    FROM anomaly_verdicts v LEFT JOIN topo t ON v.scope IN ('gpu', 'link') AND t.ip = v.subject
    WHERE v.scope IN ('host', 'gpu', 'link') AND v.severity IN ('warning', 'critical')
)
SELECT host,
       count(DISTINCT occurrence) AS occurrences,
       count(*) FILTER (WHERE severity = 'critical') AS critical,
       count(*) FILTER (WHERE severity = 'warning') AS warning,
       count(*) AS verdicts,
       string_agg(DISTINCT ip, ', ' ORDER BY ip) AS ips,
       string_agg(DISTINCT gpu, ', ' ORDER BY gpu) AS gpus,
       string_agg(DISTINCT scope || ':' || metric, ', ' ORDER BY scope || ':' || metric) AS findings,
       string_agg(DISTINCT team, ', ' ORDER BY team) AS teams,
       count(DISTINCT job_id) AS jobs,
       make_timestamp_ns(min(coalesce(start_ns, t_ns))) AS first_seen,
       make_timestamp_ns(max(t_ns)) AS last_seen,
       arg_max(explanation, (t_ns, explanation)) AS latest_explanation
FROM v
GROUP BY host
HAVING count(DISTINCT occurrence) >= coalesce(getvariable('min_occurrences')::BIGINT, 2)
ORDER BY occurrences DESC, critical DESC, verdicts DESC, host;
