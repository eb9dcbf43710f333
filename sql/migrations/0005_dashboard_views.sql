-- kprof schema, version 5: views for dashboards (Grafana: deploy/grafana) and the read-only
-- role kprof_dashboard that may select them and nothing else.
--
-- Every view lives in the schema kprof_dash, carries run_id and job, and is meant to be
-- queried with WHERE run_id = R (and optionally rank = N): the planner pushes that condition
-- down through the views' joins, GROUP BYs and window functions (all of them partition by
-- run_id) to the event tables, so only the run's partitions are read. A view without such a
-- condition reads every run: don't.
--
-- Times are milliseconds (double precision) unless a column says _ns or _us; step numbers
-- are those of the steps table (the step hook's, or ProfilerStep#N of an imported trace).
--
-- What SQL does cheaply, and what it leaves to kprof-analyzer: these views add up event
-- durations (sum of dur_ns) per rank and step. Kernels that overlap on several streams
-- therefore count twice, and idle time, communication/computation overlap and the
-- TensorBoard plugin's priority-rule breakdown (Kernel > Memcpy > Memset > Communication >
-- Runtime > DataLoader > CPU Exec > Other, never double counted) are not here: they come
-- from kprof-analyzer (`kprofctl breakdown --run R --rank N`) and `kprofctl compare`.
--
-- Attribution of GPU events to steps: by the row's own step column where it is set (a kprof
-- capture, through kprof-agent, and kprof-loadgen set it); an imported trace's rows have
-- none, and such a row belongs to the step of its rank whose host range [start_ns, start_ns +
-- dur_ns) holds the event's start (an approximation: the GPU may run behind the host; the
-- analyzer attributes by the launching call instead). Events outside every step count in no
-- step.
--
-- NCCL kernels are the kernels whose name starts with ncclKernel_ or ncclDevKernel_ (both of
-- NCCL's naming schemes); every other kernel is a compute kernel.
--
-- Public views (kprof_dashboard may select them):
--   kprof_dash.runs                 one row per run, with a label for pickers
--   kprof_dash.step_times           per run, rank and step: step time, the step's median
--                                   across ranks and the rank's deviation from it
--   kprof_dash.rank_step_breakdown  per run, rank and step: step, kernel, NCCL, memcpy and
--                                   memset time
--   kprof_dash.rank_breakdown       per run and rank: the same, as means per step and totals
--   kprof_dash.top_kernels          per run, rank and kernel name: calls, total/mean/min/max
--   kprof_dash.stragglers           per run, step and rank: step time, NCCL time and the time
--                                   outside NCCL, spread across ranks, straggler flags
--   kprof_dash.straggler_ranks      per run and rank: stragglers summed over the steps
--   kprof_dash.capture_status       per captured run and rank: the capture and the rank's
--                                   state (captures, capture_ranks, runs)
-- Helpers (not granted): kprof_dash.nccl_names, kprof_dash.gpu_events.
--
-- A later migration that changes the type of, or drops, a column these views read must drop
-- and recreate the views (PostgreSQL refuses otherwise), and re-run
-- kprof_dash.grant_dashboard_role() after recreating them.

CREATE SCHEMA kprof_dash;
COMMENT ON SCHEMA kprof_dash IS
    'kprof views for dashboards (migration 0005); query them by run_id. Role kprof_dashboard '
    'may select the public views only.';

-- The straggler threshold of kprof_dash.stragglers: a rank is flagged in a step when its step
-- time, or its time outside NCCL kernels, exceeds this many times the step's median across
-- ranks. An immutable function rather
-- than a literal, so that the views and their documentation share one number. Functions in a
-- view are checked against the querying user: kprof_dashboard calls it through PUBLIC's
-- default EXECUTE.
CREATE FUNCTION kprof_dash.straggler_threshold() RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1.2::double precision $$;

-- Helper: the names ids of NCCL kernels.
CREATE VIEW kprof_dash.nccl_names AS
SELECT id
FROM names
WHERE name LIKE 'ncclKernel\_%' OR name LIKE 'ncclDevKernel\_%';

-- Helper: kernels, memcpys and memsets as one stream. kind: 'kernel' (compute kernel),
-- 'nccl' (NCCL kernel), 'memcpy', 'memset'.
CREATE VIEW kprof_dash.gpu_events AS
SELECT k.run_id, k.rank, k.step, k.start_ns, k.dur_ns,
       CASE WHEN k.name IN (SELECT id FROM kprof_dash.nccl_names) THEN 'nccl' ELSE 'kernel' END
           AS kind
FROM kernels k
UNION ALL
SELECT m.run_id, m.rank, m.step, m.start_ns, m.dur_ns, 'memcpy' FROM memcpys m
UNION ALL
SELECT s.run_id, s.rank, s.step, s.start_ns, s.dur_ns, 'memset' FROM memsets s;

-- Runs, for pickers (Grafana's job and run variables).
--   run_id, job, name, state ('open', 'ended', 'failed'), source ('capture', 'import',
--   'synthetic', 'unspecified'), world_size, created_at, ended_at,
--   label: '#<id> <job>[ <name>] <created_at, UTC, to the second>'.
CREATE VIEW kprof_dash.runs AS
SELECT r.id AS run_id, r.job, r.name,
       CASE r.state WHEN 1 THEN 'open' WHEN 2 THEN 'ended' WHEN 3 THEN 'failed'
                    ELSE 'unspecified' END AS state,
       CASE r.source WHEN 1 THEN 'capture' WHEN 2 THEN 'import' WHEN 3 THEN 'synthetic'
                     ELSE 'unspecified' END AS source,
       r.world_size, r.created_at, r.ended_at,
       '#' || r.id || ' ' || r.job || CASE WHEN r.name <> '' THEN ' ' || r.name ELSE '' END ||
           ' ' || to_char(r.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') AS label
FROM runs r;

-- Step time per run, rank and step.
--   run_id, job, rank, step, start_ns, start_time (start_ns as a timestamptz), dur_ns,
--   dur_ms, ranks (ranks that recorded this step), median_ms (the step's median across those
--   ranks, percentile_cont(0.5)), deviation_ms (dur_ms - median_ms),
--   ratio_to_median (dur_ms / median_ms; NULL when the median is 0).
CREATE VIEW kprof_dash.step_times AS
SELECT s.run_id, r.job, s.rank, s.step, s.start_ns,
       to_timestamp(s.start_ns / 1e9) AS start_time,
       s.dur_ns,
       s.dur_ns / 1e6::double precision AS dur_ms,
       m.ranks,
       m.median_ns / 1e6 AS median_ms,
       (s.dur_ns - m.median_ns) / 1e6 AS deviation_ms,
       s.dur_ns / nullif(m.median_ns, 0) AS ratio_to_median
FROM steps s
JOIN runs r ON r.id = s.run_id
JOIN (SELECT run_id, step, count(*) AS ranks,
             percentile_cont(0.5) WITHIN GROUP (ORDER BY dur_ns) AS median_ns
      FROM steps
      GROUP BY run_id, step) m ON m.run_id = s.run_id AND m.step = s.step;

-- Per run, rank and step: what the rank's GPU did in the step, as sums of durations (see the
-- head of this file: overlaps count twice; the exact breakdown is kprof-analyzer's).
--   run_id, job, rank, step, start_ns, step_ms (the step's duration),
--   kernel_ms (all kernels), compute_kernel_ms (kernels other than NCCL's), nccl_ms (NCCL
--   kernels), memcpy_ms, memset_ms, kernels (count, NCCL included), nccl_kernels (count).
CREATE VIEW kprof_dash.rank_step_breakdown AS
SELECT st.run_id, r.job, st.rank, st.step, st.start_ns,
       st.dur_ns / 1e6::double precision AS step_ms,
       coalesce(a.compute_ns + a.nccl_ns, 0) / 1e6::double precision AS kernel_ms,
       coalesce(a.compute_ns, 0) / 1e6::double precision AS compute_kernel_ms,
       coalesce(a.nccl_ns, 0) / 1e6::double precision AS nccl_ms,
       coalesce(a.memcpy_ns, 0) / 1e6::double precision AS memcpy_ms,
       coalesce(a.memset_ns, 0) / 1e6::double precision AS memset_ms,
       coalesce(a.kernels, 0) AS kernels,
       coalesce(a.nccl_kernels, 0) AS nccl_kernels
FROM steps st
JOIN runs r ON r.id = st.run_id
LEFT JOIN (
    SELECT e.run_id, e.rank, e.step,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.kind = 'kernel'), 0) AS compute_ns,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.kind = 'nccl'), 0) AS nccl_ns,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.kind = 'memcpy'), 0) AS memcpy_ns,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.kind = 'memset'), 0) AS memset_ns,
           count(*) FILTER (WHERE e.kind IN ('kernel', 'nccl')) AS kernels,
           count(*) FILTER (WHERE e.kind = 'nccl') AS nccl_kernels
    FROM (
        -- rows that carry their step
        SELECT g.run_id, g.rank, g.step::bigint AS step, g.kind, g.dur_ns
        FROM kprof_dash.gpu_events g
        WHERE g.step IS NOT NULL
        UNION ALL
        -- rows that don't (imported traces): the step whose host range holds their start
        SELECT g.run_id, g.rank, s.step, g.kind, g.dur_ns
        FROM kprof_dash.gpu_events g
        JOIN steps s ON s.run_id = g.run_id AND s.rank = g.rank
                    AND g.start_ns >= s.start_ns AND g.start_ns < s.start_ns + s.dur_ns
        WHERE g.step IS NULL
    ) e
    GROUP BY e.run_id, e.rank, e.step
) a ON a.run_id = st.run_id AND a.rank = st.rank AND a.step = st.step;

-- Per run and rank, for a bar chart: rank_step_breakdown over the rank's steps.
--   run_id, job, rank, steps, and the mean per step of step_ms, kernel_ms,
--   compute_kernel_ms, nccl_ms, memcpy_ms, memset_ms (same names), then the totals over
--   the steps: total_step_ms, total_kernel_ms, total_nccl_ms, total_memcpy_ms,
--   total_memset_ms.
CREATE VIEW kprof_dash.rank_breakdown AS
SELECT b.run_id, b.job, b.rank, count(*) AS steps,
       avg(b.step_ms) AS step_ms,
       avg(b.kernel_ms) AS kernel_ms,
       avg(b.compute_kernel_ms) AS compute_kernel_ms,
       avg(b.nccl_ms) AS nccl_ms,
       avg(b.memcpy_ms) AS memcpy_ms,
       avg(b.memset_ms) AS memset_ms,
       sum(b.step_ms) AS total_step_ms,
       sum(b.kernel_ms) AS total_kernel_ms,
       sum(b.nccl_ms) AS total_nccl_ms,
       sum(b.memcpy_ms) AS total_memcpy_ms,
       sum(b.memset_ms) AS total_memset_ms
FROM kprof_dash.rank_step_breakdown b
GROUP BY b.run_id, b.job, b.rank;

-- Kernels per run, rank and name, over the whole run (inside steps or not).
--   run_id, job, rank, kernel (its name; '(unnamed)' without one), is_nccl, calls,
--   total_ms, mean_us, min_us, max_us, pct_of_rank (share of the rank's kernel time, %),
--   position (1 = the rank's most expensive kernel; ties broken by name).
-- Across ranks: GROUP BY kernel, sum(calls), sum(total_ms), max(max_us), and
-- 1000 * sum(total_ms) / sum(calls) for the mean (the dashboard's panel does that).
CREATE VIEW kprof_dash.top_kernels AS
SELECT a.run_id, r.job, a.rank,
       coalesce(n.name, '(unnamed)') AS kernel,
       a.name IN (SELECT id FROM kprof_dash.nccl_names) AS is_nccl,
       a.calls,
       a.total_ns / 1e6::double precision AS total_ms,
       a.total_ns / 1e3::double precision / a.calls AS mean_us,
       a.min_ns / 1e3::double precision AS min_us,
       a.max_ns / 1e3::double precision AS max_us,
       100 * a.total_ns::double precision /
           nullif(sum(a.total_ns) OVER (PARTITION BY a.run_id, a.rank), 0) AS pct_of_rank,
       row_number() OVER (PARTITION BY a.run_id, a.rank
                          ORDER BY a.total_ns DESC, coalesce(n.name, '')) AS position
FROM (SELECT run_id, rank, name, count(*) AS calls, sum(dur_ns) AS total_ns,
             min(dur_ns) AS min_ns, max(dur_ns) AS max_ns
      FROM kernels
      GROUP BY run_id, rank, name) a
JOIN runs r ON r.id = a.run_id
LEFT JOIN names n ON n.id = a.name;

-- Stragglers per run, step and rank. In a synchronous job (DDP) every rank's step ends at the
-- same collectives, so step times hardly differ: a straggler shows up as the rank that reaches
-- the collectives late, while the others wait for it inside their NCCL kernels. So besides
-- the step time this view compares work_ms, the step's time outside NCCL kernels
-- (step_ms - nccl_ms, at least 0: compute, data loading, launch overhead, everything but the
-- wait), across ranks; a high nccl_ms marks a rank that waits, not a slow one. NCCL kernels
-- that overlap compute make work_ms an approximation; `kprofctl compare` gives the exact
-- figures and the cause.
--   run_id, job, step, rank, step_ms, nccl_ms, work_ms, compute_kernel_ms,
--   ranks (ranks that recorded the step), median_step_ms (the median across them, as
--   percentile_cont(0.5)), min_step_ms, max_step_ms, step_spread_ms (max - min),
--   ratio_to_median (step_ms / median_step_ms), median_work_ms, work_ratio (work_ms /
--   median_work_ms), mean_nccl_ms, min_nccl_ms, max_nccl_ms, nccl_spread_ms (max - min),
--   slow_step: step_ms > T x median_step_ms (a step longer than the others': ranks that do
--   not synchronise, or an imported trace);
--   late_rank: work_ms > T x median_work_ms (the rank the others wait for);
--   is_straggler: slow_step or late_rank;
-- with T = kprof_dash.straggler_threshold() = 1.2. The medians are computed with window
-- functions (partitioned by run_id and step) so that WHERE run_id = R still reaches the
-- event tables.
CREATE VIEW kprof_dash.stragglers AS
SELECT y.run_id, y.job, y.step, y.rank, y.step_ms, y.nccl_ms, y.work_ms, y.compute_kernel_ms,
       y.ranks, y.median_step_ms, y.min_step_ms, y.max_step_ms,
       y.max_step_ms - y.min_step_ms AS step_spread_ms,
       y.step_ms / nullif(y.median_step_ms, 0) AS ratio_to_median,
       y.median_work_ms,
       y.work_ms / nullif(y.median_work_ms, 0) AS work_ratio,
       y.mean_nccl_ms, y.min_nccl_ms, y.max_nccl_ms,
       y.max_nccl_ms - y.min_nccl_ms AS nccl_spread_ms,
       y.step_ms > kprof_dash.straggler_threshold() * y.median_step_ms AS slow_step,
       y.work_ms > kprof_dash.straggler_threshold() * y.median_work_ms AS late_rank,
       y.step_ms > kprof_dash.straggler_threshold() * y.median_step_ms OR
           y.work_ms > kprof_dash.straggler_threshold() * y.median_work_ms AS is_straggler
FROM (
    SELECT x.*,
           -- the median: the middle row, or the mean of the two middle rows
           avg(x.step_ms) FILTER (WHERE x.rn_step BETWEEN (x.ranks + 1) / 2
                                                      AND (x.ranks + 2) / 2) OVER w
               AS median_step_ms,
           avg(x.work_ms) FILTER (WHERE x.rn_work BETWEEN (x.ranks + 1) / 2
                                                      AND (x.ranks + 2) / 2) OVER w
               AS median_work_ms,
           min(x.step_ms) OVER w AS min_step_ms,
           max(x.step_ms) OVER w AS max_step_ms,
           avg(x.nccl_ms) OVER w AS mean_nccl_ms,
           min(x.nccl_ms) OVER w AS min_nccl_ms,
           max(x.nccl_ms) OVER w AS max_nccl_ms
    FROM (
        SELECT b.run_id, b.job, b.step, b.rank, b.step_ms, b.nccl_ms, b.compute_kernel_ms,
               b.work_ms,
               count(*) OVER (PARTITION BY b.run_id, b.step) AS ranks,
               row_number() OVER (PARTITION BY b.run_id, b.step ORDER BY b.step_ms, b.rank)
                   AS rn_step,
               row_number() OVER (PARTITION BY b.run_id, b.step ORDER BY b.work_ms, b.rank)
                   AS rn_work
        FROM (SELECT rb.run_id, rb.job, rb.step, rb.rank, rb.step_ms, rb.nccl_ms,
                     rb.compute_kernel_ms, greatest(rb.step_ms - rb.nccl_ms, 0) AS work_ms
              FROM kprof_dash.rank_step_breakdown rb) b
    ) x
    WINDOW w AS (PARTITION BY x.run_id, x.step)
) y;

-- Per run and rank: kprof_dash.stragglers over the steps.
--   run_id, job, rank, steps, straggler_steps (steps where is_straggler), slow_steps,
--   late_steps (steps where slow_step, late_rank), mean_ratio and max_ratio (of
--   ratio_to_median), mean_work_ratio and max_work_ratio (of work_ratio), mean_step_ms,
--   mean_work_ms, mean_nccl_ms, mean_deviation_ms (mean of step_ms - median_step_ms),
--   is_straggler: flagged in at least half of its steps.
CREATE VIEW kprof_dash.straggler_ranks AS
SELECT s.run_id, s.job, s.rank, count(*) AS steps,
       count(*) FILTER (WHERE s.is_straggler) AS straggler_steps,
       count(*) FILTER (WHERE s.slow_step) AS slow_steps,
       count(*) FILTER (WHERE s.late_rank) AS late_steps,
       avg(s.ratio_to_median) AS mean_ratio,
       max(s.ratio_to_median) AS max_ratio,
       avg(s.work_ratio) AS mean_work_ratio,
       max(s.work_ratio) AS max_work_ratio,
       avg(s.step_ms) AS mean_step_ms,
       avg(s.work_ms) AS mean_work_ms,
       avg(s.nccl_ms) AS mean_nccl_ms,
       avg(s.step_ms - s.median_step_ms) AS mean_deviation_ms,
       2 * count(*) FILTER (WHERE s.is_straggler) >= count(*) AS is_straggler
FROM kprof_dash.stragglers s
GROUP BY s.run_id, s.job, s.rank;

-- Captures (kprofctl start) with each selected rank's last known state.
--   run_id, job, run_name, run_state (as in kprof_dash.runs), created_at, ended_at,
--   start_step (-1: a time window), steps (0: a time window), duration_ms, activities,
--   deadline_at, stopped, rank, rank_state ('pending', 'capturing', 'flushing', 'done',
--   'failed'; NULL: no rank row yet), host, pid, records, dropped, first_step, last_step,
--   reason (why a rank failed), updated_at.
CREATE VIEW kprof_dash.capture_status AS
SELECT c.run_id, r.job, r.name AS run_name,
       CASE r.state WHEN 1 THEN 'open' WHEN 2 THEN 'ended' WHEN 3 THEN 'failed'
                    ELSE 'unspecified' END AS run_state,
       r.created_at, r.ended_at,
       c.start_step, c.steps, c.duration_ms, c.activities, c.deadline_at, c.stopped,
       cr.rank,
       CASE WHEN cr.state IS NULL THEN NULL
            WHEN cr.state = 1 THEN 'pending' WHEN cr.state = 2 THEN 'capturing'
            WHEN cr.state = 3 THEN 'flushing' WHEN cr.state = 4 THEN 'done'
            WHEN cr.state = 5 THEN 'failed' ELSE 'unspecified' END AS rank_state,
       cr.host, cr.pid, cr.records, cr.dropped, cr.first_step, cr.last_step, cr.reason,
       cr.updated_at
FROM captures c
JOIN runs r ON r.id = c.run_id
LEFT JOIN capture_ranks cr ON cr.run_id = c.run_id;

COMMENT ON VIEW kprof_dash.runs IS 'kprof runs with a label, for dashboard pickers';
COMMENT ON VIEW kprof_dash.step_times IS
    'step time per run, rank and step, with the step''s median across ranks';
COMMENT ON VIEW kprof_dash.rank_step_breakdown IS
    'per run, rank and step: sums of kernel, NCCL, memcpy and memset durations (overlaps '
    'count twice; the exact breakdown is kprof-analyzer''s)';
COMMENT ON VIEW kprof_dash.rank_breakdown IS
    'per run and rank: rank_step_breakdown as means per step and totals';
COMMENT ON VIEW kprof_dash.top_kernels IS 'kernels per run, rank and name: calls and durations';
COMMENT ON VIEW kprof_dash.stragglers IS
    'per run, step and rank: step and NCCL time, spread across ranks; is_straggler when the '
    'step time or the time outside NCCL kernels > 1.2 x the step''s median across ranks';
COMMENT ON VIEW kprof_dash.straggler_ranks IS 'per run and rank: stragglers over the steps';
COMMENT ON VIEW kprof_dash.capture_status IS 'captures and their ranks'' states';

-- The read-only role. Views run with their owner's rights, so SELECT on a view is all it
-- needs: it gets no right on any table or helper view. kprof_dash.grant_dashboard_role()
-- (re)applies the grants; an administrator runs it after creating the role by hand when the
-- migrating user could not (see below).
CREATE FUNCTION kprof_dash.grant_dashboard_role() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    GRANT USAGE ON SCHEMA kprof_dash TO kprof_dashboard;
    GRANT SELECT ON kprof_dash.runs, kprof_dash.step_times, kprof_dash.rank_step_breakdown,
                    kprof_dash.rank_breakdown, kprof_dash.top_kernels, kprof_dash.stragglers,
                    kprof_dash.straggler_ranks, kprof_dash.capture_status
        TO kprof_dashboard;
END
$$;
REVOKE ALL ON FUNCTION kprof_dash.grant_dashboard_role() FROM PUBLIC;

-- Roles are cluster-wide: the role may exist already (another database of the cluster was
-- migrated first), or be created at this very moment by the migration of another database
-- (the advisory lock of kp_pg_migrate is per database), in which case CREATE ROLE fails with
-- unique_violation once that transaction commits. Both are fine. A migrating user without
-- CREATEROLE cannot create it: the migration goes on without it and says so; an
-- administrator then runs CREATE ROLE kprof_dashboard NOLOGIN; and, as the owner of the
-- views, SELECT kprof_dash.grant_dashboard_role();
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'kprof_dashboard') THEN
        BEGIN
            CREATE ROLE kprof_dashboard NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;
            WHEN insufficient_privilege THEN
                RAISE WARNING 'kprof: role kprof_dashboard not created (%); dashboards need '
                              'it: CREATE ROLE kprof_dashboard NOLOGIN, then SELECT '
                              'kprof_dash.grant_dashboard_role()', SQLERRM;
        END;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'kprof_dashboard') THEN
        PERFORM kprof_dash.grant_dashboard_role();
    END IF;
END
$$;
