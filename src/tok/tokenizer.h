/* tokenizer.h - DeepSeek-V3's tokenizer: byte-level BPE from tokenizer.json,
 * added/special tokens, streaming decoding, and chat-template rendering.
 *
 * The ids are exactly those of Hugging Face `tokenizers` (Rust) on the same
 * tokenizer.json, with these documented rules:
 *   - Invalid UTF-8 in the input is never an error: each maximal invalid
 *     subsequence (Unicode's "maximal subpart" rule, as Python's
 *     bytes.decode('utf-8', 'replace') and Rust's from_utf8_lossy do) is
 *     replaced by U+FFFD before encoding.
 *   - encode never adds BOS/EOS; chat templates put BOS in the text.
 *   - Added tokens ("special" or not, e.g. <｜User｜>) are found before
 *     pre-tokenization, leftmost-longest, first those with normalized=false,
 *     then the others in the gaps (as HF's AddedVocabulary does).
 *
 * Special-token safety: tok_encode() takes TOK_PARSE_SPECIAL. Without it the
 * text is plain text: "<｜end▁of▁sentence｜>" typed by a user becomes ordinary
 * BPE pieces. tok_encode_chat() renders the template while tracking which
 * output bytes came from the template's own literals (and bos/eos) and which
 * came from messages or extra variables; added tokens are matched only in the
 * former unless TOK_CHAT_PARSE_ALL restores the reference behaviour
 * (encode(render(...)) with everything parsed). When no message contains an
 * added-token string both give the same ids.
 *
 * Threads: a loaded tok_tokenizer is read-only; any number of threads may
 * encode/decode/render with it at once. Decoders are per-stream objects. */
#ifndef DS_TOK_TOKENIZER_H
#define DS_TOK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct tok_tokenizer tok_tokenizer;

/* Loads DIR/tokenizer.json and DIR/tokenizer_config.json (the latter
 * gives bos/eos and chat_template; it may be absent, then there is no
 * template and bos/eos are -1). Cost: ~0.3 s for V3's 128k-token vocab. */
ds_status tok_load(tok_tokenizer **out, const char *dir);
void tok_free(tok_tokenizer *t);

/* Number of ids (max id + 1); ids below it without a token decode to "". */
int32_t tok_vocab_size(const tok_tokenizer *t);
int32_t tok_bos_id(const tok_tokenizer *t); /* -1 if none */
int32_t tok_eos_id(const tok_tokenizer *t); /* -1 if none */
/* The token's string as stored in tokenizer.json (byte-level form, e.g.
 * "Ġworld"), or NULL for an id without a token. */
const char *tok_id_to_piece(const tok_tokenizer *t, int32_t id);
/* Whether id is an added token marked "special" (skipped by TOK_SKIP_SPECIAL). */
int tok_is_special(const tok_tokenizer *t, int32_t id);
/* bos/eos token strings from tokenizer_config.json ("" if none) and its
 * chat_template (NULL if none). */
const char *tok_bos_token(const tok_tokenizer *t);
const char *tok_eos_token(const tok_tokenizer *t);
const char *tok_chat_template(const tok_tokenizer *t);
/* The id of an exact token string (added tokens first, then the vocab), or -1. */
int32_t tok_piece_to_id(const tok_tokenizer *t, const char *piece, size_t len);

enum { TOK_PARSE_SPECIAL = 1 }; /* tok_encode flags */

/* Encodes len bytes of text. With TOK_PARSE_SPECIAL, added-token strings
 * become their ids (HF's default); without it everything is plain text.
 * *ids is malloc'ed (free() it); *n may be 0 (then *ids may be NULL).
 * Cost: O(n log n) in the text length. */
ds_status tok_encode(const tok_tokenizer *t, const char *text, size_t len, int flags,
                     int32_t **ids, size_t *n);

/* Like tok_encode, but trust[i] != 0 marks byte i as markup in which added
 * tokens may be matched; added tokens are matched only where all their bytes
 * are markup. trust == NULL means "all markup". */
ds_status tok_encode_masked(const tok_tokenizer *t, const char *text, size_t len,
                            const uint8_t *trust, int32_t **ids, size_t *n);

enum { TOK_SKIP_SPECIAL = 1 }; /* tok_decode flags */

/* Decodes ids to UTF-8 text (malloc'ed, NUL-terminated; *len excludes the
 * NUL). Byte sequences that are not valid UTF-8 become U+FFFD, as HF does.
 * An id < 0 or >= tok_vocab_size() is DS_ERR_RANGE. */
ds_status tok_decode(const tok_tokenizer *t, const int32_t *ids, size_t n, int flags,
                     char **text, size_t *len);

/* Streaming decoder: feed ids one at a time, get the text that is complete.
 * Bytes of a UTF-8 character split across tokens are held back until the
 * character completes (or becomes invalid, then U+FFFD is emitted), so the
 * concatenated output equals tok_decode() of all ids. */
typedef struct tok_decoder tok_decoder;
ds_status tok_decoder_new(const tok_tokenizer *t, int flags, tok_decoder **out);
/* Appends the text made complete by id to a buffer owned by the decoder;
 * *text stays valid until the next call; *len may be 0. */
ds_status tok_decoder_push(tok_decoder *d, int32_t id, const char **text, size_t *len);
/* Flushes held-back bytes (each incomplete sequence becomes U+FFFD). */
ds_status tok_decoder_finish(tok_decoder *d, const char **text, size_t *len);
void tok_decoder_free(tok_decoder *d);

/* ---- chat templates ---- */

typedef struct {
    int add_generation_prompt;
    const char *extra_vars_json; /* JSON object of extra variables ({"thinking": true}) or NULL */
    const char *template_text;   /* overrides tokenizer_config's chat_template, or NULL */
    int parse_all;               /* TOK_CHAT_PARSE_ALL: reference behaviour */
    /* Limits (0 = default): output bytes (default 64 MiB), loop iterations
     * in total (default 10^6), nesting depth of expressions/blocks (default 256). */
    size_t max_output;
    size_t max_iterations;
    int max_depth;
} tok_chat_opts;

/* Renders the chat template for messages_json, a JSON array of message
 * objects ({"role": "system"|"user"|"assistant"|"tool", "content": ...,
 * "tool_calls": [...], "reasoning_content": ...}). Variables: messages,
 * add_generation_prompt, bos_token, eos_token, then extra_vars_json.
 * *out_text is malloc'ed and NUL-terminated. opts may be NULL. */
ds_status tok_render_chat(const tok_tokenizer *t, const char *messages_json,
                          const tok_chat_opts *opts, char **out_text);

/* Renders and encodes with the safety rule above (opts->parse_all restores
 * encode(render(...), TOK_PARSE_SPECIAL)). Returns ids (malloc'ed) and, if
 * out_text is not NULL, the rendered text. */
ds_status tok_encode_chat(const tok_tokenizer *t, const char *messages_json,
                          const tok_chat_opts *opts, int32_t **ids, size_t *n,
                          char **out_text);

#endif
