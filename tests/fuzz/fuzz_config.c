/* fuzz_config.c - fuzz target for the config reader (reference and HF JSON).
 * An accepted config must pass config_validate again and survive the
 * derived computations the tools do with it (tensor list and sizes, the
 * HF config text, a round trip through config_to_json). */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "io/config.h"
#include "io/synth.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_cstr(data, size);
    ds_config c;
    ds_status s = config_parse(&c, text, "fuzz.json");
    free(text);
    if (s != DS_OK) {
        if (!strstr(ds_last_error(), "fuzz.json")) abort();
        return 0;
    }
    if (config_validate(&c, "fuzz.json")) abort();
    config_check_parallel(&c, 8);
    char *j = config_to_json(&c), *h = synth_hf_config(&c), *j2 = NULL;
    ds_config d;
    if (!j || !h || config_parse(&d, j, "round trip") != DS_OK) abort();
    if (!(j2 = config_to_json(&d)) || strcmp(j, j2)) abort();
    uint64_t n_tensors, bytes;
    if (c.n_layers <= 64 && c.n_routed_experts <= 256) synth_totals(&c, &n_tensors, &bytes);
    free(j);
    free(j2);
    free(h);
    return 0;
}
