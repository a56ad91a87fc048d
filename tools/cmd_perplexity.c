/* cmd_perplexity.c - `dsv3 perplexity`: the model's perplexity on a text file,
 * as llama-perplexity measures it.
 *
 * The text is tokenized after a BOS. Windows of --ctx-size tokens start every
 * --stride tokens, each in a fresh context; a window scores the next-token
 * losses of the targets no earlier window scored, so with the stride equal to
 * the context every token but the first is scored once, and a smaller stride
 * gives each scored token more context. --score-second-half is
 * llama-perplexity's own definition instead: disjoint chunks whose first token
 * is replaced by BOS, only the losses of the second half of each scored.
 *
 * Perplexity = exp(mean loss); the error is perplexity x the standard error of
 * the mean loss (llama-perplexity's estimate). Losses are log-softmax in
 * double precision.
 *
 * --mtp also scores DeepSeek-V3's multi-token-prediction module: at every
 * scored position p of a window whose token p + 2 exists, given t[p + 1], its
 * prediction of t[p + 2] (loss and argmax accuracy), the window's positions
 * evaluated in one ds_decode_mtp after its main pass. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "base/file.h"
#include "cmds.h"
#include "dsv3.h"

#define USAGE "--ckpt-path DIR --file TEXT [--config FILE] [--ctx-size N] [--stride S] [--batch B] [flags]"

typedef struct {
    double sum, sum2; /* of the losses */
    long n, hits;     /* hits: argmax == target */
} loss_acc;

static double acc_ppl(const loss_acc *a) { return a->n ? exp(a->sum / a->n) : NAN; }

/* llama-perplexity's uncertainty: ppl x sqrt(var / (n - 1)). */
static double acc_err(const loss_acc *a)
{
    if (a->n < 2) return 0;
    double mean = a->sum / a->n, var = a->sum2 / a->n - mean * mean;
    return acc_ppl(a) * sqrt(var > 0 ? var / (a->n - 1) : 0);
}

/* -log softmax(row)[target] */
static double token_loss(const float *row, int V, int32_t target)
{
    double mx = row[0];
    for (int i = 1; i < V; i++) mx = row[i] > mx ? row[i] : mx;
    /* (a target at the maximum is a hit: acc_add counts it) */
    double s = 0;
    for (int i = 0; i < V; i++) s += exp(row[i] - mx);
    return mx + log(s) - row[target];
}

static void acc_add(loss_acc *a, const float *row, int V, int32_t target)
{
    double l = token_loss(row, V, target);
    a->sum += l;
    a->sum2 += l * l;
    a->n++;
    a->hits += ds_argmax(row, V) == target;
}

/* One window: the tokens ids[0..len) in a fresh slot; the losses of the
 * predictions at positions [first, last] (targets ids[p + 1], which may lie
 * one past the window) are added to acc. */
typedef struct {
    int start, len, first, last;
} window;

/* The windows over T ids (see the file comment). */
static int plan_windows(int T, int ctx, int stride, bool halves, window **out)
{
    int cap = T / (halves ? ctx : stride) + 2, n = 0;
    window *w = malloc(sizeof *w * (size_t)cap);
    if (!w) return -1;
    if (halves) {
        for (int c = 0; (c + 1) * ctx <= T; c++) w[n++] = (window){c * ctx, ctx, ctx / 2, ctx - 2};
    } else {
        int scored = 0; /* targets 1..scored are done */
        for (int s = 0; scored < T - 1 && n < cap; s += stride) {
            int len = T - s < ctx ? T - s : ctx, last = s + len - 1 < T - 1 ? len - 1 : len - 2;
            w[n++] = (window){s, len, scored - s > 0 ? scored - s : 0, last};
            scored = s + last + 1;
        }
    }
    *out = w;
    return n;
}

int cmd_perplexity(int argc, char **argv)
{
    const char *ckpt = NULL, *config = NULL, *file = NULL, *tokdir = NULL, *attn = "absorb", *gemm = "bf16";
    const char *device = "auto";
    int ctx = 512, stride = -1, batch = 1, threads = 0; /* stride -1: --ctx-size */
    bool halves = false, json = false, ref = false, mtp = false, check = false;
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &ckpt, true, "DIR   checkpoint (converted, or Hugging Face layout)"},
        {"--file", ARG_STR, &file, true, "FILE  UTF-8 text to score"},
        {"--config", ARG_STR, &config, false, "FILE  model config (default: DIR/config.json)"},
        {"--tokenizer", ARG_STR, &tokdir, false, "DIR   tokenizer files (default: --ckpt-path)"},
        {"--ctx-size", ARG_INT, &ctx, false, "N     tokens per window (512)"},
        {"--stride", ARG_INT, &stride, false, "S     tokens between window starts (default: --ctx-size)"},
        {"--score-second-half", ARG_BOOL, &halves, false, "      llama-perplexity's chunks: BOS first, second half scored"},
        {"--batch", ARG_INT, &batch, false, "B     windows evaluated in one forward pass (1)"},
        {"--mtp", ARG_BOOL, &mtp, false, "      also score the MTP module's next-next-token predictions"},
        {"--json", ARG_BOOL, &json, false, "      print the result as one JSON object"},
        {"--threads", ARG_INT, &threads, false, "N     CPU threads (OpenMP's default)"},
        {"--attn-impl", ARG_STR, &attn, false, "absorb|naive"},
        {"--gemm-impl", ARG_STR, &gemm, false, "bf16|fp8"},
        {"--device", ARG_STR, &device, false, "cpu|cuda|auto (auto: CUDA when built in and a GPU is present)"},
        {"--ref-kernels", ARG_BOOL, &ref, false, "      use the scalar reference kernels (CPU)"},
        {"--check-numerics", ARG_BOOL, &check, false, "      name the first layer whose output is NaN or inf (slow)"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs, USAGE);
    if (rc) return rc == 1 ? 0 : rc;
    if (stride == -1) stride = ctx;
    const char *bad = ctx < 4 ? "--ctx-size must be >= 4"
                      : stride < 1 || stride > ctx ? "--stride must be in [1, --ctx-size]"
                      : batch < 1 || batch > 64 ? "--batch must be in [1, 64]"
                      : threads < 0 || threads > 1024 ? "--threads must be in [1, 1024]"
                      : strcmp(attn, "absorb") && strcmp(attn, "naive") ? "--attn-impl must be absorb or naive"
                      : strcmp(gemm, "bf16") && strcmp(gemm, "fp8") ? "--gemm-impl must be bf16 or fp8"
                                                                    : NULL;
    if (bad) {
        fprintf(stderr, "dsv3 perplexity: %s\n", bad);
        return 2;
    }
    ds_dist *dist = NULL;
    ds_engine *e = NULL;
    char *text = NULL;
    size_t text_len = 0, n_ids = 0;
    int32_t *ids = NULL, *all = NULL, *tok = NULL;
    int *seq = NULL, *mtp_idx = NULL;
    int32_t *mtp_next = NULL;
    bool *want = NULL;
    window *w = NULL;
    loss_acc acc = {0}, macc = {0};
    rc = 1;
    if (ds_dist_init(&argc, &argv, &dist)) goto fail;
    int rank = ds_dist_rank(dist);
    ds_engine_params p = ds_engine_default_params();
    p.config_path = config;
    p.tokenizer_dir = tokdir;
    p.device = device;
    p.ref_kernels = ref;
    p.check_numerics = check;
    p.n_threads = threads;
    p.n_ctx = ctx;
    p.n_seq = batch;
    p.attention = strcmp(attn, "naive") ? DS_ATTENTION_ABSORB : DS_ATTENTION_NAIVE;
    p.matmul = strcmp(gemm, "fp8") ? DS_MATMUL_BF16 : DS_MATMUL_FP8;
    p.dist = dist;
    p.mtp = mtp;
    if (file_read(file, FILE_MAX_TEXT, "text file", &text, &text_len) || ds_engine_load(ckpt, &p, &e)) goto fail;
    const ds_tokenizer *tk = ds_engine_tokenizer(e);
    int32_t bos = ds_engine_bos(e);
    if (bos < 0) {
        ds_errorf(DS_ERR_FORMAT, "the tokenizer names no BOS token (tokenizer_config.json bos_token)");
        goto fail;
    }
    if (ds_tokenize(tk, text, text_len, 0, &ids, &n_ids)) goto fail;
    if (n_ids + 1 > (size_t)1 << 30) {
        ds_errorf(DS_ERR_RANGE, "%s: %zu tokens; at most 2^30 are scored at once", file, n_ids);
        goto fail;
    }
    int T = (int)n_ids + 1, V = ds_engine_n_vocab(e);
    if (!(all = malloc(sizeof(int32_t) * (size_t)T))) {
        ds_errorf(DS_ERR_NOMEM, "out of memory for %d tokens", T);
        goto fail;
    }
    all[0] = bos;
    memcpy(all + 1, ids, sizeof(int32_t) * n_ids);
    if (T < (halves ? ctx : 2)) {
        ds_errorf(DS_ERR_ARG, "%s: %d tokens with BOS, fewer than %s", file, T,
                  halves ? "one chunk of --ctx-size" : "two");
        goto fail;
    }
    int n_win = plan_windows(T, ctx, stride, halves, &w);
    tok = malloc(sizeof(int32_t) * (size_t)batch * ctx);
    seq = malloc(sizeof(int) * (size_t)batch * ctx);
    want = malloc((size_t)batch * ctx);
    mtp_idx = malloc(sizeof(int) * (size_t)batch * ctx);
    mtp_next = malloc(sizeof(int32_t) * (size_t)batch * ctx);
    if (n_win < 0 || !tok || !seq || !want || !mtp_idx || !mtp_next) {
        ds_errorf(DS_ERR_NOMEM, "out of memory for %d windows of %d tokens", batch, ctx);
        goto fail;
    }
    for (int w0 = 0; w0 < n_win; w0 += batch) {
        int nb = n_win - w0 < batch ? n_win - w0 : batch, n = 0;
        for (int k = 0; k < nb; k++) {
            const window *x = &w[w0 + k];
            if (ds_seq_truncate(e, k, 0)) goto fail;
            for (int j = 0; j < x->len; j++, n++) {
                tok[n] = halves && j == 0 ? bos : all[x->start + j];
                seq[n] = k;
                want[n] = j >= x->first && j <= x->last;
            }
        }
        ds_batch b = {.n_tokens = n, .token = tok, .seq = seq, .logits = want};
        if (ds_decode(e, &b)) goto fail;
        for (int k = 0, r = 0; k < nb; k++) {
            const window *x = &w[w0 + k];
            for (int j = x->first; j <= x->last; j++, r++) acc_add(&acc, ds_logits(e, r), V, all[x->start + j + 1]);
        }
        if (mtp) {
            /* every position p < len - 1 of each window (the module's KV cache needs them all),
             * given t[p + 1]; the scored ones are those whose main prediction was scored */
            int nm = 0;
            for (int k = 0, off = 0; k < nb; off += w[w0 + k].len, k++)
                for (int j = 0; j + 1 < w[w0 + k].len; j++, nm++) {
                    mtp_idx[nm] = off + j;
                    mtp_next[nm] = all[w[w0 + k].start + j + 1];
                }
            if (nm && ds_decode_mtp(e, &(ds_mtp_batch){nm, mtp_idx, mtp_next})) goto fail;
            for (int k = 0, r = 0; k < nb; k++) {
                const window *x = &w[w0 + k];
                for (int j = 0; j + 1 < x->len; j++, r++)
                    if (j >= x->first && j <= x->last && x->start + j + 2 < T)
                        acc_add(&macc, ds_mtp_logits(e, r), V, all[x->start + j + 2]);
            }
        }
        if (rank == 0 && !json)
            fprintf(stderr, "[%d/%d] %.4f\n", w0 + nb, n_win, acc_ppl(&acc));
    }
    if (ds_engine_check(e)) goto fail;
    if (rank == 0) {
        if (json) {
            printf("{\"perplexity\": %.6f, \"error\": %.6f, \"mean_nll\": %.8f, \"tokens_scored\": %ld, "
                   "\"accuracy\": %.6f, \"windows\": %d, \"ctx_size\": %d, \"stride\": %d, \"score_second_half\": %s",
                   acc_ppl(&acc), acc_err(&acc), acc.sum / acc.n, acc.n, (double)acc.hits / acc.n, n_win, ctx,
                   halves ? ctx : stride, halves ? "true" : "false");
            if (mtp && macc.n)
                printf(", \"mtp\": {\"perplexity\": %.6f, \"error\": %.6f, \"mean_nll\": %.8f, \"tokens_scored\": %ld, "
                       "\"accuracy\": %.6f}",
                       acc_ppl(&macc), acc_err(&macc), macc.sum / macc.n, macc.n, (double)macc.hits / macc.n);
            printf("}\n");
        } else {
            printf("perplexity: %.4f +/- %.4f (mean nll %.6f over %ld tokens, %d windows of %d; next-token accuracy %.4f)\n",
                   acc_ppl(&acc), acc_err(&acc), acc.sum / acc.n, acc.n, n_win, ctx, (double)acc.hits / acc.n);
            if (mtp && macc.n)
                printf("mtp perplexity: %.4f +/- %.4f (mean nll %.6f over %ld tokens; next-next-token accuracy %.4f)\n",
                       acc_ppl(&macc), acc_err(&macc), macc.sum / macc.n, macc.n, (double)macc.hits / macc.n);
        }
    }
    rc = 0;
    goto done;
fail:
    rc = args_fail_dist(dist, "perplexity");
done:
    ds_engine_free(e);
    ds_dist_finish(dist);
    ds_free(ids);
    free(text);
    free(all);
    free(tok);
    free(seq);
    free(want);
    free(mtp_idx);
    free(mtp_next);
    free(w);
    return rc;
}
