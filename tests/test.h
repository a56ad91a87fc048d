/* test.h - a minimal test harness: CHECK macros that count failures, and helpers
 * to find the golden data and make scratch directories. */
#ifndef DS_TEST_H
#define DS_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

extern int t_failures;
extern int t_checks;

#define CHECK(cond) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_MSG(cond, ...) do { t_checks++; if (!(cond)) { t_failures++; \
    fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
/* CHECK_OK(status_expr): the call must return DS_OK; prints ds_last_error() if not. */
#define CHECK_OK(expr) do { ds_status s_ = (expr); t_checks++; if (s_ != DS_OK) { t_failures++; \
    fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, ds_last_error()); } } while (0)

/* Path under the golden directory (static buffer, rotating among 8). */
const char *t_golden(const char *rel);
/* A fresh empty scratch directory under $TMPDIR (static buffer, rotating). */
const char *t_tmpdir(const char *tag);
/* Runs a shell command, returns its exit status (-1 if it could not run). */
int t_system(const char *fmt, ...);
/* Path of the dsv3 binary under test. */
const char *t_bin(void);
/* Prints the summary line and returns the process exit code. */
int t_done(const char *name);

#endif
