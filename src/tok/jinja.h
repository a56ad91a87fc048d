/* jinja.h - an interpreter for the subset of Jinja2 that chat templates use.
 *
 * Supported: {{ }}, {% if/elif/else %}, {% for a[, b] in x [if c] %} with
 * loop.index/index0/first/last/length/revindex, {% else %} of for, {% set %}
 * (names, ns.attr, block form), break/continue, namespace(), raise_exception(),
 * range(), whitespace control {%- -%} with trim_blocks and lstrip_blocks on
 * (as transformers renders chat templates), comments, the usual operators
 * (and or not, == != < > <= >=, in / not in, is [not] test, + - * / // % **,
 * ~, a if c else b), literals, subscripts, slices, attributes, filters
 * (length, tojson, string, trim, upper, lower, default, join, first, last,
 * list, items, int, float, abs, replace, capitalize, title, safe, map,
 * selectattr, rejectattr) and string/dict methods (split, rsplit, strip,
 * lstrip, rstrip, startswith, endswith, replace, upper, lower, title, find,
 * count, join, items, keys, values, get). Not supported (reported as errors):
 * macros, call blocks, include/import/extends, recursive loops.
 *
 * Taint tracking: every string carries one byte per byte saying whether it
 * came from the template (its literals, or a "markup" variable such as
 * bos_token) or from data (messages, extra variables). The output keeps this
 * mask, so a caller can match special tokens in markup only. */
#ifndef DS_TOK_JINJA_H
#define DS_TOK_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct {
    size_t max_output;     /* bytes of output and of any one string */
    size_t max_iterations; /* loop iterations in total */
    int max_depth;         /* nesting of expressions and blocks */
    size_t max_memory;     /* bytes the render may allocate in total */
} jinja_limits;

/* Renders tmpl with the variables of data (strings marked as data) and markup
 * (strings marked as template markup); either may be NULL. *out is malloc'ed
 * and NUL-terminated; *mask (malloc'ed, may be NULL if not wanted) has 1 for
 * markup bytes, 0 for data bytes. lim may be NULL (defaults). */
ds_status jinja_render(const char *tmpl, json_t *data, json_t *markup, const jinja_limits *lim,
                       char **out, uint8_t **mask, size_t *len);

#endif
