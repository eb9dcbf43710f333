-- kprof schema, version 11: who may push into a run (docs/design.md "Authorization").
--
-- With authentication on, collectord lets a caller push into a run only if it may: an agent
-- into the runs it created with CreateRun (its local path) and into the ranks it hosts of
-- the captures collectord armed on it; an operator into runs an operator created (imports).
-- So that a collectord restart does not refuse an agent's resend into its own run, the
-- creator of every run and the agent of every capture rank are stored, as "ROLE:NAME" (the
-- caller's kp_identity; "any:anonymous" without authentication). NULL: a run made before
-- this migration, which no authenticated caller may push into.

ALTER TABLE runs ADD COLUMN created_by text;
ALTER TABLE capture_ranks ADD COLUMN agent_by text;
