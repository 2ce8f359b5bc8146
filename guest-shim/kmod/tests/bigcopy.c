/*
 * bigcopy: large host<->device copies through the CUDA driver API, checked byte for byte.
 * With the vgpu module the shim sends the application's own pages to vgpud (zero copy).
 *
 *   bigcopy [-p] MIB [SECONDS [STOPFILE]]
 *
 * Each round fills MIB MiB with a pattern of that round, copies it to the GPU (the first half
 * synchronously, the second asynchronously on a stream), copies it back and compares. With
 * SECONDS, rounds repeat until that much time has passed or STOPFILE exists. Prints
 * "BIGCOPY round N ok ..." per round and "BIGCOPY done rounds=N" at the end; exits 0 only if
 * every byte of every round came back.
 *
 * With -p the buffers are pinned host memory (cuMemHostAlloc, page-aligned) instead of malloc'd
 * ones that start one byte into a page, and bigcopy prints how much of each is backed by
 * transparent huge pages after the first round: "BIGCOPY pinned thp_kb src=N dst=M" (from
 * /proc/self/smaps).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemHostAlloc(void **, size_t, unsigned int);

#define CHECK(what, call)                                                        \
    do {                                                                         \
        CUresult r_ = (call);                                                    \
        if (r_ != 0) {                                                           \
            printf("BIGCOPY FAIL %s: %d\n", what, r_);                           \
            return 1;                                                            \
        }                                                                        \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull | 1;
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, n - i < 8 ? n - i : 8);
    }
}

/* kB of AnonHugePages in the smaps entries that overlap [p, p + n). */
static long thp_kb(const void *p, size_t n) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0;
    long kb = 0;
    unsigned long a = (unsigned long)p, b = a + n;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        long v;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            in = lo < b && a < hi;
        } else if (in && sscanf(line, "AnonHugePages: %ld kB", &v) == 1) {
            kb += v;
        }
    }
    fclose(f);
    return kb;
}

int main(int argc, char **argv) {
    int pinned = argc > 1 && strcmp(argv[1], "-p") == 0;
    if (pinned) {
        argc--;
        argv++;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: bigcopy [-p] MIB [SECONDS [STOPFILE]]\n");
        return 2;
    }
    size_t bytes = strtoull(argv[1], 0, 0) << 20;
    double seconds = argc > 2 ? atof(argv[2]) : 0;
    const char *stop = argc > 3 ? argv[3] : NULL;
    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    CUdeviceptr d;
    CHECK("cuInit", cuInit(0));
    CHECK("cuDeviceGet", cuDeviceGet(&dev, 0));
    CHECK("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev));
    CHECK("cuStreamCreate", cuStreamCreate(&s, 0));
    CHECK("cuMemAlloc", cuMemAlloc_v2(&d, bytes));
    uint8_t *src, *dst;
    if (pinned) {
        void *a, *b;
        CHECK("cuMemHostAlloc", cuMemHostAlloc(&a, bytes, 0));
        CHECK("cuMemHostAlloc", cuMemHostAlloc(&b, bytes, 0));
        src = a;
        dst = b;
    } else {
        /* Offsets by one byte: neither buffer starts on a page boundary. */
        src = malloc(bytes + 1);
        dst = malloc(bytes + 1);
        if (!src || !dst) {
            printf("BIGCOPY FAIL malloc\n");
            return 1;
        }
        src++;
        dst++;
    }
    double start = now();
    int round = 0;
    do {
        round++;
        fill(src, bytes, round);
        memset(dst, 0, bytes);
        double t0 = now();
        size_t half = bytes / 2;
        CHECK("cuMemcpyHtoD", cuMemcpyHtoD_v2(d, src, half));
        CHECK("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2(d + half, src + half, bytes - half, s));
        CHECK("cuStreamSynchronize", cuStreamSynchronize(s));
        double t1 = now();
        CHECK("cuMemcpyDtoH", cuMemcpyDtoH_v2(dst, d, bytes));
        double t2 = now();
        if (memcmp(src, dst, bytes) != 0) {
            size_t i = 0;
            while (src[i] == dst[i]) i++;
            printf("BIGCOPY FAIL round %d: byte %zu differs (%02x != %02x)\n", round, i, dst[i],
                   src[i]);
            return 1;
        }
        printf("BIGCOPY round %d ok: %zu MiB in %.0f ms, out %.0f ms, identical\n", round,
               bytes >> 20, (t1 - t0) * 1e3, (t2 - t1) * 1e3);
        if (pinned && round == 1)
            printf("BIGCOPY pinned thp_kb src=%ld dst=%ld\n", thp_kb(src, bytes), thp_kb(dst, bytes));
        fflush(stdout);
    } while (now() - start < seconds && !(stop && access(stop, F_OK) == 0));
    printf("BIGCOPY done rounds=%d\n", round);
    return 0;
}
