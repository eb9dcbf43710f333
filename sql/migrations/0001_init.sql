-- kprof schema, version 1. Applied by kprof-collectord at start (one transaction,
-- recorded in kp_schema_migrations). Event tables are partitioned by run so that a run is
-- dropped at once (kp_drop_run); their columns are named after proto/kprof.proto's fields
-- and typed by common/kp_codec.c's spec table, narrowest first in alignment order.

CREATE TABLE runs (
    id          serial PRIMARY KEY,
    job         text NOT NULL,
    name        text NOT NULL DEFAULT '',
    state       smallint NOT NULL DEFAULT 1,   -- RunState: 1 open, 2 ended, 3 failed
    source      smallint NOT NULL DEFAULT 0,   -- RunSource
    world_size  integer NOT NULL CHECK (world_size > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    ended_at    timestamptz
);
CREATE INDEX runs_job ON runs (job, id);

CREATE TABLE ranks (
    run_id          integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank            integer NOT NULL,
    job             text,
    host            text,
    pid             integer,
    local_rank      integer,
    device          smallint,
    clock_offset_ns bigint NOT NULL DEFAULT 0,
    batches         bigint NOT NULL DEFAULT 0,
    records         bigint NOT NULL DEFAULT 0,
    records_dropped bigint NOT NULL DEFAULT 0,
    cupti_dropped   bigint NOT NULL DEFAULT 0,
    overhead_ns     bigint NOT NULL DEFAULT 0,
    first_seen      timestamptz NOT NULL DEFAULT now(),
    last_seen       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, rank)
);

-- The name dictionary: kernel, op, API and metric names, shapes strings. Long names
-- (templated kernels run to kilobytes) are unique by their md5, not by a btree on the text.
CREATE TABLE names (
    id   serial PRIMARY KEY,
    name text NOT NULL
);
CREATE UNIQUE INDEX names_name_md5 ON names (md5(name));

CREATE TABLE devices (
    run_id                       integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank                         integer NOT NULL,
    id                           smallint NOT NULL,
    name                         text NOT NULL,
    global_memory_bytes          bigint,
    memory_bandwidth_bytes_per_s bigint,
    sm_count                     integer,
    clock_khz                    integer,
    max_threads_per_block        integer,
    max_threads_per_sm           integer,
    max_blocks_per_sm            integer,
    regs_per_sm                  integer,
    regs_per_block               integer,
    smem_per_sm                  integer,
    smem_per_block               integer,
    warp_size                    integer,
    cc_major                     smallint,
    cc_minor                     smallint,
    PRIMARY KEY (run_id, rank, id)
);

-- One row per stored batch: the idempotency key of Ingest. A repeated
-- (run_id, rank, stream, seq) is recognised here and its rows are skipped.
CREATE TABLE ingest_batches (
    run_id       integer NOT NULL,
    rank         integer NOT NULL,
    stream       bigint NOT NULL,
    seq          bigint NOT NULL,
    rows         integer NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, rank, stream, seq)
) PARTITION BY LIST (run_id);

CREATE TABLE kernels (
    run_id        integer NOT NULL,
    rank          integer NOT NULL,
    start_ns      bigint NOT NULL,
    dur_ns        bigint NOT NULL,
    correlation   bigint,
    external_id   bigint,
    graph_node_id bigint,
    name          integer,
    context       integer,
    stream        integer,
    grid_x        integer,
    grid_y        integer,
    grid_z        integer,
    static_smem   integer,
    dynamic_smem  integer,
    graph_id      integer,
    step          integer,
    device        smallint,
    block_x       smallint,
    block_y       smallint,
    block_z       smallint,
    registers     smallint
) PARTITION BY LIST (run_id);

CREATE TABLE memcpys (
    run_id      integer NOT NULL,
    rank        integer NOT NULL,
    start_ns    bigint NOT NULL,
    dur_ns      bigint NOT NULL,
    bytes       bigint,
    correlation bigint,
    external_id bigint,
    context     integer,
    stream      integer,
    step        integer,
    copy_kind   smallint,
    src_kind    smallint,
    dst_kind    smallint,
    device      smallint,
    src_device  smallint,
    dst_device  smallint
) PARTITION BY LIST (run_id);

CREATE TABLE memsets (
    run_id      integer NOT NULL,
    rank        integer NOT NULL,
    start_ns    bigint NOT NULL,
    dur_ns      bigint NOT NULL,
    bytes       bigint,
    value       bigint,
    correlation bigint,
    external_id bigint,
    context     integer,
    stream      integer,
    step        integer,
    mem_kind    smallint,
    device      smallint
) PARTITION BY LIST (run_id);

CREATE TABLE api_calls (
    run_id       integer NOT NULL,
    rank         integer NOT NULL,
    start_ns     bigint NOT NULL,
    dur_ns       bigint NOT NULL,
    tid          bigint,
    correlation  bigint,
    external_id  bigint,
    cbid         integer,
    name         integer,
    return_value integer,
    step         integer,
    domain       smallint   -- ApiDomain: 1 runtime, 2 driver, 3 CUPTI overhead
) PARTITION BY LIST (run_id);

CREATE TABLE ops (
    run_id       integer NOT NULL,
    rank         integer NOT NULL,
    start_ns     bigint NOT NULL,
    dur_ns       bigint NOT NULL,
    tid          bigint,
    op_id        bigint,
    parent_id    bigint,
    seq          bigint,
    fwd_tid      bigint,
    external_id  bigint,
    name         integer,
    input_shapes integer,
    input_dtypes integer,
    domain       integer,
    stream       integer,
    step         integer,
    kind         smallint,  -- OpKind
    device       smallint
) PARTITION BY LIST (run_id);

CREATE TABLE steps (
    run_id   integer NOT NULL,
    rank     integer NOT NULL,
    start_ns bigint NOT NULL,
    step     bigint NOT NULL,
    dur_ns   bigint NOT NULL
) PARTITION BY LIST (run_id);

CREATE TABLE counters (
    run_id      integer NOT NULL,
    rank        integer NOT NULL,
    correlation bigint,
    value       double precision NOT NULL,
    metric      integer NOT NULL,
    device      smallint
) PARTITION BY LIST (run_id);

CREATE TABLE collectives (
    run_id        integer NOT NULL,
    rank          integer NOT NULL,
    start_ns      bigint NOT NULL,
    dur_ns        bigint NOT NULL,
    in_nelems     bigint,
    out_nelems    bigint,
    coll_seq      bigint,
    external_id   bigint,
    tid           bigint,
    name          integer,
    dtype         integer,
    group_size    integer,
    process_group integer,
    step          integer
) PARTITION BY LIST (run_id);

CREATE TABLE syncs (
    run_id      integer NOT NULL,
    rank        integer NOT NULL,
    start_ns    bigint NOT NULL,
    dur_ns      bigint NOT NULL,
    cuda_event  bigint,
    correlation bigint,
    context     integer,
    stream      integer,
    step        integer,
    sync_type   smallint,
    device      smallint
) PARTITION BY LIST (run_id);

-- The tables partitioned by run. kp_create_run_partitions and kp_drop_run walk this list,
-- so a later migration that adds an event table adds a row here.
CREATE TABLE kp_run_tables (name text PRIMARY KEY);
INSERT INTO kp_run_tables (name) VALUES
    ('ingest_batches'), ('kernels'), ('memcpys'), ('memsets'), ('api_calls'), ('ops'),
    ('steps'), ('counters'), ('collectives'), ('syncs');

CREATE FUNCTION kp_create_run_partitions(rid integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT name FROM kp_run_tables ORDER BY name LOOP
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF %I FOR VALUES IN (%s)',
                       t || '_r' || rid, t, rid);
    END LOOP;
END
$$;

-- Drops every row of a run at once: its partitions, then the run (ranks and devices cascade).
CREATE FUNCTION kp_drop_run(rid integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT name FROM kp_run_tables ORDER BY name LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I', t || '_r' || rid);
    END LOOP;
    DELETE FROM runs WHERE id = rid;
END
$$;
