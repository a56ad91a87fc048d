/* test_fp8_kernels.c - the scalar FP8 kernels against the outputs of the
 * reference's own Triton kernels (golden/fp8_kernels.safetensors). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/quant.h"
#include "base/numeric.h"
#include "io/safetensors.h"
#include "test.h"

static const st_tensor *get(st_file *f, const char *name)
{
    const st_tensor *t = st_find(f, name);
    CHECK_MSG(t != NULL, "missing %s", name);
    return t;
}

static void check_act_quant(st_file *f, const float *x, const char *fmt, bool ue8m0)
{
    char ny[64], ns[64];
    snprintf(ny, sizeof ny, "act_quant/%s/y", fmt);
    snprintf(ns, sizeof ns, "act_quant/%s/s", fmt);
    const st_tensor *ty = get(f, ny), *ts = get(f, ns);
    if (!ty || !ts) return;
    uint8_t *y = malloc(64 * 512);
    float *s = malloc(sizeof(float) * 64 * 4);
    act_quant_ref(x, 64, 512, y, s, ue8m0);
    int bad_y = 0, bad_s = 0;
    for (int i = 0; i < 64 * 512; i++) bad_y += y[i] != ((const uint8_t *)ty->data)[i];
    for (int i = 0; i < 64 * 4; i++) bad_s += memcmp(&s[i], (const float *)ts->data + i, 4) != 0;
    CHECK_MSG(bad_y == 0, "%s: %d of %d e4m3 bytes differ", fmt, bad_y, 64 * 512);
    CHECK_MSG(bad_s == 0, "%s: %d of 256 scales differ", fmt, bad_s);
    free(y);
    free(s);
}

static void check_gemm(st_file *f, const char *fmt)
{
    char n[6][64];
    const char *parts[] = {"act_quant/%s/y", "act_quant/%s/s", "fp8_gemm/%s/w", "fp8_gemm/%s/w_scale", "fp8_gemm/%s/out"};
    const st_tensor *t[5];
    for (int i = 0; i < 5; i++) {
        snprintf(n[i], sizeof n[i], parts[i], fmt);
        if (!(t[i] = get(f, n[i]))) return;
    }
    float *out = malloc(sizeof(float) * 64 * 384);
    fp8_gemm_ref(t[0]->data, t[1]->data, t[2]->data, t[3]->data, 64, 384, 512, out);
    const float *ref = t[4]->data;
    float mx = 0, err = 0;
    for (int i = 0; i < 64 * 384; i++) {
        mx = fmaxf(mx, fabsf(ref[i]));
        err = fmaxf(err, fabsf(out[i] - ref[i]));
    }
    CHECK_MSG(err <= 1e-4f * mx, "%s: fp8_gemm max error %g vs max |out| %g", fmt, err, mx);
    printf("fp8_gemm/%s: max |err| / max |ref| = %.3g\n", fmt, err / mx);
    free(out);
}

int main(void)
{
    st_file *f;
    CHECK_OK(st_open(&f, t_golden("fp8_kernels.safetensors")));
    if (t_failures) return t_done("fp8_kernels");
    const st_tensor *tx = get(f, "x");
    check_act_quant(f, tx->data, "default", false);
    check_act_quant(f, tx->data, "ue8m0", true);
    check_gemm(f, "default");
    check_gemm(f, "ue8m0");
    /* weight_dequant to BF16, bit-identical */
    const st_tensor *w = get(f, "weight_dequant/w"), *s = get(f, "weight_dequant/s"), *o = get(f, "weight_dequant/out_bf16");
    if (w && s && o) {
        float *out = malloc(sizeof(float) * 300 * 200);
        weight_dequant_ref(w->data, s->data, 300, 200, out);
        int bad = 0;
        for (int i = 0; i < 300 * 200; i++) bad += f32_to_bf16(out[i]) != ((const uint16_t *)o->data)[i];
        CHECK_MSG(bad == 0, "weight_dequant: %d of 60000 bf16 values differ", bad);
        free(out);
    }
    /* e4m3 round trip: every finite code decodes and re-encodes to itself */
    int bad = 0;
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f) bad += f32_to_fp8_e4m3(fp8_e4m3_to_f32((uint8_t)b)) != (b == 0x80 ? 0x80 : b);
    CHECK_MSG(bad == 0, "%d e4m3 codes do not round-trip", bad);
    /* f32_round_fp8_e4m3 = the value of f32_to_fp8_e4m3's code, bit for bit: every
     * 4099th float32 bit pattern, and each e4m3 value, the midpoints beside it and
     * one float32 step either side of those */
    bad = 0;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
        uint32_t b = (uint32_t)u;
        float v;
        memcpy(&v, &b, 4);
        float want = fp8_e4m3_to_f32(f32_to_fp8_e4m3(v)), got = f32_round_fp8_e4m3(v);
        bad += !(memcmp(&want, &got, 4) == 0 || (isnan(want) && isnan(got)));
    }
    for (int c = 0; c < 127; c++) {
        float lo = fp8_e4m3_to_f32((uint8_t)c), hi = c < 126 ? fp8_e4m3_to_f32((uint8_t)(c + 1)) : 480.0f;
        float pts[] = {lo, (lo + hi) / 2, nextafterf(lo, 0), nextafterf(lo, 1e9f), nextafterf((lo + hi) / 2, 0),
                       nextafterf((lo + hi) / 2, 1e9f)};
        for (int i = 0; i < 6; i++)
            for (int sg = 0; sg < 2; sg++) {
                float v = sg ? -pts[i] : pts[i];
                float want = fp8_e4m3_to_f32(f32_to_fp8_e4m3(v)), got = f32_round_fp8_e4m3(v);
                bad += memcmp(&want, &got, 4) != 0;
            }
    }
    CHECK_MSG(bad == 0, "f32_round_fp8_e4m3: %d values differ from the code's", bad);
    /* act_fake_quant = act_quant's codes times their scales */
    for (int fi = 0; fi < 2; fi++) {
        int m = 64, k = 512, kb = 4;
        uint8_t *y = malloc((size_t)m * k);
        float *sc = malloc(sizeof(float) * (size_t)m * kb), *fq = malloc(sizeof(float) * (size_t)m * k);
        act_quant_ref(tx->data, m, k, y, sc, fi == 1);
        act_fake_quant(tx->data, m, k, fq, fi == 1);
        int diff = 0;
        for (int i = 0; i < m * k; i++) diff += fq[i] != fp8_e4m3_to_f32(y[i]) * sc[(size_t)(i / k) * kb + (i % k) / 128];
        CHECK_MSG(diff == 0, "act_fake_quant/%s: %d of %d values differ", fi ? "ue8m0" : "default", diff, m * k);
        free(y);
        free(sc);
        free(fq);
    }
    st_close(f);
    return t_done("fp8_kernels");
}
