/* test_spec.c - ds_generate's greedy speculative decoding with the MTP module
 * (spec_draft 1 to 3) on models/dsv3-mini: for prompts of several lengths
 * (prefixes of the reference sequences of ref_logits.safetensors), the
 * completion with and without speculation is token for token the same on the
 * float32 path (bf16 GEMM), one sequence and two at once, up to max_new_tokens
 * and up to the context end, and the slots hold what plain decoding leaves in
 * them; every accept length 0..N occurs (each one a different rollback of the
 * main and MTP caches); the acceptance rate is printed. The FP8 GEMM path is run and
 * printed, not checked: its activation quantisation turns the rounding
 * differences between passes of different shapes (which plain greedy decoding
 * also sees when a prompt's prefix is reused) into different tokens now and
 * then. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsv3.h"
#include "io/safetensors.h"
#include "test.h"

#ifndef DSV3_TRAINED_DIR
#define DSV3_TRAINED_DIR "models/dsv3-mini"
#endif

/* Generates for prompts with and without speculation; checks they agree
 * (strict) or prints where they first differ. */
static long accept_len[DS_SPEC_MAX_DRAFT + 1]; /* steps by drafts accepted, over a draft length's runs */

static void compare(ds_engine *e, const char *label, int n, const int32_t *const *prompts, const int *lens, int max_new,
                    int draft, bool strict)
{
    ds_generate_params gp = ds_generate_default_params();
    gp.max_new_tokens = max_new;
    gp.eos = -1;
    ds_completion plain[2], spec[2];
    CHECK_OK(ds_generate(e, n, NULL, prompts, lens, NULL, &gp, plain));
    ds_engine_stats a, b;
    ds_engine_get_stats(e, &a);
    gp.spec_draft = draft;
    CHECK_OK(ds_generate(e, n, NULL, prompts, lens, NULL, &gp, spec));
    ds_engine_get_stats(e, &b);
    long drafted = b.spec_drafted - a.spec_drafted, accepted = b.spec_accepted - a.spec_accepted;
    long steps = b.spec_steps - a.spec_steps;
    for (int k = 0; k <= DS_SPEC_MAX_DRAFT; k++) accept_len[k] += b.spec_accept_len[k] - a.spec_accept_len[k];
    /* the decode loop's time holds its MTP passes' and its checking passes' */
    double dd = b.spec_draft_seconds - a.spec_draft_seconds, dc = b.spec_check_seconds - a.spec_check_seconds;
    CHECK_MSG(dc > 0 && dd >= 0 && (dd > 0) == (drafted > 0) && dd + dc <= b.decode_seconds - a.decode_seconds,
              "%s: %.6f s in MTP passes and %.6f s checking of a decode loop of %.6f s", label, dd, dc,
              b.decode_seconds - a.decode_seconds);
    int first = -1; /* the first index where the completions differ */
    for (int i = 0; i < n; i++) {
        int same = plain[i].n_tokens == spec[i].n_tokens && plain[i].finish == spec[i].finish, j = 0;
        for (; j < plain[i].n_tokens && j < spec[i].n_tokens; j++)
            if (plain[i].tokens[j] != spec[i].tokens[j]) {
                same = 0;
                break;
            }
        if (!same && (first < 0 || j < first)) first = j;
        if (strict) CHECK_MSG(same, "%s: sequence %d: %d tokens (finish %d) with speculation, %d (finish %d) without", label, i,
                  spec[i].n_tokens, spec[i].finish, plain[i].n_tokens, plain[i].finish);
        int k = ds_seq_len(e, i);
        CHECK_MSG(k == lens[i] + spec[i].n_tokens - (spec[i].finish != DS_FINISH_EOS),
                  "%s: slot %d holds %d tokens", label, i, k);
        ds_free(plain[i].tokens);
        ds_free(spec[i].tokens);
    }
    printf("%-38s %d seq  tokens %3d  drafts %3ld accepted %3ld (%.1f%%)  tokens/step %.2f  %s", label, n,
           spec[0].n_tokens, drafted, accepted, drafted ? 100.0 * accepted / drafted : 0.0,
           steps ? (double)(steps + accepted) / steps : 0.0, first < 0 ? "identical" : "differ from token ");
    if (first >= 0) printf("%d", first);
    printf("\n");
}

int main(void)
{
    const char *dir = DSV3_TRAINED_DIR;
    char path[4096];
    st_file *ref = NULL;
    snprintf(path, sizeof path, "%s/ref/ref_logits.safetensors", dir);
    CHECK_OK(st_open(&ref, path));
    if (t_failures) return t_done("train_spec");
    static const char *const seqs[] = {"s24", "s64", "chat160"};
    const int32_t *toks[3];
    int ns[3];
    for (int i = 0; i < 3; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s/tokens", seqs[i]);
        const st_tensor *t = st_find(ref, key);
        CHECK(t && t->dtype == ST_I32);
        if (!t) return t_done("train_spec");
        toks[i] = t->data;
        ns[i] = (int)t->numel;
    }
    ds_engine_params p = ds_engine_default_params();
    p.device = "cpu";
    p.no_tokenizer = true;
    p.n_threads = 1; /* passes of a few tokens: a second thread only waits */
    p.n_seq = 2;
    p.n_ctx = 128;
    ds_engine *e = NULL;
    /* without the module: refused */
    CHECK_OK(ds_engine_load(dir, &p, &e));
    if (e) {
        ds_generate_params gp = ds_generate_default_params();
        gp.spec_draft = 1;
        int len = 4;
        ds_completion c;
        CHECK(ds_generate(e, 1, NULL, &toks[0], &len, NULL, &gp, &c) == DS_ERR_ARG);
        ds_engine_free(e);
    }
    p.mtp = true;
    for (int mm = 0; mm < 2; mm++) {
        p.matmul = mm ? DS_MATMUL_FP8 : DS_MATMUL_BF16;
        e = NULL;
        CHECK_OK(ds_engine_load(dir, &p, &e));
        if (!e) break;
        const char *path_name = mm ? "fp8" : "bf16";
        char label[96];
        for (int draft = 1; draft <= (mm ? 1 : 3); draft++) {
            static const int cut[] = {1, 5, 12, 24, 40, 56};
            memset(accept_len, 0, sizeof accept_len);
            for (int si = 0; si < 3; si++)
                for (size_t ci = 0; ci < sizeof cut / sizeof *cut; ci++) {
                    if (cut[ci] > ns[si] || (draft > 1 && ci % 2)) continue;
                    int len = cut[ci];
                    snprintf(label, sizeof label, "%s draft %d %s[:%d]", path_name, draft, seqs[si], len);
                    compare(e, label, 1, &toks[si], &len, 48, draft, !mm);
                }
            /* two at once; and to the context end (128 positions) */
            const int32_t *two[2] = {toks[1], toks[2]};
            int lens[2] = {30, 17};
            snprintf(label, sizeof label, "%s draft %d s64[:30] + chat160[:17]", path_name, draft);
            compare(e, label, 2, two, lens, 40, draft, !mm);
            int len = 50;
            snprintf(label, sizeof label, "%s draft %d s64[:50] to the context end", path_name, draft);
            compare(e, label, 1, &toks[1], &len, -1, draft, !mm);
            printf("%s draft %d: steps by drafts accepted:", path_name, draft);
            for (int k = 0; k <= draft; k++) printf(" %d: %ld", k, accept_len[k]);
            printf("\n");
            for (int k = 0; !mm && k <= draft; k++)
                CHECK_MSG(accept_len[k] > 0, "draft %d: no step accepted %d drafts", draft, k);
        }
        ds_engine_free(e);
    }
    st_close(ref);
    return t_done("train_spec");
}
