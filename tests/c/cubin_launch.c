/*
 * A cubin (SASS, from ptxas) on the simulated GPU, which runs PTX: the module loads with its
 * kernel known (libraries that look their kernels up start), and a launch of it fails at once
 * with CUDA_ERROR_NO_BINARY_FOR_GPU, as CUDA refuses a kernel without an image: directly, as a
 * graph's kernel node and inside a stream capture, leaving nothing pending that a later call
 * would trip on. Copies go on.
 *
 * Usage: cubin_launch CUBIN (an sm_80 cubin of tests/kernels/ptx/saxpy.sm_80.ptx).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUgraph, *CUgraphNode;
typedef struct {
    CUfunction func;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams, **extra;
} CUDA_KERNEL_NODE_PARAMS;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuFuncGetAttribute(int *, int, CUfunction);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuCtxSynchronize(void);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphAddKernelNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphDestroy(CUgraph);

enum { N = 256, NO_BINARY = 209, PARAMS = 4 };

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: cubin_launch CUBIN\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    static unsigned char image[1 << 20];
    size_t len = fread(image, 1, sizeof image, f);
    fclose(f);
    expect("an ELF image was read", len > 4 && !memcmp(image, "\x7f" "ELF", 4));

    CUdevice dev;
    CUcontext ctx;
    check("cuInit", cuInit(0), 0);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), 0);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), 0);
    CUmodule m;
    check("the cubin loads", cuModuleLoadData(&m, image), 0);
    CUfunction saxpy;
    check("its kernel is known", cuModuleGetFunction(&saxpy, m, "saxpy"), 0);
    int max_threads = 0;
    check("and has attributes", cuFuncGetAttribute(&max_threads, 0, saxpy), 0);
    expect("a thread limit", max_threads > 0);

    float hx[N], hy[N], back[N];
    for (int i = 0; i < N; i++) {
        hx[i] = (float)i;
        hy[i] = 1.0f;
    }
    CUdeviceptr x, y;
    cuMemAlloc_v2(&x, sizeof hx);
    cuMemAlloc_v2(&y, sizeof hy);
    cuMemcpyHtoD_v2(x, hx, sizeof hx);
    cuMemcpyHtoD_v2(y, hy, sizeof hy);
    unsigned n = N;
    float a = 2.0f;
    void *args[PARAMS] = {&n, &a, &x, &y};
    check("a launch is refused at once",
          cuLaunchKernel(saxpy, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL), NO_BINARY);
    CUstream s;
    cuStreamCreate(&s, 0);
    check("... on a stream too", cuLaunchKernel(saxpy, 1, 1, 1, N, 1, 1, 0, s, args, NULL),
          NO_BINARY);
    check("nothing is left to fail later", cuStreamSynchronize(s), 0);
    check("... in the context either", cuCtxSynchronize(), 0);

    CUgraph g;
    cuGraphCreate(&g, 0);
    CUDA_KERNEL_NODE_PARAMS kp = {saxpy, 1, 1, 1, N, 1, 1, 0, args, NULL};
    CUgraphNode node;
    check("a graph's kernel node of it is refused", cuGraphAddKernelNode(&node, g, NULL, 0, &kp),
          NO_BINARY);
    cuGraphDestroy(g);

    check("a capture begins", cuStreamBeginCapture_v2(s, 2 /* relaxed */), 0);
    check("a captured launch is refused",
          cuLaunchKernel(saxpy, 1, 1, 1, N, 1, 1, 0, s, args, NULL), NO_BINARY);
    CUgraph captured = NULL;
    CUresult end = cuStreamEndCapture(s, &captured);
    expect("the capture ends (or reports the failed launch)", end == 0 || end == 901);
    if (captured) cuGraphDestroy(captured);

    check("copies go on", cuMemcpyDtoH_v2(back, y, sizeof back), 0);
    expect("y was not touched", back[0] == 1.0f && back[N - 1] == 1.0f);
    printf("# cubin_launch: %d failed\n", failures);
    return failures;
}
