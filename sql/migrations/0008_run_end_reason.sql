-- kprof schema, version 8: why a run was ended as failed by collectord itself (not by its
-- producer): e.g. "no live producer stream and no batch for 10m0s" when an import or an API
-- producer died and left the run open (collectord's --open-run-timeout). NULL: ended by its
-- producer, or still open.

ALTER TABLE runs ADD COLUMN end_reason text;
