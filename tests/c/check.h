/*
 * The checks the driver API test programs print: "ok <what>" or "FAIL <what>: ...", counted in
 * `failures` (the programs' exit status). Include after <stdio.h>.
 */
#ifndef VGPU_TESTS_C_CHECK_H
#define VGPU_TESTS_C_CHECK_H

int cuGetErrorName(int, const char **);

static int failures;

/* A call's CUresult against the one wanted. */
static void check(const char *what, int got, int want) {
    if (got == want) {
        printf("ok %s\n", what);
    } else {
        const char *name = "?";
        cuGetErrorName(got, &name);
        printf("FAIL %s: got %d (%s), want %d\n", what, got, name, want);
        failures++;
    }
    fflush(stdout);
}

/* A condition that must hold. */
static void expect(const char *what, int cond) {
    printf(cond ? "ok %s\n" : "FAIL %s\n", what);
    if (!cond) failures++;
    fflush(stdout);
}

#endif
