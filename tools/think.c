/* think.c - thinking apart from the answer (think.h). */
#include "think.h"

#include <string.h>

#define DIM "\033[2m"
#define UNDIM "\033[0m"

static void emit(think_filter *f, const char *s, size_t n)
{
    if (n && !(f->in_think && f->hide)) fwrite(s, 1, n, f->out);
}

void think_toggle(think_filter *f)
{
    f->in_think = !f->in_think;
    if (f->hide) return;
    if (f->tty) fputs(f->in_think ? DIM : UNDIM, f->out);
    else fputs(f->in_think ? "<think>" : "</think>", f->out);
}

void think_push(think_filter *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        f->pend[f->np++] = s[i];
        /* invariant: pend is a proper prefix of the tag looked for, or ends the loop empty */
        while (f->np) {
            const char *tag = f->in_think ? "</think>" : "<think>";
            size_t tl = strlen(tag);
            if (!memcmp(f->pend, tag, f->np < tl ? f->np : tl)) {
                if (f->np == tl) {
                    f->np = 0;
                    think_toggle(f);
                }
                break;
            }
            emit(f, f->pend, 1);
            memmove(f->pend, f->pend + 1, --f->np);
        }
    }
}

void think_finish(think_filter *f)
{
    emit(f, f->pend, f->np);
    f->np = 0;
    if (f->in_think) think_toggle(f); /* the style ends, or the tags balance */
}
