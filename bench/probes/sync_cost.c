/*
 * sync_cost: what synchronizations and synchronous copies cost a process with one CUDA thread
 * and with two (guest-shim/src/sync_wait.rs: a process with more than one CUDA thread waits for
 * long synchronizations on connections of its own, and waits for a synchronous copy's stream
 * before the copy, or before a synchronous fill or device copy). Prints p50, p10 and p90 of 2000
 * idle cuCtxSynchronize calls, 2000 4 KiB cuMemcpyDtoH calls, 2000 4 KiB cuMemsetD32 and
 * cuMemcpyDtoD calls, 2000 rounds of cuMemAlloc, a 4 KiB cuMemcpyDtoH and cuMemFree, and 200 launches of a spin kernel each followed by cuStreamSynchronize.
 * With THREADS 2 a second thread makes one CUDA call and sleeps; run the two modes alternately.
 *
 *   gcc -O2 bench/probes/sync_cost.c -o /tmp/sync_cost -L target/release -lcuda -lpthread
 *   (with target/release/libcuda.so copied as libcuda.so.1 into LD_LIBRARY_PATH, vgpud running)
 *   VGPU_TRANSPORT=unix:/path/vm.sock /tmp/sync_cost THREADS bench/kernels/spin.ptx ITERS
 *
 * docs/performance.md ("Synchronizations of multi-threaded processes") reports what it showed.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUstream, *CUmodule, *CUfunction;
CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
CUresult cuStreamSynchronize(CUstream);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);

#define CALLS 2000
#define KERNELS (CALLS / 10)

static CUcontext ctx;
static double t[CALLS];

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, int n) {
    qsort(t, n, sizeof t[0], by_value);
    printf("%-36s p50 %9.2f us  p10 %9.2f  p90 %9.2f\n", what, t[n / 2], t[n / 10],
           t[n * 9 / 10]);
}

static void *second_thread(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    for (;;) pause();
    return NULL;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = calloc(n + 1, 1);
    if (b && fread(b, 1, n, f) != (size_t)n) b[0] = 0;
    fclose(f);
    return b;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: sync_cost THREADS SPIN_PTX ITERS\n");
        return 2;
    }
    int threads = atoi(argv[1]);
    unsigned iters = (unsigned)atoi(argv[3]);
    CUdevice dev;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate_v2(&ctx, 0, dev)) {
        fprintf(stderr, "no GPU\n");
        return 1;
    }
    if (threads > 1) {
        pthread_t th;
        pthread_create(&th, NULL, second_thread, NULL);
        usleep(100000);
    }
    CUdeviceptr p;
    static char host[4096];
    cuMemAlloc_v2(&p, sizeof host);
    for (int i = 0; i < CALLS; i++) {
        double a = now_us();
        cuCtxSynchronize();
        t[i] = now_us() - a;
    }
    report("idle cuCtxSynchronize", CALLS);
    for (int i = 0; i < CALLS; i++) {
        double a = now_us();
        cuMemcpyDtoH_v2(host, p, sizeof host);
        t[i] = now_us() - a;
    }
    report("4 KiB cuMemcpyDtoH", CALLS);
    for (int i = 0; i < CALLS; i++) {
        double a = now_us();
        cuMemsetD32_v2(p, (unsigned)i, sizeof host / 4);
        t[i] = now_us() - a;
    }
    report("4 KiB cuMemsetD32", CALLS);
    CUdeviceptr q;
    cuMemAlloc_v2(&q, sizeof host);
    for (int i = 0; i < CALLS; i++) {
        double a = now_us();
        cuMemcpyDtoD_v2(q, p, sizeof host);
        t[i] = now_us() - a;
    }
    report("4 KiB cuMemcpyDtoD", CALLS);
    for (int i = 0; i < CALLS; i++) {
        double a = now_us();
        CUdeviceptr r;
        cuMemAlloc_v2(&r, sizeof host);
        cuMemcpyDtoH_v2(host, r, sizeof host);
        cuMemFree_v2(r);
        t[i] = now_us() - a;
    }
    report("cuMemAlloc + 4 KiB DtoH + cuMemFree", CALLS);
    CUmodule m;
    CUfunction f;
    char *ptx = read_file(argv[2]);
    if (!ptx || cuModuleLoadData(&m, ptx) || cuModuleGetFunction(&f, m, "spin")) {
        fprintf(stderr, "cannot load %s\n", argv[2]);
        return 1;
    }
    void *args[] = {&p, &iters};
    for (int i = 0; i < KERNELS; i++) {
        double a = now_us();
        cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL);
        cuStreamSynchronize(NULL);
        t[i] = now_us() - a;
    }
    report("spin kernel + cuStreamSynchronize", KERNELS);
    return 0;
}
