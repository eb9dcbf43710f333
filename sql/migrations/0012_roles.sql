-- kprof schema, version 12: the group roles the daemons' login users belong to
-- (docs/postgres-roles.md). None of them may CREATE, ALTER or DROP anything: the schema
-- belongs to the user that migrates it (kprof-collectord --migrate).
--
--   kprof_writer     kprof-collectord: SELECT, INSERT, UPDATE, DELETE on every table (COPY
--                    FROM is INSERT; LOCK TABLE ... ROW EXCLUSIVE needs INSERT), USAGE, SELECT
--                    and UPDATE on the sequences, EXECUTE on kp_create_run_partitions and
--                    kp_drop_run. Those two create and drop a run's partitions, so they run as
--                    their owner (SECURITY DEFINER, search_path pinned) and nobody else may
--                    call them. kp_schema_migrations and kp_run_tables (whose names those
--                    functions trust) are read-only to it.
--   kprof_reader     kprof-analyzer: SELECT on every table, nothing else.
--   kprof_dashboard  (migration 0005) SELECT on the public kprof_dash views only; untouched.
--
-- Tables of later migrations: ALTER DEFAULT PRIVILEGES below gives the same rights on every
-- table and sequence that the migrating user creates later in this schema (a later migration's
-- tables, and each run's partitions, which kp_create_run_partitions creates as that user), so
-- a later migration grants nothing. A later migration run by another user (or a table that
-- must stay read-only to the writer) runs SELECT kp_grant_roles(), which (re)applies every
-- grant of this file; it is idempotent, and so is this file.
--
-- Roles are cluster-wide: they may exist already (another database of the cluster was
-- migrated first) or be created at this moment by another database's migration
-- (unique_violation once it commits); both are fine. A migrating user without CREATEROLE
-- cannot create them: the migration goes on and says so; an administrator then runs
-- CREATE ROLE kprof_writer NOLOGIN; CREATE ROLE kprof_reader NOLOGIN; and, as the schema owner,
-- SELECT kp_grant_roles();
--
-- Login users are the deployer's, e.g.
--   CREATE ROLE kprof_collectord LOGIN PASSWORD '...' IN ROLE kprof_writer;
--   CREATE ROLE kprof_analyzer LOGIN PASSWORD '...' IN ROLE kprof_reader;
--   CREATE ROLE grafana LOGIN PASSWORD '...' IN ROLE kprof_dashboard;

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

-- The writer creates and drops a run's partitions through these two only, as their owner.
-- The search_path is pinned to this schema (pg_temp last) so that a caller's own objects
-- cannot stand in for the tables they name.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION kp_create_run_partitions(integer) SECURITY DEFINER '
                   'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION kp_drop_run(integer) SECURITY DEFINER '
                   'SET search_path = %I, pg_temp', current_schema());
END
$$;
REVOKE ALL ON FUNCTION kp_create_run_partitions(integer), kp_drop_run(integer) FROM PUBLIC;

-- Nobody but the owner creates objects here, temporary tables included. PostgreSQL 15 no
-- longer grants CREATE on schema public to PUBLIC; older ones do. A user that does not own the
-- schema or the database gets a warning from these, not an error.
DO $$
BEGIN
    EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC', current_schema());
    EXECUTE format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE WARNING 'kprof: could not revoke CREATE and TEMPORARY from PUBLIC (%)', SQLERRM;
END
$$;

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['kprof_writer', 'kprof_reader'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION
                WHEN duplicate_object OR unique_violation THEN
                    NULL;
                WHEN insufficient_privilege THEN
                    RAISE WARNING 'kprof: role % not created (%): CREATE ROLE % NOLOGIN, then '
                                  'SELECT kp_grant_roles()', r, SQLERRM, r;
            END;
        END IF;
    END LOOP;
    PERFORM kp_grant_roles();
END
$$;
