/*
 * NVIDIA's cuSOLVER (Debian's libcusolver 11.4, CUDA 11.8, linked against CUDA 11.8's runtime) on
 * vgpu: its kernels, and those of the cuBLAS 11 it calls, ship as cubins and as PTX for compute
 * 9.0, which the simulated GPU runs. Dense LU and Cholesky factorizations solve a system, a QR
 * factorization and a symmetric eigensolver give the known answers, on a 4 x 4 tridiagonal matrix
 * (4 on the diagonal, 1 beside it), whose eigenvalues are 4 + 2 cos(k pi / 5).
 *
 * Usage: cusolver [sim|gpu] (the same checks on both). Each check prints "ok <what>" or
 * "FAIL <what>"; the exit status is the number of failures.
 */
#include <math.h>
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <cusolverDn.h>

enum { N = 4 };

#include "lib_check.h"

/* Whether `got` is within a millionth (relative) of `want`. */
static int near(float got, float want) { return fabsf(got - want) <= 1e-5f * fmaxf(1.0f, fabsf(want)); }

/* The workspace of the call about to be made: `lwork` floats (cuSOLVER 12's QR asks for 192 MiB
 * even for this matrix). NULL when it cannot be had. */
static float *work;
static float *workspace(int lwork) {
    cudaFree(work);
    work = NULL;
    if (cudaMalloc((void **)&work, (size_t)(lwork > 0 ? lwork : 1) * sizeof(float)) != cudaSuccess) work = NULL;
    return work;
}

/* The matrix, column-major (it is symmetric). */
static const float A[N * N] = {4, 1, 0, 0, 1, 4, 1, 0, 0, 1, 4, 1, 0, 0, 1, 4};

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    cusolverDnHandle_t h;
    cusolverStatus_t st = cusolverDnCreate(&h);
    expect("cusolverDnCreate", st == CUSOLVER_STATUS_SUCCESS, st);

    /* b = A [1 2 3 4]. */
    const float want[N] = {1, 2, 3, 4};
    float b[N];
    for (int i = 0; i < N; i++) {
        b[i] = 0;
        for (int j = 0; j < N; j++) b[i] += A[j * N + i] * want[j];
    }
    float *da, *db;
    int *ipiv, *info, lwork = 0, hinfo = -1;
    cudaMalloc((void **)&da, sizeof A);
    cudaMalloc((void **)&db, sizeof b);
    cudaMalloc((void **)&ipiv, N * sizeof(int));
    cudaMalloc((void **)&info, sizeof(int));

    /* LU with partial pivoting, then the solve. */
    cudaMemcpy(da, A, sizeof A, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    st = cusolverDnSgetrf_bufferSize(h, N, N, da, N, &lwork);
    expect("getrf's workspace", st == CUSOLVER_STATUS_SUCCESS && workspace(lwork) != NULL, lwork);
    st = cusolverDnSgetrf(h, N, N, da, N, work, ipiv, info);
    if (st == CUSOLVER_STATUS_SUCCESS) st = cusolverDnSgetrs(h, CUBLAS_OP_N, N, 1, da, N, ipiv, db, N, info);
    float x[N] = {0};
    cudaMemcpy(x, db, sizeof x, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hinfo, info, sizeof hinfo, cudaMemcpyDeviceToHost);
    expect("getrf and getrs solve A x = b", st == CUSOLVER_STATUS_SUCCESS && hinfo == 0 && near(x[0], 1) &&
                                                near(x[1], 2) && near(x[2], 3) && near(x[3], 4),
           st);

    /* Cholesky, then the solve. */
    cudaMemcpy(da, A, sizeof A, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    st = cusolverDnSpotrf_bufferSize(h, CUBLAS_FILL_MODE_LOWER, N, da, N, &lwork);
    if (st == CUSOLVER_STATUS_SUCCESS && workspace(lwork)) st = cusolverDnSpotrf(h, CUBLAS_FILL_MODE_LOWER, N, da, N, work, lwork, info);
    float l00 = 0;
    cudaMemcpy(&l00, da, sizeof l00, cudaMemcpyDeviceToHost);
    if (st == CUSOLVER_STATUS_SUCCESS) st = cusolverDnSpotrs(h, CUBLAS_FILL_MODE_LOWER, N, 1, da, N, db, N, info);
    cudaMemcpy(x, db, sizeof x, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hinfo, info, sizeof hinfo, cudaMemcpyDeviceToHost);
    expect("potrf and potrs solve A x = b", st == CUSOLVER_STATUS_SUCCESS && hinfo == 0 && near(l00, 2) &&
                                                near(x[0], 1) && near(x[3], 4),
           st);

    /* QR: R's first entry is minus the first column's length. */
    float *tau;
    cudaMalloc((void **)&tau, N * sizeof(float));
    cudaMemcpy(da, A, sizeof A, cudaMemcpyHostToDevice);
    st = cusolverDnSgeqrf_bufferSize(h, N, N, da, N, &lwork);
    if (st == CUSOLVER_STATUS_SUCCESS && workspace(lwork)) st = cusolverDnSgeqrf(h, N, N, da, N, tau, work, lwork, info);
    float r00 = 0;
    cudaMemcpy(&r00, da, sizeof r00, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hinfo, info, sizeof hinfo, cudaMemcpyDeviceToHost);
    expect("geqrf", st == CUSOLVER_STATUS_SUCCESS && hinfo == 0 && near(fabsf(r00), sqrtf(17.0f)), st);
    cudaFree(tau);

    /* The symmetric eigensolver, eigenvalues in ascending order. */
    float *dw;
    cudaMalloc((void **)&dw, N * sizeof(float));
    cudaMemcpy(da, A, sizeof A, cudaMemcpyHostToDevice);
    st = cusolverDnSsyevd_bufferSize(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, N, da, N, dw, &lwork);
    if (st == CUSOLVER_STATUS_SUCCESS && workspace(lwork))
        st = cusolverDnSsyevd(h, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, N, da, N, dw, work, lwork, info);
    float w[N] = {0};
    cudaMemcpy(w, dw, sizeof w, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hinfo, info, sizeof hinfo, cudaMemcpyDeviceToHost);
    const float pi = 3.14159265f;
    int right = st == CUSOLVER_STATUS_SUCCESS && hinfo == 0;
    for (int k = 0; k < N; k++) right = right && near(w[k], 4 + 2 * cosf((N - k) * pi / 5));
    expect("syevd's eigenvalues", right, st);
    cudaFree(dw);

    st = cusolverDnDestroy(h);
    expect("cusolverDnDestroy", st == CUSOLVER_STATUS_SUCCESS, st);
    float back[N * N];
    cudaError_t e = cudaMemcpy(back, da, sizeof back, cudaMemcpyDeviceToHost);
    expect("the context still works", e == cudaSuccess, e);
    cudaFree(da);
    cudaFree(db);
    cudaFree(ipiv);
    cudaFree(info);
    cudaFree(work);
    printf("# cusolver: %d failed\n", failures);
    return failures;
}
