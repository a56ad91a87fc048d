/* think.h - R1/V3.1 thinking apart from the answer in streamed text.
 *
 * A reply's text arrives in pieces cut anywhere; <think> and </think> split it
 * into thinking and answer. The thinking is written dimmed (ANSI faint) on a
 * terminal, between its tags otherwise, or not at all when hidden. A piece
 * that could begin a tag waits until the next piece says whether it does. */
#ifndef DS_THINK_H
#define DS_THINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
    FILE *out;
    bool hide, tty; /* leave the thinking out; dim it rather than print its tags */
    bool in_think;
    char pend[16];  /* a possible tag's first bytes (shorter than "</think>") */
    size_t np;
} think_filter;

/* Enters (or leaves) the thinking: for a prompt that opened it (V3.1). */
void think_toggle(think_filter *f);
void think_push(think_filter *f, const char *s, size_t n);
/* Writes what waited and leaves the thinking (its style ends; its tags balance). */
void think_finish(think_filter *f);

#endif
