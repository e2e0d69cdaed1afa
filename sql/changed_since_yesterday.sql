-- changed_since_yesterday: what changed in the findings over the last 24 hours, against the 24 hours before?
-- A finding is (detector, scope, subject, job, metric). change is
--   new    raised in the last 24 h, not in the day before
--   worse  raised in both, with a higher worst severity now
--   gone   raised the day before, not in the last 24 h
--   better raised in both, with a lower worst severity now
-- Findings unchanged in severity are left out. New and worse first, critical first.
-- The 24 h end at the newest verdict time (end_ns, else start_ns) in the warehouse; verdicts
-- without a time span are left out.
-- Variables (`fleetscope sql NAME --var name=value`; in the duckdb shell `SET VARIABLE name = value;`):
--   as_of_ns  compare the 24 h before this time (ns since the epoch) with the 24 h before those (default: the newest verdict time)
WITH v AS (
    SELECT *, coalesce(end_ns, start_ns) AS t_ns,
           CASE severity WHEN 'critical' THEN 2 WHEN 'warning' THEN 1 ELSE 0 END AS sev
    FROM anomaly_verdicts
    WHERE coalesce(end_ns, start_ns) IS NOT NULL
),
params AS (SELECT coalesce(getvariable('as_of_ns')::BIGINT, max(t_ns)) AS as_of_ns FROM v),
tagged AS (
    SELECT v.*, CASE WHEN v.t_ns > p.as_of_ns - 86400000000000 THEN 'today' ELSE 'yesterday' END AS day
    FROM v, params p
    WHERE v.t_ns <= p.as_of_ns AND v.t_ns > p.as_of_ns - 2 * 86400000000000
),
findings AS (
    SELECT detector, scope, subject, job_id, metric,
           any_value(team) AS team,
           count(*) FILTER (WHERE day = 'today') AS n_today,
           count(*) FILTER (WHERE day = 'yesterday') AS n_yesterday,
           max(sev) FILTER (WHERE day = 'today') AS sev_today,
           max(sev) FILTER (WHERE day = 'yesterday') AS sev_yesterday,
           max(t_ns) AS last_ns,
           arg_max(explanation, (t_ns, explanation)) AS latest_explanation
    FROM tagged
    GROUP BY detector, scope, subject, job_id, metric
),
labelled AS (
    SELECT *, CASE WHEN n_yesterday = 0 THEN 'new'
                   WHEN n_today = 0 THEN 'gone'
                   WHEN sev_today > sev_yesterday THEN 'worse'
                   WHEN sev_today < sev_yesterday THEN 'better' END AS change
    FROM findings
)
SELECT change,
       ['info', 'warning', 'critical'][coalesce(sev_today, sev_yesterday) + 1] AS severity,
       team, scope, subject, job_id, metric, detector, n_today, n_yesterday,
       make_timestamp_ns(last_ns) AS last_seen, latest_explanation
FROM labelled
WHERE change IS NOT NULL
ORDER BY CASE change WHEN 'new' THEN 0 WHEN 'worse' THEN 1 WHEN 'gone' THEN 2 ELSE 3 END,
         coalesce(sev_today, sev_yesterday) DESC, team, scope, subject;
