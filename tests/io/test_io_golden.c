/* test_io_golden.c - convert (mp 1 and 2) and cast-bf16 of golden/tiny_hf reproduce,
 * byte for byte, what DeepSeek's convert.py and fp8_cast_bf16.py wrote. */
#include <string.h>
#include <sys/stat.h>

#include "base/numeric.h"
#include "io/cast.h"
#include "io/convert.h"
#include "manifest.h"
#include "sha256.h"
#include "test.h"

static void test_sha256(void)
{
    char hex[65];
    sha256_hex("", 0, hex);
    CHECK(!strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"));
    sha256_hex("abc", 3, hex);
    CHECK(!strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"));
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: two pad blocks */
    sha256_hex(m, strlen(m), hex);
    CHECK(!strcmp(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"));
}

static void test_convert(int mp)
{
    const char *out = t_tmpdir("convert");
    convert_opts o = {.hf_dir = t_golden("tiny_hf"), .save_dir = out, .n_experts = 16, .mp = mp};
    CHECK_OK(convert_checkpoint(&o));
    char man[64];
    snprintf(man, sizeof man, "convert_mp%d.manifest.json", mp);
    check_manifest(t_golden(man), out);
    char cfg[4200];
    struct stat sb;
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    CHECK(stat(cfg, &sb) == 0);
    t_system("rm -rf '%s'", out);
}

static void test_cast(int threads)
{
    const char *out = t_tmpdir("cast");
    cast_opts o = {.in_dir = t_golden("tiny_hf"), .out_dir = out, .threads = threads};
    CHECK_OK(cast_bf16_checkpoint(&o));
    check_manifest(t_golden("cast_bf16.manifest.json"), out);
    char a[65] = "", b[65] = "", p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", out);
    CHECK(sha256_file(p, a) == 0 && sha256_file(t_golden("cast_bf16.index.json"), b) == 0 && !strcmp(a, b));
    /* config.json no longer claims FP8 */
    snprintf(p, sizeof p, "%s/config.json", out);
    FILE *f = fopen(p, "rb");
    char text[8192] = "";
    CHECK(f && fread(text, 1, sizeof text - 1, f) > 0);
    if (f) fclose(f);
    CHECK(strstr(text, "hidden_size") && !strstr(text, "quantization_config"));
    t_system("rm -rf '%s'", out);
}

/* cast_dequant_rows against the reference's weight_dequant kernel output
 * (300x200 e4m3 with partial edge blocks -> BF16). */
static void test_dequant_kernel(void)
{
    st_file *f = NULL;
    CHECK_OK(st_open(&f, t_golden("fp8_kernels.safetensors")));
    if (!f) return;
    const st_tensor *w = st_find(f, "weight_dequant/w"), *sc = st_find(f, "weight_dequant/s"),
                    *ref = st_find(f, "weight_dequant/out_bf16");
    CHECK(w && sc && ref && w->dtype == ST_F8_E4M3 && sc->dtype == ST_F32 && ref->dtype == ST_BF16);
    if (w && sc && ref) {
        int64_t rows = w->shape[0], cols = w->shape[1];
        uint16_t *out = malloc((size_t)(rows * cols) * 2);
        cast_dequant_rows(w->data, sc->data, out, rows, cols, 0, rows);
        CHECK(!memcmp(out, ref->data, ref->nbytes));
        /* a row range lands at the start of out */
        cast_dequant_rows(w->data, sc->data, out, rows, cols, 130, 131);
        CHECK(!memcmp(out, (const uint16_t *)ref->data + 130 * cols, (size_t)cols * 2));
        free(out);
    }
    st_close(f);
}

int main(void)
{
    test_sha256();
    test_dequant_kernel();
    test_convert(1);
    test_convert(2);
    test_cast(1);
    test_cast(0);
    return t_done("io_golden");
}
