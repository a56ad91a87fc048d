/* test_think.c - tools/think.c: a reply's thinking apart from its answer, for
 * every way the text may be cut into streamed pieces, against the expected
 * strings written out by hand. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "think.h"

/* Runs text through a filter in pieces of `cut` bytes; returns what it wrote (free). */
static char *run(const char *text, size_t cut, bool hide, bool tty, bool opened)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&buf, &len);
    think_filter f = {.out = out, .hide = hide, .tty = tty};
    if (opened) think_toggle(&f);
    size_t n = strlen(text);
    for (size_t i = 0; i < n; i += cut) think_push(&f, text + i, n - i < cut ? n - i : cut);
    think_finish(&f);
    fclose(out);
    return buf;
}

static void expect(const char *text, bool hide, bool tty, bool opened, const char *want)
{
    for (size_t cut = 1; cut <= strlen(text) + 1; cut++) {
        char *got = run(text, cut, hide, tty, opened);
        CHECK_MSG(!strcmp(got, want), "'%s' in pieces of %zu (hide %d, tty %d): got '%s', want '%s'", text, cut, hide,
                  tty, got, want);
        free(got);
    }
}

int main(void)
{
    const char *r1 = "<think>\nLet me see: 2+2.\n</think>\n\nIt is 4.";
    expect(r1, false, false, false, r1);
    expect(r1, true, false, false, "\n\nIt is 4.");
    expect(r1, false, true, false, "\033[2m\nLet me see: 2+2.\n\033[0m\n\nIt is 4.");
    expect(r1, true, true, false, "\n\nIt is 4.");
    /* V3.1: the prompt ended in <think>, the reply begins inside it */
    expect("hmm</think>yes", true, false, true, "yes");
    expect("hmm</think>yes", false, true, true, "\033[2mhmm\033[0myes");
    /* near misses are text; an unclosed thinking ends with the reply */
    expect("a <thin> b </think> <<think>x", false, false, false, "a <thin> b </think> <<think>x</think>");
    expect("1 < 2 <think", true, false, false, "1 < 2 <think");
    expect("<think>never closed", false, true, false, "\033[2mnever closed\033[0m");
    expect("<think>never closed", true, true, false, "");
    expect("plain text, no tags", true, true, false, "plain text, no tags");
    return t_done("test_think");
}
