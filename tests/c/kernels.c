/*
 * Kernel-level behaviour of vgpu's libcuda.so.1, from a plain C program:
 *
 *   kernels fault OOB_PTX VECADD_PTX   a kernel fault poisons its context only
 *   kernels badptx                      unsupported PTX fails at load, with a log
 *   kernels globals SLICE_BYTES         module globals are charged to the slice
 *   kernels steal VECADD_PTX PTR        a kernel cannot touch another VM's memory
 *
 * Prints "ok <what>" / "FAIL <what>"; the exit status is the failure count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction;

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleLoadDataEx(CUmodule *, const void *, unsigned, int *, void **);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
CUresult cuFuncGetAttribute(int *, int, CUfunction);

static int failures;

static void check(const char *what, CUresult got, CUresult want) {
    if (got == want) {
        printf("ok %s\n", what);
    } else {
        printf("FAIL %s: got %d, want %d\n", what, got, want);
        failures++;
    }
    fflush(stdout);
}

static void expect(const char *what, int cond) {
    printf("%s %s\n", cond ? "ok" : "FAIL", what);
    if (!cond) failures++;
    fflush(stdout);
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(100); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (fread(b, 1, n, f) != (size_t)n) exit(100);
    b[n] = 0;
    fclose(f);
    return b;
}

static int vector_add(const char *ptx, int n) {
    CUmodule m;
    CUfunction f;
    if (cuModuleLoadData(&m, ptx) || cuModuleGetFunction(&f, m, "vector_add")) return -1;
    size_t bytes = n * sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    for (int i = 0; i < n; i++) { a[i] = i; b[i] = 2 * i; }
    CUdeviceptr da, db, dc;
    if (cuMemAlloc_v2(&da, bytes) || cuMemAlloc_v2(&db, bytes) || cuMemAlloc_v2(&dc, bytes)) return -1;
    cuMemcpyHtoD_v2(da, a, bytes);
    cuMemcpyHtoD_v2(db, b, bytes);
    void *p[] = {&da, &db, &dc, &n};
    if (cuLaunchKernel(f, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, p, NULL)) return -1;
    if (cuMemcpyDtoH_v2(c, dc, bytes)) return -1;
    int bad = 0;
    for (int i = 0; i < n; i++) bad += c[i] != 3.0f * i;
    cuMemFree_v2(da); cuMemFree_v2(db); cuMemFree_v2(dc);
    cuModuleUnload(m);
    free(a); free(b); free(c);
    return bad;
}

static int fault(const char *oob_path, const char *vec_path) {
    char *oob = read_file(oob_path), *vec = read_file(vec_path);
    CUcontext bad, other;
    check("cuInit", cuInit(0), 0);
    check("context A", cuCtxCreate_v2(&bad, 0, 0), 0);
    CUmodule m;
    CUfunction f;
    check("load oob module", cuModuleLoadData(&m, oob), 0);
    check("get oob_write", cuModuleGetFunction(&f, m, "oob_write"), 0);
    CUdeviceptr d;
    check("alloc", cuMemAlloc_v2(&d, 4096), 0);
    long long offset = 1LL << 40;
    int value = 7;
    void *p[] = {&d, &offset, &value};
    check("launch is accepted (asynchronous)", cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, p, NULL), 0);
    check("the fault surfaces at synchronize", cuCtxSynchronize(), 700);
    check("the context stays poisoned", cuMemAlloc_v2(&d, 16), 700);
    check("destroying the poisoned context works", cuCtxDestroy_v2(bad), 0);
    check("a new context", cuCtxCreate_v2(&other, 0, 0), 0);
    expect("a new context runs kernels correctly", vector_add(vec, 1000) == 0);
    return failures;
}

static int badptx(void) {
    const char *ptx =
        ".version 8.0\n.target sm_80\n.address_size 64\n"
        ".visible .entry k(.param .u64 p)\n{\n"
        "  .reg .b32 %r<4>;\n"
        "  frobnicate.b32 %r1, %r2;\n"
        "  ret;\n}\n";
    CUcontext c;
    check("cuInit", cuInit(0), 0);
    check("context", cuCtxCreate_v2(&c, 0, 0), 0);
    char log[512] = {0};
    int opts[] = {5 /* CU_JIT_ERROR_LOG_BUFFER */, 6 /* ..._SIZE_BYTES */};
    void *vals[] = {log, (void *)(size_t)sizeof log};
    CUmodule m;
    CUresult r = cuModuleLoadDataEx(&m, ptx, 2, opts, vals);
    expect("unsupported PTX is refused at load", r == 801 || r == 218);
    printf("log: %s\n", log);
    expect("the log names the instruction", strstr(log, "frobnicate") != NULL);
    expect("the log names the line", strstr(log, "line 7") != NULL);
    check("garbage is refused", cuModuleLoadData(&m, "this is not ptx"), 218);
    return failures;
}

static int globals(size_t slice) {
    /* A module with an 8 MiB __device__ array and a 4-byte __constant__. */
    const char *ptx =
        ".version 8.0\n.target sm_80\n.address_size 64\n"
        ".visible .global .align 4 .b8 big[8388608];\n"
        ".visible .const .align 4 .u32 answer = 42;\n"
        ".visible .entry touch(.param .u32 v)\n{\n"
        "  .reg .b32 %r<3>;\n  .reg .b64 %rd<3>;\n"
        "  ld.param.u32 %r1, [v];\n  mov.u64 %rd1, big;\n  ld.const.u32 %r2, [answer];\n"
        "  add.s32 %r1, %r1, %r2;\n  st.global.u32 [%rd1+4], %r1;\n  ret;\n}\n";
    CUcontext c;
    size_t free0, free1, total;
    check("cuInit", cuInit(0), 0);
    check("context", cuCtxCreate_v2(&c, 0, 0), 0);
    check("info", cuMemGetInfo_v2(&free0, &total), 0);
    CUmodule m;
    check("load", cuModuleLoadData(&m, ptx), 0);
    check("info", cuMemGetInfo_v2(&free1, &total), 0);
    expect("globals are charged to the slice", free0 - free1 >= (8u << 20));
    CUdeviceptr g, k;
    size_t gs = 0, ks = 0;
    check("cuModuleGetGlobal big", cuModuleGetGlobal_v2(&g, &gs, m, "big"), 0);
    check("cuModuleGetGlobal answer", cuModuleGetGlobal_v2(&k, &ks, m, "answer"), 0);
    expect("global sizes", gs == (8u << 20) && ks == 4);
    unsigned v = 0;
    check("read the initialised constant", cuMemcpyDtoH_v2(&v, k, 4), 0);
    expect("constant initialiser", v == 42);
    CUfunction f;
    check("get touch", cuModuleGetFunction(&f, m, "touch"), 0);
    unsigned arg = 100;
    void *p[] = {&arg};
    check("launch", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, p, NULL), 0);
    check("read the global the kernel wrote", cuMemcpyDtoH_v2(&v, g + 4, 4), 0);
    expect("kernel wrote 142", v == 142);
    check("unknown global", cuModuleGetGlobal_v2(&g, &gs, m, "nope"), 500);
    check("unknown kernel", cuModuleGetFunction(&f, m, "nope"), 500);
    /* Fill the slice, then a second copy of the module does not fit. */
    CUdeviceptr fill;
    check("fill the rest of the slice", cuMemAlloc_v2(&fill, free1 - (1u << 20)), 0);
    CUmodule m2;
    check("a module whose globals do not fit is refused", cuModuleLoadData(&m2, ptx), 2);
    check("unload", cuModuleUnload(m), 0);
    check("info", cuMemGetInfo_v2(&free1, &total), 0);
    expect("unloading returns the globals' memory", free1 >= (8u << 20));
    check("now it fits", cuModuleLoadData(&m2, ptx), 0);
    (void)slice;
    return failures;
}

static int steal(const char *vec_path, CUdeviceptr foreign) {
    /* vector_add's output pointer aimed at another VM's allocation. */
    char *ptx = read_file(vec_path);
    CUcontext c;
    CUmodule m;
    CUfunction f;
    check("cuInit", cuInit(0), 0);
    check("context", cuCtxCreate_v2(&c, 0, 0), 0);
    check("load", cuModuleLoadData(&m, ptx), 0);
    check("get", cuModuleGetFunction(&f, m, "vector_add"), 0);
    CUdeviceptr a;
    check("alloc", cuMemAlloc_v2(&a, 4096), 0);
    int n = 256;
    void *p[] = {&a, &a, &foreign, &n};
    check("launch", cuLaunchKernel(f, 2, 1, 1, 128, 1, 1, 0, NULL, p, NULL), 0);
    check("writing another VM's memory faults", cuCtxSynchronize(), 700);
    return failures;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "fault") && argc > 3) return fault(argv[2], argv[3]);
    if (!strcmp(mode, "badptx")) return badptx();
    if (!strcmp(mode, "globals") && argc > 2) return globals(strtoull(argv[2], 0, 0));
    if (!strcmp(mode, "steal") && argc > 3) return steal(argv[2], strtoull(argv[3], 0, 0));
    fprintf(stderr, "usage: kernels fault OOB VEC | badptx | globals SLICE | steal VEC PTR\n");
    return 100;
}
