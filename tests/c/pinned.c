/*
 * Page-locked host memory through vgpu's libcuda.so, from a plain C program:
 *
 *   pinned shared     cuMemAllocHost / cuMemHostAlloc buffers must be memfds shared with vgpud
 *                     (the unix socket transport); copies from and to them, synchronous and
 *                     asynchronous, at several sizes and offsets, check their data
 *   pinned private    the same checks with sharing off (VGPU_SHARE_PINNED=0): the buffers are
 *                     private and the copies take the ordinary path
 *
 * A range that straddles the end of a pinned buffer (into memory mapped right after it) is
 * copied correctly too (the shim sends it the ordinary way).
 *
 * Prints "ok <what>" / "FAIL <what>"; the exit status is the failure count.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream;

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemHostAlloc(void **, size_t, unsigned int);
CUresult cuMemFreeHost(void *);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamDestroy_v2(CUstream);

static int failures;

static void check(int cond, const char *what) {
    printf("%s %s\n", cond ? "ok" : "FAIL", what);
    if (!cond) failures++;
}

static void checkr(CUresult r, const char *what) {
    if (r != 0) printf("  (%s returned %d)\n", what, r);
    check(r == 0, what);
}

/* Whether `p` lies in a mapping of the shim's memfds. */
static int is_shared(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (unsigned long)p >= lo &&
            (unsigned long)p < hi)
            found = strstr(line, "memfd:vgpu-pinned") != NULL;
    }
    fclose(f);
    return found;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 131 + seed * 7 + (i >> 12)) & 0xff);
}

/* Copies `n` bytes through the device from `src` to `dst` (both host), sync or async. */
static void round_trip(unsigned char *src, unsigned char *dst, size_t n, CUstream s,
                       const char *what) {
    char name[160];
    CUdeviceptr d = 0;
    unsigned seed = (unsigned)n ^ (unsigned)(uintptr_t)src;
    snprintf(name, sizeof name, "%s: %zu bytes cuMemAlloc", what, n);
    checkr(cuMemAlloc_v2(&d, n), name);
    fill(src, n, seed);
    memset(dst, 0xEE, n);
    if (s) {
        snprintf(name, sizeof name, "%s: %zu bytes HtoDAsync", what, n);
        checkr(cuMemcpyHtoDAsync_v2(d, src, n, s), name);
        snprintf(name, sizeof name, "%s: %zu bytes DtoHAsync", what, n);
        checkr(cuMemcpyDtoHAsync_v2(dst, d, n, s), name);
        snprintf(name, sizeof name, "%s: %zu bytes stream sync", what, n);
        checkr(cuStreamSynchronize(s), name);
    } else {
        snprintf(name, sizeof name, "%s: %zu bytes HtoD", what, n);
        checkr(cuMemcpyHtoD_v2(d, src, n), name);
        snprintf(name, sizeof name, "%s: %zu bytes DtoH", what, n);
        checkr(cuMemcpyDtoH_v2(dst, d, n), name);
    }
    snprintf(name, sizeof name, "%s: %zu bytes data", what, n);
    check(memcmp(src, dst, n) == 0, name);
    cuMemFree_v2(d);
}

int main(int argc, char **argv) {
    int want_shared = argc > 1 && strcmp(argv[1], "shared") == 0;
    CUcontext ctx;
    CUstream s;
    checkr(cuInit(0), "cuInit");
    checkr(cuCtxCreate_v2(&ctx, 0, 0), "cuCtxCreate");
    checkr(cuStreamCreate(&s, 1), "cuStreamCreate (non-blocking)");

    static const size_t sizes[] = {1, 4099, (1 << 20) + 17, 9 << 20};
    const size_t slack = 3 * 4096;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *a = NULL, *b = NULL;
        checkr(cuMemAllocHost_v2((void **)&a, n + slack), "cuMemAllocHost");
        checkr(cuMemHostAlloc((void **)&b, n + slack, 0), "cuMemHostAlloc");
        if (!a || !b) continue;
        check(is_shared(a) == want_shared && is_shared(b) == want_shared,
              want_shared ? "pinned buffers are shared memfds" : "pinned buffers are private");
        round_trip(a, b, n, NULL, "pinned sync");
        round_trip(a + 4096 + 5, b + 2 * 4096 + 3, n, NULL, "pinned sync at offsets");
        round_trip(a + 17, b + 1, n, s, "pinned async at offsets");
        round_trip(a + slack, b + slack, n, s, "pinned async to the very end");
        /* Pinned to pageable and back. */
        unsigned char *p = malloc(n);
        round_trip(a, p, n, s, "pinned to pageable");
        round_trip(p, b, n, NULL, "pageable to pinned");
        free(p);
        checkr(cuMemFreeHost(a), "cuMemFreeHost");
        checkr(cuMemFreeHost(b), "cuMemFreeHost");
    }

    /* Several asynchronous copies queued before one synchronization, each into its own part
       of one pinned buffer: device-to-host copies to pinned memory do not wait. */
    {
        const size_t part = 256 << 10, parts = 8;
        unsigned char *h = NULL, *out = NULL;
        CUdeviceptr d = 0;
        checkr(cuMemAllocHost_v2((void **)&h, part * parts), "cuMemAllocHost (parts)");
        checkr(cuMemAllocHost_v2((void **)&out, part * parts), "cuMemAllocHost (parts out)");
        checkr(cuMemAlloc_v2(&d, part * parts), "cuMemAlloc (parts)");
        fill(h, part * parts, 99);
        memset(out, 0, part * parts);
        for (size_t k = 0; k < parts; k++)
            cuMemcpyHtoDAsync_v2(d + k * part, h + k * part, part, s);
        for (size_t k = 0; k < parts; k++)
            cuMemcpyDtoHAsync_v2(out + (parts - 1 - k) * part, d + k * part, part, s);
        checkr(cuStreamSynchronize(s), "parts: stream sync");
        int same = 1;
        for (size_t k = 0; k < parts; k++)
            same &= memcmp(out + (parts - 1 - k) * part, h + k * part, part) == 0;
        check(same, "parts: every async copy landed in its place");
        cuMemFree_v2(d);
        cuMemFreeHost(h);
        cuMemFreeHost(out);
    }

    /* A range straddling the end (or the start) of a pinned buffer into a page mapped right
       after (or before) it: the shim sends it the ordinary way. */
    {
        const size_t len = 2 * 4096;
        unsigned char *h = NULL;
        checkr(cuMemAllocHost_v2((void **)&h, len), "cuMemAllocHost (straddle)");
        int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
        unsigned char *after = mmap(h + len, 4096, PROT_READ | PROT_WRITE, flags, -1, 0);
        unsigned char *before = mmap(h - 4096, 4096, PROT_READ | PROT_WRITE, flags, -1, 0);
        unsigned char *back = malloc(4096);
        int tried = 0;
        if (after == h + len) {
            round_trip(h + len - 2048, back, 4096, NULL, "straddling the end, sync");
            round_trip(h + len - 100, back, 4096, s, "straddling the end, async");
            tried = 1;
        }
        if (before == h - 4096) {
            round_trip(h - 2048, back, 4096, NULL, "straddling the start, sync");
            round_trip(back, h - 100, 4096, s, "straddling the start, async");
            tried = 1;
        }
        if (!tried) check(1, "straddle: skipped (the pages around the buffer are taken)");
        if (after != MAP_FAILED) munmap(after, 4096);
        if (before != MAP_FAILED) munmap(before, 4096);
        free(back);
        checkr(cuMemFreeHost(h), "cuMemFreeHost (straddle)");
    }

    /* Errors: a foreign device pointer, freeing twice. */
    {
        unsigned char *h = NULL;
        checkr(cuMemAllocHost_v2((void **)&h, 4096), "cuMemAllocHost (errors)");
        check(cuMemcpyHtoD_v2(0x10, h, 16) == 1, "HtoD to a foreign pointer: INVALID_VALUE");
        check(cuMemcpyDtoH_v2(h, 0x10, 16) == 1, "DtoH from a foreign pointer: INVALID_VALUE");
        checkr(cuMemFreeHost(h), "cuMemFreeHost (errors)");
        check(cuMemFreeHost(h) == 1, "cuMemFreeHost twice: INVALID_VALUE");
    }

    checkr(cuStreamDestroy_v2(s), "cuStreamDestroy");
    checkr(cuCtxDestroy_v2(ctx), "cuCtxDestroy");
    return failures;
}
