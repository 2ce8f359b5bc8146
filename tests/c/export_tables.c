/*
 * The driver's private tables, called directly through cuGetExportTable as NVIDIA's libraries call
 * them, against vgpu's libcuda.so:
 *
 * - the CUDA 13 tools table (21318c60): entry 51 names the stream a handle stands for in a
 *   context (a forged handle is refused), entry 39 gives that stream's number as
 *   cuStreamGetId does; cuBLAS's reductions key their result buffers on the two;
 * - a library that reads past the size a table declares gets an entry that refuses with
 *   CUDA_ERROR_NOT_SUPPORTED (and a warning naming it), not the next table's entries.
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is the number of failures.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUhandle;
typedef struct {
    unsigned char bytes[16];
} CUuuid;

enum {
    SUCCESS = 0,
    INVALID_HANDLE = 400,
    NOT_SUPPORTED = 801,
};

/* CU_STREAM_PER_THREAD. */
#define PER_THREAD ((CUhandle)0x2)

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUhandle *, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUhandle);
CUresult cuStreamCreate(CUhandle *, unsigned int);
CUresult cuStreamDestroy_v2(CUhandle);
CUresult cuStreamGetId(CUhandle, unsigned long long *);
CUresult cuGetExportTable(const void **, const CUuuid *);

typedef CUresult (*ContextStream)(CUhandle, CUhandle, CUhandle *, int);
typedef CUresult (*StreamNumber)(CUhandle, CUhandle, unsigned long long *);
typedef CUresult (*Unknown)(void);

static const CUuuid TOOLS_CONTEXT = {{0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6,
                                      0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2}};
static const CUuuid TOOLS_TLS = {{0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6,
                                  0xe7, 0x8a, 0x3a, 0xec, 0xdc}};

/* Entry 51 then entry 39 for `stream`, as cuBLAS calls them; the number, or 0 on a refusal. */
static unsigned long long number_of(const void *const *table, CUhandle ctx, CUhandle stream,
                                    const char *what) {
    CUhandle named = (CUhandle)0x5a5a;
    int per_thread = stream == PER_THREAD;
    char label[128];
    snprintf(label, sizeof label, "entry 51 names %s", what);
    CUresult r = ((ContextStream)table[51])(ctx, stream, &named, per_thread);
    check(label, r, SUCCESS);
    unsigned long long number = 0;
    snprintf(label, sizeof label, "entry 39 numbers %s", what);
    check(label, ((StreamNumber)table[39])(ctx, named, &number), SUCCESS);
    return number;
}

int main(void) {
    CUdevice dev;
    CUhandle ctx, stream;
    check("cuInit", cuInit(0), SUCCESS);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), SUCCESS);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), SUCCESS);
    check("cuStreamCreate", cuStreamCreate(&stream, 0), SUCCESS);

    const void *const *table = NULL;
    check("the CUDA 13 tools table", cuGetExportTable((const void **)&table, &TOOLS_CONTEXT),
          SUCCESS);
    expect("it declares 16 entries", (uintptr_t)table[0] == 16 * sizeof(void *));

    unsigned long long want = 0;
    cuStreamGetId(stream, &want);
    unsigned long long got = number_of(table, ctx, stream, "a created stream");
    expect("a created stream's number is cuStreamGetId's", got == want && want != 0);
    cuStreamGetId(NULL, &want);
    got = number_of(table, ctx, NULL, "the legacy default stream");
    expect("the default stream's number is cuStreamGetId's", got == want);
    cuStreamGetId(PER_THREAD, &want);
    got = number_of(table, ctx, PER_THREAD, "the per-thread stream");
    expect("the per-thread stream's number is cuStreamGetId's", got == want);
    unsigned long long legacy = 0;
    cuStreamGetId(NULL, &legacy);
    expect("streams have distinct numbers", want != legacy);

    CUhandle named = NULL;
    check("entry 51 refuses a forged stream",
          ((ContextStream)table[51])(ctx, (CUhandle)0xdead0000beefULL, &named, 0), INVALID_HANDLE);
    unsigned long long number = 0;
    check("entry 39 refuses a forged stream",
          ((StreamNumber)table[39])(ctx, (CUhandle)0xdead0000beefULL, &number), INVALID_HANDLE);

    /* Past a table's declared end: refusals, not a neighbour's entries. */
    check("an unknown entry past the CUDA 13 table's end refuses", ((Unknown)table[40])(),
          NOT_SUPPORTED);
    const void *const *tls = NULL;
    check("the tools TLS table", cuGetExportTable((const void **)&tls, &TOOLS_TLS), SUCCESS);
    expect("it declares 4 entries", (uintptr_t)tls[0] == 4 * sizeof(void *));
    check("an entry past the tools TLS table's end refuses", ((Unknown)tls[9])(), NOT_SUPPORTED);

    check("cuStreamDestroy", cuStreamDestroy_v2(stream), SUCCESS);
    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), SUCCESS);
    printf("# export_tables: %d failed\n", failures);
    return failures;
}
