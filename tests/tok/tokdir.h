/* tokdir.h - where the tok tests find DeepSeek-V3's tokenizer files.
 *
 * $DSV3_TOKENIZER if set; otherwise scripts/fetch_tokenizer.sh is run (it is
 * idempotent: after the first run it only prints the cached directory). */
#ifndef DS_TEST_TOKDIR_H
#define DS_TEST_TOKDIR_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *tok_test_dir(void)
{
    static char dir[4096];
    const char *e = getenv("DSV3_TOKENIZER");
    if (e && *e) return e;
    const char *tests = getenv("DSV3_TESTS");
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "bash '%s/../scripts/fetch_tokenizer.sh'", tests ? tests : "tests");
    FILE *p = popen(cmd, "r");
    if (!p || !fgets(dir, sizeof dir, p)) {
        if (p) pclose(p);
        fprintf(stderr, "cannot get the tokenizer: %s failed (needs node/npm, or set DSV3_TOKENIZER)\n", cmd);
        exit(2);
    }
    pclose(p);
    dir[strcspn(dir, "\n")] = '\0';
    return dir;
}

#endif
