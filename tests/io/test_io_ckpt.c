/* test_io_ckpt.c - checkpoint directories: the index may only name plain files
 * inside the directory, must match the shards, and a tensor lives in one shard. */
#include <string.h>

#include "io/ckpt.h"
#include "test.h"

static void write_text(const char *dir, const char *name, const char *text)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A shard holding one U8 tensor per name. */
static void write_shard(const char *dir, const char *file, const char *const *names, int n)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    st_writer *w;
    int64_t shape[1] = {4};
    CHECK_OK(st_writer_open(&w, p));
    for (int i = 0; i < n; i++) CHECK_OK(st_writer_add(w, names[i], ST_U8, 1, shape));
    CHECK_OK(st_writer_begin(w));
    for (int i = 0; i < n; i++) CHECK_OK(st_writer_write(w, "abcd", 4));
    CHECK_OK(st_writer_finish(w));
}

static void expect_index_error(const char *dir, const char *index, const char *must)
{
    write_text(dir, "model.safetensors.index.json", index);
    ds_ckpt *c = NULL;
    ds_status s = ckpt_open_dir(&c, dir);
    CHECK_MSG(s == DS_ERR_FORMAT || s == DS_ERR_IO, "index %s: status %d", index, s);
    CHECK_MSG(strstr(ds_last_error(), must), "index %s: message '%s' lacks '%s'", index, ds_last_error(), must);
    if (!s) ckpt_close(c);
}

int main(void)
{
    const char *dir = t_tmpdir("ckpt");
    const char *a[] = {"x", "y"}, *b[] = {"z"};
    write_shard(dir, "s1.safetensors", a, 2);
    write_shard(dir, "s2.safetensors", b, 1);

    /* without an index: every shard, in name order */
    ds_ckpt *c = NULL;
    CHECK_OK(ckpt_open_dir(&c, dir));
    if (c) {
        CHECK(c->n_files == 2 && c->n_tensors == 3);
        const st_tensor *z = ckpt_find(c, "z");
        CHECK(z && strstr(ckpt_file_of(c, z)->path, "s2.safetensors"));
        CHECK(!ckpt_find(c, "w"));
        ckpt_close(c);
    }
    /* a good index */
    write_text(dir, "model.safetensors.index.json",
               "{\"weight_map\": {\"x\": \"s1.safetensors\", \"y\": \"s1.safetensors\", \"z\": \"s2.safetensors\"}}");
    CHECK_OK(ckpt_open_dir(&c, dir));
    if (c) ckpt_close(c);

    expect_index_error(dir, "{\"weight_map\": {\"x\": \"../x.safetensors\"}}", "../x.safetensors");
    expect_index_error(dir, "{\"weight_map\": {\"x\": \"/etc/passwd\"}}", "/etc/passwd");
    expect_index_error(dir, "{\"weight_map\": {\"x\": \"sub/s1.safetensors\"}}", "sub/s1.safetensors");
    expect_index_error(dir, "{\"weight_map\": {\"x\": \"..\"}}", "'..'");
    expect_index_error(dir, "{\"weight_map\": {\"x\": \"s1.safetensors\", \"missing\": \"s1.safetensors\"}}", "missing");
    expect_index_error(dir, "{\"weight_map\": {\"z\": \"s1.safetensors\", \"x\": \"s2.safetensors\"}}", "s1.safetensors");
    expect_index_error(dir, "{\"weight_map\": {\"x\": \"nofile.safetensors\"}}", "nofile.safetensors");
    expect_index_error(dir, "{\"weight_map\": {\"x\": 3}}", "'x'");
    expect_index_error(dir, "{\"weight_map\": [1]}", "weight_map");
    expect_index_error(dir, "{\"metadata\": {}}", "weight_map");
    expect_index_error(dir, "{\"weight_map\": {", "model.safetensors.index.json");

    /* the same tensor in two shards */
    t_system("rm -f '%s/model.safetensors.index.json'", dir);
    write_shard(dir, "s3.safetensors", b, 1);
    CHECK(ckpt_open_dir(&c, dir) == DS_ERR_FORMAT && strstr(ds_last_error(), "'z'"));
    /* not a directory; an empty directory */
    CHECK(ckpt_open_dir(&c, "/nonexistent-dir") == DS_ERR_IO);
    t_system("rm -f '%s'/*", dir);
    CHECK(ckpt_open_dir(&c, dir) == DS_ERR_IO && strstr(ds_last_error(), dir));

    CHECK(ckpt_safe_name("model-00001-of-00002.safetensors"));
    CHECK(!ckpt_safe_name("") && !ckpt_safe_name(".") && !ckpt_safe_name("..") && !ckpt_safe_name("a/b"));
    t_system("rm -rf '%s'", dir);
    return t_done("io_ckpt");
}
