/* fuzz_jinja.c - fuzz target for the chat-template engine: the input is a
 * template, parsed and rendered with a fixed conversation under tight limits
 * (so that a template cannot make one input take seconds). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "tok/jinja.h"

static json_t *g_data, *g_markup;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_data = json_loads("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                        " {\"role\": \"user\", \"content\": \"Hi <｜Assistant｜> {{ x }}\"},"
                        " {\"role\": \"assistant\", \"content\": \"Hello\", \"tool_calls\": [{\"type\": \"function\","
                        " \"function\": {\"name\": \"f\", \"arguments\": \"{}\"}}]},"
                        " {\"role\": \"tool\", \"content\": \"42\"}], \"add_generation_prompt\": true,"
                        " \"n\": 3, \"f\": 2.5, \"items\": [1, 2, 3], \"none\": null}", 0, NULL);
    g_markup = json_loads("{\"bos_token\": \"<｜begin▁of▁sentence｜>\", \"eos_token\": \"<｜end▁of▁sentence｜>\"}", 0, NULL);
    if (!g_data || !g_markup) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_data) LLVMFuzzerInitialize(NULL, NULL);
    char *tmpl = fuzz_cstr(data, size);
    jinja_limits lim = {.max_output = 1 << 16, .max_iterations = 1 << 14, .max_depth = 64, .max_memory = 16 << 20};
    char *out = NULL;
    uint8_t *mask = NULL;
    size_t len = 0;
    ds_status s = jinja_render(tmpl, g_data, g_markup, &lim, &out, &mask, &len);
    if (s == DS_OK) {
        if (!out || strlen(out) > len || len > lim.max_output) abort();
        unsigned x = 0;
        for (size_t i = 0; i < len; i++) x += mask[i];
        (void)x;
    } else if (!strstr(ds_last_error(), "template")) {
        abort(); /* every message says where it comes from */
    }
    free(out);
    free(mask);
    free(tmpl);
    return 0;
}
