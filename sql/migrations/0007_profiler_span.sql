-- kprof schema, version 7: the profiler's own span per rank, as proto/kprof.proto's
-- RankInfo.profiler_start_ns/_end_ns (an imported trace's "PyTorch Profiler (0)" event). The
-- analyzer's GPU utilization timeline spans it, as the TensorBoard plugin's does
-- (docs/specs/tbplugin-views.md §8). NULL: not known (then the span of the rank's events).

ALTER TABLE ranks ADD COLUMN profiler_start_ns bigint,
                  ADD COLUMN profiler_end_ns bigint;
