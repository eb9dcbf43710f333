-- kprof schema, version 8: an imported trace's time base per rank, as proto/kprof.proto's
-- RankInfo.time_base_ns (the trace's baseTimeNanoseconds: its ts are µs relative to it). The
-- stored times stay ns since the epoch; HTA-compatible analyses (analyzer/hta.h) round the
-- trace's own relative µs, as HTA does, by subtracting it. NULL: the times are absolute (a
-- trace without baseTimeNanoseconds, or a live capture).

ALTER TABLE ranks ADD COLUMN time_base_ns bigint;
