-- kprof schema, version 6: kernels' blocks per SM and est. achieved occupancy move to a side
-- table.
--
-- Only imported Kineto traces carry these figures ("blocks per SM", "est. achieved occupancy
-- %"); CUPTI captures never do. As two columns of `kernels` (migration 0004) they cost every
-- kernel row of a capture its NULL bitmap (8 bytes once a row has a NULL), and 16 bytes where
-- they were stored as values. kernel_occupancy holds one row per kernel that has either
-- figure (not NaN), written by collectord in the batch's transaction (common/kp_codec.c's
-- kernel_side): the kernel's key (start_ns, device, stream, correlation; a value the batch
-- lacked, NULL in `kernels`, is 0 here) and both figures (NaN: not known). Readers LEFT JOIN
-- it (KP_SQL_KERNEL_OCCUPANCY_JOIN in common/kp_codec.h), averaging rows with the same key so
-- that a kernel is never repeated. Partitioned by run like the event tables: made and dropped
-- with the run (kp_run_tables).

CREATE TABLE kernel_occupancy (
    run_id        integer NOT NULL,
    rank          integer NOT NULL,
    start_ns      bigint NOT NULL,
    correlation   bigint NOT NULL,
    blocks_per_sm double precision NOT NULL,
    est_occupancy double precision NOT NULL,
    stream        integer NOT NULL,
    device        smallint NOT NULL
) PARTITION BY LIST (run_id);

-- kp_create_run_partitions and kp_drop_run now cover the new table too; runs made before
-- this migration get their partition.
INSERT INTO kp_run_tables (name) VALUES ('kernel_occupancy');
SELECT kp_create_run_partitions(id) FROM runs ORDER BY id;

-- The figures stored so far.
INSERT INTO kernel_occupancy (run_id, rank, start_ns, correlation, blocks_per_sm,
                              est_occupancy, stream, device)
SELECT run_id, rank, start_ns, coalesce(correlation, 0),
       coalesce(blocks_per_sm, 'NaN'), coalesce(est_occupancy, 'NaN'),
       coalesce(stream, 0), coalesce(device, 0)
FROM kernels
WHERE (blocks_per_sm IS NOT NULL AND blocks_per_sm <> 'NaN')
   OR (est_occupancy IS NOT NULL AND est_occupancy <> 'NaN');

-- Views (migration 0005) do not use them.
ALTER TABLE kernels DROP COLUMN blocks_per_sm, DROP COLUMN est_occupancy;
