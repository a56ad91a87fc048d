/* golden_run.c - the golden-logit tests' shared runs and comparisons (golden_run.h). */
#include "model/golden_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "model/pick_check.h"
#include "test.h"

int golden_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

double golden_cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

double golden_mean_cosine(const float *got, const float *ref, int rows, int V)
{
    double s = 0;
    for (int r = 0; r < rows; r++) s += golden_cosine(got + (size_t)r * V, ref + (size_t)r * V, V);
    return s / rows;
}

float *golden_run(ds_model *m, const int32_t *tok, int n, bool stepwise, void (*after)(void))
{
    int V = m->cfg.vocab_size;
    float *out = malloc(sizeof(float) * (size_t)n * V);
    ds_kvcache *kv = NULL;
    CHECK_OK(kvcache_new(&kv, m, 1, n));
    int *seq = calloc((size_t)n, sizeof(int)), *pos = malloc(sizeof(int) * (size_t)n);
    bool *want = malloc((size_t)n);
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        want[i] = true;
    }
    if (kv && stepwise) {
        for (int i = 0; i < n; i++) CHECK_OK(model_forward(m, kv, 1, tok + i, seq, pos + i, want, out + (size_t)i * V));
    } else if (kv) {
        CHECK_OK(model_forward(m, kv, n, tok, seq, pos, want, out));
    }
    if (after) after();
    kvcache_free(kv);
    free(seq);
    free(pos);
    free(want);
    return out;
}

void golden_sequences(ds_model *m, st_file *ref, json_t *seqs, const golden_mode *md, golden_compare_fn *cmp,
                      bool pick, bool pick_exact, void (*after)(void))
{
    static const char *const names[] = {"s8", "s40", "s200"};
    for (int si = 0; si < 3; si++) {
        json_t *arr = json_object_get(seqs, names[si]);
        int n = (int)json_array_size(arr), V = m->cfg.vocab_size;
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
        for (int i = 0; i < n; i++) tok[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
        char key[96], label[96];
        snprintf(key, sizeof key, "%s/%s/stepwise", md->row, names[si]);
        const st_tensor *t = st_find(ref, key);
        CHECK_MSG(t && t->shape[0] == n, "%s missing", key);
        snprintf(key, sizeof key, "%s/%s/prefill_last", md->row, names[si]);
        const st_tensor *pl = st_find(ref, key);
        if (!t || !pl) {
            free(tok);
            continue;
        }
        float *pre = golden_run(m, tok, n, false, after), *step = golden_run(m, tok, n, true, after);
        if (pick && si == 1) check_forward_pick(m, tok, n, pick_exact);
        if (!md->fp8) {
            snprintf(label, sizeof label, "%s/%s prefill", md->label, names[si]);
            cmp(label, pre, t->data, n, V);
            snprintf(label, sizeof label, "%s/%s stepwise", md->label, names[si]);
            cmp(label, step, t->data, n, V);
            snprintf(label, sizeof label, "%s/%s prefill_last", md->label, names[si]);
            cmp(label, pre + (size_t)(n - 1) * V, pl->data, 1, V);
        } else {
            double cp = golden_mean_cosine(pre, t->data, n, V), cs = golden_mean_cosine(step, t->data, n, V);
            printf("%-14s %-5s mean cosine: prefill %.4f stepwise %.4f\n", md->row, names[si], cp, cs);
            CHECK_MSG(cp >= 0.9 && cs >= 0.9, "%s/%s: mean cosine %.4f / %.4f below 0.9", md->row, names[si], cp, cs);
        }
        free(pre);
        free(step);
        free(tok);
    }
}
