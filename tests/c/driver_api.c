/*
 * A plain C program using the CUDA driver API, linked with -lcuda against
 * vgpu's libcuda.so. It declares the prototypes it uses itself (as an
 * application built against cuda.h would see them) so that it builds without
 * NVIDIA's headers.
 *
 * Modes:
 *   driver_api basic               exercise device, context, memory, streams, events
 *   driver_api fill BYTES          allocate BYTES in chunks until OUT_OF_MEMORY, report
 *   driver_api hold BYTES          allocate BYTES, print the pointer, then copy forever
 *   driver_api probe PTR           try to read, write and free a pointer we do not own
 *   driver_api wait BYTES          allocate BYTES, queue long kernels, print "waiting",
 *                                  then wait for them in cuCtxSynchronize
 *   driver_api bomb                a kernel declaring a million registers runs on the few it
 *                                  uses; one whose registers cannot be packed is refused
 *                                  with LAUNCH_OUT_OF_RESOURCES, and the context goes on
 *   driver_api modules N           load modules until one is refused (at most N): prints
 *                                  "loaded K" and the refusal's code, then checks that
 *                                  unloading one makes room for another
 *   driver_api latency N           N cuCtxSynchronize on an idle context and N 4 KiB
 *                                  device-to-host copies, timed one by one: prints
 *                                  "latency sync p50 X us p99 Y us" and the same for "copy"
 * Each check prints "ok <what>" or "FAIL <what>: <code>"; the exit status is
 * the number of failures.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

CUresult cuInit(unsigned int);
CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetName(char *, int, CUdevice);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuDeviceGetUuid(unsigned char *, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxGetCurrent(CUcontext *);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *, size_t *, CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpy(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD32Async(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemFreeHost(void *);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuEventElapsedTime(float *, CUevent, CUevent);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuModuleLoadData(void **, const void *);
CUresult cuModuleGetFunction(void **, void *, const char *);
CUresult cuModuleUnload(void *);
CUresult cuLaunchKernel(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);


static CUcontext setup(void) {
    CUdevice dev;
    CUcontext ctx;
    check("cuInit", cuInit(0), 0);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), 0);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), 0);
    return ctx;
}

static int basic(void) {
    check("call before cuInit", cuDeviceGetCount(&(int){0}), 3 /* NOT_INITIALIZED */);
    CUcontext ctx = setup();
    int version = 0, count = 0, warp = 0, major = 0;
    char name[128];
    size_t total = 0, free_b = 0, total_b = 0;
    CUdevice dev = 0;
    check("cuDriverGetVersion", cuDriverGetVersion(&version), 0);
    expect("driver version is 12.x", version >= 12000);
    check("cuDeviceGetCount", cuDeviceGetCount(&count), 0);
    expect("one device", count == 1);
    check("cuDeviceGetName", cuDeviceGetName(name, sizeof name, dev), 0);
    printf("device %s\n", name);
    check("cuDeviceTotalMem", cuDeviceTotalMem_v2(&total, dev), 0);
    printf("total %zu\n", total);
    check("warp size", cuDeviceGetAttribute(&warp, 10, dev), 0);
    expect("warp is 32", warp == 32);
    check("cc major", cuDeviceGetAttribute(&major, 75, dev), 0);
    expect("cc major >= 5", major >= 5);
    check("bad device", cuDeviceGet(&dev, 3), 101);
    check("cuMemGetInfo", cuMemGetInfo_v2(&free_b, &total_b), 0);
    expect("cuMemGetInfo total is the slice", total_b == total);

    size_t n = 3 << 20; /* spans chunks? no: one chunk; big enough to matter */
    unsigned char *h = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 31 + 7);
    CUdeviceptr d = 0, d2 = 0;
    check("cuMemAlloc", cuMemAlloc_v2(&d, n), 0);
    check("cuMemAlloc 2", cuMemAlloc_v2(&d2, n), 0);
    check("HtoD", cuMemcpyHtoD_v2(d, h, n), 0);
    check("DtoD", cuMemcpyDtoD_v2(d2, d, n), 0);
    check("DtoH", cuMemcpyDtoH_v2(back, d2, n), 0);
    expect("data round trip", memcmp(h, back, n) == 0);
    check("memset", cuMemsetD8_v2(d + 10, 0xab, 5), 0);
    check("cuMemcpy (UVA) DtoH", cuMemcpy((CUdeviceptr)(uintptr_t)back, d, 16), 0);
    expect("memset visible", back[9] == h[9] && back[10] == 0xab && back[14] == 0xab && back[15] == h[15]);

    CUdeviceptr base = 0;
    size_t size = 0;
    check("cuMemGetAddressRange", cuMemGetAddressRange_v2(&base, &size, d + 100), 0);
    expect("address range", base == d && size == n);

    CUstream s;
    CUevent e0, e1;
    float ms = -1;
    void *pinned = NULL;
    check("cuMemAllocHost", cuMemAllocHost_v2(&pinned, 4096), 0);
    check("cuStreamCreate", cuStreamCreate(&s, 1), 0);
    check("cuEventCreate", cuEventCreate(&e0, 0), 0);
    check("cuEventCreate", cuEventCreate(&e1, 0), 0);
    check("cuEventRecord", cuEventRecord(e0, s), 0);
    check("memset async", cuMemsetD32Async(d, 0x01020304u, 1024, s), 0);
    check("DtoH async", cuMemcpyDtoHAsync_v2(pinned, d, 4096, s), 0);
    check("cuEventRecord", cuEventRecord(e1, s), 0);
    check("cuStreamSynchronize", cuStreamSynchronize(s), 0);
    check("cuEventSynchronize", cuEventSynchronize(e1), 0);
    check("cuEventElapsedTime", cuEventElapsedTime(&ms, e0, e1), 0);
    expect("elapsed time is sane", ms >= 0 && ms < 10000);
    expect("async memset result", ((unsigned int *)pinned)[1023] == 0x01020304u);
    check("cuEventDestroy", cuEventDestroy_v2(e0), 0);
    check("cuEventDestroy", cuEventDestroy_v2(e1), 0);
    check("cuStreamDestroy", cuStreamDestroy_v2(s), 0);
    check("cuMemFreeHost", cuMemFreeHost(pinned), 0);

    /* Async errors surface at the next synchronizing call. */
    check("async memset on a bad pointer is accepted", cuMemsetD32Async(0x1234, 0, 4, 0), 0);
    check("...and reported by cuCtxSynchronize", cuCtxSynchronize(), 1);
    check("...once", cuCtxSynchronize(), 0);

    check("interior free refused", cuMemFree_v2(d + 8), 1);
    check("free", cuMemFree_v2(d), 0);
    check("double free refused", cuMemFree_v2(d), 1);
    check("use after free refused", cuMemcpyHtoD_v2(d, h, 8), 1);
    check("free 2", cuMemFree_v2(d2), 0);
    check("incomplete PTX is refused", cuModuleLoadData(&(void *){0}, ".version 7.0"), 218);
    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), 0);
    CUcontext cur = (CUcontext)1;
    check("cuCtxGetCurrent", cuCtxGetCurrent(&cur), 0);
    expect("no current context after destroy", cur == NULL);
    check("no context", cuMemAlloc_v2(&d, 16), 201);
    free(h);
    free(back);
    return failures;
}

/* Allocates CHUNK-sized blocks until OUT_OF_MEMORY; prints how much fit. */
static int fill(size_t limit) {
    setup();
    const size_t chunk = 1 << 20;
    size_t got = 0;
    CUdeviceptr ptrs[4096];
    int n = 0;
    CUresult r = 0;
    while (n < 4096) {
        r = cuMemAlloc_v2(&ptrs[n], chunk);
        if (r != 0) break;
        got += chunk;
        n++;
    }
    printf("allocated %zu bytes before result %d\n", got, r);
    check("stopped by OUT_OF_MEMORY", r, 2);
    expect("filled the slice exactly", got == limit);
    size_t free_b = 1, total_b = 0;
    check("cuMemGetInfo", cuMemGetInfo_v2(&free_b, &total_b), 0);
    expect("no memory left", free_b == 0 && total_b == limit);
    check("free one", cuMemFree_v2(ptrs[0]), 0);
    check("room again", cuMemAlloc_v2(&ptrs[0], chunk), 0);
    return failures;
}

static int hold(size_t bytes) {
    setup();
    CUdeviceptr d;
    check("cuMemAlloc", cuMemAlloc_v2(&d, bytes), 0);
    const char secret[] = "tenant-secret";
    check("HtoD", cuMemcpyHtoD_v2(d, secret, sizeof secret), 0);
    printf("ptr 0x%llx\n", d);
    printf("holding\n");
    fflush(stdout);
    size_t chunk = bytes < (8u << 20) ? bytes : (8u << 20);
    unsigned char *buf = calloc(1, chunk);
    for (;;) {
        /* Keep the session busy with calls (so a kill lands mid-call). */
        if (cuMemcpyHtoD_v2(d, buf, chunk) != 0) return 1;
        memcpy(buf, secret, sizeof secret);
    }
}

static int probe(CUdeviceptr foreign) {
    setup();
    unsigned char buf[16] = {0};
    check("foreign read refused", cuMemcpyDtoH_v2(buf, foreign, 8), 1);
    check("foreign write refused", cuMemcpyHtoD_v2(foreign, "XXXXXXXX", 8), 1);
    check("foreign free refused", cuMemFree_v2(foreign), 1);
    check("foreign memset refused at sync", cuMemsetD8_v2(foreign, 0, 8), 1);
    return failures;
}

/* A kernel that spins for minutes on the simulated GPU. */
static const char SPIN[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry spin(.param .u64 p)\n{\n .reg .pred %p; .reg .b64 %rd<4>;\n"
    " mov.u64 %rd1, 0;\nLOOP:\n add.u64 %rd1, %rd1, 1;\n setp.lt.u64 %p, %rd1, 4000000000;\n"
    " @%p bra LOOP;\n ld.param.u64 %rd2, [p]; cvta.to.global.u64 %rd3, %rd2;\n"
    " st.global.u64 [%rd3], %rd1;\n ret;\n}\n";

static int wait_for_kernels(size_t bytes) {
    setup();
    CUdeviceptr d;
    void *m, *f;
    check("cuMemAlloc", cuMemAlloc_v2(&d, bytes), 0);
    check("load the spinning kernel", cuModuleLoadData(&m, SPIN), 0);
    check("cuModuleGetFunction", cuModuleGetFunction(&f, m, "spin"), 0);
    void *args[] = {&d};
    for (int i = 0; i < 8; i++)
        check("launch", cuLaunchKernel(f, 4, 1, 1, 32, 1, 1, 0, 0, args, 0), 0);
    printf("waiting\n");
    fflush(stdout);
    return cuCtxSynchronize() != 0;
}

/* The register bomb: a million 64-bit registers in a 40-byte declaration. As the kernel uses
 * one, the interpreter packs them into a frame of a few and the launch runs. */
static const char BOMB[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry bomb(.param .u64 p)\n{\n .reg .b64 %rd<1048000>;\n"
    " ld.param.u64 %rd1047999, [p];\n ret;\n}\n";

/* The bomb with control flow that register packing gives up on (100 blocks, each jumping to the
 * one laid out before it, with values live through them: liveness settles one block per pass),
 * so its frames would hold every declared register: 8 GiB per block of 1024 threads. */
static char *chained_bomb(void) {
    size_t cap = 16384, n = 0;
    char *s = malloc(cap);
    n += snprintf(s + n, cap - n,
                  ".version 7.0\n.target sm_52\n.address_size 64\n"
                  ".visible .entry bomb(.param .u64 p)\n{\n .reg .b64 %%rd<1048000>;\n"
                  " ld.param.u64 %%rd1047999, [p];\n mov.u64 %%rd7, 5;\n bra.uni C99;\n");
    for (int i = 0; i < 100; i++) {
        n += snprintf(s + n, cap - n, "C%d:\n add.u64 %%rd9, %%rd9, 1;\n", i);
        if (i == 0)
            n += snprintf(s + n, cap - n, " bra.uni END;\n");
        else
            n += snprintf(s + n, cap - n, " bra.uni C%d;\n", i - 1);
    }
    snprintf(s + n, cap - n, "END:\n st.global.u64 [%%rd1047999], %%rd7;\n ret;\n}\n");
    return s;
}

static int bomb(void) {
    setup();
    void *m, *f;
    CUdeviceptr d;
    check("cuMemAlloc", cuMemAlloc_v2(&d, 4096), 0);
    check("the bomb loads", cuModuleLoadData(&m, BOMB), 0);
    check("cuModuleGetFunction", cuModuleGetFunction(&f, m, "bomb"), 0);
    void *args[] = {&d};
    CUresult r = cuLaunchKernel(f, 64, 1, 1, 1024, 1, 1, 0, 0, args, 0);
    if (r == 0) r = cuCtxSynchronize();
    check("the bomb's packed registers launch", r, 0);
    char *chained = chained_bomb();
    check("the chained bomb loads", cuModuleLoadData(&m, chained), 0);
    free(chained);
    check("cuModuleGetFunction", cuModuleGetFunction(&f, m, "bomb"), 0);
    for (int i = 0; i < 4; i++) {
        r = cuLaunchKernel(f, 64, 1, 1, 1024, 1, 1, 0, 0, args, 0);
        if (r == 0) r = cuCtxSynchronize();
        check("the launch is refused for lack of resources", r, 701);
    }
    unsigned char b = 1;
    check("the context goes on", cuMemsetD8_v2(d, 7, 1), 0);
    check("and copies", cuMemcpyDtoH_v2(&b, d, 1), 0);
    expect("the memset ran", b == 7);
    return failures;
}

/* A small module: one empty kernel. */
static const char TINY[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry tiny()\n{\n    ret;\n}\n";

static int modules(unsigned long long most) {
    setup();
    void *m[4096];
    unsigned long long loaded = 0;
    CUresult refused = 0;
    if (most > 4096) most = 4096;
    while (loaded < most) {
        CUresult r = cuModuleLoadData(&m[loaded], TINY);
        if (r != 0) {
            refused = r;
            break;
        }
        loaded++;
    }
    printf("loaded %llu\n", loaded);
    printf("refused %d\n", refused);
    if (refused != 0 && loaded > 0) {
        check("cuModuleUnload", cuModuleUnload(m[loaded - 1]), 0);
        check("a module loads again after an unload", cuModuleLoadData(&m[loaded - 1], TINY), 0);
    }
    void *f;
    if (loaded > 0) check("its kernels work", cuModuleGetFunction(&f, m[0], "tiny"), 0);
    return failures;
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report_latency(const char *what, double *v, size_t n) {
    qsort(v, n, sizeof *v, cmp_double);
    printf("latency %s p50 %.1f us p99 %.1f us\n", what, v[n / 2], v[n * 99 / 100]);
}

/* Synchronous round trips one by one, timed (the figure, not a check). */
static int latency(size_t n) {
    if (n == 0) return 100;
    setup();
    CUdeviceptr d;
    unsigned char buf[4096];
    double *v = calloc(n, sizeof *v);
    if (!v) return 100;
    check("cuMemAlloc", cuMemAlloc_v2(&d, sizeof buf), 0);
    for (size_t i = 0; i < n && !failures; i++) {
        double t = now_us();
        if (cuCtxSynchronize() != 0) failures++;
        v[i] = now_us() - t;
    }
    report_latency("sync", v, n);
    for (size_t i = 0; i < n && !failures; i++) {
        double t = now_us();
        if (cuMemcpyDtoH_v2(buf, d, sizeof buf) != 0) failures++;
        v[i] = now_us() - t;
    }
    report_latency("copy", v, n);
    free(v);
    check("cuMemFree", cuMemFree_v2(d), 0);
    return failures;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "basic";
    if (!strcmp(mode, "basic")) return basic();
    if (!strcmp(mode, "fill") && argc > 2) return fill(strtoull(argv[2], 0, 0));
    if (!strcmp(mode, "hold") && argc > 2) return hold(strtoull(argv[2], 0, 0));
    if (!strcmp(mode, "probe") && argc > 2) return probe(strtoull(argv[2], 0, 0));
    if (!strcmp(mode, "wait") && argc > 2) return wait_for_kernels(strtoull(argv[2], 0, 0));
    if (!strcmp(mode, "bomb")) return bomb();
    if (!strcmp(mode, "modules") && argc > 2) return modules(strtoull(argv[2], 0, 0));
    if (!strcmp(mode, "latency") && argc > 2) return latency(strtoull(argv[2], 0, 0));
    fprintf(stderr, "usage: %s basic | fill BYTES | hold BYTES | probe PTR | wait BYTES | bomb | modules N | latency N\n", argv[0]);
    return 100;
}
