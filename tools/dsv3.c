/* dsv3.c - the command-line tool: dispatches to one subcommand per file.
 *
 * Process-wide concerns live here, around the subcommand: descriptors 0-2 are
 * opened to /dev/null when the tool starts with them closed (else the first
 * file opened would become stdout and a message would land in it); SIGINT,
 * SIGTERM and SIGHUP remove an output transaction's temporary before the
 * process ends (io/txn.h); SIGXFSZ is ignored so that a file-size limit is a
 * write error with a message; SIGBUS inside a mapped file (a checkpoint
 * truncated under a run) is reported naming the file; and a failed write to
 * stdout or stderr, found at the latest when they are flushed at exit, makes
 * the exit status non-zero. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmds.h"
#include "commit.h" /* DSV3_COMMIT, written by tools/commit.cmake */
#include "dsv3.h"
#include "io/txn.h"

/* Subcommands are weak so that a build without a subsystem still links; the
 * table says which exist. */
#pragma weak cmd_convert
#pragma weak cmd_cast_bf16
#pragma weak cmd_synth
#pragma weak cmd_info
#pragma weak cmd_logits
#pragma weak cmd_generate
#pragma weak cmd_tokenize
#pragma weak cmd_bench
#pragma weak cmd_perplexity
int cmd_serve(int argc, char **argv); /* tools/cmd_serve.c */
#pragma weak cmd_serve

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_cmds[] = {
    {"generate", cmd_generate, "chat interactively or complete a file of prompts"},
    {"logits", cmd_logits, "write the model's logits for a token sequence"},
    {"tokenize", cmd_tokenize, "print the token ids of a text or a chat"},
    {"perplexity", cmd_perplexity, "measure the model's perplexity on a text file"},
    {"serve", cmd_serve, "serve an OpenAI-compatible HTTP API (chat, completions, streaming)"},
    {"bench", cmd_bench, "measure prefill and decode speed against the hardware limits"},
    {"convert", cmd_convert, "shard a Hugging Face checkpoint for model parallelism"},
    {"cast-bf16", cmd_cast_bf16, "dequantise an FP8 checkpoint to BF16"},
    {"synth", cmd_synth, "write a random-weight checkpoint for any config"},
    {"info", cmd_info, "list the tensors of a checkpoint or safetensors file"},
};

static void usage(FILE *out)
{
    fprintf(out, "dsv3 %s - DeepSeek-V3-family inference in C\n\nusage: dsv3 <command> [flags]\n\ncommands:\n",
            DSV3_VERSION);
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (k_cmds[i].fn) fprintf(out, "  %-10s %s\n", k_cmds[i].name, k_cmds[i].help);
    fprintf(out, "\n'dsv3 <command> --help' lists a command's flags.\n");
}

/* `dsv3 --version`: the version, the commit and what the build can use. The
 * CPU features are the running machine's, as the kernels pick them at run time. */
static void version(void)
{
    printf("dsv3 %s (commit %s)\n", DSV3_VERSION, DSV3_COMMIT);
    printf("compiler: %s\n", __VERSION__);
    printf("cuda: %s\nmpi: %s\nnccl: %s\n",
#ifdef DSV3_CUDA
           "yes",
#else
           "no",
#endif
#ifdef DSV3_MPI
           "yes",
#else
           "no",
#endif
#ifdef DSV3_NCCL
           "yes"
#else
           "no"
#endif
    );
    printf("line editing: %s\n",
#ifdef DSV3_LIBEDIT
           "libedit"
#else
           "no"
#endif
    );
    printf("cpu features:");
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) printf(" avx2");
    if (__builtin_cpu_supports("fma")) printf(" fma");
    if (__builtin_cpu_supports("f16c")) printf(" f16c");
    if (__builtin_cpu_supports("avx512f")) printf(" avx512f");
    if (__builtin_cpu_supports("avx512bw")) printf(" avx512bw");
    if (__builtin_cpu_supports("avx512vl")) printf(" avx512vl");
#elif defined(__aarch64__)
    printf(" neon");
#endif
    printf("\n");
}

static void open_std_fds(void)
{
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            /* open() takes the lowest free descriptor: fd itself */
            int n = open("/dev/null", fd ? O_WRONLY : O_RDONLY);
            if (n >= 0 && n != fd) close(n);
        }
}

static void on_terminate(int sig)
{
    int e = errno;
    if (txn_signal_cleanup(sig) == 2) { /* publishing: main re-raises once it is done */
        errno = e;
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void put(const char *s)
{
    ssize_t r = write(2, s, strlen(s));
    (void)r;
}

/* The file mapped at addr, from /proc/self/maps, into path (async-signal-safe). */
static int mapped_file(uintptr_t addr, char *path, size_t cap)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[8192], line[4096 + 256];
    size_t ll = 0;
    int found = 0;
    ssize_t n;
    while (!found && (n = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < n && !found; i++) {
            if (buf[i] != '\n') {
                if (ll < sizeof line - 1) line[ll++] = buf[i];
                continue;
            }
            line[ll] = 0;
            ll = 0;
            uintptr_t lo = 0, hi = 0;
            const char *p = line;
            for (; *p && *p != '-'; p++) lo = lo * 16 + (uintptr_t)(*p <= '9' ? *p - '0' : (*p | 32) - 'a' + 10);
            for (p += *p == '-'; *p && *p != ' '; p++) hi = hi * 16 + (uintptr_t)(*p <= '9' ? *p - '0' : (*p | 32) - 'a' + 10);
            if (addr < lo || addr >= hi) continue;
            const char *f = strchr(line, '/');
            if (!f) break;
            size_t k = strlen(f) < cap - 1 ? strlen(f) : cap - 1;
            memcpy(path, f, k);
            path[k] = 0;
            found = 1;
        }
    }
    close(fd);
    return found;
}

/* SIGBUS: an access past the end of a mapped file that shrank after it was opened. */
static void on_bus(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    char path[4096];
    txn_signal_cleanup(sig);
    if (mapped_file((uintptr_t)si->si_addr, path, sizeof path)) {
        put("dsv3: ");
        put(path);
        put(" changed while in use (truncated or rewritten by another program); stopping\n");
    } else {
        put("dsv3: bus error (a mapped file changed while in use?)\n");
    }
    _exit(1);
}

static void install_handlers(void)
{
    static const int term[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof term / sizeof *term; i++) {
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_terminate;
        sigemptyset(&sa.sa_mask);
        /* a signal ignored by whoever started us (nohup, a background job) stays ignored */
        if (sigaction(term[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(term[i], &sa, NULL);
    }
    struct sigaction sb;
    memset(&sb, 0, sizeof sb);
    sb.sa_sigaction = on_bus;
    sb.sa_flags = SA_SIGINFO;
    sigemptyset(&sb.sa_mask);
    sigaction(SIGBUS, &sb, NULL);
    signal(SIGXFSZ, SIG_IGN);
}

/* Flushes stdout and stderr; a write error anywhere in the run makes rc non-zero. */
static int finish_output(int rc)
{
    int bad_out = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad_out) {
        bad_out = 1;
        e = errno;
    }
    if (bad_out) fprintf(stderr, "dsv3: error writing standard output: %s\n", e ? strerror(e) : "write failed");
    int bad_err = fflush(stderr) != 0 || ferror(stderr);
    return rc ? rc : bad_out || bad_err ? 1 : 0;
}

static int run(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        version();
        return 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++)
        if (!strcmp(argv[1], k_cmds[i].name) && k_cmds[i].fn) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dsv3: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    open_std_fds();
    install_handlers();
    errno = 0;
    int rc = finish_output(run(argc, argv));
    int sig = txn_pending_signal();
    if (sig) { /* arrived while an output was being published: honour it now */
        signal(sig, SIG_DFL);
        raise(sig);
    }
    return rc;
}
