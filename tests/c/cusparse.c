/*
 * NVIDIA's cuSPARSE on vgpu (cuSPARSE 12, with CUDA 13's runtime): sparse matrix-vector products
 * through the generic API, on a 4 x 4 tridiagonal matrix in CSR form (4 on the diagonal, 1
 * beside it). cuSPARSE 12's kernels carry PTX the simulated GPU runs (cuSPARSE 11.7's SpMV
 * kernel is SASS only, and cuSPARSE does not report its failed launch).
 *
 * Usage: cusparse [sim|gpu] (the same checks on both). Each check prints "ok <what>" or
 * "FAIL <what>"; the exit status is the number of failures.
 */
#define DISABLE_CUSPARSE_DEPRECATED
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <cusparse.h>

#include "lib_check.h"

enum { N = 4, NNZ = 10 };

/* y = alpha op(A) x + beta y, with the workspace cuSPARSE asks for. */
static cusparseStatus_t spmv(cusparseHandle_t h, cusparseOperation_t op, const float *alpha,
                             cusparseSpMatDescr_t a, cusparseDnVecDescr_t x, const float *beta,
                             cusparseDnVecDescr_t y) {
    size_t bytes = 0;
    cusparseStatus_t st =
        cusparseSpMV_bufferSize(h, op, alpha, a, x, beta, y, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, &bytes);
    void *buf = NULL;
    if (st == CUSPARSE_STATUS_SUCCESS && cudaMalloc(&buf, bytes + 1) == cudaSuccess)
        st = cusparseSpMV(h, op, alpha, a, x, beta, y, CUDA_R_32F, CUSPARSE_SPMV_ALG_DEFAULT, buf);
    cudaFree(buf);
    return st;
}

int main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    cusparseHandle_t h;
    cusparseStatus_t st = cusparseCreate(&h);
    expect("cusparseCreate", st == CUSPARSE_STATUS_SUCCESS, st);

    const int rows[N + 1] = {0, 2, 5, 8, 10};
    const int cols[NNZ] = {0, 1, 0, 1, 2, 1, 2, 3, 2, 3};
    const float vals[NNZ] = {4, 1, 1, 4, 1, 1, 4, 1, 1, 4};
    const float x[N] = {1, 2, 3, 4};
    int *drows, *dcols;
    float *dvals, *dx, *dy;
    cudaMalloc((void **)&drows, sizeof rows);
    cudaMalloc((void **)&dcols, sizeof cols);
    cudaMalloc((void **)&dvals, sizeof vals);
    cudaMalloc((void **)&dx, sizeof x);
    cudaMalloc((void **)&dy, sizeof x);
    cudaMemcpy(drows, rows, sizeof rows, cudaMemcpyHostToDevice);
    cudaMemcpy(dcols, cols, sizeof cols, cudaMemcpyHostToDevice);
    cudaMemcpy(dvals, vals, sizeof vals, cudaMemcpyHostToDevice);
    cudaMemcpy(dx, x, sizeof x, cudaMemcpyHostToDevice);
    cudaMemset(dy, 0, sizeof x);

    cusparseSpMatDescr_t a;
    cusparseDnVecDescr_t vx, vy;
    st = cusparseCreateCsr(&a, N, N, NNZ, drows, dcols, dvals, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                           CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F);
    if (st == CUSPARSE_STATUS_SUCCESS) st = cusparseCreateDnVec(&vx, N, dx, CUDA_R_32F);
    if (st == CUSPARSE_STATUS_SUCCESS) st = cusparseCreateDnVec(&vy, N, dy, CUDA_R_32F);
    expect("CSR matrix and dense vectors", st == CUSPARSE_STATUS_SUCCESS, st);

    /* y = A x, then y = 2 A^T x + y (A is symmetric: 3 A x). */
    float one = 1.0f, two = 2.0f, zero = 0.0f;
    st = spmv(h, CUSPARSE_OPERATION_NON_TRANSPOSE, &one, a, vx, &zero, vy);
    float y[N] = {0};
    cudaError_t e = cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost);
    expect("SpMV: y = A x", st == CUSPARSE_STATUS_SUCCESS && e == cudaSuccess && y[0] == 6.0f &&
                                y[1] == 12.0f && y[2] == 18.0f && y[3] == 19.0f,
           st);
    st = spmv(h, CUSPARSE_OPERATION_TRANSPOSE, &two, a, vx, &one, vy);
    e = cudaMemcpy(y, dy, sizeof y, cudaMemcpyDeviceToHost);
    expect("SpMV: y = 2 A^T x + y", st == CUSPARSE_STATUS_SUCCESS && e == cudaSuccess && y[0] == 18.0f &&
                                        y[3] == 57.0f,
           st);

    cusparseDestroySpMat(a);
    cusparseDestroyDnVec(vx);
    cusparseDestroyDnVec(vy);
    st = cusparseDestroy(h);
    expect("cusparseDestroy", st == CUSPARSE_STATUS_SUCCESS, st);
    cudaFree(drows);
    cudaFree(dcols);
    cudaFree(dvals);
    cudaFree(dx);
    cudaFree(dy);
    printf("# cusparse: %d failed\n", failures);
    return failures;
}
