/*
 * CUDA 12.8's cuMemcpy3DBatchAsync: batches of 3-D copies between pitched device memory,
 * pageable host memory and CUDA arrays, each operand a pointer (with its own row length and
 * layer height, or packed) or an array (with an element offset), checked byte for byte; and
 * the refusals CUDA documents, with the index of the operation at fault.
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is the number of
 * failures.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUarray_st *CUarray;

typedef struct {
    int type;
    int id;
} CUmemLocation;

typedef struct {
    int type; /* 1 pointer, 2 array */
    union {
        struct {
            CUdeviceptr ptr;
            size_t rowLength;
            size_t layerHeight;
            CUmemLocation locHint;
        } ptr;
        struct {
            CUarray array;
            size_t x, y, z;
        } array;
    } op;
} CUmemcpy3DOperand;

typedef struct {
    CUmemcpy3DOperand src;
    CUmemcpy3DOperand dst;
    size_t width, height, depth;
    int srcAccessOrder;
    unsigned flags;
} CUDA_MEMCPY3D_BATCH_OP;

typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned NumChannels;
    unsigned Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuMemcpy3DBatchAsync(size_t, CUDA_MEMCPY3D_BATCH_OP *, size_t *, unsigned long long,
                              CUstream);

#include "check.h"

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_FOUND 500
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2
#define CU_MEMCPY_OPERAND_TYPE_POINTER 1
#define CU_MEMCPY_OPERAND_TYPE_ARRAY 2
#define CU_MEMCPY_SRC_ACCESS_ORDER_STREAM 1
#define CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL 2
#define CU_AD_FORMAT_FLOAT 0x20
#define CU_STREAM_NON_BLOCKING 1

/* The pitched source: rows of ROW bytes, layers of LAYER rows, DEPTH layers. */
#define ROW 64
#define LAYER 8
#define DEPTH 4
/* The box copied out of it: W bytes by H rows by D layers. */
#define W 40
#define H 5
#define D 3
/* The CUDA array: AW x AH x AD floats. */
#define AW 16
#define AH 8
#define AD 2

static CUmemcpy3DOperand pointer(CUdeviceptr p, size_t row, size_t layer) {
    CUmemcpy3DOperand o;
    memset(&o, 0, sizeof o);
    o.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
    o.op.ptr.ptr = p;
    o.op.ptr.rowLength = row;
    o.op.ptr.layerHeight = layer;
    return o;
}

static CUmemcpy3DOperand array_at(CUarray a, size_t x, size_t y, size_t z) {
    CUmemcpy3DOperand o;
    memset(&o, 0, sizeof o);
    o.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
    o.op.array.array = a;
    o.op.array.x = x;
    o.op.array.y = y;
    o.op.array.z = z;
    return o;
}

static CUDA_MEMCPY3D_BATCH_OP copy_of(CUmemcpy3DOperand src, CUmemcpy3DOperand dst, size_t w,
                                      size_t h, size_t d) {
    CUDA_MEMCPY3D_BATCH_OP op;
    memset(&op, 0, sizeof op);
    op.src = src;
    op.dst = dst;
    op.width = w;
    op.height = h;
    op.depth = d;
    op.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    return op;
}

int main(void) {
    void *fn = NULL;
    int found = -1;
    check("cuGetProcAddress: cuMemcpy3DBatchAsync for CUDA 12.8",
          cuGetProcAddress_v2("cuMemcpy3DBatchAsync", &fn, 12080, 0, &found), CUDA_SUCCESS);
    expect("... is the exported function", found == 0 && fn == (void *)cuMemcpy3DBatchAsync);
    check("cuGetProcAddress: for CUDA 12.7 callers",
          cuGetProcAddress_v2("cuMemcpy3DBatchAsync", &fn, 12070, 0, &found),
          CUDA_ERROR_NOT_FOUND);
    expect("... a version not sufficient", found == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

    CUdevice dev;
    CUcontext ctx;
    CUstream s;
    check("cuInit", cuInit(0), CUDA_SUCCESS);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), CUDA_SUCCESS);
    check("stream", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    /* Pitched device memory to packed device memory and back to the host, in one batch. */
    static unsigned char host[ROW * LAYER * DEPTH], box[W * H * D], back[W * H * D];
    for (size_t i = 0; i < sizeof host; i++) host[i] = (unsigned char)(i * 7 + 3);
    CUdeviceptr pitched, packed;
    check("pitched source", cuMemAlloc_v2(&pitched, sizeof host), CUDA_SUCCESS);
    check("packed destination", cuMemAlloc_v2(&packed, sizeof box), CUDA_SUCCESS);
    check("the source's bytes", cuMemcpyHtoD_v2(pitched, host, sizeof host), CUDA_SUCCESS);
    check("the destination cleared", cuMemsetD8_v2(packed, 0, sizeof box), CUDA_SUCCESS);
    /* The box starts at byte 8 of row 2 of layer 1. */
    CUdeviceptr corner = pitched + (size_t)1 * ROW * LAYER + 2 * ROW + 8;
    CUDA_MEMCPY3D_BATCH_OP two[2] = {
        copy_of(pointer(corner, ROW, LAYER), pointer(packed, 0, 0), W, H, D),
        copy_of(pointer(packed, 0, 0), pointer((CUdeviceptr)(uintptr_t)back, 0, 0), W, H, D),
    };
    size_t fail = 12345;
    check("a batch of two pitched copies", cuMemcpy3DBatchAsync(2, two, &fail, 0, s),
          CUDA_SUCCESS);
    check("... synchronized", cuStreamSynchronize(s), CUDA_SUCCESS);
    expect("... the failing index is left alone", fail == 12345);
    int same = 1;
    for (size_t z = 0; z < D; z++)
        for (size_t y = 0; y < H; y++)
            for (size_t x = 0; x < W; x++)
                same &= back[(z * H + y) * W + x] ==
                        host[(1 + z) * ROW * LAYER + (2 + y) * ROW + 8 + x];
    expect("the box arrived byte for byte, packed", same);

    /* Host floats into a CUDA array at an offset, and back out. */
    CUarray arr;
    CUDA_ARRAY3D_DESCRIPTOR desc = {AW, AH, AD, CU_AD_FORMAT_FLOAT, 1, 0};
    check("a 3-D float array", cuArray3DCreate_v2(&arr, &desc), CUDA_SUCCESS);
    static float in[4 * 3 * 2], out[4 * 3 * 2];
    for (int i = 0; i < 24; i++) in[i] = 0.5f + (float)i;
    CUDA_MEMCPY3D_BATCH_OP to_array =
        copy_of(pointer((CUdeviceptr)(uintptr_t)in, 0, 0), array_at(arr, 2, 3, 1), 4, 3, 1);
    to_array.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
    CUDA_MEMCPY3D_BATCH_OP from_array =
        copy_of(array_at(arr, 2, 3, 1), pointer((CUdeviceptr)(uintptr_t)out, 0, 0), 4, 3, 1);
    check("host to array", cuMemcpy3DBatchAsync(1, &to_array, NULL, 0, s), CUDA_SUCCESS);
    check("array to host", cuMemcpy3DBatchAsync(1, &from_array, NULL, 0, s), CUDA_SUCCESS);
    check("... synchronized", cuStreamSynchronize(s), CUDA_SUCCESS);
    expect("the floats came back through the array", memcmp(in, out, 12 * sizeof(float)) == 0);

    /* Refusals. */
    CUDA_MEMCPY3D_BATCH_OP bad[2] = {two[0], two[0]};
    bad[1].depth = 0;
    fail = 0;
    check("a zero extent", cuMemcpy3DBatchAsync(2, bad, &fail, 0, s), CUDA_ERROR_INVALID_VALUE);
    expect("... names the operation", fail == 1);
    bad[1] = two[0];
    bad[1].srcAccessOrder = 7;
    check("an unknown source access order", cuMemcpy3DBatchAsync(2, bad, &fail, 0, s),
          CUDA_ERROR_INVALID_VALUE);
    expect("... names the operation", fail == 1);
    bad[0].src.op.ptr.rowLength = W - 1;
    check("a row shorter than the copy", cuMemcpy3DBatchAsync(2, bad, &fail, 0, s),
          CUDA_ERROR_INVALID_VALUE);
    expect("... names the first operation", fail == 0);
    check("the legacy stream", cuMemcpy3DBatchAsync(1, two, &fail, 0, NULL),
          CUDA_ERROR_INVALID_VALUE);
    expect("... names no operation", fail == SIZE_MAX);
    check("flags", cuMemcpy3DBatchAsync(1, two, &fail, 1, s), CUDA_ERROR_INVALID_VALUE);
    check("no operations", cuMemcpy3DBatchAsync(0, two, &fail, 0, s), CUDA_ERROR_INVALID_VALUE);
    bad[0] = two[0];
    bad[0].src.type = 3;
    check("an unknown operand type", cuMemcpy3DBatchAsync(1, bad, &fail, 0, s),
          CUDA_ERROR_INVALID_VALUE);
    check("nothing queued by refused batches", cuStreamSynchronize(s), CUDA_SUCCESS);

    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), CUDA_SUCCESS);
    printf("%d failures\n", failures);
    return failures;
}
