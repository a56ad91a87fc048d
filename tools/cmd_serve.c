/* cmd_serve.c - `dsv3 serve`: an OpenAI-compatible HTTP server (src/serve/).
 * Parses the flags and runs the server; the server is a client of dsv3.h. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "cmds.h"
#include "serve/serve.h"

#define USAGE "--ckpt-path DIR [--config FILE] [--host 127.0.0.1] [--port 8080] [flags]"

int cmd_serve(int argc, char **argv)
{
    srv_options o = srv_default_options();
    int max_body_kb = (int)(o.max_body >> 10), max_prompt_kb = (int)(o.limits.max_prompt_bytes >> 10), cache_mb = 0;
    const char *spec = NULL;
    int draft = 1;
    arg_spec specs[] = {
        {"--ckpt-path", ARG_STR, &o.ckpt, true, "DIR   checkpoint (converted, or Hugging Face layout)"},
        {"--config", ARG_STR, &o.config, false, "FILE  model config (default: DIR/config.json)"},
        {"--host", ARG_STR, &o.host, false, "ADDR  IPv4 address to listen on (127.0.0.1)"},
        {"--port", ARG_INT, &o.port, false, "N     TCP port (8080; 0 picks a free one)"},
        {"--api-key-file", ARG_STR, &o.api_key_file, false, "FILE  require 'Authorization: Bearer <the file's key>'"},
        {"--parallel", ARG_INT, &o.parallel, false, "N     sequences decoded at once (KV-cache slots) (4)"},
        {"--ctx-size", ARG_INT, &o.ctx, false, "N     positions per sequence (min(max_seq_len, 4096))"},
        {"--cache-mem", ARG_INT, &cache_mb, false,
         "MB    KV cache kept for prompt-prefix reuse beyond --parallel's slots, in MiB (0: only theirs)"},
        {"--device", ARG_STR, &o.device, false, "cpu|cuda|auto"},
        {"--threads", ARG_INT, &o.threads, false, "N     CPU threads (OpenMP's default)"},
        {"--model-name", ARG_STR, &o.model_name, false, "S     the model id the API reports (the directory's name)"},
        {"--queue", ARG_INT, &o.queue, false, "N     requests waiting for a slot before 503 (64)"},
        {"--timeout", ARG_INT, &o.timeout_s, false, "S     per-request deadline in seconds (600; 0 none)"},
        {"--prefill-chunk", ARG_INT, &o.prefill_chunk, false, "N     prompt tokens per step beside the decodes (256)"},
        {"--spec", ARG_STR, &spec, false, "mtp   speculative decoding of greedy requests with the checkpoint's MTP module "
                                          "(default off: slower than plain on the models measured, docs/performance.md)"},
        {"--draft", ARG_INT, &draft, false, "N     tokens the MTP module drafts a step, 1 to 7 (1: measured fastest)"},
        {"--max-body-kb", ARG_INT, &max_body_kb, false, "N     request body cap in KiB (8192)"},
        {"--max-tokens", ARG_INT, &o.limits.max_tokens, false, "N     largest max_tokens a request may ask (32768)"},
        {"--max-n", ARG_INT, &o.limits.max_n, false, "N     largest n (8)"},
        {"--max-messages", ARG_INT, &o.limits.max_messages, false, "N     messages per request (1024)"},
        {"--max-prompt-kb", ARG_INT, &max_prompt_kb, false, "N     prompt text cap in KiB (4096)"},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof *specs, USAGE);
    if (rc) return rc == 1 ? 0 : rc;
    const char *bad = o.port < 0 || o.port > 65535               ? "--port must be in [0, 65535]"
                      : o.parallel < 1                           ? "--parallel must be >= 1"
                      : o.ctx < 0                                ? "--ctx-size must be >= 1"
                      : cache_mb < 0                             ? "--cache-mem must be >= 0"
                      : o.queue < 1 || o.queue > 1000000         ? "--queue must be in [1, 1000000]"
                      : o.timeout_s < 0                          ? "--timeout must be >= 0"
                      : o.prefill_chunk < 1                      ? "--prefill-chunk must be >= 1"
                      : spec && strcmp(spec, "mtp") && strcmp(spec, "off") ? "--spec is mtp or off"
                      : draft < 1 || draft > DS_SPEC_MAX_DRAFT   ? "--draft must be in [1, 7]"
                      : max_body_kb < 1 || max_prompt_kb < 1     ? "--max-body-kb and --max-prompt-kb must be >= 1"
                      : o.limits.max_tokens < 1 || o.limits.max_n < 1 || o.limits.max_messages < 1
                          ? "--max-tokens, --max-n and --max-messages must be >= 1"
                          : NULL;
    if (bad) {
        fprintf(stderr, "dsv3 serve: %s\n", bad);
        return 2;
    }
    o.spec_draft = spec && !strcmp(spec, "mtp") ? draft : 0;
    o.max_body = (size_t)max_body_kb << 10;
    o.cache_mem = (size_t)cache_mb << 20;
    o.limits.max_prompt_bytes = (size_t)max_prompt_kb << 10;
    return srv_run(&o);
}
