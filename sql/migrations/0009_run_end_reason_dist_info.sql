-- kprof schema, version 8.
-- runs.end_reason: why collectord itself (not the producer) ended a run as failed, e.g. "no
-- live producer stream and no batch for 600.000 s" when an import or an API producer died and
-- left the run open (collectord's --open-run-timeout). NULL: ended by its producer, or open.

ALTER TABLE runs ADD COLUMN end_reason text;

-- An imported trace's distributedInfo object as JSON text (RankInfo.distributed_info):
-- backend, pg_count, pg_config, nccl_version and the rest, so export writes it back as it was.
-- NULL: the trace had none (a one-rank trace), or the rank was captured.
ALTER TABLE ranks ADD COLUMN distributed_info text;
