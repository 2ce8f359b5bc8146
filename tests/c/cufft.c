/*
 * NVIDIA's cuFFT on vgpu (PyPI nvidia-cufft-cu12, linked against NVIDIA's
 * CUDA 12 runtime). cuFFT 11.4 builds each plan's kernels at run time as
 * PTX modules and walks their kernels through a private driver table, so
 * its transforms run on the simulated GPU as on a real one: every result is
 * checked against a DFT computed here on the CPU.
 *
 * Usage: cufft. Each check prints "ok <what>" or "FAIL <what>"; the exit
 * status is the number of failures.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cufft.h>

#include "lib_check.h"

/* The largest |a - b| over n complex values. */
static double max_error(const cufftComplex *a, const cufftComplex *b, int n) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double dx = fabs((double)a[i].x - b[i].x), dy = fabs((double)a[i].y - b[i].y);
        if (dx > worst) worst = dx;
        if (dy > worst) worst = dy;
    }
    return worst;
}

/* out[k] = sum_j in[j * stride] e^(sign 2 pi i j k / n). */
static void dft(const cufftComplex *in, cufftComplex *out, int n, int sign) {
    for (int k = 0; k < n; k++) {
        double re = 0, im = 0;
        for (int j = 0; j < n; j++) {
            double a = sign * 2.0 * M_PI * (double)j * k / n;
            re += in[j].x * cos(a) - in[j].y * sin(a);
            im += in[j].x * sin(a) + in[j].y * cos(a);
        }
        out[k].x = (float)re;
        out[k].y = (float)im;
    }
}

/* A forward C2C transform of size n (batch 2) checked against the CPU. */
static void c2c(int n) {
    enum { BATCH = 2, MAXN = 1024 };
    static cufftComplex in[BATCH * MAXN], got[BATCH * MAXN], want[BATCH * MAXN];
    for (int i = 0; i < BATCH * n; i++) {
        in[i].x = (float)sin(0.37 * i) + (float)(i % 7) * 0.25f;
        in[i].y = (float)cos(0.11 * i);
    }
    for (int b = 0; b < BATCH; b++) dft(in + b * n, want + b * n, n, -1);

    char what[96];
    cufftHandle plan;
    cufftResult r = cufftPlan1d(&plan, n, CUFFT_C2C, BATCH);
    snprintf(what, sizeof what, "cufftPlan1d C2C n=%d batch=%d", n, BATCH);
    expect(what, r == CUFFT_SUCCESS, r);
    if (r != CUFFT_SUCCESS) return;
    cufftComplex *d;
    cudaMalloc((void **)&d, sizeof(cufftComplex) * BATCH * n);
    cudaMemcpy(d, in, sizeof(cufftComplex) * BATCH * n, cudaMemcpyHostToDevice);
    r = cufftExecC2C(plan, d, d, CUFFT_FORWARD);
    cudaError_t e = cudaMemcpy(got, d, sizeof(cufftComplex) * BATCH * n, cudaMemcpyDeviceToHost);
    double err = max_error(got, want, BATCH * n);
    snprintf(what, sizeof what, "cufftExecC2C forward n=%d matches the CPU DFT (max error %.2g)", n, err);
    expect(what, r == CUFFT_SUCCESS && e == cudaSuccess && err < 1e-3 * n, r ? (int)r : (int)e);

    /* Inverse brings the input back, times n. */
    r = cufftExecC2C(plan, d, d, CUFFT_INVERSE);
    e = cudaMemcpy(got, d, sizeof(cufftComplex) * BATCH * n, cudaMemcpyDeviceToHost);
    for (int i = 0; i < BATCH * n; i++) {
        got[i].x /= (float)n;
        got[i].y /= (float)n;
    }
    err = max_error(got, in, BATCH * n);
    snprintf(what, sizeof what, "cufftExecC2C inverse n=%d restores the input (max error %.2g)", n, err);
    expect(what, r == CUFFT_SUCCESS && e == cudaSuccess && err < 1e-4 * n, r ? (int)r : (int)e);
    cudaFree(d);
    r = cufftDestroy(plan);
    expect("cufftDestroy", r == CUFFT_SUCCESS, r);
}

int main(void) {
    int version = 0;
    cufftResult r = cufftGetVersion(&version);
    expect("cufftGetVersion", r == CUFFT_SUCCESS && version >= 11000, version);

    c2c(64);
    c2c(1000);

    /* A real-to-complex transform on a stream of the program's own. */
    enum { N = 256 };
    static float real_in[N];
    static cufftComplex got[N / 2 + 1], full[N], want[N];
    for (int i = 0; i < N; i++) {
        real_in[i] = (float)cos(2 * M_PI * 5 * i / N) + 0.5f;
        full[i].x = real_in[i];
        full[i].y = 0;
    }
    dft(full, want, N, -1);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    cufftHandle plan;
    r = cufftPlan1d(&plan, N, CUFFT_R2C, 1);
    expect("cufftPlan1d R2C", r == CUFFT_SUCCESS, r);
    r = cufftSetStream(plan, stream);
    expect("cufftSetStream", r == CUFFT_SUCCESS, r);
    float *din;
    cufftComplex *dout;
    cudaMalloc((void **)&din, sizeof real_in);
    cudaMalloc((void **)&dout, sizeof got);
    cudaMemcpyAsync(din, real_in, sizeof real_in, cudaMemcpyHostToDevice, stream);
    r = cufftExecR2C(plan, din, dout);
    cudaMemcpyAsync(got, dout, sizeof got, cudaMemcpyDeviceToHost, stream);
    cudaError_t e = cudaStreamSynchronize(stream);
    double err = max_error(got, want, N / 2 + 1);
    expect("cufftExecR2C on a stream matches the CPU DFT", r == CUFFT_SUCCESS && e == cudaSuccess && err < 1e-2, r ? (int)r : (int)e);
    expect("the R2C spectrum has its peak at bin 5",
           fabs(got[5].x - N / 2.0) < 1e-2 && fabs(got[0].x - N / 2.0) < 1e-2, 0);
    cufftDestroy(plan);
    cudaFree(din);
    cudaFree(dout);
    cudaStreamDestroy(stream);

    /* The context is still usable and cuFFT left nothing behind. */
    e = cudaDeviceSynchronize();
    expect("the context still works", e == cudaSuccess, e);
    printf("# cufft: %d failed\n", failures);
    return failures;
}
