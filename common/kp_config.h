/*
 * Table-driven configuration (docs/style.md §6): one static table of struct kp_config_def per
 * binary drives defaults, the config file, the environment, flags, --help, --dry-run and
 * --print-config.
 *
 * Precedence, lowest first: the row's default; the file (/etc/kprof/<prog>.conf, or the one
 * named by --config=PATH); the environment KPROF_<KEY> (the key upper-cased, '.' and '-'
 * turned into '_': "ingest.max-name-bytes" is KPROF_INGEST_MAX_NAME_BYTES); flags
 * --key=value or --key value. Bools also take a bare --key (true) and --no-key (false), and
 * only the --key=value form with a value.
 *
 * File format: one "key = value" per line; blank lines and lines whose first non-blank
 * character is '#' are ignored ('#' later in a line is part of the value, so conninfo strings
 * and passwords survive). Whitespace around key and value is trimmed; a value wrapped in
 * double quotes loses them (no escapes). In values, ${VAR} expands to the environment
 * variable (empty if unset) and ${VAR:-default} to the default when VAR is unset or empty.
 * Lines are at most KP_CONFIG_LINE_MAX bytes and files KP_CONFIG_FILE_MAX bytes.
 *
 * Value syntax:
 *   BOOL      true/false, yes/no, on/off, 1/0 (any case)
 *   INT       decimal, optional sign
 *   SIZE      bytes, with an optional unit (any case, optional space): b; k, kib; m, mib;
 *             g, gib; t, tib (all 1024-based); kb, mb, gb, tb (SI, 1000-based).
 *             "64MiB", "512k", "16384"
 *   DURATION  one or more number+unit groups, units ms, s, m, h, d: "500ms", "30s", "1h30m";
 *             a bare "0" is allowed; stored in ms
 *   STRING    anything; min/max bound its length in bytes
 *   ENUM      one of enum_values (any case), stored as its index
 *
 * Built-in flags: --config=PATH, --help (or -h), --dry-run, --print-config. A table may not
 * use those names. "--" ends the flags.
 *
 * Positional arguments: kp_config_load() rejects them with KP_ECONFIG; programs that take
 * them (kprofctl) call kp_config_load_args() with a struct kp_config_pos.
 */
#ifndef KP_CONFIG_H
#define KP_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define KP_CONFIG_DIR      "/etc/kprof"
#define KP_CONFIG_LINE_MAX 4096
#define KP_CONFIG_FILE_MAX (1 << 20)

enum kp_config_type {
    KP_CONFIG_BOOL,     /* stored as bool */
    KP_CONFIG_INT,      /* long long */
    KP_CONFIG_SIZE,     /* long long, bytes: "64MiB", "512k", 16384 */
    KP_CONFIG_DURATION, /* long long, ms: "500ms", "30s", "2m", "1h" */
    KP_CONFIG_STRING,   /* char *, owned by the config (strdup'd; kp_config_fini frees) */
    KP_CONFIG_ENUM,     /* int, index into enum_values */
};

/* What the caller does after a successful kp_config_load(). */
enum kp_config_action {
    KP_CONFIG_RUN,     /* run the program with cfg */
    KP_CONFIG_EXIT_OK, /* --help, --dry-run or --print-config was served: exit 0 */
};

struct kp_config_def {
    const char *name; /* "listen", "pg.conninfo", "ingest.max-name-bytes": [a-z0-9.-] */
    enum kp_config_type type;
    const char *def; /* the default, in the same syntax as a flag value; NULL: "" / 0 / false */
    /* INT, SIZE, DURATION: inclusive bounds on the value, both 0 for none (LLONG_MAX for no
     * upper bound; SIZE and DURATION are never negative). STRING: min is the least length in
     * bytes (1: must not be empty), max the most (0: no limit). Others: unused. */
    long long min, max;
    size_t offset;                  /* offsetof the field in the caller's struct */
    const char *help;               /* one line for --help */
    const char *const *enum_values; /* ENUM only: NULL-terminated list */
    bool secret;                    /* masked as *** by --print-config and in errors */
};

/* Positional arguments, for kp_config_load_args(). */
struct kp_config_pos {
    char **args; /* caller's array of max entries; filled with argv entries (borrowed) */
    int max;
    int n; /* set by the call */
};

/*
 * Loads the configuration into cfg (the caller's struct; every field a row names must be
 * zeroed, or left as by kp_config_fini, before the call) from the table defs[0..n), in the
 * precedence described above. prog names the default file (/etc/kprof/<prog>.conf; NULL:
 * none) and the usage line. argv is borrowed and not changed; argv[0] is skipped.
 *
 * Returns 0 and sets *action to KP_CONFIG_RUN or, after printing --help or --print-config to
 * stdout or validating for --dry-run, KP_CONFIG_EXIT_OK; in both cases call kp_config_fini()
 * when done. On failure returns KP_ECONFIG (unknown flag or key, bad value, out of range, a
 * missing --config file, a bad table), -ENOMEM or -errno (reading the file), with one line
 * in errbuf naming the source, the key, the bad value and what is allowed, e.g.
 * "--ingest.max-name-bytes=abc: not a size (use e.g. 16384, 16KiB, 1MiB)"; cfg is then as
 * after kp_config_fini(). Not thread-safe (reads the environment).
 */
int kp_config_load(const struct kp_config_def *defs, size_t n, void *cfg, const char *prog,
                   int argc, char **argv, char *errbuf, size_t errlen, int *action);

/* As kp_config_load(), but collects positional arguments (anywhere among the flags, and
 * everything after "--") into pos, in order, instead of rejecting them; more than pos->max
 * is KP_ECONFIG. */
int kp_config_load_args(const struct kp_config_def *defs, size_t n, void *cfg, const char *prog,
                        int argc, char **argv, struct kp_config_pos *pos, char *errbuf,
                        size_t errlen, int *action);

/* Frees cfg's strings and sets them to NULL. Safe to call twice. */
/*
 * The start of every main(): kp_config_load, with errors printed to stderr as
 * "prog: reason". Returns -1 when the program should run with cfg, or the exit
 * status (0 after --help/--dry-run/--print-config, 2 on a bad setting; cfg is then freed).
 */
int kp_config_main(const struct kp_config_def *defs, size_t n, void *cfg, const char *prog,
                   int argc, char **argv);

void kp_config_fini(const struct kp_config_def *defs, size_t n, void *cfg);

/* Writes the --help text for the table to out: every key with its type, default, bounds or
 * allowed values, environment variable and help. */
void kp_config_usage(const struct kp_config_def *defs, size_t n, const char *prog, FILE *out);

/* Writes every key as "key = value" (a valid config file) to out; secrets that are set are
 * written as ***. */
void kp_config_print(const struct kp_config_def *defs, size_t n, const void *cfg, FILE *out);

/* Parses a size ("64MiB", "512k", "16384"; see above) into bytes. Returns 0, -EINVAL
 * (syntax) or -ERANGE (does not fit a long long). */
int kp_parse_size(const char *s, long long *out);

/* Parses a duration ("500ms", "30s", "1h30m", "0") into ms. Returns 0, -EINVAL or
 * -ERANGE. */
int kp_parse_duration_ms(const char *s, long long *out);

/* Parses true/false, yes/no, on/off, 1/0 (any case). Returns 0 or -EINVAL. */
int kp_parse_bool(const char *s, bool *out);

#endif
