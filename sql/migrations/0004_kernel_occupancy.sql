-- kprof schema, version 4: the kernel launch figures the TensorBoard plugin's kernel view and
-- GPU metrics average (Kineto's "blocks per SM" and "est. achieved occupancy %"), as
-- proto/kprof.proto's Kernels.blocks_per_sm and .est_occupancy. NULL (or NaN): not known.
-- ALTER on the partitioned table reaches every run's partition.

ALTER TABLE kernels ADD COLUMN blocks_per_sm double precision,
                    ADD COLUMN est_occupancy double precision;
