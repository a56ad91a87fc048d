/* test.c - the shared pieces of the test harness. */
#include "test.h"

#include <stdarg.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int t_failures;
int t_checks;

static char *rot_buf(void)
{
    static char bufs[8][4096];
    static int i;
    return bufs[i++ & 7];
}

const char *t_golden(const char *rel)
{
    const char *g = getenv("DSV3_GOLDEN");
    char *b = rot_buf();
    snprintf(b, 4096, "%s/%s", g ? g : "tests/golden", rel);
    return b;
}

const char *t_tmpdir(const char *tag)
{
    const char *base = getenv("TMPDIR");
    char *b = rot_buf();
    snprintf(b, 4096, "%s/dsv3-%s-XXXXXX", base ? base : "/tmp", tag);
    if (!mkdtemp(b)) {
        perror("mkdtemp");
        exit(2);
    }
    return b;
}

int t_system(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc == -1) return -1;
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

const char *t_bin(void)
{
    const char *b = getenv("DSV3_BIN");
    return b ? b : "build/dsv3";
}

int t_done(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, t_checks - t_failures, t_failures);
    return t_failures ? 1 : 0;
}
