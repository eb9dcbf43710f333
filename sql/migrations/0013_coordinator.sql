-- kprof schema, version 13: the capture coordinator (docs/design.md "Coordinator election").
-- Every collectord replica with --coordinator tries a session-level advisory lock; the one
-- holding it coordinates captures and writes who it is and where it serves into the one row
-- of this table, so that any replica can tell clients where to go (Control.Coordinator).
-- The row is a notice board, not the lock: a row left by a coordinator that died stays until
-- the next one takes over; readers trust it only while some session holds the lock.
-- Idempotent, as every migration: it may be applied again.
CREATE TABLE IF NOT EXISTS kp_coordinator (
    id smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    address text NOT NULL,      -- HOST:PORT where it serves (--advertise-address)
    host text NOT NULL,
    pid integer NOT NULL,
    since timestamptz NOT NULL, -- when it took over
    epoch bigint NOT NULL,      -- incremented at every takeover
    seen timestamptz NOT NULL   -- its last heartbeat, over the lock's own connection
);

-- The writer and reader roles of 0012 get their rights by its default privileges when this
-- runs as the same user; kp_grant_roles() covers a migration run by another owner.
SELECT kp_grant_roles();
