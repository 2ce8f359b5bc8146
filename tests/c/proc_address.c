/*
 * cuGetProcAddress for every name on standard input (one per line), for callers built against
 * the CUDA version given as the argument, with and without the per-thread default stream flag,
 * as cuda-python and NVIDIA's runtime resolve the driver. Prints "missing <name> (<flags>):
 * <CUresult>, status <status>" for each lookup that finds nothing, "# <n> names" at the end;
 * the exit status is the number of lookups that failed (at most 255).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;

CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

/* CU_GET_PROC_ADDRESS_DEFAULT, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM. */
static const unsigned long long FLAGS[] = {0, 1ULL << 1};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CUDA_VERSION < names\n", argv[0]);
        return 255;
    }
    int version = atoi(argv[1]);
    char name[256];
    int names = 0, failed = 0;
    while (fgets(name, sizeof name, stdin)) {
        name[strcspn(name, "\r\n")] = 0;
        if (!name[0]) continue;
        names++;
        for (unsigned i = 0; i < sizeof FLAGS / sizeof FLAGS[0]; i++) {
            void *fn = NULL;
            int status = -1;
            CUresult r = cuGetProcAddress_v2(name, &fn, version, FLAGS[i], &status);
            if (r != 0 || fn == NULL || status != 0) {
                printf("missing %s (flags %llu): %d, status %d\n", name, FLAGS[i], r, status);
                failed++;
            }
        }
    }
    printf("# %d names\n", names);
    return failed > 255 ? 255 : failed;
}
