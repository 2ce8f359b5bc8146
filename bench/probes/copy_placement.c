/*
 * copy_placement: how much a 16 MiB copy's speed depends on where its buffers land, with no vgpu
 * code involved. Copies 16 MiB from "guest RAM" (a hugetlb memfd, as QEMU's
 * memory-backend-memfd,hugetlb=on) into a freshly allocated 4 KiB-page buffer (the simulated
 * GPU's memory before it used huge pages) and into a buffer advised to use transparent huge pages
 * (MADV_HUGEPAGE, as the simulated GPU keeps allocations of 2 MiB and more now), and between two
 * malloc'd buffers (vgpu-bench's plain memcpy baseline) and two THP buffers (its huge-page
 * memcpy baseline), 32 times each, alternately, five rounds; prints the middle round (GB/s) and
 * the two guest-RAM copies' ratios to the plain memcpy. Run it several times: each run gets fresh
 * physical pages.
 *
 *   sysctl vm.nr_hugepages=64
 *   gcc -O2 bench/probes/copy_placement.c -o /tmp/copy_placement
 *   for i in $(seq 20); do /tmp/copy_placement; done
 *
 * docs/vgpu-device.md (Benchmark) reports what it showed on the development machine.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SIZE (16UL << 20)
#define GUEST_RAM (64UL << 20)
#define REPS 32
#define ROUNDS 5

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* SIZE bytes advised to use transparent huge pages, 2 MiB aligned, touched. */
static char *thp_buffer(char fill) {
    char *p = aligned_alloc(2UL << 20, SIZE);
    if (p) {
        madvise(p, SIZE, MADV_HUGEPAGE);
        memset(p, fill, SIZE);
    }
    return p;
}

/* GB/s of REPS copies of SIZE bytes from src to dst. */
static double rate(char *dst, const char *src) {
    double t = now();
    for (int i = 0; i < REPS; i++) {
        memcpy(dst, src, SIZE);
        __asm__ volatile("" : : "r"(dst) : "memory");
    }
    return SIZE * (double)REPS / (now() - t) / 1e9;
}

int main(void) {
    int fd = memfd_create("guest-ram", MFD_HUGETLB);
    if (fd < 0 || ftruncate(fd, GUEST_RAM) != 0) {
        perror("hugetlb memfd (reserve huge pages: sysctl vm.nr_hugepages=64)");
        return 1;
    }
    char *guest = mmap(NULL, GUEST_RAM, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    char *a = malloc(SIZE), *b = malloc(SIZE), *gpu = aligned_alloc(4096, SIZE);
    char *gpu_thp = thp_buffer(0), *ha = thp_buffer(4), *hb = thp_buffer(5);
    if (guest == MAP_FAILED || !a || !b || !gpu || !gpu_thp || !ha || !hb) {
        perror("allocating the buffers");
        return 1;
    }
    memset(guest, 1, GUEST_RAM);
    memset(a, 2, SIZE);
    memset(b, 3, SIZE);
    memset(gpu, 0, SIZE);
    double m[ROUNDS], h[ROUNDS], g[ROUNDS], t[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        m[r] = rate(b, a);
        h[r] = rate(hb, ha);
        g[r] = rate(gpu, guest);
        t[r] = rate(gpu_thp, guest);
    }
    int c = ROUNDS / 2;
    printf("memcpy %.1f | huge-page memcpy %.1f | guest pages -> 4 KiB pages %.1f (%.0f %%) | "
           "guest pages -> THP %.1f (%.0f %%)\n",
           m[c], h[c], g[c], 100 * g[c] / m[c], t[c], 100 * t[c] / m[c]);
    return 0;
}
