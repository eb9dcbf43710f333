/*
 * Unit tests for PyProf's table writer as rows come (pyprof.h kp_pyprof_writer_*, what kprofctl
 * prof prints ProfRows' pages with): byte for byte what kp_pyprof_write_rows writes for the same
 * rows at once, in text, CSV and JSON, with any column selection and -w, whatever the pages'
 * sizes; a text table past 16 MiB of cells kept in an unlinked file in $TMPDIR (the directory
 * empty throughout); a $TMPDIR that cannot take it refused with what to do; an empty table; a
 * table that stops short left unended.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pyprof.h"

/* n rows of every kind of cell: UTF-8, quotes, none-values, negative and unknown figures;
 * params of params_len bytes. Strings are static or in *pool (free it). */
static struct kp_pyprof_row *rows_of(size_t n, size_t params_len, char **pool)
{
    static const char *const kernels[] = { "volta_sgemm_128x64_nn", "elementwise \"add\"",
                                           "k\u00e9rnel_\u2026_utf8", "" };
    static const char *const ops[] = { "linear", "conv2d", "add_", "-" };
    struct kp_pyprof_row *r = calloc(n ? n : 1, sizeof(*r));
    char *p = malloc(params_len + 1);

    assert_non_null(r);
    assert_non_null(p);
    for (size_t i = 0; i < params_len; i++) {
        p[i] = (char) ('a' + i % 26);
    }
    p[params_len] = '\0';
    *pool = p;
    for (size_t i = 0; i < n; i++) {
        r[i].idx = i + 1;
        r[i].seq = i % 5 == 0 ? -1 : (int64_t) (i * 7);
        r[i].altseq = i % 3 ? "-" : "12,14";
        r[i].tid = 1000 + (int64_t) (i % 4);
        r[i].layer = i % 2 ? "-" : "layer:block1:conv";
        r[i].trace = i % 4 ? "train.py(42): step" : "-";
        r[i].bwd = i % 2 == 1;
        r[i].sub = (int) (i % 3);
        r[i].mod = i % 2 ? "torch.nn.functional" : "Tensor";
        r[i].op = ops[i % 4];
        r[i].kernel = kernels[i % 4];
        r[i].params = params_len > 0 ? p : (i % 2 ? "T=(32,64),type=float32" : "-");
        r[i].sil_ns = i % 9 == 0 ? -1 : (int64_t) (i * 1237 % 100000);
        r[i].tc = i % 3 == 0 ? "1" : "-";
        r[i].device = i % 7 == 0 ? -1 : 0;
        r[i].stream = i % 7 == 0 ? -1 : 7;
        r[i].grid = "128,1,1";
        r[i].block = "256,1,1";
        r[i].flops = (double) i * 1e9 / 3.0;
        r[i].flops_known = i % 4 != 0;
        r[i].bytes = (double) i * 4096.5;
        r[i].bytes_known = i % 5 != 0;
    }
    return r;
}

/* kp_pyprof_write_rows' output. Free it. */
static char *at_once(const struct kp_pyprof_row *r, size_t n, const enum kp_pyprof_col *cols,
                     int ncols, enum kp_pyprof_format fmt, int width, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);

    assert_non_null(f);
    kp_pyprof_write_rows(f, r, n, 42, 3, cols, ncols, fmt, width);
    assert_int_equal(fclose(f), 0);
    return buf;
}

/* The writer's output, fed in pages of page rows. Free it. */
static char *by_pages(const struct kp_pyprof_row *r, size_t n, size_t page,
                      const enum kp_pyprof_col *cols, int ncols, enum kp_pyprof_format fmt,
                      int width, size_t *len)
{
    char *buf = NULL, err[512] = "";
    FILE *f = open_memstream(&buf, len);
    struct kp_pyprof_writer *w = NULL;

    assert_non_null(f);
    assert_int_equal(kp_pyprof_writer_open(f, 42, 3, cols, ncols, fmt, width, &w), 0);
    for (size_t at = 0; at < n; at += page) {
        size_t k = n - at < page ? n - at : page;

        assert_int_equal(kp_pyprof_writer_rows(w, r + at, k, err, sizeof(err)), 0);
    }
    assert_int_equal(kp_pyprof_writer_close(w, true, err, sizeof(err)), 0);
    assert_int_equal(fclose(f), 0);
    return buf;
}

static void same_output(const struct kp_pyprof_row *r, size_t n, size_t page,
                        const enum kp_pyprof_col *cols, int ncols, enum kp_pyprof_format fmt,
                        int width)
{
    size_t la = 0, lb = 0;
    char *a = at_once(r, n, cols, ncols, fmt, width, &la);
    char *b = by_pages(r, n, page, cols, ncols, fmt, width, &lb);

    if (la != lb || memcmp(a, b, la) != 0) {
        fail_msg("format %d, width %d, %zu rows in pages of %zu: %zu bytes at once, %zu by pages",
                 (int) fmt, width, n, page, la, lb);
    }
    free(a);
    free(b);
}

static void test_same_as_at_once(void **state)
{
    enum kp_pyprof_col all[KP_PYPROF_COL_COUNT],
        few[3] = { KP_PYPROF_KERNEL, KP_PYPROF_SIL, KP_PYPROF_FLOPS };
    static const size_t pages[] = { 1, 7, 4096, 100000 };
    static const int widths[] = { 0, 20 };
    char *pool;
    struct kp_pyprof_row *r = rows_of(1000, 0, &pool);

    (void) state;
    for (int c = 0; c < KP_PYPROF_COL_COUNT; c++) {
        all[c] = (enum kp_pyprof_col) c;
    }
    for (int fmt = KP_PYPROF_TEXT; fmt <= KP_PYPROF_JSON; fmt++) {
        for (size_t p = 0; p < sizeof(pages) / sizeof(pages[0]); p++) {
            for (size_t w = 0; w < sizeof(widths) / sizeof(widths[0]); w++) {
                same_output(r, 1000, pages[p], all, KP_PYPROF_COL_COUNT,
                            (enum kp_pyprof_format) fmt, widths[w]);
                same_output(r, 1000, pages[p], few, 3, (enum kp_pyprof_format) fmt, widths[w]);
            }
        }
        same_output(r, 0, 1, all, KP_PYPROF_COL_COUNT, (enum kp_pyprof_format) fmt, 0); /* empty */
    }
    free(r);
    free(pool);
}

/* A test directory for $TMPDIR; returns its path (static). */
static const char *tmpdir(void)
{
    static char dir[] = "/tmp/kp-test-pyprof-XXXXXX";
    static bool made;

    if (!made) {
        assert_non_null(mkdtemp(dir));
        made = true;
    }
    return dir;
}

static size_t entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t n = 0;

    assert_non_null(d);
    while ((e = readdir(d)) != NULL) {
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    }
    closedir(d);
    return n;
}

/* 120 k rows of 200-byte params: over 24 MiB of cells, past what the text writer keeps in
 * memory: the rest goes to an unlinked file in $TMPDIR, and the table is the same. */
static void test_text_spills_to_tmpdir(void **state)
{
    enum kp_pyprof_col cols[4] = { KP_PYPROF_IDX, KP_PYPROF_KERNEL, KP_PYPROF_PARAMS,
                                   KP_PYPROF_SIL };
    char *pool, *a, *b = NULL, err[512] = "";
    struct kp_pyprof_row *r = rows_of(120000, 200, &pool);
    struct kp_pyprof_writer *w = NULL;
    size_t la = 0, lb = 0;
    FILE *f;

    (void) state;
    assert_int_equal(setenv("TMPDIR", tmpdir(), 1), 0);
    a = at_once(r, 120000, cols, 4, KP_PYPROF_TEXT, 0, &la);
    assert_true(la > (24u << 20));
    f = open_memstream(&b, &lb);
    assert_int_equal(kp_pyprof_writer_open(f, 42, 3, cols, 4, KP_PYPROF_TEXT, 0, &w), 0);
    for (size_t at = 0; at < 120000; at += 4096) {
        size_t k = 120000 - at < 4096 ? 120000 - at : 4096;

        assert_int_equal(kp_pyprof_writer_rows(w, r + at, k, err, sizeof(err)), 0);
        assert_int_equal(entries(tmpdir()), 0); /* unlinked at once */
    }
    assert_int_equal(kp_pyprof_writer_close(w, true, err, sizeof(err)), 0);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(a);
    free(b);
    free(r);
    free(pool);
}

/* A $TMPDIR where no file can be made: refused with where and what to do. */
static void test_tmpdir_refused(void **state)
{
    enum kp_pyprof_col cols[1] = { KP_PYPROF_PARAMS };
    char *pool, *b = NULL, err[512] = "";
    struct kp_pyprof_row *r = rows_of(40000, 500, &pool);
    struct kp_pyprof_writer *w = NULL;
    size_t lb = 0;
    int rc = 0;
    FILE *f;

    (void) state;
    assert_int_equal(setenv("TMPDIR", "/nonexistent/kprof-test", 1), 0);
    f = open_memstream(&b, &lb);
    assert_int_equal(kp_pyprof_writer_open(f, 42, 3, cols, 1, KP_PYPROF_TEXT, 0, &w), 0);
    for (size_t at = 0; at < 40000 && rc == 0; at += 1000) {
        rc = kp_pyprof_writer_rows(w, r + at, 1000, err, sizeof(err));
    }
    assert_int_equal(rc, -ENOENT);
    assert_non_null(strstr(err, "/nonexistent/kprof-test"));
    assert_non_null(strstr(err, "set TMPDIR, or print --csv or --json"));
    assert_int_equal(kp_pyprof_writer_close(w, false, err, sizeof(err)), 0);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(lb, 0); /* nothing printed: text waits for every row */
    free(b);
    free(r);
    free(pool);
    assert_int_equal(unsetenv("TMPDIR"), 0);
}

/* A table that stops short (the stream cut): JSON's header and rows, never its closing. */
static void test_unended(void **state)
{
    enum kp_pyprof_col cols[2] = { KP_PYPROF_IDX, KP_PYPROF_KERNEL };
    char *pool, *b = NULL, err[64];
    struct kp_pyprof_row *r = rows_of(3, 0, &pool);
    struct kp_pyprof_writer *w = NULL;
    size_t lb = 0;
    FILE *f = open_memstream(&b, &lb);

    (void) state;
    assert_int_equal(kp_pyprof_writer_open(f, 42, 3, cols, 2, KP_PYPROF_JSON, 0, &w), 0);
    assert_int_equal(kp_pyprof_writer_rows(w, r, 3, err, sizeof(err)), 0);
    assert_int_equal(kp_pyprof_writer_close(w, false, err, sizeof(err)), 0);
    assert_int_equal(fclose(f), 0);
    assert_non_null(strstr(b, "\"rows\": [\n  {\"idx\": 1"));
    assert_null(strstr(b, "]}"));
    free(b);
    free(r);
    free(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_at_once),
        cmocka_unit_test(test_text_spills_to_tmpdir),
        cmocka_unit_test(test_tmpdir_refused),
        cmocka_unit_test(test_unended),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);

    rmdir(tmpdir());
    return rc;
}
