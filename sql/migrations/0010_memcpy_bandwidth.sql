-- kprof schema, version 10: Kineto's "memory bandwidth (GB/s)" of each memcpy and memset, in
-- side tables (like kernel_occupancy, migration 0006).
--
-- HTA's memory bandwidth summary (docs/specs/hta-analyses.md §11) reads the figure the
-- profiler wrote per gpu_memcpy/gpu_memset event. It cannot be rebuilt from bytes and dur_ns:
-- traces written in whole µs round the duration the profiler divided by. Only imported
-- traces carry it, so it lives beside memcpys and memsets, one row per event that has it
-- (not NaN), written by collectord in the batch's transaction (common/kp_codec.c's
-- memcpy_side/memset_side): the event's key (start_ns, device, stream, correlation; a value
-- the batch lacked, NULL in the event table, is 0 here) and the figure. Readers LEFT JOIN it
-- (KP_SQL_BANDWIDTH_JOIN in common/kp_codec.h). Partitioned by run like the event tables.

CREATE TABLE memcpy_bandwidth (
    run_id         integer NOT NULL,
    rank           integer NOT NULL,
    start_ns       bigint NOT NULL,
    correlation    bigint NOT NULL,
    bandwidth_gbps double precision NOT NULL,
    stream         integer NOT NULL,
    device         smallint NOT NULL
) PARTITION BY LIST (run_id);

-- The same columns for memsets.
CREATE TABLE memset_bandwidth (LIKE memcpy_bandwidth) PARTITION BY LIST (run_id);

INSERT INTO kp_run_tables (name) VALUES ('memcpy_bandwidth'), ('memset_bandwidth');
SELECT kp_create_run_partitions(id) FROM runs ORDER BY id;
