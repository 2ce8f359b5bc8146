/*
 * Stream-ordered memory pools shared between processes of one VM
 * (cuMemPoolExportToShareableHandle, cuMemPoolImportFromShareableHandle,
 * cuMemPoolExportPointer, cuMemPoolImportPointer), from a plain C program against vgpu's
 * libcuda.so. The test harness (tests/ipc.rs) runs it several times. The exporter's pool file
 * descriptor reaches other processes as /proc/PID/fd/N (a new descriptor of the same memfd,
 * as SCM_RIGHTS would give); the pointer's 64-byte export data travels as hex:
 *
 *   pool_ipc export N         create a pool exportable as a POSIX fd, allocate N words from
 *                             it, fill word i with i, export the pool and the block, print
 *                             "pool PATH", "ptr HEX" and "holding"; on a line of stdin check
 *                             what the importer wrote (word 0 = MARK, word i = i + 1), free
 *                             the block (cuMemFreeAsync), synchronize, print "freed"; on
 *                             another line exit
 *   pool_ipc import PATH HEX N  import the pool and the block, check the imported pool cannot
 *                             allocate, read the block, run a kernel on it, write word 0,
 *                             print "holding"; on a line of stdin read it again (the exporter
 *                             freed it meanwhile) and free it (cuMemFreeAsync)
 *   pool_ipc hold PATH HEX    import the pool and the block, print "holding", wait (killed)
 *   pool_ipc open PATH CODE   import the pool, expecting CODE
 *   pool_ipc forged PATH      import the pool; forged export data is refused
 *
 * Prints "ok <what>" / "FAIL <what>"; the exit status is the failure count.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUmemoryPool;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int allocType, handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
typedef struct { unsigned char reserved[64]; } CUmemPoolPtrExportData;

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxSynchronize(void);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolExportToShareableHandle(void *, CUmemoryPool, int, unsigned long long);
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *, void *, int, unsigned long long);
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *, CUdeviceptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *, CUmemoryPool, CUmemPoolPtrExportData *);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuGetErrorName(CUresult, const char **);

#define CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE 17
#define CUDA_ERROR_INVALID_VALUE 1
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1
#define MARK 0xC0FFEEu

static const char *INC_PTX =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry inc(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %pr;\n"
    "  .reg .b32 %r<7>;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p];\n"
    "  ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x;\n"
    "  mov.u32 %r3, %ntid.x;\n"
    "  mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r5, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %pr, %r5, %r1;\n"
    "  @%pr bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n"
    "  mul.wide.u32 %rd3, %r5, 4;\n"
    "  add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r6, [%rd4];\n"
    "  add.s32 %r6, %r6, 1;\n"
    "  st.global.u32 [%rd4], %r6;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

static CUfunction inc_fn;

static void setup(void) {
    CUcontext ctx;
    CUmodule mod;
    if (cuInit(0) || cuCtxCreate_v2(&ctx, 0, 0) || cuModuleLoadData(&mod, INC_PTX) ||
        cuModuleGetFunction(&inc_fn, mod, "inc")) {
        printf("FAIL setup\n");
        exit(100);
    }
}

static void wait_line(void) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) exit(failures + 50);
}

static CUmemPoolPtrExportData parse(const char *hex) {
    CUmemPoolPtrExportData d;
    memset(&d, 0, sizeof d);
    for (int i = 0; i < 64 && hex[2 * i] && hex[2 * i + 1]; i++)
        sscanf(hex + 2 * i, "%2hhx", &d.reserved[i]);
    return d;
}

static unsigned *read_words(CUdeviceptr p, unsigned n) {
    unsigned *w = calloc(n, 4);
    check("read the shared block", cuMemcpyDtoH_v2(w, p, (size_t)n * 4), 0);
    return w;
}

static CUmemoryPool import_pool(const char *path, CUresult want) {
    int fd = open(path, O_RDONLY);
    expect("the exporter's pool descriptor opens", fd >= 0);
    CUmemoryPool pool = NULL;
    check("cuMemPoolImportFromShareableHandle",
          cuMemPoolImportFromShareableHandle(&pool, (void *)(uintptr_t)fd,
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          want);
    close(fd);
    return pool;
}

static void export_pool(unsigned n) {
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 0;
    CUmemoryPool plain = NULL, pool = NULL;
    check("cuMemPoolCreate without handle types", cuMemPoolCreate(&plain, &props), 0);
    int fd = -1;
    check("a pool without handle types is not exported",
          cuMemPoolExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          CUDA_ERROR_INVALID_VALUE);
    props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    check("cuMemPoolCreate exportable", cuMemPoolCreate(&pool, &props), 0);
    CUdeviceptr d = 0;
    check("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&d, (size_t)n * 4, pool, NULL), 0);
    unsigned *w = malloc((size_t)n * 4);
    for (unsigned i = 0; i < n; i++) w[i] = i;
    check("fill", cuMemcpyHtoD_v2(d, w, (size_t)n * 4), 0);
    check("cuMemPoolExportToShareableHandle",
          cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          0);
    expect("a file descriptor", fd >= 0);
    CUmemPoolPtrExportData data, again;
    check("cuMemPoolExportPointer", cuMemPoolExportPointer(&data, d), 0);
    check("cuMemPoolExportPointer again", cuMemPoolExportPointer(&again, d), 0);
    expect("one block has one export", !memcmp(&data, &again, sizeof data));
    int raw = 0;
    for (int i = 0; i + 8 <= 64; i++) raw |= !memcmp(data.reserved + i, &d, 8);
    expect("the export data does not carry the device address", !raw);
    printf("pool /proc/%d/fd/%d\nptr ", (int)getpid(), fd);
    for (int i = 0; i < 64; i++) printf("%02x", data.reserved[i]);
    printf("\nholding\n");
    fflush(stdout);
    wait_line();
    unsigned *r = read_words(d, n);
    int same = r[0] == MARK;
    for (unsigned i = 1; i < n; i++) same &= r[i] == i + 1;
    expect("the exporter sees the importer's kernel and copy", same);
    check("cuMemFreeAsync of the exported block", cuMemFreeAsync(d, NULL), 0);
    check("synchronize", cuStreamSynchronize(NULL), 0);
    check("its export is gone", cuMemPoolExportPointer(&again, d), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr e = 0;
    check("the pool allocates again", cuMemAllocFromPoolAsync(&e, (size_t)n * 4, pool, NULL), 0);
    expect("not the block another process holds", e != d);
    check("free it", cuMemFreeAsync(e, NULL), 0);
    check("synchronize again", cuStreamSynchronize(NULL), 0);
    printf("freed\n");
    fflush(stdout);
    wait_line();
}

static CUdeviceptr import_ptr(CUmemoryPool pool, const char *hex) {
    CUmemPoolPtrExportData data = parse(hex);
    CUdeviceptr p = 0;
    check("cuMemPoolImportPointer", cuMemPoolImportPointer(&p, pool, &data), 0);
    return p;
}

/* Imports the block, checks the exporter's data, runs a kernel and writes on it, then holds it
 * until told to go on; `keep` (the "hold" mode, whose process is killed) ends there. */
static void import_block(const char *path, const char *hex, unsigned n, int keep) {
    CUmemoryPool pool = import_pool(path, 0);
    CUdeviceptr none = 0;
    check("an imported pool cannot allocate",
          cuMemAllocFromPoolAsync(&none, 4096, pool, NULL), CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr p = import_ptr(pool, hex);
    CUdeviceptr q = import_ptr(pool, hex);
    expect("a second import gives the same address", q == p);
    check("free the second import", cuMemFree_v2(q), 0);
    CUmemoryPool owner = NULL;
    check("the block still names its pool after one of two frees",
          cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p), 0);
    expect("the imported pool", owner == pool);
    unsigned *r = read_words(p, n);
    int same = 1;
    for (unsigned i = 0; i < n; i++) same &= r[i] == i;
    expect("the importer reads what the exporter wrote", same);
    void *args[] = {&p, &n};
    check("a kernel on the imported block",
          cuLaunchKernel(inc_fn, (n + 127) / 128, 1, 1, 128, 1, 1, 0, NULL, args, NULL), 0);
    check("synchronize", cuCtxSynchronize(), 0);
    unsigned mark = MARK;
    check("write to the imported block", cuMemcpyHtoD_v2(p, &mark, 4), 0);
    printf("holding\n");
    fflush(stdout);
    wait_line();
    if (keep) return;
    r = read_words(p, n);
    same = r[0] == MARK;
    for (unsigned i = 1; i < n; i++) same &= r[i] == i + 1;
    expect("the block outlives its exporter's free", same);
    check("cuMemFreeAsync of the imported block", cuMemFreeAsync(p, NULL), 0);
    check("synchronize at the end", cuStreamSynchronize(NULL), 0);
}

int main(int argc, char **argv) {
    if (argc < 2) return 99;
    setup();
    if (!strcmp(argv[1], "export") && argc == 3) {
        export_pool((unsigned)atoi(argv[2]));
    } else if (!strcmp(argv[1], "import") && argc == 5) {
        import_block(argv[2], argv[3], (unsigned)atoi(argv[4]), 0);
    } else if (!strcmp(argv[1], "hold") && argc == 5) {
        import_block(argv[2], argv[3], (unsigned)atoi(argv[4]), 1);
    } else if (!strcmp(argv[1], "open") && argc == 4) {
        import_pool(argv[2], atoi(argv[3]));
    } else if (!strcmp(argv[1], "forged") && argc == 3) {
        CUmemoryPool pool = import_pool(argv[2], 0);
        CUmemPoolPtrExportData data;
        memset(&data, 0, sizeof data);
        memcpy(data.reserved, "VGPUPTR1", 8);
        for (int i = 8; i < 24; i++) data.reserved[i] = (unsigned char)(i * 37);
        CUdeviceptr p = 0;
        check("forged export data is refused", cuMemPoolImportPointer(&p, pool, &data),
              CUDA_ERROR_INVALID_VALUE);
        memset(&data, 0, sizeof data);
        check("export data not made by vgpu is refused", cuMemPoolImportPointer(&p, pool, &data),
              CUDA_ERROR_INVALID_VALUE);
    } else {
        return 99;
    }
    return failures;
}
