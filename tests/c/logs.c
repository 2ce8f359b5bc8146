/*
 * CUDA's error log (cuLogs*, CUDA 12.9) on vgpu: a failed call leaves a message with its function,
 * its result and vgpud's reason, which a program reads with cuLogsDumpToMemory or
 * cuLogsDumpToFile from an advancing iterator, or receives through a registered callback.
 *
 *   logs SLICE_BYTES DUMP_FILE
 *
 * Prints "ok <what>" or "FAIL <what>"; the exit status is the number of failures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUlogsCallbackHandle;
typedef unsigned int CUlogIterator;
typedef void (*CUlogsCallback)(void *, int, char *, size_t);

CUresult cuInit(unsigned int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, int);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuLogsRegisterCallback(CUlogsCallback, void *, CUlogsCallbackHandle *);
CUresult cuLogsUnregisterCallback(CUlogsCallbackHandle);
CUresult cuLogsCurrent(CUlogIterator *, unsigned int);
CUresult cuLogsDumpToFile(CUlogIterator *, const char *, unsigned int);
CUresult cuLogsDumpToMemory(CUlogIterator *, char *, size_t *, unsigned int);

#define INVALID_VALUE 1
#define OUT_OF_MEMORY 2
#define NOT_FOUND 500
#define VERSION_NOT_SUFFICIENT 2
#define CU_LOG_LEVEL_ERROR 0
#define BUF 8192

struct seen {
    int calls;
    int level;
    char last[512];
};

static void on_log(void *data, int level, char *message, size_t length) {
    struct seen *s = data;
    s->calls++;
    s->level = level;
    snprintf(s->last, sizeof s->last, "%.*s", (int)length, message);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: logs SLICE_BYTES DUMP_FILE\n");
        return 2;
    }
    size_t slice = strtoull(argv[1], NULL, 10);
    void *fn = NULL;
    int found = -1;
    check("cuGetProcAddress: cuLogsDumpToMemory for CUDA 12.9",
          cuGetProcAddress_v2("cuLogsDumpToMemory", &fn, 12090, 0, &found), 0);
    expect("... is the exported function", found == 0 && fn == (void *)cuLogsDumpToMemory);
    check("cuGetProcAddress: for CUDA 12.8 callers",
          cuGetProcAddress_v2("cuLogsDumpToMemory", &fn, 12080, 0, &found), NOT_FOUND);
    expect("... a version not sufficient", found == VERSION_NOT_SUFFICIENT);

    CUcontext ctx;
    check("cuInit", cuInit(0), 0);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, 0), 0);

    CUlogIterator it = 0;
    check("cuLogsCurrent with flags", cuLogsCurrent(&it, 1), INVALID_VALUE);
    check("cuLogsCurrent", cuLogsCurrent(&it, 0), 0);
    CUlogIterator start = it;
    struct seen seen = {0};
    CUlogsCallbackHandle h = NULL;
    check("cuLogsRegisterCallback without a function", cuLogsRegisterCallback(NULL, &seen, &h),
          INVALID_VALUE);
    check("cuLogsRegisterCallback", cuLogsRegisterCallback(on_log, &seen, &h), 0);
    expect("... a handle", h != NULL);
    /* The failed registration above left its own message; start after it. */
    check("cuLogsCurrent", cuLogsCurrent(&it, 0), 0);
    start = it;

    CUdeviceptr p;
    check("an allocation past the slice", cuMemAlloc_v2(&p, 2 * slice), OUT_OF_MEMORY);
    expect("the callback got the message", seen.calls == 1 && seen.level == CU_LOG_LEVEL_ERROR);
    printf("callback: %s\n", seen.last);
    expect("... naming the call and its result",
           strstr(seen.last, "[cuMemAlloc_v2] CUDA_ERROR_OUT_OF_MEMORY (2)") != NULL);
    expect("... with vgpud's reason", strstr(seen.last, "memory slice") != NULL);

    char buf[BUF];
    size_t size = sizeof buf;
    check("cuLogsDumpToMemory", cuLogsDumpToMemory(&it, buf, &size, 0), 0);
    printf("dump: %s", buf);
    expect("the dump holds the message", strstr(buf, seen.last) != NULL);
    expect("... its size is the text's", size == strlen(buf));
    expect("... and the iterator moved on", it != start);
    size = sizeof buf;
    check("nothing new", cuLogsDumpToMemory(&it, buf, &size, 0), 0);
    expect("... is an empty dump", size == 0);

    check("freeing a pointer that is not an allocation", cuMemFree_v2(0xdead0000ull),
          INVALID_VALUE);
    expect("the callback got that too", seen.calls == 2 && strstr(seen.last, "[cuMemFree_v2]"));
    size = 8;
    check("a buffer too small for the newest message", cuLogsDumpToMemory(&it, buf, &size, 0),
          INVALID_VALUE);
    expect("... says 0 bytes", size == 0);
    size = sizeof buf;
    check("cuLogsDumpToMemory with flags", cuLogsDumpToMemory(&it, buf, &size, 1), INVALID_VALUE);
    size = sizeof buf;
    check("cuLogsDumpToMemory with a NULL buffer", cuLogsDumpToMemory(&it, NULL, &size, 0),
          INVALID_VALUE);

    check("cuLogsUnregisterCallback", cuLogsUnregisterCallback(h), 0);
    check("... only once", cuLogsUnregisterCallback(h), INVALID_VALUE);
    int calls = seen.calls;
    check("another failure", cuMemAlloc_v2(&p, 0), INVALID_VALUE);
    expect("reaches no callback once unregistered", seen.calls == calls);

    check("cuLogsDumpToFile of everything", cuLogsDumpToFile(NULL, argv[2], 0), 0);
    FILE *f = fopen(argv[2], "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    expect("the file has every message",
           strstr(buf, "[cuMemAlloc_v2] CUDA_ERROR_OUT_OF_MEMORY") &&
               strstr(buf, "[cuMemFree_v2] CUDA_ERROR_INVALID_VALUE") &&
               strstr(buf, "[cuLogsUnregisterCallback]"));
    check("cuLogsDumpToFile to a directory that is not there",
          cuLogsDumpToFile(NULL, "/nonexistent/dir/log.txt", 0), INVALID_VALUE);
    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), 0);
    printf("%s\n", failures ? "FAILED" : "PASS");
    return failures;
}
