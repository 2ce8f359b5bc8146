/*
 * A tenant for the scheduler tests (tests/sched_*.rs): runs the `spin`
 * kernel of bench/kernels/spin.ptx through vgpu's libcuda.so.1.
 *
 *   sched_client saturate PTX ITERS GRID SECONDS
 *       launches kernels back to back for SECONDS, DEPTH batches in flight;
 *       prints "done <CLOCK_REALTIME ns> <kernels>" per completed batch
 *   sched_client latency PTX ITERS GRID SECONDS
 *       launches one kernel, synchronizes, sleeps 1-5 ms, for SECONDS;
 *       prints "rtt <ns>" per kernel (launch to synchronize returning)
 *   sched_client once PTX ITERS GRID
 *       one kernel; prints "result <CUresult> <ns>"
 *
 * Output is printed at the end. Exit status: 0, or 1 with a message on
 * stderr when a call fails (except the kernel result of `once`).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUevent;

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventRecord(CUevent, void *);
CUresult cuEventSynchronize(CUevent);

#define BLOCK 32
#define BATCH 4
#define DEPTH 8
#define MAX_LINES 200000

static char **lines;
static int nlines;

static void die(const char *what, CUresult r) {
    fprintf(stderr, "sched_client: %s failed with %d\n", what, r);
    exit(1);
}

static void call(const char *what, CUresult r) {
    if (r != 0) die(what, r);
}

static unsigned long long ns(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void emit(const char *fmt, ...) {
    if (nlines == MAX_LINES) return;
    char *l = malloc(64);
    if (!l) exit(2);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l, 64, fmt, ap);
    va_end(ap);
    lines[nlines++] = l;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (!b || fread(b, 1, n, f) != (size_t)n) { perror(path); exit(2); }
    b[n] = 0;
    fclose(f);
    return b;
}

static CUfunction fn;
static CUdeviceptr out;
static unsigned int iters;
static unsigned int grid;

static CUresult launch(void) {
    void *params[] = {&out, &iters};
    return cuLaunchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, NULL, params, NULL);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: sched_client saturate|latency|once PTX ITERS GRID [SECONDS]\n");
        return 2;
    }
    const char *mode = argv[1];
    char *ptx = read_file(argv[2]);
    iters = (unsigned)strtoul(argv[3], NULL, 10);
    grid = (unsigned)strtoul(argv[4], NULL, 10);
    double seconds = argc > 5 ? atof(argv[5]) : 0;
    lines = calloc(MAX_LINES, sizeof(char *));
    if (!lines) return 2;

    CUcontext ctx;
    CUmodule mod;
    call("cuInit", cuInit(0));
    call("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, 0));
    call("cuModuleLoadData", cuModuleLoadData(&mod, ptx));
    call("cuModuleGetFunction", cuModuleGetFunction(&fn, mod, "spin"));
    call("cuMemAlloc", cuMemAlloc_v2(&out, (size_t)grid * BLOCK * sizeof(float)));

    unsigned long long stop = ns(CLOCK_MONOTONIC) + (unsigned long long)(seconds * 1e9);
    if (strcmp(mode, "saturate") == 0) {
        /* DEPTH batches in flight keep the VM's queue full even when this
         * process is slow to wake up on a loaded machine (with 4, a VM of
         * weight 4 ran dry and got 60 % of the device, not 80 %, with two
         * busy loops beside the test). */
        CUevent ev[DEPTH];
        for (int k = 0; k < DEPTH; k++) call("cuEventCreate", cuEventCreate(&ev[k], 0));
        unsigned long i = 0;
        while (ns(CLOCK_MONOTONIC) < stop) {
            for (int k = 0; k < BATCH; k++) call("cuLaunchKernel", launch());
            call("cuEventRecord", cuEventRecord(ev[i % DEPTH], NULL));
            if (i + 1 >= DEPTH) {
                call("cuEventSynchronize", cuEventSynchronize(ev[(i + 1) % DEPTH]));
                emit("done %llu %d", ns(CLOCK_REALTIME), BATCH);
            }
            i++;
        }
        for (unsigned long j = i >= DEPTH - 1 ? i - (DEPTH - 1) : 0; j < i; j++) {
            call("cuEventSynchronize", cuEventSynchronize(ev[j % DEPTH]));
            emit("done %llu %d", ns(CLOCK_REALTIME), BATCH);
        }
    } else if (strcmp(mode, "latency") == 0) {
        unsigned long long rng = 0x9e3779b97f4a7c15ull;
        while (ns(CLOCK_MONOTONIC) < stop) {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            struct timespec nap = {0, (long)(1000000 + rng % 4000000)};
            nanosleep(&nap, NULL);
            unsigned long long t = ns(CLOCK_MONOTONIC);
            call("cuLaunchKernel", launch());
            call("cuCtxSynchronize", cuCtxSynchronize());
            emit("rtt %llu", ns(CLOCK_MONOTONIC) - t);
        }
    } else if (strcmp(mode, "once") == 0) {
        unsigned long long t = ns(CLOCK_MONOTONIC);
        CUresult r = launch();
        if (r == 0) r = cuCtxSynchronize();
        emit("result %d %llu", r, ns(CLOCK_MONOTONIC) - t);
    } else {
        fprintf(stderr, "sched_client: unknown mode %s\n", mode);
        return 2;
    }
    for (int i = 0; i < nlines; i++) puts(lines[i]);
    return 0;
}
