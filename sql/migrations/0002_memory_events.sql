-- kprof schema, version 2: allocator events.
--
-- memory_events holds the caching allocator's events that torch.profiler records with
-- profile_memory=True (Kineto's "[memory]" and "[OutOfMemory]" instant events): one row per
-- allocation (bytes > 0) or free (bytes < 0), with the allocator's totals after it. Columns
-- follow proto/kprof.proto's MemoryEvents and common/kp_codec.c's spec table, narrowest
-- first in alignment order, like the tables of 0001_init.

CREATE TABLE memory_events (
    run_id          integer NOT NULL,
    rank            integer NOT NULL,
    start_ns        bigint NOT NULL,
    addr            bigint,
    bytes           bigint,   -- negative: a free
    total_allocated bigint,
    total_reserved  bigint,
    tid             bigint,
    name            integer,  -- names.id: "[memory]" or "[OutOfMemory]"
    step            integer,
    device_type     smallint, -- c10::DeviceType: 0 CPU, 1 CUDA, ...
    device          smallint  -- -1: none (CPU)
) PARTITION BY LIST (run_id);

-- kp_create_run_partitions and kp_drop_run now cover the new table too.
INSERT INTO kp_run_tables (name) VALUES ('memory_events');

-- Runs made before this migration get their partition, so that they can still take events
-- (a late batch, a resend) and kp_drop_run drops it with them.
SELECT kp_create_run_partitions(id) FROM runs ORDER BY id;
