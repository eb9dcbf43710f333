/* The schema migrations in sql/migrations, compiled in (see cmake/embed_migrations.cmake). */
#ifndef KP_MIGRATIONS_H
#define KP_MIGRATIONS_H

#include <stddef.h>

struct kp_migration {
    int version;      /* from the file name's leading number; applied in ascending order */
    const char *name; /* file name without .sql */
    const char *sql;  /* the whole file; run in one transaction */
};

extern const struct kp_migration kp_migrations[];
extern const size_t kp_migrations_count;

#endif
