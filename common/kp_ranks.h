/*
 * kp_ranks: the rank selection a user writes ("all", "0,3-5"), as `kprofctl start --ranks`
 * sends it: collectord checks it against the job's world size and the agent picks its local
 * ranks with it. The text form, both ways.
 */
#ifndef KP_RANKS_H
#define KP_RANKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Parses a rank selection: "all" (or NULL or "") sets *all, else a list such as "0,3-5" marks
 * sel[r] = 1 for each rank (sel has world entries, zeroed by the caller). Returns 0, -EINVAL
 * if the text is not such a list, or -ERANGE if a rank is world or above (*bad_rank, may be
 * NULL, says which).
 */
int kp_ranks_parse(const char *s, uint32_t world, uint8_t *sel, bool *all, long *bad_rank);

/* Writes the ranks r with sel[r] != 0 (r < n) as a short list ("0-3,5,7-9") into buf, cut
 * with "..." if it does not fit. Returns buf. */
char *kp_ranks_format(const uint8_t *sel, size_t n, char *buf, size_t cap);

#endif
