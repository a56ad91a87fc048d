/* sched.c - the scheduler: the one thread that uses the engine.
 *
 * Continuous batching: every step is one ds_decode over a batch made of one
 * token for each running choice plus, within a token budget
 * (--prefill-chunk), the next chunk of the prompts being prefilled, so that a
 * long prompt never stalls the running streams. Requests join at any step
 * boundary when slots are free and leave when they finish or their client
 * goes away (the HTTP thread sets job.cancelled; the next step boundary frees
 * the slots).
 *
 * Prefix cache: a slot keeps its tokens' KV after its request ends. A new
 * request's first choice takes the slot (free or running) whose tokens share
 * the longest prefix with its prompt: a free one is truncated to that prefix,
 * a running one's prefix is forked into a free slot; the rest of the prompt is
 * computed. Other choices are forked from the first once its prompt is in.
 * Free slots are reused least recently used first. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "server.h"

/* Per-slot state, the scheduler's alone. */
typedef struct {
    bool busy;
    long used; /* LRU stamp */
} slot_info;

typedef struct {
    srv *s;
    ds_engine *e;
    int n_slots, n_vocab;
    slot_info *slots;
    long clock;
    job **active;
    void **wake; /* connections to resume after this step's lock */
    int n_active;
    /* the batch */
    int32_t *tok;
    int *seq;
    bool *want;
    job **row_job;   /* per wanted row: its job and choice (-1: a prefill's last token) */
    int *row_choice;
    ds_token_sampler **pick_smp;
    int32_t *next;
    int *row_idx;    /* per wanted row: its index in the batch */
    float *scratch;
    /* speculative decoding (--spec N): the MTP passes' rows (the last main
     * pass's batch index, or the last MTP pass's row, and the next token), the
     * choice each row drafts for (NULL: a row written for later drafts), and
     * the prefill rows of a pass whose next tokens the prompt gives */
    int N;
    int *m_idx, *m_from, *pf_idx;
    int32_t *m_tok, *pf_tok;
    choice **m_ch, **m_chain;
    int n_pf;
    double engine_s; /* time in the engine, this loop */
    sbuf text, content, reasoning; /* a token's pieces */
    /* metrics gathered over a step, added to s->m under s->mu at its end */
    struct {
        long ttft_bucket[12], ttft_count;
        double ttft_sum;
        long spec_drafted, spec_accepted;
    } m;
} sched;

static const char *k_markers[] = {"<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                                  "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"};

static void bucket(long *b, double v)
{
    static const double le[11] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    int i = 0;
    while (i < 11 && v > le[i]) i++;
    b[i]++;
}

static int busy_slots(const sched *c)
{
    int n = 0;
    for (int i = 0; i < c->n_slots; i++) n += c->slots[i].busy;
    return n;
}

/* The least recently used free slot, other than avoid. */
static int lru_slot(const sched *c, int avoid)
{
    int best = -1;
    for (int i = 0; i < c->n_slots; i++)
        if (!c->slots[i].busy && i != avoid && (best < 0 || c->slots[i].used < c->slots[best].used)) best = i;
    return best;
}

static void take_slot(sched *c, int i)
{
    c->slots[i].busy = true;
    c->slots[i].used = ++c->clock;
}

static void release_slot(sched *c, int i)
{
    c->slots[i].busy = false;
    c->slots[i].used = ++c->clock;
}

/* A salt for choice ci's tool-call ids: the job's id hashed (FNV-1a). */
static uint64_t call_salt(const job *j, int ci)
{
    uint64_t h = 14695981039346656037ull;
    for (const char *p = j->id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h + (uint64_t)ci * 64;
}

/* What a choice produced this step: a streamed job's SSE events go to
 * j->stage (published under s->mu at the end of the step), a whole reply's
 * text to the choice. */
static void emit(job *j, int ci, const sbuf *content, const sbuf *reasoning, json_t *tool_calls, const char *finish,
                 json_t *lp)
{
    choice *ch = &j->ch[ci];
    if (!j->req.stream) {
        sb_add(&ch->content, content->p ? content->p : "", content->n);
        sb_add(&ch->reasoning, reasoning->p ? reasoning->p : "", reasoning->n);
        json_decref(tool_calls);
        json_decref(lp);
        return;
    }
    if (!content->n && !reasoning->n && !tool_calls && !finish && !lp) return;
    if (!tool_calls && !finish && !lp) { /* the per-token path: text only */
        reply_chunk_sse(&j->stage, j, ci, content, reasoning);
        return;
    }
    json_t *o = reply_chunk(j, ci, NULL, content, reasoning, tool_calls, finish, lp);
    if (o) sse_append(&j->stage, o);
}

/* Hands j's staged events to its connection (the caller holds s->mu);
 * whether there were any (its connection is then to be woken). */
static bool publish_locked(job *j)
{
    if (!j->stage.n) return false;
    sb_add(&j->out, j->stage.p, j->stage.n);
    sb_clear(&j->stage);
    j->last_out = ds_now();
    return true;
}

/* Ends choice ci: flushes the held text, frees its decoding state, releases its slot. */
static void finish_choice(sched *c, job *j, int ci, const char *why)
{
    choice *ch = &j->ch[ci];
    sbuf text = {0}, content = {0}, reasoning = {0};
    const char *tail;
    size_t tl;
    bool stopped = !strcmp(why, "stop_string");
    if (!stopped && ch->ts && ds_text_stream_finish(ch->ts, &tail, &tl) == DS_OK && tl)
        stopped = stop_push(&ch->stop, tail, tl, &text);
    if (!stopped) stop_flush(&ch->stop, &text);
    if (stopped) why = "stop";
    outp_push(&ch->parser, text.p ? text.p : "", text.n, &content, &reasoning);
    outp_finish(&ch->parser, &content, &reasoning);
    json_t *calls = NULL;
    bool any_calls = false;
    if (j->req.kind == REQ_CHAT && j->req.stream) {
        calls = outp_call_deltas(&ch->parser, true, call_salt(j, ci));
        any_calls = ch->parser.calls_sent > 0;
    } else if (j->req.kind == REQ_CHAT) {
        ch->tool_calls = outp_tool_calls(&ch->parser, call_salt(j, ci)); /* for reply_final */
        any_calls = ch->tool_calls != NULL;
    }
    if (any_calls && !strcmp(why, "stop")) why = "tool_calls";
    ch->finish = why;
    emit(j, ci, &content, &reasoning, calls, why, NULL);
    sb_free(&text);
    sb_free(&content);
    sb_free(&reasoning);
    ds_sampler_free(ch->smp);
    ds_text_stream_free(ch->ts);
    ch->smp = NULL;
    ch->ts = NULL;
    if (ch->slot >= 0) release_slot(c, ch->slot);
    ch->slot = -1;
}

/* Ends a job whose choices are all finished (or that failed with err): its
 * last events or its whole body, then the scheduler's reference. */
static void finish_job(sched *c, job *j, const srv_error *err)
{
    srv *s = c->s;
    srv_error gone;
    if (!err && !j->ch) { /* never admitted: there is no reply to build */
        srv_err(&gone, 503, "server_error", "cancelled", NULL, "the request was cancelled");
        err = &gone;
    }
    for (int i = 0; i < j->req.n; i++)
        if (j->ch && j->ch[i].slot >= 0) {
            release_slot(c, j->ch[i].slot);
            j->ch[i].slot = -1;
        }
    pthread_mutex_lock(&s->mu);
    j->state = JOB_DONE;
    if (j->stage.n) sb_add(&j->out, j->stage.p, j->stage.n);
    sb_clear(&j->stage);
    if (err) {
        json_t *e = reply_error(err);
        if (j->req.stream) {
            job_sse_locked(j, e);
        } else {
            char *d = json_dumps(e, JSON_COMPACT);
            sb_clear(&j->out);
            if (d) sb_adds(&j->out, d);
            free(d);
            json_decref(e);
            j->status = err->status;
        }
    } else if (j->req.stream) {
        if (j->req.include_usage) {
            json_t *u = reply_chunk(j, -1, NULL, NULL, NULL, NULL, NULL, NULL);
            if (u) job_sse_locked(j, u);
        }
    } else {
        json_t *r = reply_final(j);
        char *d = r ? json_dumps(r, JSON_COMPACT) : NULL;
        sb_clear(&j->out);
        if (d) sb_adds(&j->out, d);
        free(d);
        json_decref(r);
        j->status = d ? 200 : 500;
    }
    if (j->req.stream) sb_adds(&j->out, "data: [DONE]\n\n");
    s->m.prompt_tokens += j->n_prompt;
    s->m.completion_tokens += j->completion_tokens;
    s->m.cache_hit_tokens += j->cached;
    j->finished = true;
    void *conn = job_unsuspend_locked(j);
    job_unref_locked(j); /* the connection's reference stays until it completes */
    pthread_mutex_unlock(&s->mu);
    if (conn) srv_resume(conn);
}

static void drop_active(sched *c, int k)
{
    c->active[k] = c->active[--c->n_active];
}

/* Whether the token is a special token other than a marker the parser reads. */
static bool hidden_special(const ds_tokenizer *t, int32_t id)
{
    if (!ds_token_is_special(t, id)) return false;
    const char *p = ds_token_piece(t, id);
    for (size_t i = 0; p && i < sizeof k_markers / sizeof *k_markers; i++)
        if (!strcmp(p, k_markers[i])) return false;
    return true;
}

/* A sampled token for choice ci: text through the stop matcher and the parser;
 * finishes the choice on eos, a stop string, max_tokens or the context end. */
static void on_token(sched *c, job *j, int ci, int32_t t, json_t *lp)
{
    srv *s = c->s;
    choice *ch = &j->ch[ci];
    if (!j->t_first) {
        j->t_first = ds_now();
        double d = j->t_first - j->t_start;
        c->m.ttft_sum += d;
        c->m.ttft_count++;
        bucket(c->m.ttft_bucket, d);
    }
    if (t == ds_engine_eos(c->e) && !j->req.ignore_eos) {
        json_decref(lp);
        finish_choice(c, j, ci, "stop");
        return;
    }
    ch->n_gen++;
    j->completion_tokens++;
    sbuf *text = &c->text, *content = &c->content, *reasoning = &c->reasoning;
    sb_clear(text);
    sb_clear(content);
    sb_clear(reasoning);
    bool stopped = false;
    const char *piece = NULL;
    size_t pl = 0;
    if (t < ds_tokenizer_n_vocab(s->tok) && !hidden_special(s->tok, t) &&
        ds_text_stream_push(ch->ts, t, &piece, &pl) == DS_OK && pl)
        stopped = stop_push(&ch->stop, piece, pl, text);
    outp_push(&ch->parser, text->p ? text->p : "", text->n, content, reasoning);
    json_t *lpo = NULL, *calls = NULL;
    if (j->req.stream && j->req.kind == REQ_CHAT && ch->parser.state == OUT_TOOLS)
        calls = outp_call_deltas(&ch->parser, false, call_salt(j, ci));
    if (lp && j->req.kind == REQ_CHAT) {
        if (j->req.stream) lpo = json_pack("{s:[o]}", "content", lp);
        else json_array_append_new(json_object_get(ch->logprobs, "content"), lp);
    } else if (lp) { /* completions: the legacy parallel arrays */
        json_t *dst = j->req.stream ? (lpo = json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs",
                                                       "top_logprobs", "text_offset"))
                                    : ch->logprobs;
        json_t *top = json_object();
        size_t i;
        json_t *alt;
        json_array_foreach(json_object_get(lp, "top_logprobs"), i, alt)
            json_object_set(top, json_string_value(json_object_get(alt, "token")), json_object_get(alt, "logprob"));
        json_array_append(json_object_get(dst, "tokens"), json_object_get(lp, "token"));
        json_array_append(json_object_get(dst, "token_logprobs"), json_object_get(lp, "logprob"));
        json_array_append_new(json_object_get(dst, "top_logprobs"), top);
        json_array_append_new(json_object_get(dst, "text_offset"), json_integer((json_int_t)ch->content.n));
        json_decref(lp);
    }
    emit(j, ci, content, reasoning, calls, NULL, lpo);
    if (stopped) finish_choice(c, j, ci, "stop_string");
    else if (ch->n_gen >= j->max_new || ds_seq_len(c->e, ch->slot) + 1 >= ds_engine_n_ctx(c->e))
        finish_choice(c, j, ci, "length");
    else ch->pending = t;
}

static bool job_done(const job *j)
{
    for (int i = 0; i < j->req.n; i++)
        if (!j->ch[i].finish) return false;
    return true;
}

/* Per-choice decoding state (samplers seeded per choice: seed + index). */
static ds_status init_choices(sched *c, job *j)
{
    srv *s = c->s;
    if (!(j->ch = calloc((size_t)j->req.n, sizeof *j->ch))) return ds_errorf(DS_ERR_NOMEM, "out of memory");
    uint64_t seed = j->req.has_seed ? j->req.seed : call_salt(j, 0) ^ (uint64_t)time(NULL) * 2654435761u;
    for (int i = 0; i < j->req.n; i++) {
        choice *ch = &j->ch[i];
        ch->slot = -1;
        ch->pending = -1;
        ch->hl = -1;
        ch->spec = c->N > 0 && j->req.n == 1 && !(j->req.temperature > 0);
        ds_sampler_params p = ds_sampler_default_params();
        p.temperature = (float)j->req.temperature;
        p.top_p = (float)j->req.top_p;
        p.top_k = j->req.top_k;
        p.presence_penalty = (float)j->req.presence_penalty;
        p.frequency_penalty = (float)j->req.frequency_penalty;
        p.repetition_penalty = (float)j->req.repetition_penalty;
        p.seed = seed + (uint64_t)i;
        ds_status st = ds_sampler_new(&p, c->n_vocab, &ch->smp);
        if (!st) st = ds_text_stream_new(s->tok, DS_DETOKENIZE_SKIP_SPECIAL, &ch->ts);
        if (st) return st;
        stop_init(&ch->stop, j->req.stop, j->req.n_stop);
        outp_init(&ch->parser, j->in_reasoning);
        if (j->req.logprobs)
            ch->logprobs = j->req.kind == REQ_CHAT
                               ? json_pack("{s:[]}", "content")
                               : json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs",
                                           "text_offset");
    }
    return DS_OK;
}

/* Slots for a queued job and its prompt prefix from the cache. */
static ds_status admit(sched *c, job *j)
{
    ds_status st = init_choices(c, j);
    if (st) return st;
    int best = -1, k = 0;
    for (int i = 0; i < c->n_slots; i++) {
        int m = ds_seq_common_prefix(c->e, i, j->prompt, j->n_prompt);
        if (m > k) k = m, best = i;
    }
    if (k > j->n_prompt - 1) k = j->n_prompt - 1; /* the last token is computed for its logits */
    /* a free slot whose tokens all match is taken; one holding more is kept
     * (the least recently used free slot gets a copy of the prefix) */
    int s0 = lru_slot(c, -1);
    if (best >= 0 && k > 0 && !c->slots[best].busy && (ds_seq_len(c->e, best) == k || s0 == best)) {
        s0 = best;
        st = ds_seq_truncate(c->e, s0, k);
    } else {
        st = k > 0 ? ds_seq_fork(c->e, s0, best, k) : ds_seq_truncate(c->e, s0, 0);
    }
    if (st) return st;
    take_slot(c, s0);
    j->ch[0].slot = s0;
    for (int i = 1; i < j->req.n; i++) {
        int q = lru_slot(c, -1);
        take_slot(c, q);
        j->ch[i].slot = q;
    }
    j->n_fed = k;
    j->cached = k;
    int room = ds_engine_n_ctx(c->e) - j->n_prompt;
    j->max_new = j->req.max_tokens > 0 && j->req.max_tokens < room ? j->req.max_tokens : room;
    j->state = JOB_PREFILL;
    return DS_OK;
}

static void fail_job(sched *c, job *j, int status, const char *msg)
{
    srv_error err;
    srv_err(&err, status, status >= 500 ? "server_error" : "invalid_request_error", NULL, NULL, "%s", msg);
    for (int i = 0; j->ch && i < j->req.n; i++) {
        ds_sampler_free(j->ch[i].smp);
        ds_text_stream_free(j->ch[i].ts);
        j->ch[i].smp = NULL;
        j->ch[i].ts = NULL;
    }
    finish_job(c, j, &err);
}

/* Moves queued jobs into the running set while slots allow (FIFO). */
static void admit_queued(sched *c)
{
    srv *s = c->s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        job *j = s->q_head;
        if (!j || busy_slots(c) + j->req.n > s->o.parallel) {
            pthread_mutex_unlock(&s->mu);
            return;
        }
        s->q_head = j->next;
        if (!s->q_head) s->q_tail = NULL;
        s->n_queued--;
        j->next = NULL;
        bool gone = j->cancelled;
        pthread_mutex_unlock(&s->mu);
        if (gone) {
            pthread_mutex_lock(&s->mu);
            s->m.cancelled++;
            pthread_mutex_unlock(&s->mu);
            finish_job(c, j, NULL);
            continue;
        }
        ds_status st = admit(c, j);
        if (st) {
            fail_job(c, j, 500, ds_last_error());
            continue;
        }
        c->active[c->n_active++] = j;
    }
}

/* Jobs whose client went away or whose deadline passed: their slots are
 * freed now, and queued ones leave the queue. */
static void reap_cancelled(sched *c)
{
    srv *s = c->s;
    double now = ds_now();
    for (;;) {
        pthread_mutex_lock(&s->mu);
        job *gone = NULL, *prev = NULL;
        for (job *q = s->q_head; q && !gone; prev = q, q = q->next)
            if (q->cancelled || (q->deadline > 0 && now > q->deadline)) {
                gone = q;
                if (prev) prev->next = q->next;
                else s->q_head = q->next;
                if (s->q_tail == q) s->q_tail = prev;
                s->n_queued--;
                q->cancelled = true;
                s->m.cancelled++;
            }
        pthread_mutex_unlock(&s->mu);
        if (!gone) break;
        srv_error err; /* read only where the deadline passed: the client of the other is gone */
        srv_err(&err, 504, "server_error", "timeout", NULL, "the request waited past its deadline (--timeout %d s)",
                s->o.timeout_s);
        finish_job(c, gone, &err);
    }
    for (int k = 0; k < c->n_active;) {
        job *j = c->active[k];
        pthread_mutex_lock(&s->mu);
        bool gone = j->cancelled || (j->deadline > 0 && now > j->deadline);
        if (gone && !j->cancelled) j->cancelled = true;
        if (gone) s->m.cancelled++;
        pthread_mutex_unlock(&s->mu);
        if (!gone) {
            k++;
            continue;
        }
        for (int i = 0; i < j->req.n; i++)
            if (!j->ch[i].finish) finish_choice(c, j, i, "length");
        drop_active(c, k);
        finish_job(c, j, NULL);
    }
}

/* The logprob entry of token t from an untouched logits row, when wanted. */
static json_t *logprob_of(sched *c, job *j, int32_t t, const float *row)
{
    if (!j->req.logprobs) return NULL;
    return reply_logprob_entry(c->s->tok, t, row, c->n_vocab, j->req.top_logprobs);
}

/* Samples choice ci's next token from row (kept intact) with the first n_hist
 * tokens of its slot as history. Greedy without penalties the sampler would
 * take the argmax of the row as it is (drawing nothing): taken here without
 * copying the row. */
static int32_t sample_at(sched *c, job *j, int ci, const float *row, int n_hist)
{
    choice *ch = &j->ch[ci];
    const ds_sampler_params *p = ds_sampler_params_of(ch->smp);
    if (!(p->temperature > 0) && p->repetition_penalty == 1.0f && p->presence_penalty == 0 && p->frequency_penalty == 0)
        return ds_argmax(row, c->n_vocab);
    memcpy(c->scratch, row, sizeof(float) * (size_t)c->n_vocab);
    return ds_sampler_sample(ch->smp, c->scratch, ds_seq_tokens(c->e, ch->slot), n_hist);
}

static int32_t sample_row(sched *c, job *j, int ci, const float *row)
{
    return sample_at(c, j, ci, row, ds_seq_len(c->e, j->ch[ci].slot));
}

/* ---- speculative decoding (--spec N)
 * A drafting choice's slot holds positions 0..c-1 and its next token t
 * (pending) is chosen; the last main pass holds position c-1 at batch index hl,
 * and before it the accepted drafts whose MTP rows are still to be written
 * (pend). A step: one MTP pass over those rows and (hl, t), whose last row
 * drafts d1 (the argmax); passes 2..N chain on the module's own output (dj from
 * d[j-1]); the main pass feeds [t, d1..dN] at c..c+N; the drafts are kept while
 * each is the main model's pick after the ones before (sample_at, with the
 * choice's penalties), then the main model's next pick; the slot is cut back
 * past the accepted ones. Every kept token is the main model's greedy pick
 * after the same prefix, so the output is plain decoding's; a draft only
 * decides how many tokens a step yields. The MTP rows of prompt positions are
 * written after each pass that computes them, so that a prefix taken from the
 * cache has them. Sampled and n > 1 requests decode a token a step. */

/* The MTP passes of a step: every drafting choice's drafts (ch->nd, ch->d).
 * On an error the step drafts nothing (the output does not depend on drafts). */
static void spec_draft(sched *c)
{
    ds_engine *e = c->e;
    int N = c->N, m = 0, n_ctx = ds_engine_n_ctx(e);
    for (int k = 0; k < c->n_active; k++) {
        job *j = c->active[k];
        if (j->state != JOB_DECODE) continue;
        for (int i = 0; i < j->req.n; i++) {
            choice *ch = &j->ch[i];
            ch->nd = 0;
            if (ch->finish || !ch->spec || ch->hl < 0) continue;
            /* room: the slot's end stays short of the context's last position,
             * and every kept token within max_tokens */
            int nd = N, room = n_ctx - 3 - ds_seq_len(e, ch->slot), left = j->max_new - ch->n_gen - 1;
            nd = nd < room ? nd : room;
            nd = nd < left ? nd : left;
            for (int p = 0; p < ch->n_pend; p++, m++) {
                c->m_idx[m] = ch->pend_idx[p];
                c->m_tok[m] = ch->pend_tok[p];
                c->m_ch[m] = NULL;
            }
            c->m_idx[m] = ch->hl;
            c->m_tok[m] = ch->pending;
            c->m_ch[m++] = nd > 0 ? ch : NULL;
            ch->n_pend = 0;
            ch->hl = -1;
            ch->nd = nd > 0 ? nd : 0;
        }
    }
    if (!m) return;
    ds_mtp_batch b = {m, c->m_idx, c->m_tok};
    ds_status st = ds_decode_mtp(e, &b);
    int q = 0; /* drafting rows of the last MTP pass: m_from[i] for m_chain[i] */
    for (int r = 0; !st && r < m; r++)
        if (c->m_ch[r]) {
            c->m_ch[r]->d[0] = ds_argmax(ds_mtp_logits(e, r), c->n_vocab);
            c->m_from[q] = r;
            c->m_chain[q++] = c->m_ch[r];
        }
    for (int d = 2; !st && d <= N; d++) {
        int n = 0;
        for (int i = 0; i < q; i++)
            if (c->m_chain[i]->nd >= d) {
                c->m_from[n] = c->m_from[i];
                c->m_tok[n] = c->m_chain[i]->d[d - 2];
                c->m_chain[n++] = c->m_chain[i];
            }
        if (!n) break;
        if ((st = ds_decode_mtp_chain(e, n, c->m_from, c->m_tok))) break;
        for (int i = 0; i < n; i++) {
            c->m_chain[i]->d[d - 1] = ds_argmax(ds_mtp_logits(e, i), c->n_vocab);
            c->m_from[i] = i;
        }
        q = n;
    }
    if (st) {
        fprintf(stderr, "dsv3 serve: drafting skipped this step: %s\n", ds_last_error());
        for (int k = 0; k < c->n_active; k++)
            for (int i = 0; c->active[k]->state == JOB_DECODE && i < c->active[k]->req.n; i++) c->active[k]->ch[i].nd = 0;
    }
}

/* Choice ci after the main pass fed [t, d1..dnd] from wanted row r0 on: the
 * drafts the main model agrees with, then its own next token; the slot is cut
 * back past them and the tokens are emitted in order. */
static void spec_accept(sched *c, job *j, int ci, int r0)
{
    choice *ch = &j->ch[ci];
    int len = ds_seq_len(c->e, ch->slot), c0 = len - ch->nd - 1, a = 0;
    int32_t next;
    for (;; a++) {
        next = sample_at(c, j, ci, ds_logits(c->e, r0 + a), c0 + 1 + a);
        if (a == ch->nd || next != ch->d[a]) break;
    }
    c->m.spec_drafted += ch->nd;
    c->m.spec_accepted += a;
    ds_seq_truncate(c->e, ch->slot, c0 + a + 1);
    for (int i = 0; i < a; i++) {
        ch->pend_idx[i] = ch->off + i;
        ch->pend_tok[i] = ch->d[i];
    }
    ch->n_pend = a;
    ch->hl = ch->off + a;
    for (int i = 0; i < a && !ch->finish; i++)
        on_token(c, j, ci, ch->d[i], logprob_of(c, j, ch->d[i], ds_logits(c->e, r0 + i)));
    if (!ch->finish) on_token(c, j, ci, next, logprob_of(c, j, next, ds_logits(c->e, r0 + a)));
}

/* One forward pass over every running choice and a prefill chunk; returns
 * false when there was nothing to do. */
static bool step(sched *c)
{
    srv *s = c->s;
    int n = 0, rows = 0, budget = s->o.prefill_chunk;
    bool any_lp = false, any_prefill = false;
    if (c->N) spec_draft(c);
    for (int k = 0; k < c->n_active; k++) {
        job *j = c->active[k];
        if (j->state != JOB_DECODE) continue;
        for (int i = 0; i < j->req.n; i++) {
            choice *ch = &j->ch[i];
            if (ch->finish) continue;
            ch->off = n;
            for (int d = 0; d <= ch->nd; d++, n++, rows++) { /* t, then this step's drafts */
                c->tok[n] = d ? ch->d[d - 1] : ch->pending;
                c->seq[n] = ch->slot;
                c->want[n] = true;
                c->pick_smp[rows] = ch->smp;
                c->row_job[rows] = j;
                c->row_choice[rows] = d ? -2 : i; /* a draft's row: read by spec_accept */
                c->row_idx[rows] = n;
            }
            any_lp |= j->req.logprobs;
        }
    }
    int n_decode = n;
    c->n_pf = 0;
    for (int k = 0; k < c->n_active && budget > 0; k++) {
        job *j = c->active[k];
        if (j->state != JOB_PREFILL) continue;
        int m = j->n_prompt - j->n_fed < budget ? j->n_prompt - j->n_fed : budget;
        for (int i = 0; i < m; i++) {
            c->tok[n] = j->prompt[j->n_fed + i];
            c->seq[n] = j->ch[0].slot;
            c->want[n] = j->n_fed + i == j->n_prompt - 1;
            if (c->want[n]) {
                c->row_job[rows] = j;
                c->row_idx[rows] = n;
                c->row_choice[rows++] = -1;
            } else if (c->N) { /* its MTP row, once the pass has its hidden state */
                c->pf_idx[c->n_pf] = n;
                c->pf_tok[c->n_pf++] = j->prompt[j->n_fed + i + 1];
            }
            n++;
        }
        budget -= m;
        any_prefill = true;
    }
    if (n == 0) return false;
    ds_batch b = {.n_tokens = n, .token = c->tok, .seq = c->seq, .logits = c->want};
    double t0 = ds_now();
    /* speculative decoding reads every row's logits and the hidden states a
     * pick on the device does not keep */
    ds_status st = !c->N && !any_prefill && !any_lp ? ds_decode_pick(c->e, &b, c->pick_smp, c->next) : ds_decode(c->e, &b);
    if (!st && c->n_pf) { /* the prompt rows' MTP rows, before any slot is forked from them */
        ds_mtp_batch mb = {c->n_pf, c->pf_idx, c->pf_tok};
        if (ds_decode_mtp(c->e, &mb)) fprintf(stderr, "dsv3 serve: the MTP rows of a prompt: %s\n", ds_last_error());
    }
    double dt = ds_now() - t0;
    c->engine_s += dt;
    if (st) { /* the slots are as they were: every job in the batch fails */
        char msg[512];
        snprintf(msg, sizeof msg, "the engine failed: %s", ds_last_error());
        fprintf(stderr, "dsv3 serve: %s\n", msg);
        for (int k = 0; k < c->n_active;) {
            job *j = c->active[k];
            drop_active(c, k);
            fail_job(c, j, 500, msg);
        }
        return true;
    }
    /* prefill progress first: the batch order puts decodes before prefills */
    for (int k = 0; k < c->n_active; k++) {
        job *j = c->active[k];
        if (j->state != JOB_PREFILL) continue;
        j->n_fed = ds_seq_len(c->e, j->ch[0].slot);
    }
    for (int r = 0; r < rows; r++) {
        job *j = c->row_job[r];
        int ci = c->row_choice[r];
        if (ci == -2) continue; /* a draft's row */
        if (ci >= 0) {
            choice *ch = &j->ch[ci];
            if (ch->nd) {
                spec_accept(c, j, ci, r);
            } else if (!c->N && !any_prefill && !any_lp) {
                on_token(c, j, ci, c->next[r], NULL);
            } else {
                const float *row = ds_logits(c->e, r);
                int32_t t = sample_row(c, j, ci, row);
                ch->hl = c->row_idx[r];
                on_token(c, j, ci, t, logprob_of(c, j, t, row));
            }
            continue;
        }
        /* a prompt is in: fork it to the other choices, then each draws its first token */
        for (int i = 1; i < j->req.n; i++)
            if ((st = ds_seq_fork(c->e, j->ch[i].slot, j->ch[0].slot, j->n_prompt))) break;
        const float *row = ds_logits(c->e, r);
        j->state = JOB_DECODE;
        j->ch[0].hl = c->row_idx[r]; /* the others' slots are forks: they draft from their own rows */
        for (int i = 0; !st && i < j->req.n; i++) {
            int32_t t = sample_row(c, j, i, row);
            on_token(c, j, i, t, logprob_of(c, j, t, row));
        }
        if (st) j->cancelled = true, fprintf(stderr, "dsv3 serve: %s\n", ds_last_error());
    }
    /* this step's events and metrics, under one lock */
    pthread_mutex_lock(&s->mu);
    int n_wake = 0;
    for (int k = 0; k < c->n_active; k++)
        if (publish_locked(c->active[k]) && (c->wake[n_wake] = job_unsuspend_locked(c->active[k]))) n_wake++;
    s->m.batch_tokens = n;
    if (n_decode) {
        s->m.step_sum += dt;
        s->m.step_count++;
        bucket(s->m.step_bucket, dt);
    }
    for (int i = 0; i < 12; i++) s->m.ttft_bucket[i] += c->m.ttft_bucket[i];
    s->m.ttft_sum += c->m.ttft_sum;
    s->m.ttft_count += c->m.ttft_count;
    s->m.spec_drafted += c->m.spec_drafted;
    s->m.spec_accepted += c->m.spec_accepted;
    memset(&c->m, 0, sizeof c->m);
    pthread_mutex_unlock(&s->mu);
    /* resumed after the unlock, the connections do not queue on the mutex the
     * scheduler still holds */
    for (int k = 0; k < n_wake; k++) srv_resume(c->wake[k]);
    for (int k = 0; k < c->n_active;) {
        job *j = c->active[k];
        if (j->state == JOB_DECODE && job_done(j)) {
            drop_active(c, k);
            finish_job(c, j, NULL);
        } else {
            k++;
        }
    }
    return true;
}

/* The gauges, and the time of a loop that stepped (busy: all of it). */
static void update_gauges(sched *c, bool stepped, double busy)
{
    int running = 0;
    for (int k = 0; k < c->n_active; k++) running += c->active[k]->req.n;
    int kept = 0;
    for (int i = 0; i < c->n_slots; i++)
        if (!c->slots[i].busy) kept += ds_seq_len(c->e, i);
    pthread_mutex_lock(&c->s->mu);
    c->s->m.running = running;
    c->s->m.cache_tokens = kept;
    c->s->m.queue_depth = c->s->n_queued;
    if (stepped) {
        c->s->m.sched_steps++;
        c->s->m.sched_engine_s += c->engine_s;
        c->s->m.sched_other_s += busy - c->engine_s;
    }
    pthread_mutex_unlock(&c->s->mu);
}

bool sched_main(srv *s)
{
    bool ok = true;
    sched c = {.s = s, .e = s->e, .n_slots = ds_engine_n_seq(s->e), .n_vocab = ds_engine_n_vocab(s->e)};
    c.N = s->o.spec_draft;
    int cap = c.n_slots * (c.N + 1) + s->o.prefill_chunk + 1;
    c.slots = calloc((size_t)c.n_slots, sizeof *c.slots);
    c.active = calloc((size_t)c.n_slots, sizeof *c.active);
    c.wake = calloc((size_t)c.n_slots, sizeof *c.wake);
    c.tok = calloc((size_t)cap, sizeof *c.tok);
    c.seq = calloc((size_t)cap, sizeof *c.seq);
    c.want = calloc((size_t)cap, sizeof *c.want);
    c.row_job = calloc((size_t)cap, sizeof *c.row_job);
    c.row_choice = calloc((size_t)cap, sizeof *c.row_choice);
    c.pick_smp = calloc((size_t)cap, sizeof *c.pick_smp);
    c.next = calloc((size_t)cap, sizeof *c.next);
    c.row_idx = calloc((size_t)cap, sizeof *c.row_idx);
    c.m_idx = calloc((size_t)cap, sizeof *c.m_idx);
    c.m_from = calloc((size_t)cap, sizeof *c.m_from);
    c.pf_idx = calloc((size_t)cap, sizeof *c.pf_idx);
    c.m_tok = calloc((size_t)cap, sizeof *c.m_tok);
    c.pf_tok = calloc((size_t)cap, sizeof *c.pf_tok);
    c.m_ch = calloc((size_t)cap, sizeof *c.m_ch);
    c.m_chain = calloc((size_t)cap, sizeof *c.m_chain);
    c.scratch = calloc((size_t)c.n_vocab, sizeof *c.scratch);
    if (!c.slots || !c.active || !c.wake || !c.tok || !c.seq || !c.want || !c.row_job || !c.row_choice || !c.pick_smp ||
        !c.next || !c.scratch || !c.row_idx || !c.m_idx || !c.m_from || !c.pf_idx || !c.m_tok || !c.pf_tok || !c.m_ch ||
        !c.m_chain) {
        fprintf(stderr, "dsv3 serve: out of memory for the scheduler\n");
        ok = false;
    }
    while (ok) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && !s->q_head && c.n_active == 0) pthread_cond_wait(&s->wake, &s->mu);
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        double t0 = ds_now();
        c.engine_s = 0;
        reap_cancelled(&c);
        admit_queued(&c);
        bool stepped = step(&c);
        update_gauges(&c, stepped, ds_now() - t0);
    }
    for (int k = 0; k < c.n_active; k++) {
        job *j = c.active[k];
        for (int i = 0; i < j->req.n; i++)
            if (!j->ch[i].finish) finish_choice(&c, j, i, "length");
        finish_job(&c, j, NULL);
    }
    free(c.slots);
    free(c.active);
    free(c.wake);
    free(c.tok);
    free(c.seq);
    free(c.want);
    free(c.row_job);
    free(c.row_choice);
    free(c.pick_smp);
    free(c.next);
    free(c.row_idx);
    free(c.m_idx);
    free(c.m_from);
    free(c.pf_idx);
    free(c.m_tok);
    free(c.pf_tok);
    free(c.m_ch);
    free(c.m_chain);
    free(c.scratch);
    sb_free(&c.text);
    sb_free(&c.content);
    sb_free(&c.reasoning);
    return ok;
}

bool sched_submit(srv *s, job *j)
{
    pthread_mutex_lock(&s->mu);
    bool ok = s->n_queued < s->o.queue && !s->stopping;
    if (ok) {
        j->refs++;
        j->next = NULL;
        if (s->q_tail) s->q_tail->next = j;
        else s->q_head = j;
        s->q_tail = j;
        s->n_queued++;
        s->m.queue_depth = s->n_queued;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}
