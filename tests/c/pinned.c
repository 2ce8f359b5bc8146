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
 * cuMemHostRegister'ed malloc buffers (ends not page-aligned): with sharing on, their whole
 * pages become a memfd shared with vgpud, bytes unchanged; copies over the whole range, over
 * parts of it and into it asynchronously check their data; unregistering waits for the copies
 * queued into it and gives the pages back as private memory, bytes unchanged. A registered
 * file mapping stays the file's: what the device writes into it reaches the file.
 *
 * Prints "ok <what>" / "FAIL <what>"; the exit status is the failure count.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
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
CUresult cuMemHostRegister_v2(void *, size_t, unsigned int);
CUresult cuMemHostUnregister(void *);
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

/* Whether `p` lies in a mapping whose maps line contains `name`. */
static int in_mapping_named(const void *p, const char *name) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    if (!f) return 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (unsigned long)p >= lo &&
            (unsigned long)p < hi)
            found = strstr(line, name) != NULL;
    }
    fclose(f);
    return found;
}

/* Whether `p` lies in a mapping of the shim's memfds for cuMemHostAlloc buffers. */
static int is_shared(const void *p) { return in_mapping_named(p, "memfd:vgpu-pinned"); }

/* Whether `p` lies in a memfd that took over a registered range's pages. */
static int is_adopted(const void *p) { return in_mapping_named(p, "memfd:vgpu-registered"); }

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

    /* cuMemHostRegister'ed malloc buffers, their ends not page-aligned. */
    static const size_t reg_sizes[] = {4099, (1 << 20) + 17, (9 << 20) + 5};
    for (size_t i = 0; i < sizeof reg_sizes / sizeof reg_sizes[0]; i++) {
        size_t n = reg_sizes[i];
        char name[160];
        unsigned char *m = malloc(n + 64), *orig = malloc(n), *out = malloc(n);
        unsigned char *r = m + 3;
        const unsigned char *inner = (const unsigned char *)(((uintptr_t)r + 8191) & ~(uintptr_t)4095);
        CUdeviceptr d = 0;
        fill(r, n, 5);
        memcpy(orig, r, n);
        snprintf(name, sizeof name, "registered %zu bytes: cuMemHostRegister", n);
        checkr(cuMemHostRegister_v2(r, n, 0), name);
        int adopt = want_shared && n >= (1 << 20);
        snprintf(name, sizeof name, "registered %zu bytes: %s", n,
                 adopt ? "whole pages moved into a shared memfd" : "pages stay private");
        check(is_adopted(inner) == adopt, name);
        snprintf(name, sizeof name, "registered %zu bytes: registering keeps the bytes", n);
        check(memcmp(r, orig, n) == 0, name);
        round_trip(r, out, n, NULL, "registered, whole range, sync");
        round_trip(out, r, n, s, "registered, whole range, async into it");
        round_trip(out, r, n, NULL, "registered, whole range, sync into it");
        round_trip(r + n / 4 + 1, out, n / 2, s, "registered, a part from it, async");
        round_trip(out, r + n / 3, n - n / 3, NULL, "registered, a part into it, sync");
        /* Device-to-host copies queued into it, then unregistering at once. */
        checkr(cuMemAlloc_v2(&d, n), "registered: cuMemAlloc");
        fill(orig, n, 11);
        checkr(cuMemcpyHtoD_v2(d, orig, n), "registered: HtoD");
        checkr(cuMemsetD8_v2(d, 0x5c, 1), "registered: memset");
        orig[0] = 0x5c;
        memset(r, 0, n);
        checkr(cuMemcpyDtoHAsync_v2(r, d, n, s), "registered: DtoHAsync into it");
        snprintf(name, sizeof name, "registered %zu bytes: cuMemHostUnregister", n);
        checkr(cuMemHostUnregister(r), name);
        snprintf(name, sizeof name, "registered %zu bytes: the queued copy landed before unregistering returned", n);
        check(memcmp(r, orig, n) == 0, name);
        snprintf(name, sizeof name, "registered %zu bytes: unregistered pages are private", n);
        check(!is_adopted(inner), name);
        if (adopt) {
            /* Registered again: a child of fork gets its own copy, as of anonymous memory. */
            checkr(cuMemHostRegister_v2(r, n, 0), "registered again");
            pid_t child = fork();
            if (child == 0) {
                int same = memcmp(r, orig, n) == 0;
                memset(r, 0x77, n);
                _exit(same ? 0 : 1);
            }
            int status = -1;
            waitpid(child, &status, 0);
            check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "fork: the child sees the registered bytes");
            check(memcmp(r, orig, n) == 0, "fork: the child's writes do not reach the parent");
            checkr(cuMemHostUnregister(r), "registered again: cuMemHostUnregister");
        }
        r[0] ^= 1;
        r[n - 1] ^= 1;
        check(r[0] == (orig[0] ^ 1) && r[n - 1] == (orig[n - 1] ^ 1), "unregistered pages take writes");
        cuMemFree_v2(d);
        free(m);
        free(orig);
        free(out);
    }

    /* At most 64 ranges are shared at once (each keeps a descriptor); later ones stay private
       and copy the same. */
    {
        enum { MANY = 66, PART = 256 << 10 };
        unsigned char *bufs[MANY];
        int adopted = 0, all_registered = 1;
        for (int k = 0; k < MANY; k++) {
            bufs[k] = malloc(PART);
            memset(bufs[k], k, PART);
            all_registered &= cuMemHostRegister_v2(bufs[k], PART, 0) == 0;
            adopted += is_adopted(bufs[k] + 8192);
        }
        check(all_registered, "many: every range registered");
        check(adopted == (want_shared ? 64 : 0), want_shared ? "many: 64 ranges shared, the rest private"
                                                           : "many: none shared");
        round_trip(bufs[0], bufs[MANY - 1], PART, NULL, "many, shared to private");
        round_trip(bufs[MANY - 1], bufs[1], PART, s, "many, private to shared");
        int unregistered = 1;
        for (int k = 0; k < MANY; k++) {
            unregistered &= cuMemHostUnregister(bufs[k]) == 0 && !is_adopted(bufs[k] + 8192);
            free(bufs[k]);
        }
        check(unregistered, "many: every range unregistered, its pages private");
    }

    /* A registered file mapping stays the file's. */
    {
        const size_t n = 2 << 20;
        char path[] = "/tmp/vgpu-pinned-XXXXXX";
        int fd = mkstemp(path);
        unsigned char *f = MAP_FAILED, *back = malloc(n), *src = malloc(n);
        if (fd >= 0 && ftruncate(fd, (off_t)n) == 0)
            f = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        check(f != MAP_FAILED, "file mapping: mmap");
        if (f != MAP_FAILED) {
            checkr(cuMemHostRegister_v2(f, n, 0), "file mapping: cuMemHostRegister");
            check(!is_adopted(f + 4096), "file mapping: pages stay the file's");
            round_trip(src, f, n, NULL, "file mapping, into it, sync");
            check(pread(fd, back, n, 0) == (ssize_t)n && memcmp(back, f, n) == 0,
                  "file mapping: what the device wrote is in the file");
            checkr(cuMemHostUnregister(f), "file mapping: cuMemHostUnregister");
            munmap(f, n);
        }
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        free(back);
        free(src);
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
