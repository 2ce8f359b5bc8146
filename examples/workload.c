/*
 * vgpu demo workload: an ordinary CUDA driver-API program.
 *
 *   workload MATMUL_PTX [SIZE] [ROUNDS]
 *
 * It prints the GPU it sees and its memory slice, runs a tiled matrix
 * multiply (NVRTC-compiled PTX) ROUNDS times and checks the result against
 * the CPU, then allocates until the slice is exhausted to show the hard limit.
 * It links against libcuda.so.1 like any CUDA program; under vgpu that is the
 * guest shim. Exit status 0 means every check passed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction;

CUresult cuInit(unsigned int);
CUresult cuDeviceGetName(char *, int, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
CUresult cuCtxSynchronize(void);
CUresult cuGetErrorName(CUresult, const char **);

#define CHECK(call)                                                            \
    do {                                                                       \
        CUresult r_ = (call);                                                  \
        if (r_ != 0) {                                                         \
            const char *n_ = "?";                                              \
            cuGetErrorName(r_, &n_);                                           \
            fprintf(stderr, "workload: %s failed: %s (%d)\n", #call, n_, r_); \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (fread(b, 1, n, f) != (size_t)n) { fclose(f); free(b); return NULL; }
    b[n] = 0;
    fclose(f);
    return b;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MATMUL_PTX [SIZE] [ROUNDS]\n", argv[0]);
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 64;
    int rounds = argc > 3 ? atoi(argv[3]) : 3;
    char *ptx = read_file(argv[1]);
    if (!ptx) { perror(argv[1]); return 2; }

    char name[128];
    size_t free_b, total_b;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGetName(name, sizeof name, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    printf("gpu: %s, memory slice %zu MiB (%zu MiB free)\n", name, total_b >> 20, free_b >> 20);

    CUmodule mod;
    CUfunction fn;
    CHECK(cuModuleLoadData(&mod, ptx));
    CHECK(cuModuleGetFunction(&fn, mod, "matmul_tiled"));

    size_t bytes = (size_t)n * n * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes), *ref = malloc(bytes);
    srand(7);
    for (int i = 0; i < n * n; i++) {
        a[i] = (float)(rand() % 17) / 8.0f - 1.0f;
        b[i] = (float)(rand() % 13) / 6.0f - 1.0f;
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += (double)a[i * n + k] * b[k * n + j];
            ref[i * n + j] = (float)s;
        }
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc_v2(&da, bytes));
    CHECK(cuMemAlloc_v2(&db, bytes));
    CHECK(cuMemAlloc_v2(&dc, bytes));
    CHECK(cuMemcpyHtoD_v2(da, a, bytes));
    CHECK(cuMemcpyHtoD_v2(db, b, bytes));
    void *params[] = {&da, &db, &dc, &n, &n, &n};
    unsigned grid = (n + 15) / 16;
    double t0 = now();
    for (int r = 0; r < rounds; r++)
        CHECK(cuLaunchKernel(fn, grid, grid, 1, 16, 16, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    double dt = now() - t0;
    CHECK(cuMemcpyDtoH_v2(c, dc, bytes));
    double max_err = 0;
    for (int i = 0; i < n * n; i++) {
        double e = fabs((double)c[i] - ref[i]);
        if (e > max_err) max_err = e;
    }
    int ok = max_err < 1e-3 * n;
    printf("matmul %dx%d: %d kernels in %.3f s, max error %.2g: %s\n", n, n, rounds, dt, max_err,
           ok ? "result OK" : "RESULT WRONG");

    /* Show the hard limit: allocate 16 MiB blocks until the slice says no. */
    CUdeviceptr blocks[4096];
    int nb = 0;
    CUresult r = 0;
    while (nb < 4096 && (r = cuMemAlloc_v2(&blocks[nb], 16u << 20)) == 0) nb++;
    const char *rn = "?";
    cuGetErrorName(r, &rn);
    printf("allocated %d MiB more before %s: the slice is a hard limit\n", nb * 16, rn);
    for (int i = 0; i < nb; i++) CHECK(cuMemFree_v2(blocks[i]));
    CHECK(cuMemFree_v2(da));
    CHECK(cuMemFree_v2(db));
    CHECK(cuMemFree_v2(dc));
    return ok && r == 2 ? 0 : 1;
}
