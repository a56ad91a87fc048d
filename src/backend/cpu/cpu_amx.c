/* cpu_amx.c - whether AMX may run here, and each thread's tile configuration.
 *
 * Linux keeps the 8 KiB of tile data out of a thread's saved state until the
 * process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
 * a tile instruction before that is a SIGILL. The request is made once, on
 * the first call of cpu_has_amx(), and only where cpuid and /proc/cpuinfo
 * both show AMX-TILE and AMX-BF16 (the latter says the kernel knows them). */
#include "cpu_amx.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu_simd.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static bool g_amx;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;

/* Whether the flags line of /proc/cpuinfo names flag. */
static bool cpuinfo_has(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    char line[8192];
    bool found = false;
    size_t n = strlen(flag);
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5)) continue;
        for (const char *p = strstr(line, flag); p && !found; p = strstr(p + 1, flag))
            found = p[-1] == ' ' && (p[n] == ' ' || p[n] == '\n' || p[n] == 0);
        break; /* the first CPU's flags */
    }
    fclose(f);
    return found;
}

static void amx_probe(void)
{
#if defined(__x86_64__) && defined(__linux__)
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    bool tile = d & (1u << 24), bf16 = d & (1u << 22);
    if (!tile || !bf16 || !cpu_has_avx512() || !cpuinfo_has("amx_bf16") || !cpuinfo_has("amx_tile")) return;
    g_amx = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#endif
}

bool cpu_has_amx(void)
{
    pthread_once(&g_amx_once, amx_probe);
    return g_amx;
}

/* ldtilecfg's 64 bytes: palette 1, every tile 16 rows of 64 bytes. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

void cpu_amx_tiles_on(void)
{
    amx_config cfg __attribute__((aligned(64)));
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(cfg) : "memory");
}

void cpu_amx_tiles_off(void) { __asm__ volatile("tilerelease" ::: "memory"); }
