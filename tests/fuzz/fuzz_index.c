/* fuzz_index.c - fuzz target for model.safetensors.index.json (ckpt_parse_index).
 * Every accepted map must hold only plain file names; errors name the file. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "io/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *wm = NULL;
    ds_status s = ckpt_parse_index((const char *)data, size, "fuzz.index.json", &wm);
    if (s == DS_OK) {
        const char *k;
        json_t *v;
        json_object_foreach(wm, k, v)
            if (!json_is_string(v) || !ckpt_safe_name(json_string_value(v))) abort();
        json_decref(wm);
    } else if (wm || !strstr(ds_last_error(), "fuzz.index.json")) {
        abort();
    }
    return 0;
}
