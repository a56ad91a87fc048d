/* tokenizer.c - byte-level BPE as Hugging Face `tokenizers` runs it for
 * DeepSeek-V3's tokenizer.json.
 *
 * encode: (1) invalid UTF-8 -> U+FFFD; (2) added tokens are cut out,
 * leftmost-longest (normalized=false ones first, then normalized=true ones in
 * the gaps); (3) each gap goes through the pre-tokenizer Sequence: every Split
 * step applies its regex to each piece the previous steps made and keeps both
 * matches and gaps ("Isolated"); (4) each final piece is mapped byte -> symbol
 * (ByteLevel) and merged by BPE with a heap, lowest merge rank first and the
 * leftmost pair among equal ranks, which is HF's Word::merge_all, O(n log n).
 *
 * Regexes run on PCRE2 with UTF|UCP. HF runs them on Oniguruma, whose \s is
 * Unicode White_Space; PCRE2's UCP \s lacks U+0085, so \s and \S are rewritten
 * to an explicit White_Space class before compiling. Each piece is matched as
 * its own subject, so look-ahead cannot see past the piece, as in HF. */
#include "tok/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "tok/utf8.h"

/* ---- hash maps ---- */

/* bytes -> int32 (open addressing, keys borrowed). */
typedef struct {
    const char **key;
    uint32_t *klen;
    int32_t *val;
    size_t cap, count;
} bmap;

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h ^ (h >> 29);
}

static ds_status bmap_init(bmap *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    m->key = calloc(cap, sizeof *m->key);
    m->klen = calloc(cap, sizeof *m->klen);
    m->val = calloc(cap, sizeof *m->val);
    m->cap = cap;
    m->count = 0;
    if (!m->key || !m->klen || !m->val) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    return DS_OK;
}

static void bmap_free(bmap *m)
{
    free(m->key);
    free(m->klen);
    free(m->val);
    memset(m, 0, sizeof *m);
}

/* Returns the slot of key, or of the empty slot where it would go. */
static size_t bmap_slot(const bmap *m, const char *k, size_t n)
{
    size_t j = hash_bytes(k, n) & (m->cap - 1);
    while (m->key[j] && !(m->klen[j] == n && !memcmp(m->key[j], k, n))) j = (j + 1) & (m->cap - 1);
    return j;
}

static int32_t bmap_get(const bmap *m, const char *k, size_t n)
{
    if (!m->cap) return -1;
    size_t j = bmap_slot(m, k, n);
    return m->key[j] ? m->val[j] : -1;
}

/* Inserts or overwrites; the map was sized for all keys at init. */
static void bmap_put(bmap *m, const char *k, size_t n, int32_t v)
{
    size_t j = bmap_slot(m, k, n);
    if (!m->key[j]) m->count++;
    m->key[j] = k;
    m->klen[j] = (uint32_t)n;
    m->val[j] = v;
}

/* (left id, right id) -> (rank, merged id). */
typedef struct {
    uint64_t *key; /* (a << 32 | b) + 1; 0 = empty */
    uint32_t *rank;
    int32_t *out;
    size_t cap;
} pmap;

static inline uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1; }

static inline size_t pmap_slot(const pmap *m, uint64_t k)
{
    uint64_t h = k * 0x9E3779B97F4A7C15ULL;
    size_t j = (h >> 20) & (m->cap - 1);
    while (m->key[j] && m->key[j] != k) j = (j + 1) & (m->cap - 1);
    return j;
}

static inline bool pmap_get(const pmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *out)
{
    size_t j = pmap_slot(m, pair_key(a, b));
    if (!m->key[j]) return false;
    *rank = m->rank[j];
    *out = m->out[j];
    return true;
}

/* ---- the tokenizer ---- */

typedef struct {
    char *content;
    size_t len;
    int32_t id;
    bool special, normalized;
} added_token;

/* One class of added tokens (normalized=false or true) for matching. */
typedef struct {
    bmap map;          /* content -> index into added[] */
    size_t *lens;      /* distinct lengths, longest first */
    size_t n_lens;
    uint8_t first[256]; /* first bytes that begin some token */
} added_set;

typedef struct {
    pcre2_code *re; /* NULL: the ByteLevel step (always last) */
    char *pattern;
} pre_step;

struct tok_tokenizer {
    int32_t n_ids;
    char **piece;       /* id -> token string (byte-level form), NULL if none */
    char *bytes;        /* decoded bytes of every id, concatenated */
    size_t *boff;       /* id -> offset into bytes; boff[n_ids] = end */
    uint8_t *special;   /* id -> added token with special=true */
    bmap vocab;         /* model vocab string -> id */
    pmap merges;
    int32_t byte_id[256];
    added_token *added;
    size_t n_added;
    added_set aset[2]; /* [0]: normalized=false, [1]: normalized=true */
    pre_step *steps;
    size_t n_steps;
    char *bos, *eos, *chat_template;
    int32_t bos_id, eos_id;
};

/* GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest to
 * U+0100 upwards in byte order. */
static void byte_chars(uint32_t map[256])
{
    uint32_t n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        map[b] = keep ? (uint32_t)b : 256 + n++;
    }
}

/* max and what: the file's size cap and kind (base/file.h). */
static ds_status load_json(const char *path, size_t max, const char *what, json_t **out)
{
    char *buf = NULL;
    size_t n = 0;
    ds_status s = file_read(path, max, what, &buf, &n);
    if (s) return s;
    json_error_t e;
    *out = json_loadb(buf, n, JSON_ALLOW_NUL, &e);
    free(buf);
    if (!*out) return ds_errorf(DS_ERR_FORMAT, "%s: line %d: %s", path, e.line, e.text);
    return DS_OK;
}

/* Rewrites \s and \S (outside character classes) to Unicode White_Space. */
static char *translate_regex(const char *p)
{
    static const char ws[] = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
                             "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
    size_t n = strlen(p);
    char *o = malloc(n * (sizeof ws + 4) + 1);
    if (!o) return NULL;
    size_t j = 0;
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            if ((d == 's' || d == 'S') && !in_class) {
                j += (size_t)sprintf(o + j, d == 's' ? "[%s]" : "[^%s]", ws);
            } else if (d == 's' && in_class) {
                j += (size_t)sprintf(o + j, "%s", ws);
            } else {
                o[j++] = c;
                o[j++] = d;
            }
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = true;
            o[j++] = c;
            /* a ']' right after '[' or '[^' is literal */
            if (i + 1 < n && p[i + 1] == '^') o[j++] = p[++i];
            if (i + 1 < n && p[i + 1] == ']') o[j++] = p[++i];
            continue;
        }
        if (c == ']' && in_class) in_class = false;
        o[j++] = c;
    }
    o[j] = '\0';
    return o;
}

static ds_status add_regex_step(tok_tokenizer *t, const char *path, const char *pattern)
{
    char *tr = translate_regex(pattern);
    if (!tr) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    int err;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)tr, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &err, &off, NULL);
    if (!re) {
        char msg[256];
        pcre2_get_error_message(err, (PCRE2_UCHAR *)msg, sizeof msg);
        free(tr);
        return ds_errorf(DS_ERR_FORMAT, "%s: pre_tokenizer regex \"%s\" at offset %zu: %s", path,
                         pattern, (size_t)off, msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
    pre_step *ns = realloc(t->steps, (t->n_steps + 1) * sizeof *ns);
    if (!ns) {
        pcre2_code_free(re);
        free(tr);
        return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->steps = ns;
    t->steps[t->n_steps++] = (pre_step){re, tr};
    return DS_OK;
}

/* Escapes regex metacharacters of a literal Split pattern. */
static char *quote_regex(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(2 * n + 1), *q = o;
    if (!o) return NULL;
    for (; *s; s++) {
        if (strchr("\\^$.|?*+()[]{}", *s)) *q++ = '\\';
        *q++ = *s;
    }
    *q = '\0';
    return o;
}

static const char gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static ds_status parse_pre(tok_tokenizer *t, const char *path, json_t *pt, bool *have_bl)
{
    const char *type = json_string_value(json_object_get(pt, "type"));
    if (!type) return ds_errorf(DS_ERR_FORMAT, "%s: pre_tokenizer without a \"type\"", path);
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(pt, "pretokenizers");
        if (!json_is_array(arr))
            return ds_errorf(DS_ERR_FORMAT, "%s: Sequence pre_tokenizer without \"pretokenizers\"", path);
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) {
            ds_status s = parse_pre(t, path, v, have_bl);
            if (s) return s;
        }
        return DS_OK;
    }
    if (*have_bl) return ds_errorf(DS_ERR_UNSUPPORTED, "%s: pre_tokenizer %s after ByteLevel", path, type);
    if (!strcmp(type, "Split")) {
        const char *beh = json_string_value(json_object_get(pt, "behavior"));
        if (!beh || strcmp(beh, "Isolated") || json_is_true(json_object_get(pt, "invert")))
            return ds_errorf(DS_ERR_UNSUPPORTED, "%s: Split pre_tokenizer: only behavior \"Isolated\" "
                             "without invert is supported (got \"%s\")", path, beh ? beh : "?");
        json_t *pat = json_object_get(pt, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        if (re) return add_regex_step(t, path, re);
        const char *lit = json_string_value(json_object_get(pat, "String"));
        if (!lit) return ds_errorf(DS_ERR_FORMAT, "%s: Split pre_tokenizer without a pattern", path);
        char *q = quote_regex(lit);
        if (!q) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
        ds_status s = add_regex_step(t, path, q);
        free(q);
        return s;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (json_is_true(json_object_get(pt, "add_prefix_space")))
            return ds_errorf(DS_ERR_UNSUPPORTED, "%s: ByteLevel add_prefix_space=true is not supported", path);
        if (json_is_true(json_object_get(pt, "use_regex"))) {
            ds_status s = add_regex_step(t, path, gpt2_regex);
            if (s) return s;
        }
        *have_bl = true;
        return DS_OK;
    }
    return ds_errorf(DS_ERR_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported", path, type);
}

static ds_status set_piece(tok_tokenizer *t, int32_t id, const char *s, size_t n)
{
    char *c = malloc(n + 1);
    if (!c) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(c, s, n);
    c[n] = '\0';
    free(t->piece[id]);
    t->piece[id] = c;
    return DS_OK;
}

/* Decoded bytes of every id: a vocab token maps back through the byte-level
 * table; a token with a char outside the table (like "<｜User｜>") keeps its
 * UTF-8 bytes, as HF's ByteLevel decoder does. */
static ds_status build_bytes(tok_tokenizer *t)
{
    uint32_t map[256];
    int16_t inv[512];
    byte_chars(map);
    for (int i = 0; i < 512; i++) inv[i] = -1;
    for (int b = 0; b < 256; b++) inv[map[b]] = (int16_t)b;
    size_t total = 0;
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->piece[id]) total += strlen(t->piece[id]);
    t->bytes = malloc(total + 1);
    t->boff = malloc((size_t)(t->n_ids + 1) * sizeof *t->boff);
    if (!t->bytes || !t->boff) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    size_t o = 0;
    for (int32_t id = 0; id < t->n_ids; id++) {
        t->boff[id] = o;
        const char *p = t->piece[id];
        if (!p) continue;
        size_t n = strlen(p), i = 0, start = o;
        bool raw = false;
        while (i < n) {
            uint32_t cp;
            size_t bad;
            int inc;
            size_t l = utf8_next((const uint8_t *)p + i, n - i, &cp, &bad, &inc);
            if (!l || cp >= 512 || inv[cp] < 0) {
                raw = true;
                break;
            }
            t->bytes[o++] = (char)inv[cp];
            i += l;
        }
        if (raw) {
            memcpy(t->bytes + start, p, n);
            o = start + n;
        }
    }
    t->boff[t->n_ids] = o;
    return DS_OK;
}

static ds_status parse_model(tok_tokenizer *t, const char *path, json_t *model, json_t *added)
{
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE"))
        return ds_errorf(DS_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (need BPE)", path,
                         type ? type : "?");
    if (json_is_true(json_object_get(model, "byte_fallback")) ||
        json_is_string(json_object_get(model, "continuing_subword_prefix")) ||
        json_is_string(json_object_get(model, "end_of_word_suffix")))
        return ds_errorf(DS_ERR_UNSUPPORTED, "%s: BPE byte_fallback/continuing_subword_prefix/"
                         "end_of_word_suffix are not supported", path);
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab)) return ds_errorf(DS_ERR_FORMAT, "%s: model.vocab is not an object", path);
    if (!json_is_array(merges)) return ds_errorf(DS_ERR_FORMAT, "%s: model.merges is not an array", path);
    if (added && !json_is_array(added)) return ds_errorf(DS_ERR_FORMAT, "%s: added_tokens is not an array", path);

    /* ids: find the range first */
    int64_t max_id = -1;
    const char *k;
    json_t *v;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24))
            return ds_errorf(DS_ERR_FORMAT, "%s: vocab entry \"%s\" has id that is not in [0, 2^24)", path, k);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        json_t *id = json_object_get(v, "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= (1 << 24) ||
            !json_is_string(json_object_get(v, "content")) ||
            json_string_length(json_object_get(v, "content")) == 0)
            return ds_errorf(DS_ERR_FORMAT, "%s: added_tokens[%zu] needs an id in [0, 2^24) and a "
                             "non-empty content", path, i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    if (max_id < 0) return ds_errorf(DS_ERR_FORMAT, "%s: empty vocab", path);
    t->n_ids = (int32_t)max_id + 1;
    t->piece = calloc((size_t)t->n_ids, sizeof *t->piece);
    t->special = calloc((size_t)t->n_ids, 1);
    if (!t->piece || !t->special) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    ds_status s = bmap_init(&t->vocab, json_object_size(vocab));
    if (s) return s;
    json_object_foreach(vocab, k, v) {
        int32_t id = (int32_t)json_integer_value(v);
        s = set_piece(t, id, k, strlen(k));
        if (s) return s;
    }
    /* vocab keys point at the id's own copy: stable for the tokenizer's life */
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->piece[id]) bmap_put(&t->vocab, t->piece[id], strlen(t->piece[id]), id);

    uint32_t map[256];
    byte_chars(map);
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t l = utf8_put(map[b], u);
        t->byte_id[b] = bmap_get(&t->vocab, u, l);
    }

    /* merges */
    size_t nm = json_array_size(merges), cap = 16;
    while (cap < nm * 2) cap <<= 1;
    t->merges.cap = cap;
    t->merges.key = calloc(cap, sizeof *t->merges.key);
    t->merges.rank = calloc(cap, sizeof *t->merges.rank);
    t->merges.out = calloc(cap, sizeof *t->merges.out);
    char *buf = NULL;
    size_t bufcap = 0;
    if (!t->merges.key || !t->merges.rank || !t->merges.out)
        return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    json_array_foreach(merges, i, v) {
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(v)) {
            a = json_string_value(v);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                free(buf);
                return ds_errorf(DS_ERR_FORMAT, "%s: merges[%zu] \"%s\" is not \"left right\"", path, i, a);
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
                   json_is_string(json_array_get(v, 1))) {
            a = json_string_value(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            free(buf);
            return ds_errorf(DS_ERR_FORMAT, "%s: merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, i);
        }
        if (la + lb > bufcap) {
            bufcap = (la + lb) * 2;
            char *nb = realloc(buf, bufcap);
            if (!nb) {
                free(buf);
                return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
            }
            buf = nb;
        }
        memcpy(buf, a, la);
        memcpy(buf + la, b, lb);
        int32_t ia = bmap_get(&t->vocab, a, la), ib = bmap_get(&t->vocab, b, lb);
        int32_t io = bmap_get(&t->vocab, buf, la + lb);
        if (ia < 0 || ib < 0 || io < 0) {
            free(buf);
            return ds_errorf(DS_ERR_FORMAT, "%s: merges[%zu]: a token of \"%.*s\" + \"%.*s\" is not in the vocab",
                             path, i, (int)la, a, (int)lb, b);
        }
        size_t j = pmap_slot(&t->merges, pair_key(ia, ib));
        if (t->merges.key[j]) continue; /* HF keeps the first rank of a duplicate */
        t->merges.key[j] = pair_key(ia, ib);
        t->merges.rank[j] = (uint32_t)i;
        t->merges.out[j] = io;
    }
    free(buf);

    /* added tokens */
    t->n_added = json_array_size(added);
    t->added = calloc(t->n_added ? t->n_added : 1, sizeof *t->added);
    if (!t->added) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    json_array_foreach(added, i, v) {
        added_token *a = &t->added[i];
        json_t *c = json_object_get(v, "content");
        a->len = json_string_length(c);
        a->content = malloc(a->len + 1);
        if (!a->content) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
        memcpy(a->content, json_string_value(c), a->len + 1);
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->special = json_is_true(json_object_get(v, "special"));
        /* HF's default for a missing "normalized" is !special */
        json_t *norm = json_object_get(v, "normalized");
        a->normalized = norm ? json_is_true(norm) : !a->special;
        if (json_is_true(json_object_get(v, "lstrip")) || json_is_true(json_object_get(v, "rstrip")) ||
            json_is_true(json_object_get(v, "single_word")))
            return ds_errorf(DS_ERR_UNSUPPORTED, "%s: added token \"%s\": lstrip/rstrip/single_word are "
                             "not supported", path, a->content);
        s = set_piece(t, a->id, a->content, a->len);
        if (s) return s;
        t->special[a->id] = a->special;
    }
    for (int c = 0; c < 2; c++) {
        added_set *as = &t->aset[c];
        s = bmap_init(&as->map, t->n_added + 1);
        if (s) return s;
        as->lens = calloc(t->n_added + 1, sizeof *as->lens);
        if (!as->lens) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
        for (size_t a = 0; a < t->n_added; a++) {
            added_token *at = &t->added[a];
            if ((int)at->normalized != c) continue;
            bmap_put(&as->map, at->content, at->len, (int32_t)a);
            as->first[(uint8_t)at->content[0]] = 1;
            size_t l = 0;
            while (l < as->n_lens && as->lens[l] != at->len) l++;
            if (l == as->n_lens) {
                /* keep lengths sorted, longest first */
                size_t p = as->n_lens++;
                while (p > 0 && as->lens[p - 1] < at->len) {
                    as->lens[p] = as->lens[p - 1];
                    p--;
                }
                as->lens[p] = at->len;
            }
        }
    }
    return build_bytes(t);
}

static char *dup_token_field(json_t *v)
{
    /* "bos_token": "<s>" or {"content": "<s>", ...} */
    if (json_is_object(v)) v = json_object_get(v, "content");
    return strdup(json_is_string(v) ? json_string_value(v) : "");
}

static ds_status parse_config(tok_tokenizer *t, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) && errno == ENOENT) { /* optional; anything else there is checked by load_json */
        t->bos = strdup("");
        t->eos = strdup("");
        return t->bos && t->eos ? DS_OK : ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    }
    json_t *cfg;
    ds_status s = load_json(path, FILE_MAX_TOK_CONFIG, "tokenizer config", &cfg);
    if (s) return s;
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return ds_errorf(DS_ERR_FORMAT, "%s: not a JSON object", path);
    }
    t->bos = dup_token_field(json_object_get(cfg, "bos_token"));
    t->eos = dup_token_field(json_object_get(cfg, "eos_token"));
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) {
        t->chat_template = strdup(json_string_value(ct));
    } else if (json_is_array(ct)) { /* [{"name": "default", "template": ...}, ...] */
        size_t i;
        json_t *v;
        json_array_foreach(ct, i, v) {
            const char *name = json_string_value(json_object_get(v, "name"));
            const char *tpl = json_string_value(json_object_get(v, "template"));
            if (name && tpl && !strcmp(name, "default")) t->chat_template = strdup(tpl);
        }
    } else if (ct && !json_is_null(ct)) {
        json_decref(cfg);
        return ds_errorf(DS_ERR_FORMAT, "%s: chat_template is neither a string nor a list", path);
    }
    json_decref(cfg);
    if (!t->bos || !t->eos) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    t->bos_id = *t->bos ? tok_piece_to_id(t, t->bos, strlen(t->bos)) : -1;
    t->eos_id = *t->eos ? tok_piece_to_id(t, t->eos, strlen(t->eos)) : -1;
    if (*t->bos && t->bos_id < 0) return ds_errorf(DS_ERR_FORMAT, "%s: bos_token \"%s\" is not a token", path, t->bos);
    if (*t->eos && t->eos_id < 0) return ds_errorf(DS_ERR_FORMAT, "%s: eos_token \"%s\" is not a token", path, t->eos);
    return DS_OK;
}

ds_status tok_load(tok_tokenizer **out, const char *dir)
{
    *out = NULL;
    if (!dir) return ds_errorf(DS_ERR_ARG, "tok_load: no tokenizer directory");
    tok_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    t->bos_id = t->eos_id = -1;
    size_t dl = strlen(dir);
    char *path = malloc(dl + 32);
    if (!path) {
        free(t);
        return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    }
    snprintf(path, dl + 32, "%s/tokenizer.json", dir);
    json_t *root = NULL;
    ds_status s = load_json(path, FILE_MAX_TOKENIZER, "tokenizer", &root);
    if (!s && !json_is_object(root)) s = ds_errorf(DS_ERR_FORMAT, "%s: not a JSON object", path);
    if (!s) {
        json_t *norm = json_object_get(root, "normalizer");
        if (norm && !json_is_null(norm)) {
            const char *nt = json_string_value(json_object_get(norm, "type"));
            if (!nt || strcmp(nt, "Sequence") || json_array_size(json_object_get(norm, "normalizers")) != 0)
                s = ds_errorf(DS_ERR_UNSUPPORTED, "%s: normalizer \"%s\" is not supported (only none)", path,
                              nt ? nt : "?");
        }
    }
    if (!s) {
        json_t *dec = json_object_get(root, "decoder");
        const char *dt = json_string_value(json_object_get(dec, "type"));
        if (dec && !json_is_null(dec) && (!dt || strcmp(dt, "ByteLevel")))
            s = ds_errorf(DS_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported (only ByteLevel)", path,
                          dt ? dt : "?");
    }
    if (!s) {
        json_t *model = json_object_get(root, "model");
        if (!json_is_object(model)) s = ds_errorf(DS_ERR_FORMAT, "%s: no \"model\" object", path);
        else s = parse_model(t, path, model, json_object_get(root, "added_tokens"));
    }
    if (!s) {
        bool have_bl = false;
        json_t *pt = json_object_get(root, "pre_tokenizer");
        if (pt && !json_is_null(pt)) s = parse_pre(t, path, pt, &have_bl);
        if (!s && !have_bl)
            s = ds_errorf(DS_ERR_UNSUPPORTED, "%s: the pre_tokenizer has no ByteLevel step (only "
                          "byte-level BPE is supported)", path);
    }
    json_decref(root);
    if (!s) {
        snprintf(path, dl + 32, "%s/tokenizer_config.json", dir);
        s = parse_config(t, path);
    }
    free(path);
    if (s) {
        tok_free(t);
        return s;
    }
    *out = t;
    return DS_OK;
}

void tok_free(tok_tokenizer *t)
{
    if (!t) return;
    if (t->piece)
        for (int32_t i = 0; i < t->n_ids; i++) free(t->piece[i]);
    free(t->piece);
    free(t->special);
    free(t->bytes);
    free(t->boff);
    bmap_free(&t->vocab);
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.out);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int c = 0; c < 2; c++) {
        bmap_free(&t->aset[c].map);
        free(t->aset[c].lens);
    }
    for (size_t i = 0; i < t->n_steps; i++) {
        pcre2_code_free(t->steps[i].re);
        free(t->steps[i].pattern);
    }
    free(t->steps);
    free(t->bos);
    free(t->eos);
    free(t->chat_template);
    free(t);
}

int32_t tok_vocab_size(const tok_tokenizer *t) { return t->n_ids; }
int32_t tok_bos_id(const tok_tokenizer *t) { return t->bos_id; }
int32_t tok_eos_id(const tok_tokenizer *t) { return t->eos_id; }
const char *tok_bos_token(const tok_tokenizer *t) { return t->bos; }
const char *tok_eos_token(const tok_tokenizer *t) { return t->eos; }
const char *tok_chat_template(const tok_tokenizer *t) { return t->chat_template; }

const char *tok_id_to_piece(const tok_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids ? t->piece[id] : NULL;
}

int tok_is_special(const tok_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->special[id];
}

int32_t tok_piece_to_id(const tok_tokenizer *t, const char *piece, size_t len)
{
    for (int c = 0; c < 2; c++) {
        int32_t a = bmap_get(&t->aset[c].map, piece, len);
        if (a >= 0) return t->added[a].id;
    }
    return bmap_get(&t->vocab, piece, len);
}

/* ---- encoding ---- */

typedef struct {
    int32_t *v;
    size_t n, cap;
} idvec;

static bool idvec_push(idvec *o, int32_t id)
{
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *nv = realloc(o->v, cap * sizeof *nv);
        if (!nv) return false;
        o->v = nv;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return true;
}

typedef struct {
    uint32_t rank, pos;
    int32_t out;
} merge_ent;

static inline bool merge_less(merge_ent a, merge_ent b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(merge_ent *h, size_t *n, merge_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(e, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static merge_ent heap_pop(merge_ent *h, size_t *n)
{
    merge_ent top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_less(h[c + 1], h[c])) c++;
        if (!merge_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Scratch space reused across the words of one encode call. */
typedef struct {
    int32_t *sym, *prev, *next;
    merge_ent *heap;
    size_t cap;
} bpe_scratch;

static bool scratch_fit(bpe_scratch *w, size_t n)
{
    if (n <= w->cap) return true;
    size_t cap = n < 64 ? 64 : n * 2;
    int32_t *a = realloc(w->sym, cap * sizeof *a);
    if (a) w->sym = a;
    int32_t *b = realloc(w->prev, cap * sizeof *b);
    if (b) w->prev = b;
    int32_t *c = realloc(w->next, cap * sizeof *c);
    if (c) w->next = c;
    /* each merge pushes at most 2 entries: n + 2n bounds the heap */
    merge_ent *h = realloc(w->heap, 3 * cap * sizeof *h);
    if (h) w->heap = h;
    if (!a || !b || !c || !h) return false;
    w->cap = cap;
    return true;
}

/* BPE on one pre-tokenized piece (raw bytes), as HF's Word::merge_all. */
static ds_status bpe_word(const tok_tokenizer *t, const uint8_t *s, size_t n, bpe_scratch *w, idvec *out)
{
    if (!scratch_fit(w, n)) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[s[i]];
        if (id >= 0) w->sym[m++] = id; /* no unk token: HF drops unknown chars */
    }
    if (m == 1) return idvec_push(out, w->sym[0]) ? DS_OK : ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < m; i++) {
        w->prev[i] = (int32_t)i - 1;
        w->next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < m; i++) {
        merge_ent e = {0, (uint32_t)i, 0};
        if (pmap_get(&t->merges, w->sym[i], w->sym[i + 1], &e.rank, &e.out)) heap_push(w->heap, &hn, e);
    }
    while (hn) {
        merge_ent e = heap_pop(w->heap, &hn);
        int32_t p = (int32_t)e.pos;
        if (w->sym[p] < 0 || w->next[p] < 0) continue; /* removed, or last */
        int32_t q = w->next[p];
        uint32_t r;
        int32_t o;
        if (!pmap_get(&t->merges, w->sym[p], w->sym[q], &r, &o) || o != e.out) continue; /* stale */
        w->sym[p] = e.out;
        w->sym[q] = -1;
        w->next[p] = w->next[q];
        if (w->next[q] >= 0) w->prev[w->next[q]] = p;
        if (w->prev[p] >= 0) {
            merge_ent f = {0, (uint32_t)w->prev[p], 0};
            if (pmap_get(&t->merges, w->sym[w->prev[p]], w->sym[p], &f.rank, &f.out)) heap_push(w->heap, &hn, f);
        }
        if (w->next[p] >= 0) {
            merge_ent f = {0, (uint32_t)p, 0};
            if (pmap_get(&t->merges, w->sym[p], w->sym[w->next[p]], &f.rank, &f.out)) heap_push(w->heap, &hn, f);
        }
    }
    for (int32_t i = 0; i >= 0 && m; i = w->next[i])
        if (!idvec_push(out, w->sym[i])) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    return DS_OK;
}

typedef struct {
    const tok_tokenizer *t;
    pcre2_match_data *md;
    bpe_scratch w;
    idvec out;
} enc_ctx;

/* Applies pre-tokenizer step k to the piece s[0..n), then BPE at the end. */
static ds_status pretok(enc_ctx *c, size_t k, const char *s, size_t n)
{
    if (n == 0) return DS_OK;
    if (k == c->t->n_steps) return bpe_word(c->t, (const uint8_t *)s, n, &c->w, &c->out);
    pcre2_code *re = c->t->steps[k].re;
    size_t pos = 0, last = 0;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            char msg[256];
            pcre2_get_error_message(rc, (PCRE2_UCHAR *)msg, sizeof msg);
            return ds_errorf(DS_ERR_INTERNAL, "tokenizer: regex %zu: %s", k, msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* empty match: split nothing, step one char */
            pos = a + 1;
            while (pos < n && ((uint8_t)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        ds_status st = pretok(c, k + 1, s + last, a - last);
        if (!st) st = pretok(c, k + 1, s + a, b - a);
        if (st) return st;
        last = pos = b;
    }
    return pretok(c, k + 1, s + last, n - last);
}

/* The added token (index) starting at s[p] in class c that is allowed by
 * trust, longest first; -1 if none. */
static int32_t added_at(const tok_tokenizer *t, int c, const char *s, size_t p, size_t end,
                        const uint8_t *trust)
{
    const added_set *as = &t->aset[c];
    if (!as->first[(uint8_t)s[p]]) return -1;
    for (size_t l = 0; l < as->n_lens; l++) {
        size_t len = as->lens[l];
        if (len > end - p) continue;
        int32_t a = bmap_get(&as->map, s + p, len);
        if (a < 0) continue;
        if (trust) {
            size_t i = 0;
            while (i < len && trust[p + i]) i++;
            if (i < len) continue;
        }
        return a;
    }
    return -1;
}

/* Encodes s[a..b) that holds no added token of class < c: cuts out class c
 * tokens and recurses into the gaps with c + 1; c == 2 is plain text. */
static ds_status encode_span(enc_ctx *c, int cls, const char *s, size_t a, size_t b, const uint8_t *trust,
                             bool special)
{
    if (cls == 2 || !special) return pretok(c, 0, s + a, b - a);
    size_t gap = a;
    for (size_t p = a; p < b;) {
        int32_t m = added_at(c->t, cls, s, p, b, trust);
        if (m < 0) {
            p++;
            continue;
        }
        ds_status st = encode_span(c, cls + 1, s, gap, p, trust, special);
        if (st) return st;
        if (!idvec_push(&c->out, c->t->added[m].id)) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
        p += c->t->added[m].len;
        gap = p;
    }
    return encode_span(c, cls + 1, s, gap, b, trust, special);
}

static ds_status encode_impl(const tok_tokenizer *t, const char *text, size_t len, const uint8_t *trust,
                             bool special, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    if (!text && len) return ds_errorf(DS_ERR_ARG, "tok_encode: NULL text");
    size_t sn;
    uint8_t *sm = NULL;
    char *s = utf8_sanitize(text ? text : "", len, trust, &sn, trust ? &sm : NULL);
    if (!s) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
    enc_ctx c = {.t = t};
    ds_status st = DS_OK;
    if (t->n_steps) {
        c.md = pcre2_match_data_create(4, NULL);
        if (!c.md) st = ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    }
    if (!st) st = encode_span(&c, 0, s, 0, sn, sm, special);
    free(s);
    free(sm);
    pcre2_match_data_free(c.md);
    free(c.w.sym);
    free(c.w.prev);
    free(c.w.next);
    free(c.w.heap);
    if (st) {
        free(c.out.v);
        return st;
    }
    *ids = c.out.v;
    *n = c.out.n;
    return DS_OK;
}

ds_status tok_encode(const tok_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids, size_t *n)
{
    return encode_impl(t, text, len, NULL, (flags & TOK_PARSE_SPECIAL) != 0, ids, n);
}

ds_status tok_encode_masked(const tok_tokenizer *t, const char *text, size_t len, const uint8_t *trust,
                            int32_t **ids, size_t *n)
{
    return encode_impl(t, text, len, trust, true, ids, n);
}

/* ---- decoding ---- */

ds_status tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int flags, char **text, size_t *len)
{
    *text = NULL;
    if (len) *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids)
            return ds_errorf(DS_ERR_RANGE, "tok_decode: id %d at position %zu is outside [0, %d)", ids[i], i,
                             t->n_ids);
        total += t->boff[ids[i] + 1] - t->boff[ids[i]];
    }
    char *raw = malloc(total + 1);
    if (!raw) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if ((flags & TOK_SKIP_SPECIAL) && t->special[ids[i]]) continue;
        size_t l = t->boff[ids[i] + 1] - t->boff[ids[i]];
        memcpy(raw + o, t->bytes + t->boff[ids[i]], l);
        o += l;
    }
    size_t sn;
    char *s = utf8_sanitize(raw, o, NULL, &sn, NULL);
    free(raw);
    if (!s) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    *text = s;
    if (len) *len = sn;
    return DS_OK;
}

struct tok_decoder {
    const tok_tokenizer *t;
    int flags;
    char pend[8]; /* bytes of an incomplete character (at most 3) */
    size_t npend;
    char *buf;
    size_t cap;
};

ds_status tok_decoder_new(const tok_tokenizer *t, int flags, tok_decoder **out)
{
    *out = calloc(1, sizeof **out);
    if (!*out) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    (*out)->t = t;
    (*out)->flags = flags;
    return DS_OK;
}

void tok_decoder_free(tok_decoder *d)
{
    if (!d) return;
    free(d->buf);
    free(d);
}

/* Decodes pend + s into d->buf; keeps an incomplete tail unless final. */
static ds_status decoder_run(tok_decoder *d, const char *s, size_t n, bool final, const char **text, size_t *len)
{
    size_t need = (d->npend + n) * 3 + 1;
    if (need > d->cap) {
        char *nb = realloc(d->buf, need);
        if (!nb) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
        d->buf = nb;
        d->cap = need;
    }
    /* the pending bytes go first; work on a joined copy at the end of buf */
    char tmp[64];
    char *in = d->npend + n <= sizeof tmp ? tmp : malloc(d->npend + n);
    if (!in) return ds_errorf(DS_ERR_NOMEM, "tokenizer: out of memory");
    memcpy(in, d->pend, d->npend);
    if (n) memcpy(in + d->npend, s, n);
    size_t m = d->npend + n, i = 0, o = 0;
    d->npend = 0;
    while (i < m) {
        uint32_t cp;
        size_t bad;
        int inc;
        size_t l = utf8_next((const uint8_t *)in + i, m - i, &cp, &bad, &inc);
        if (l) {
            memcpy(d->buf + o, in + i, l);
            o += l;
            i += l;
            continue;
        }
        if (inc && !final) {
            memcpy(d->pend, in + i, m - i);
            d->npend = m - i;
            break;
        }
        memcpy(d->buf + o, "\xEF\xBF\xBD", 3);
        o += 3;
        i += bad;
    }
    if (in != tmp) free(in);
    d->buf[o] = '\0';
    *text = d->buf;
    *len = o;
    return DS_OK;
}

ds_status tok_decoder_push(tok_decoder *d, int32_t id, const char **text, size_t *len)
{
    const tok_tokenizer *t = d->t;
    *text = "";
    *len = 0;
    if (id < 0 || id >= t->n_ids)
        return ds_errorf(DS_ERR_RANGE, "tok_decoder_push: id %d is outside [0, %d)", id, t->n_ids);
    if ((d->flags & TOK_SKIP_SPECIAL) && t->special[id]) return decoder_run(d, NULL, 0, false, text, len);
    return decoder_run(d, t->bytes + t->boff[id], t->boff[id + 1] - t->boff[id], false, text, len);
}

ds_status tok_decoder_finish(tok_decoder *d, const char **text, size_t *len)
{
    return decoder_run(d, NULL, 0, true, text, len);
}
