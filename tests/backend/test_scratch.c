/* test_scratch.c - the CPU kernels' per-thread scratch (cpu_scratch) is freed
 * when its thread exits: threads that each take megabytes of it and end leave
 * the heap where it was (mallinfo2; under ASan, LeakSanitizer checks the same
 * at exit), and a thread sees its own buffer grow and persist across calls. */
#include <malloc.h>
#include <pthread.h>
#include <string.h>

#include "backend/cpu/cpu_simd.h"
#include "test.h"

#define THREADS 16
#define BYTES ((size_t)4 << 20)

static void *take(void *arg)
{
    int *ok = arg;
    char *a = cpu_scratch(0, BYTES);
    char *b = cpu_scratch(2, BYTES / 2);
    *ok = a && b && a != b;
    if (*ok) {
        memset(a, 1, BYTES);
        memset(b, 2, BYTES / 2);
        *ok = cpu_scratch(0, BYTES / 4) == a; /* a smaller request reuses the buffer */
    }
    return NULL;
}

static size_t heap_in_use(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}

int main(void)
{
    int ok[THREADS];
    /* one thread first, so that the allocator's own per-thread arenas exist */
    pthread_t t;
    CHECK(pthread_create(&t, NULL, take, &ok[0]) == 0 && pthread_join(t, NULL) == 0);
    size_t before = heap_in_use();
    for (int i = 0; i < THREADS; i++) {
        ok[i] = 0;
        CHECK(pthread_create(&t, NULL, take, &ok[i]) == 0 && pthread_join(t, NULL) == 0);
        CHECK_MSG(ok[i], "thread %d did not get its scratch", i);
    }
    size_t after = heap_in_use();
    /* leaked, the threads would hold THREADS * 6 MiB */
    CHECK_MSG(after < before + BYTES, "heap grew by %zu bytes over %d threads", after - before, THREADS);
    return t_done("backend_scratch");
}
