/*
 * The checks the library test programs (cuBLAS, cuFFT, cuSOLVER) print: "ok <what>" or
 * "FAIL <what> (status N)" with the library's status, counted in `failures` (the programs' exit
 * status). Include after <stdio.h>.
 */
#ifndef VGPU_TESTS_C_LIB_CHECK_H
#define VGPU_TESTS_C_LIB_CHECK_H

static int failures;

static void expect(const char *what, int cond, int code) {
    if (cond) {
        printf("ok %s\n", what);
    } else {
        printf("FAIL %s (status %d)\n", what, code);
        failures++;
    }
    fflush(stdout);
}

#endif
