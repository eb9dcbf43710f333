-- kprof schema, version 16: the dashboards' per-step and per-kernel sums, summarised once per
-- run when it ends (docs/storage.md), so that kprof_dash's views answer a run of a thousand
-- ranks from a few rows per (rank, step) and per (rank, kernel name) instead of its events.
--
-- collectord's summariser writes them in the transaction that writes the run's compare
-- summary (migration 0014), from the same functions the views use on a run without them
-- (kprof_dash.step_sums_events, kprof_dash.kernel_sums_events): one definition of each figure.
-- A run's dashboard sums count only while its dash_runs row exists; that row references the
-- run's compare_runs row, so whatever makes the compare summary stale (a late batch, rows
-- changed by hand: 0014's triggers) deletes it too, and the views go back to the events.
-- Runs summarised before this migration have no dash_runs row: the views read their events
-- until collectord's start-up sweep (or EndRun) summarises them again.
-- Idempotent, as every migration: it may be applied again.

CREATE TABLE IF NOT EXISTS dash_runs (
    run_id     integer PRIMARY KEY REFERENCES compare_runs (run_id) ON DELETE CASCADE
);

-- Per (rank, step): rank_step_breakdown's sums of durations and counts (see 0005).
CREATE TABLE IF NOT EXISTS dash_steps (
    run_id       integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank         integer NOT NULL,
    step         bigint NOT NULL,
    compute_ns   bigint NOT NULL,
    nccl_ns      bigint NOT NULL,
    memcpy_ns    bigint NOT NULL,
    memset_ns    bigint NOT NULL,
    kernels      bigint NOT NULL,
    nccl_kernels bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS dash_steps_run ON dash_steps (run_id);

-- Per (rank, kernel name id; NULL: unnamed): top_kernels' calls and durations.
CREATE TABLE IF NOT EXISTS dash_kernels (
    run_id     integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank       integer NOT NULL,
    name       integer,
    calls      bigint NOT NULL,
    total_ns   bigint NOT NULL,
    min_ns     bigint NOT NULL,
    max_ns     bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS dash_kernels_run ON dash_kernels (run_id);

-- rank_step_breakdown's sums of one run, from its events (0005's definition, word for word,
-- with the run's filter): rows that carry their step, and rows that do not (imported traces)
-- in the step whose host range holds their start.
CREATE OR REPLACE FUNCTION kprof_dash.step_sums_events(run integer)
RETURNS TABLE (rank integer, step bigint, compute_ns bigint, nccl_ns bigint, memcpy_ns bigint,
               memset_ns bigint, kernels bigint, nccl_kernels bigint)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT e.rank, e.step,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.kind = 'kernel'), 0)::bigint,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.kind = 'nccl'), 0)::bigint,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.kind = 'memcpy'), 0)::bigint,
           coalesce(sum(e.dur_ns) FILTER (WHERE e.kind = 'memset'), 0)::bigint,
           count(*) FILTER (WHERE e.kind IN ('kernel', 'nccl')),
           count(*) FILTER (WHERE e.kind = 'nccl')
    FROM (
        SELECT g.rank, g.step::bigint AS step, g.kind, g.dur_ns
        FROM kprof_dash.gpu_events g
        WHERE g.run_id = run AND g.step IS NOT NULL
        UNION ALL
        SELECT g.rank, s.step, g.kind, g.dur_ns
        FROM kprof_dash.gpu_events g
        JOIN steps s ON s.run_id = g.run_id AND s.rank = g.rank
                    AND g.start_ns >= s.start_ns AND g.start_ns < s.start_ns + s.dur_ns
        WHERE g.run_id = run AND s.run_id = run AND g.step IS NULL
    ) e
    GROUP BY e.rank, e.step
$$;

-- top_kernels' aggregate of one run, from its events. Both are PARALLEL SAFE: a query that
-- calls them (inlined) may then scan in parallel, as the views did before.
CREATE OR REPLACE FUNCTION kprof_dash.kernel_sums_events(run integer)
RETURNS TABLE (rank integer, name integer, calls bigint, total_ns bigint, min_ns bigint,
               max_ns bigint)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT k.rank, k.name, count(*), sum(k.dur_ns)::bigint, min(k.dur_ns), max(k.dur_ns)
    FROM kernels k
    WHERE k.run_id = run
    GROUP BY k.rank, k.name
$$;

-- The same sums: from the summary while it holds, else from the events. PL/pgSQL rather
-- than SQL: its RETURN QUERY is planned for the run at hand (the run's partitions only) and
-- may scan in parallel, where a SQL function's generic plan did neither and took 1.7x as
-- long; JIT is off (compiling the events' plan cost 0.7 s where the summary's rows take
-- milliseconds). They run as their owner (the views' owner, who reads the tables) with the
-- search_path pinned, since a function in a view runs as the querying user (kprof_dashboard
-- may select the views and nothing else); only that role may call them.
CREATE OR REPLACE FUNCTION kprof_dash.step_sums(run integer)
RETURNS TABLE (rank integer, step bigint, compute_ns bigint, nccl_ns bigint, memcpy_ns bigint,
               memset_ns bigint, kernels bigint, nccl_kernels bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT 1 FROM dash_runs x WHERE x.run_id = run) THEN
        RETURN QUERY SELECT d.rank, d.step, d.compute_ns, d.nccl_ns, d.memcpy_ns, d.memset_ns,
                            d.kernels, d.nccl_kernels
                     FROM dash_steps d WHERE d.run_id = run;
    ELSE
        RETURN QUERY SELECT * FROM kprof_dash.step_sums_events(run);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION kprof_dash.kernel_sums(run integer)
RETURNS TABLE (rank integer, name integer, calls bigint, total_ns bigint, min_ns bigint,
               max_ns bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
#variable_conflict use_column
BEGIN
    IF EXISTS (SELECT 1 FROM dash_runs x WHERE x.run_id = run) THEN
        RETURN QUERY SELECT d.rank, d.name, d.calls, d.total_ns, d.min_ns, d.max_ns
                     FROM dash_kernels d WHERE d.run_id = run;
    ELSE
        RETURN QUERY SELECT * FROM kprof_dash.kernel_sums_events(run);
    END IF;
END $$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION kprof_dash.step_sums(integer) SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION kprof_dash.kernel_sums(integer) SET search_path = %I, '
                   'pg_temp', current_schema());
END $$;
ALTER FUNCTION kprof_dash.step_sums(integer) SET jit = off;
ALTER FUNCTION kprof_dash.kernel_sums(integer) SET jit = off;
REVOKE ALL ON FUNCTION kprof_dash.step_sums(integer), kprof_dash.kernel_sums(integer)
    FROM PUBLIC;

-- The two views, same columns and figures, over the functions: runs r (filtered by the
-- query's run_id) calls them once per run.
CREATE OR REPLACE VIEW kprof_dash.rank_step_breakdown AS
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
    SELECT ar.id AS run_id, x.rank, x.step, x.compute_ns, x.nccl_ns, x.memcpy_ns, x.memset_ns,
           x.kernels, x.nccl_kernels
    FROM runs ar, kprof_dash.step_sums(ar.id) x
) a ON a.run_id = st.run_id AND a.rank = st.rank AND a.step = st.step;

CREATE OR REPLACE VIEW kprof_dash.top_kernels AS
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
FROM (SELECT ar.id AS run_id, x.rank, x.name, x.calls, x.total_ns, x.min_ns, x.max_ns
      FROM runs ar, kprof_dash.kernel_sums(ar.id) x) a
JOIN runs r ON r.id = a.run_id
LEFT JOIN names n ON n.id = a.name;

-- The dashboard role calls the two functions through the views; its grants, again.
CREATE OR REPLACE FUNCTION kprof_dash.grant_dashboard_role() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    GRANT USAGE ON SCHEMA kprof_dash TO kprof_dashboard;
    GRANT SELECT ON kprof_dash.runs, kprof_dash.step_times, kprof_dash.rank_step_breakdown,
                    kprof_dash.rank_breakdown, kprof_dash.top_kernels, kprof_dash.stragglers,
                    kprof_dash.straggler_ranks, kprof_dash.capture_status
        TO kprof_dashboard;
    GRANT EXECUTE ON FUNCTION kprof_dash.step_sums(integer), kprof_dash.kernel_sums(integer)
        TO kprof_dashboard;
END
$$;
REVOKE ALL ON FUNCTION kprof_dash.grant_dashboard_role() FROM PUBLIC;

DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'kprof_dashboard') THEN
        PERFORM kprof_dash.grant_dashboard_role();
    END IF;
END $$;

-- A run's partitions, created apart and then attached: ATTACH PARTITION takes the parent's
-- SHARE UPDATE EXCLUSIVE lock, which neither readers (ACCESS SHARE: a summary holds it for
-- seconds at a thousand ranks, see above) nor the sink's COPYs (ROW EXCLUSIVE) conflict with,
-- where CREATE TABLE ... PARTITION OF takes ACCESS EXCLUSIVE: a CreateRun waited for every
-- summary in progress (2-16 s at 1024 ranks). LIKE ... INCLUDING ALL gives the partition the
-- parent's columns, defaults, storage, compression and indexes (which the attach adopts); the
-- partition is new and empty, so the attach has nothing to scan. Parents are taken in name
-- order, as before; a partition that exists already is attached if it is not.
CREATE OR REPLACE FUNCTION kp_create_run_partitions(rid integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    p text;
BEGIN
    FOR t IN SELECT name FROM kp_run_tables ORDER BY name LOOP
        p := t || '_r' || rid;
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I (LIKE %I INCLUDING ALL)', p, t);
        IF NOT (SELECT relispartition FROM pg_class WHERE oid = to_regclass(p)) THEN
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES IN (%s)', t, p, rid);
        END IF;
    END LOOP;
END
$$;
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION kp_create_run_partitions(integer) SECURITY DEFINER '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;
REVOKE ALL ON FUNCTION kp_create_run_partitions(integer) FROM PUBLIC;

-- The roles' grants (0012's kp_grant_roles), with what the writer needs for the sums:
-- collectord's summariser reads the events through kprof_dash's helper views.
CREATE OR REPLACE FUNCTION kp_grant_roles() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    s text := current_schema();
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'kprof_writer') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO kprof_writer', s);
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA %I '
                       'TO kprof_writer', s);
        EXECUTE format('GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA %I '
                       'TO kprof_writer', s);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I '
                       'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO kprof_writer', s);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I '
                       'GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO kprof_writer', s);
        REVOKE INSERT, UPDATE, DELETE ON kp_schema_migrations, kp_run_tables FROM kprof_writer;
        GRANT EXECUTE ON FUNCTION kp_create_run_partitions(integer), kp_drop_run(integer)
            TO kprof_writer;
        -- collectord's summariser makes the dashboards' sums (0016) through the functions the
        -- views use, which read these two helper views
        GRANT USAGE ON SCHEMA kprof_dash TO kprof_writer;
        GRANT SELECT ON kprof_dash.gpu_events, kprof_dash.nccl_names TO kprof_writer;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'kprof_reader') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO kprof_reader', s);
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO kprof_reader', s);
        EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I '
                       'GRANT SELECT ON TABLES TO kprof_reader', s);
    END IF;
END
$$;
REVOKE ALL ON FUNCTION kp_grant_roles() FROM PUBLIC;

SELECT kp_grant_roles();
