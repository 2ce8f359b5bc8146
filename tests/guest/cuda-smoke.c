/*
 * cuda-smoke: a minimal CUDA driver-API client for vgpu guests.
 *
 * It dlopen()s libcuda.so.1 (the vgpu guest shim, or any other driver) like a
 * real application linked with -lcuda would find it, and runs:
 *   cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetName,
 *   cuDeviceTotalMem, cuCtxCreate, cuMemGetInfo, cuMemAlloc(BYTES),
 *   cuMemcpyHtoD + cuMemcpyDtoH (checked round trip), cuMemFree, cuCtxDestroy.
 * No CUDA headers are needed: the few types and prototypes are declared here
 * with the driver API's ABI (cuda.h, API version 12).
 *
 *   cuda-smoke [--lib PATH] [--alloc BYTES] [--expect-alloc CODE]
 *     --lib PATH          library to load (default: libcuda.so.1 via the loader)
 *     --alloc BYTES       size of the test allocation (default 1 MiB)
 *     --expect-alloc CODE the CUresult cuMemAlloc must return (default 0); when
 *                         it is not 0 the copy steps are skipped
 *
 * Output lines (for the harness to match):
 *   CUDA-SMOKE <call> = <code> <name>
 *   CUDA-SMOKE driver_version=12040 devices=1
 *   CUDA-SMOKE device name="vgpu sim" total_mem=2147483648
 *   CUDA-SMOKE mem_info free=... total=...
 *   CUDA-SMOKE ok                    (exit 0)
 *   CUDA-SMOKE FAIL <what>           (exit 1: a call returned the wrong CUresult,
 *                                     or the copied data came back different)
 *   CUDA-SMOKE NO-DRIVER <dlerror>   (exit 3: the library or a symbol is missing)
 * Exit 2 is a usage error.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFIX "CUDA-SMOKE"
#define DEFAULT_LIB "libcuda.so.1"
#define DEFAULT_ALLOC_BYTES (1UL << 20)
#define NAME_LEN 256
#define EXIT_FAIL 1
#define EXIT_USAGE 2
#define EXIT_NO_DRIVER 3

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static void *lib;

static void *sym(const char *name)
{
    void *p = dlsym(lib, name);
    if (p == NULL) {
        printf(PREFIX " NO-DRIVER missing symbol %s\n", name);
        exit(EXIT_NO_DRIVER);
    }
    return p;
}

static CUresult (*p_cuGetErrorName)(CUresult, const char **);

static const char *err_name(CUresult r)
{
    const char *name = NULL;
    if (p_cuGetErrorName == NULL || p_cuGetErrorName(r, &name) != 0 || name == NULL)
        return "?";
    return name;
}

/* Prints the result of a call and fails unless it is the expected one. */
static void check(const char *call, CUresult got, CUresult want)
{
    printf(PREFIX " %s = %d %s\n", call, got, err_name(got));
    if (got != want) {
        printf(PREFIX " FAIL %s returned %d (%s), expected %d (%s)\n", call, got, err_name(got), want,
               err_name(want));
        exit(EXIT_FAIL);
    }
}

static int parse_num(const char *s, unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    if (s == NULL || *s == '\0' || *s == '-')
        return -1;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return (errno != 0 || *end != '\0' || *out > max) ? -1 : 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: cuda-smoke [--lib PATH] [--alloc BYTES] [--expect-alloc CODE]\n");
    return EXIT_USAGE;
}

int main(int argc, char **argv)
{
    const char *lib_path = DEFAULT_LIB;
    unsigned long long alloc = DEFAULT_ALLOC_BYTES, expect_alloc = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--lib") == 0 && i + 1 < argc) {
            lib_path = argv[++i];
        } else if (strcmp(argv[i], "--alloc") == 0 && i + 1 < argc) {
            if (parse_num(argv[++i], SIZE_MAX, &alloc) || alloc == 0)
                return usage();
        } else if (strcmp(argv[i], "--expect-alloc") == 0 && i + 1 < argc) {
            if (parse_num(argv[++i], INT32_MAX, &expect_alloc))
                return usage();
        } else {
            return usage();
        }
    }

    lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf(PREFIX " NO-DRIVER %s\n", dlerror());
        return EXIT_NO_DRIVER;
    }
    CUresult (*cuInit)(unsigned int) = sym("cuInit");
    CUresult (*cuDriverGetVersion)(int *) = sym("cuDriverGetVersion");
    CUresult (*cuDeviceGetCount)(int *) = sym("cuDeviceGetCount");
    CUresult (*cuDeviceGet)(CUdevice *, int) = sym("cuDeviceGet");
    CUresult (*cuDeviceGetName)(char *, int, CUdevice) = sym("cuDeviceGetName");
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice) = sym("cuDeviceTotalMem_v2");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned int, CUdevice) = sym("cuCtxCreate_v2");
    CUresult (*cuCtxDestroy)(CUcontext) = sym("cuCtxDestroy_v2");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = sym("cuMemGetInfo_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = sym("cuMemAlloc_v2");
    CUresult (*cuMemFree)(CUdeviceptr) = sym("cuMemFree_v2");
    CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t) = sym("cuMemcpyHtoD_v2");
    CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t) = sym("cuMemcpyDtoH_v2");
    p_cuGetErrorName = dlsym(lib, "cuGetErrorName");

    int version = 0, count = 0;
    CUdevice dev = 0;
    char name[NAME_LEN] = {0};
    size_t total = 0, free_mem = 0, total_mem = 0;
    CUcontext ctx = NULL;
    CUdeviceptr dptr = 0;

    check("cuInit", cuInit(0), 0);
    check("cuDriverGetVersion", cuDriverGetVersion(&version), 0);
    check("cuDeviceGetCount", cuDeviceGetCount(&count), 0);
    printf(PREFIX " driver_version=%d devices=%d\n", version, count);
    if (count < 1) {
        printf(PREFIX " FAIL no CUDA device\n");
        return EXIT_FAIL;
    }
    check("cuDeviceGet", cuDeviceGet(&dev, 0), 0);
    check("cuDeviceGetName", cuDeviceGetName(name, NAME_LEN - 1, dev), 0);
    check("cuDeviceTotalMem", cuDeviceTotalMem(&total, dev), 0);
    printf(PREFIX " device name=\"%s\" total_mem=%zu\n", name, total);
    check("cuCtxCreate", cuCtxCreate(&ctx, 0, dev), 0);
    check("cuMemGetInfo", cuMemGetInfo(&free_mem, &total_mem), 0);
    printf(PREFIX " mem_info free=%zu total=%zu\n", free_mem, total_mem);

    check("cuMemAlloc", cuMemAlloc(&dptr, (size_t)alloc), (CUresult)expect_alloc);
    if (expect_alloc == 0) {
        unsigned char *out = malloc((size_t)alloc), *in = malloc((size_t)alloc);
        if (out == NULL || in == NULL) {
            printf(PREFIX " FAIL host malloc of %llu bytes\n", alloc);
            return EXIT_FAIL;
        }
        for (size_t i = 0; i < (size_t)alloc; i++)
            out[i] = (unsigned char)((i * 13U + 5U) & 0xffU);
        memset(in, 0, (size_t)alloc);
        check("cuMemcpyHtoD", cuMemcpyHtoD(dptr, out, (size_t)alloc), 0);
        check("cuMemcpyDtoH", cuMemcpyDtoH(in, dptr, (size_t)alloc), 0);
        if (memcmp(in, out, (size_t)alloc) != 0) {
            printf(PREFIX " FAIL device memory round trip returned different bytes\n");
            return EXIT_FAIL;
        }
        check("cuMemFree", cuMemFree(dptr), 0);
        free(out);
        free(in);
    }
    check("cuCtxDestroy", cuCtxDestroy(ctx), 0);
    printf(PREFIX " ok\n");
    return 0;
}
