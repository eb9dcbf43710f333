-- kprof schema, version 3: capture control (kprofctl start/stop/status).
--
-- A run made by Control.StartCapture has one `captures` row (what was asked for) and one
-- `capture_ranks` row per selected rank with the rank's last known state. collectord writes
-- both when the capture starts (every rank pending) and again when it ends, so that status
-- survives a collectord restart and dashboards can show why a rank failed. Both cascade with
-- their run (kp_drop_run deletes the runs row).

CREATE TABLE captures (
    run_id      integer PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    start_step  bigint NOT NULL,           -- -1: a time window
    steps       integer NOT NULL,          -- 0: a time window of duration_ms
    duration_ms bigint NOT NULL,
    activities  text NOT NULL,
    deadline_at timestamptz NOT NULL,
    stopped     boolean NOT NULL DEFAULT false
);

CREATE TABLE capture_ranks (
    run_id     integer NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    rank       integer NOT NULL,
    state      smallint NOT NULL,          -- RankState: 1 pending, 2 capturing, 3 flushing,
                                           -- 4 done, 5 failed
    host       text NOT NULL DEFAULT '',
    pid        integer NOT NULL DEFAULT 0,
    records    bigint NOT NULL DEFAULT 0,
    dropped    bigint NOT NULL DEFAULT 0,
    first_step bigint NOT NULL DEFAULT -1,
    last_step  bigint NOT NULL DEFAULT -1,
    reason     text NOT NULL DEFAULT '',
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, rank)
);
