/*
 * The driver API a CUDA runtime and its libraries resolve beyond the basics,
 * called from C the way cuda.h declares it, against vgpu's libcuda.so:
 * modules and libraries (enumeration, names, parameter info, globals,
 * loading from files, CUDA 12 libraries loaded with no current context),
 * the JIT linker (two PTX modules, one calling a function the other
 * defines, and a register limit), pitched 2-D/3-D copies and memsets,
 * pointer attributes, peer queries, PCI bus ids, stream capture queries,
 * CUDA 13's context entry points, stream attributes, CUDA 12's stream and
 * context IDs and function loading queries, the legacy property block and
 * shared memory configuration, occupancy with flags and by shared memory,
 * 3-D peer copies, event records with flags, the launch API of CUDA
 * before 4.0 (cuParamSet*, cuLaunchGrid), and CUDA arrays with texture and
 * surface objects (descriptors, copies in and out of padded rows, refusals).
 *
 * Each check prints "ok <what>" or "FAIL <what>: ..."; the exit status is
 * the number of failures.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUlinkState_st *CUlinkState;

typedef struct {
    size_t srcXInBytes, srcY;
    unsigned int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    unsigned int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

typedef struct {
    size_t srcXInBytes, srcY, srcZ, srcLOD;
    unsigned int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    void *reserved0;
    size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD;
    unsigned int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    void *reserved1;
    size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;

enum { HOST = 1, DEVICE = 2 };

CUresult cuInit(unsigned int);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDeviceGetPCIBusId(char *, int, CUdevice);
CUresult cuDeviceGetByPCIBusId(CUdevice *, const char *);
CUresult cuDeviceCanAccessPeer(int *, CUdevice, CUdevice);
CUresult cuDeviceGetP2PAttribute(int *, int, CUdevice, CUdevice);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxCreate_v4(CUcontext *, void *, unsigned int, CUdevice);
CUresult cuDeviceGetExecAffinitySupport(int *, int, CUdevice);
CUresult cuCtxGetExecAffinity(void *, int);
CUresult cuCtxCreate_v3(CUcontext *, void *, int, unsigned int, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize_v2(CUcontext);
CUresult cuCtxGetDevice_v2(CUdevice *, CUcontext);
CUresult cuCtxEnablePeerAccess(CUcontext, unsigned int);
CUresult cuCtxDisablePeerAccess(CUcontext);
typedef struct {
    unsigned int numDevices;
    size_t size;
    unsigned long long handleTypes, flags;
} CUmulticastObjectProp;
CUresult cuMulticastCreate(unsigned long long *, const CUmulticastObjectProp *);
CUresult cuMulticastGetGranularity(size_t *, const CUmulticastObjectProp *, int);
CUresult cuMulticastAddDevice(unsigned long long, CUdevice);
CUresult cuMulticastBindMem(unsigned long long, size_t, unsigned long long, size_t, size_t,
                            unsigned long long);
CUresult cuMulticastBindAddr(unsigned long long, size_t, unsigned long long, size_t,
                             unsigned long long);
CUresult cuMulticastUnbind(unsigned long long, CUdevice, size_t, size_t);
CUresult cuDeviceGetHostAtomicCapabilities(unsigned int *, const int *, unsigned int, CUdevice);
CUresult cuDeviceGetP2PAtomicCapabilities(unsigned int *, const int *, unsigned int, CUdevice,
                                          CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemAllocHost_v2(void **, size_t);
CUresult cuMemFreeHost(void *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *);
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *, CUstream);
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *);
CUresult cuMemsetD2D32_v2(CUdeviceptr, size_t, unsigned int, size_t, size_t);
CUresult cuMemsetD2D8Async(CUdeviceptr, size_t, unsigned char, size_t, size_t, CUstream);
CUresult cuMemcpyPeer(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t);
CUresult cuPointerGetAttribute(void *, int, CUdeviceptr);
CUresult cuPointerGetAttributes(unsigned int, int *, void **, CUdeviceptr);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuStreamIsCapturing(CUstream, int *);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleLoadDataEx(CUmodule *, const void *, unsigned int, int *, void **);
CUresult cuModuleLoad(CUmodule *, const char *);
CUresult cuModuleUnload(CUmodule);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuModuleGetLoadingMode(int *);
CUresult cuModuleGetFunctionCount(unsigned int *, CUmodule);
CUresult cuModuleEnumerateFunctions(CUfunction *, unsigned int, CUmodule);
CUresult cuFuncGetName(const char **, CUfunction);
CUresult cuFuncGetModule(CUmodule *, CUfunction);
CUresult cuFuncGetParamInfo(CUfunction, size_t, size_t *, size_t *);
CUresult cuFuncGetParamCount(CUfunction, size_t *);
CUresult cuKernelGetParamCount(CUkernel, size_t *);
CUresult cuFuncGetAttribute(int *, int, CUfunction);
CUresult cuLibraryLoadData(CUlibrary *, const void *, void *, void *, unsigned int, void *, void *,
                           unsigned int);
CUresult cuLibraryUnload(CUlibrary);
CUresult cuLibraryGetModule(CUmodule *, CUlibrary);
CUresult cuLibraryGetKernel(CUkernel *, CUlibrary, const char *);
CUresult cuLibraryGetKernelCount(unsigned int *, CUlibrary);
CUresult cuLibraryEnumerateKernels(CUkernel *, unsigned int, CUlibrary);
CUresult cuLibraryGetGlobal(CUdeviceptr *, size_t *, CUlibrary, const char *);
CUresult cuKernelGetName(const char **, CUkernel);
CUresult cuKernelGetFunction(CUfunction *, CUkernel);
CUresult cuKernelGetAttribute(int *, int, CUkernel, CUdevice);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuLinkCreate_v2(unsigned int, int *, void **, CUlinkState *);
/* CUDA 5.5's names (cuDNN 9 resolves them). */
CUresult cuLinkCreate(unsigned int, int *, void **, CUlinkState *);
CUresult cuLinkAddData(CUlinkState, int, void *, size_t, const char *, unsigned int, int *, void **);
CUresult cuLinkAddData_v2(CUlinkState, int, void *, size_t, const char *, unsigned int, int *,
                          void **);
CUresult cuLinkComplete(CUlinkState, void **, size_t *);
CUresult cuLinkDestroy(CUlinkState);
CUresult cuStreamGetId(CUstream, unsigned long long *);
CUresult cuStreamGetId_ptsz(CUstream, unsigned long long *);
CUresult cuStreamGetDevice(CUstream, CUdevice *);
CUresult cuCtxGetId(CUcontext, unsigned long long *);
CUresult cuFuncIsLoaded(int *, CUfunction);
CUresult cuFuncLoad(CUfunction);
CUresult cuOccupancyMaxPotentialBlockSize(int *, int *, CUfunction, size_t (*)(int), size_t, int);
CUresult cuOccupancyMaxPotentialBlockSizeWithFlags(int *, int *, CUfunction, size_t (*)(int),
                                                   size_t, int, unsigned int);
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *, CUfunction, int, size_t);
CUresult cuOccupancyAvailableDynamicSMemPerBlock(size_t *, CUfunction, int, int);
CUresult cuOccupancyMaxPotentialClusterSize(int *, CUfunction, const void *);
CUresult cuOccupancyMaxActiveClusters(int *, CUfunction, const void *);
CUresult cuMemcpy3DPeer(const void *);
CUresult cuMemcpy3DPeerAsync(const void *, CUstream);
typedef struct CUevent_st *CUevent;
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuEventRecordWithFlags(CUevent, CUstream, unsigned int);
CUresult cuEventSynchronize(CUevent);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, void **);
CUresult cuFuncSetBlockShape(CUfunction, int, int, int);
CUresult cuFuncSetSharedSize(CUfunction, unsigned int);
CUresult cuParamSetSize(CUfunction, unsigned int);
CUresult cuParamSeti(CUfunction, int, unsigned int);
CUresult cuParamSetf(CUfunction, int, float);
CUresult cuParamSetv(CUfunction, int, void *, unsigned int);
CUresult cuLaunch(CUfunction);
CUresult cuLaunchGrid(CUfunction, int, int);
CUresult cuLaunchGridAsync(CUfunction, int, int, CUstream);
CUresult cuDeviceGetAttribute(int *, int, CUdevice);
CUresult cuDeviceGetProperties(int *, CUdevice);
CUresult cuCtxGetSharedMemConfig(int *);
CUresult cuCtxSetSharedMemConfig(int);
CUresult cuFuncSetSharedMemConfig(CUfunction, int);
CUresult cuStreamCreateWithPriority(CUstream *, unsigned int, int);
CUresult cuCtxGetFlags(unsigned int *);
CUresult cuCtxSetFlags(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuDevicePrimaryCtxGetState(CUdevice, unsigned int *, int *);
typedef union {
    struct {
        void *base_ptr;
        size_t num_bytes;
        float hitRatio;
        int hitProp, missProp;
    } accessPolicyWindow;
    int syncPolicy;
    int priority;
    char pad[64];
} CUlaunchAttributeValue;
CUresult cuStreamGetAttribute(CUstream, int, CUlaunchAttributeValue *);
CUresult cuStreamSetAttribute(CUstream, int, const CUlaunchAttributeValue *);
CUresult cuStreamCopyAttributes(CUstream, CUstream);
CUresult cuCtxResetPersistingL2Cache(void);



typedef struct CUarray_st *CUarray;
typedef unsigned long long CUtexObject;
typedef unsigned long long CUsurfObject;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct {
    size_t Width, Height, Depth;
    int Format;
    unsigned NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { size_t size, alignment; unsigned reserved[4]; } CUDA_ARRAY_MEMORY_REQUIREMENTS;
typedef struct {
    int resType;
    union {
        struct { CUarray hArray; } array;
        struct { CUdeviceptr devPtr; int format; unsigned numChannels; size_t sizeInBytes; } linear;
        struct {
            CUdeviceptr devPtr; int format; unsigned numChannels;
            size_t width, height, pitchInBytes;
        } pitch2D;
        int reserved[32];
    } res;
    unsigned flags;
} CUDA_RESOURCE_DESC;
typedef struct {
    int addressMode[3];
    int filterMode;
    unsigned flags, maxAnisotropy;
    int mipmapFilterMode;
    float mipmapLevelBias, minMipmapLevelClamp, maxMipmapLevelClamp;
    float borderColor[4];
    int reserved[12];
} CUDA_TEXTURE_DESC;
typedef struct {
    int format;
    size_t width, height, depth;
    unsigned firstMipmapLevel, lastMipmapLevel, firstLayer, lastLayer;
    unsigned reserved[16];
} CUDA_RESOURCE_VIEW_DESC;
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *, CUarray);
CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *, CUarray);
CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUarray, CUdevice);
CUresult cuArrayGetPlane(CUarray *, CUarray, unsigned);
CUresult cuMipmappedArrayCreate(void **, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayGetLevel(CUarray *, void *, unsigned);
CUresult cuMipmappedArrayDestroy(void *);
CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *, void *, CUdevice);
CUresult cuMipmappedArrayGetSparseProperties(void *, void *);
CUresult cuMemcpyHtoA_v2(CUarray, size_t, const void *, size_t);
CUresult cuMemcpyAtoH_v2(void *, CUarray, size_t, size_t);
CUresult cuMemcpyDtoA_v2(CUarray, size_t, CUdeviceptr, size_t);
CUresult cuMemcpyAtoD_v2(CUdeviceptr, CUarray, size_t, size_t);
CUresult cuMemcpyAtoA_v2(CUarray, size_t, CUarray, size_t, size_t);
CUresult cuMemcpyHtoAAsync_v2(CUarray, size_t, const void *, size_t, CUstream);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuTexObjectCreate(CUtexObject *, const CUDA_RESOURCE_DESC *, const CUDA_TEXTURE_DESC *,
                           const CUDA_RESOURCE_VIEW_DESC *);
CUresult cuTexObjectDestroy(CUtexObject);
CUresult cuDeviceGetTexture1DLinearMaxWidth(size_t *, int, unsigned, CUdevice);
CUresult cuTexObjectGetResourceDesc(CUDA_RESOURCE_DESC *, CUtexObject);
CUresult cuTexObjectGetTextureDesc(CUDA_TEXTURE_DESC *, CUtexObject);
CUresult cuTexObjectGetResourceViewDesc(CUDA_RESOURCE_VIEW_DESC *, CUtexObject);
CUresult cuSurfObjectCreate(CUsurfObject *, const CUDA_RESOURCE_DESC *);
CUresult cuSurfObjectDestroy(CUsurfObject);
CUresult cuSurfObjectGetResourceDesc(CUDA_RESOURCE_DESC *, CUsurfObject);

CUresult cuStreamGetCtx(CUstream, CUcontext *);
CUresult cuStreamGetCtx_v2(CUstream, CUcontext *, void **);
CUresult cuEventElapsedTime_v2(float *, CUevent, CUevent);
CUresult cuEventRecord(CUevent, CUstream);

typedef struct {
    CUfunction function;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;
CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *, unsigned, unsigned);

typedef struct CUtexref_st *CUtexref;
typedef struct CUsurfref_st *CUsurfref;
CUresult cuModuleGetTexRef(CUtexref *, CUmodule, const char *);
CUresult cuModuleGetSurfRef(CUsurfref *, CUmodule, const char *);
CUresult cuModuleGetGlobal_v2(CUdeviceptr *, size_t *, CUmodule, const char *);
CUresult cuTexRefSetAddress_v2(size_t *, CUtexref, CUdeviceptr, size_t);
CUresult cuTexRefSetFormat(CUtexref, int, int);
CUresult cuTexRefGetFormat(int *, int *, CUtexref);
CUresult cuTexRefSetAddressMode(CUtexref, int, int);
CUresult cuTexRefGetAddressMode(int *, CUtexref, int);
CUresult cuTexRefSetFilterMode(CUtexref, int);
CUresult cuTexRefGetFilterMode(int *, CUtexref);
CUresult cuTexRefSetFlags(CUtexref, unsigned);
CUresult cuTexRefGetFlags(unsigned *, CUtexref);
CUresult cuTexRefSetBorderColor(CUtexref, float *);
CUresult cuTexRefGetBorderColor(float *, CUtexref);
CUresult cuTexRefGetAddress_v2(CUdeviceptr *, CUtexref);
CUresult cuTexRefSetArray(CUtexref, CUarray, unsigned);
CUresult cuTexRefSetMipmappedArray(CUtexref, void *, unsigned);
CUresult cuTexRefGetMipmappedArray(void **, CUtexref);
CUresult cuParamSetTexRef(CUfunction, int, CUtexref);

typedef struct {
    int srcAccessOrder;
    struct { int type, id; } srcLocHint, dstLocHint;
    unsigned flags;
} CUmemcpyAttributes;
CUresult cuMemcpyBatchAsync(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
                            size_t, size_t *, CUstream);
/* CUDA 13.2: one copy with its attributes. */
CUresult cuMemcpyWithAttributesAsync(CUdeviceptr, CUdeviceptr, size_t, CUmemcpyAttributes *, CUstream);

#include "check.h"

static const char MODULE[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .global .align 4 .u32 counter = 7;\n"
    ".visible .entry add_one(.param .u64 p, .param .u32 n)\n"
    "{\n"
    "  .reg .pred %p1; .reg .b32 %r<6>; .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [p]; ld.param.u32 %r1, [n];\n"
    "  mov.u32 %r2, %ctaid.x; mov.u32 %r3, %ntid.x; mov.u32 %r4, %tid.x;\n"
    "  mad.lo.s32 %r2, %r2, %r3, %r4;\n"
    "  setp.ge.u32 %p1, %r2, %r1;\n"
    "  @%p1 bra DONE;\n"
    "  cvta.to.global.u64 %rd2, %rd1; mul.wide.u32 %rd3, %r2, 4; add.s64 %rd4, %rd2, %rd3;\n"
    "  ld.global.u32 %r5, [%rd4]; add.u32 %r5, %r5, 1; st.global.u32 [%rd4], %r5;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n"
    ".visible .entry noop()\n"
    "{\n"
    "  .reg .b32 %r<40>;\n"
    "  ret;\n"
    "}\n";

static const char CALLER[] =
    "//\n// calls a function another module defines\n//\n"
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".extern .func (.param .b32 ret0) twice\n(\n  .param .b32 x\n)\n;\n"
    ".visible .entry apply(.param .u64 p)\n"
    "{\n"
    "  .reg .b32 %r<3>; .reg .b64 %rd<3>;\n"
    "  ld.param.u64 %rd1, [p]; cvta.to.global.u64 %rd2, %rd1;\n"
    "  ld.global.u32 %r1, [%rd2];\n"
    "  {\n"
    "  .param .b32 param0;\n"
    "  st.param.b32 [param0+0], %r1;\n"
    "  .param .b32 retval0;\n"
    "  call.uni (retval0), twice, (param0);\n"
    "  ld.param.b32 %r2, [retval0+0];\n"
    "  }\n"
    "  st.global.u32 [%rd2], %r2;\n"
    "  ret;\n"
    "}\n";

static const char CALLEE[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .func (.param .b32 ret0) twice(.param .b32 x)\n"
    "{\n"
    "  .reg .b32 %r<3>;\n"
    "  ld.param.b32 %r1, [x];\n"
    "  add.u32 %r2, %r1, %r1;\n"
    "  st.param.b32 [ret0+0], %r2;\n"
    "  ret;\n"
    "}\n";

/* A fat binary (header and one uncompressed PTX entry for compute_52), as
 * nvcc lays it out, in `buf`; returns its size. */
static size_t make_fatbin(unsigned char *buf, const char *ptx) {
    size_t text = strlen(ptx) + 1, padded = (text + 7) / 8 * 8;
    memset(buf, 0, 16 + 72 + padded);
    uint32_t magic = 0xBA55ED50u, u32;
    uint16_t u16;
    uint64_t u64 = 72 + padded;
    memcpy(buf, &magic, 4);
    u16 = 1; memcpy(buf + 4, &u16, 2);
    u16 = 16; memcpy(buf + 6, &u16, 2);
    memcpy(buf + 8, &u64, 8);
    unsigned char *e = buf + 16;
    u16 = 1; memcpy(e, &u16, 2);          /* kind: PTX */
    u16 = 0x0101; memcpy(e + 2, &u16, 2); /* entry version */
    u32 = 72; memcpy(e + 4, &u32, 4);     /* header size */
    u32 = (uint32_t)padded; memcpy(e + 8, &u32, 4);
    u32 = 52; memcpy(e + 28, &u32, 4);    /* compute_52 */
    u32 = 64; memcpy(e + 32, &u32, 4);    /* address bits */
    memcpy(e + 72, ptx, text);
    return 16 + 72 + padded;
}

static const char UNIT_A[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry unit_a(.param .u64 p)\n{\n  .reg .b32 %r<2>; .reg .b64 %rd<3>;\n"
    "  ld.param.u64 %rd1, [p]; cvta.to.global.u64 %rd2, %rd1;\n"
    "  mov.u32 %r1, 11; st.global.u32 [%rd2], %r1;\n  ret;\n}\n";
static const char UNIT_B[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry unit_b(.param .u64 p)\n{\n  .reg .b32 %r<2>; .reg .b64 %rd<3>;\n"
    "  ld.param.u64 %rd1, [p]; cvta.to.global.u64 %rd2, %rd1;\n"
    "  mov.u32 %r1, 22; st.global.u32 [%rd2+4], %r1;\n  ret;\n}\n";

/* nvcc's __fatBinC_Wrapper_t version 2: a fat binary and a NULL-terminated
 * list of the translation units' prelinked fat binaries. Both units'
 * kernels must load as one module, and run. */
static void translation_units(void) {
    static unsigned char fat_a[1024] __attribute__((aligned(8)));
    static unsigned char fat_b[1024] __attribute__((aligned(8)));
    make_fatbin(fat_a, UNIT_A);
    make_fatbin(fat_b, UNIT_B);
    static const void *prelinked[2];
    prelinked[0] = fat_b;
    prelinked[1] = NULL;
    static struct { int magic, version; const void *data; const void **prelinked; } wrapper;
    wrapper.magic = 0x466243B1;
    wrapper.version = 2;
    wrapper.data = fat_a;
    wrapper.prelinked = prelinked;
    CUmodule m;
    check("two translation units in one wrapper", cuModuleLoadData(&m, &wrapper), 0);
    CUfunction a, b;
    check("the first unit's kernel", cuModuleGetFunction(&a, m, "unit_a"), 0);
    check("the second unit's kernel", cuModuleGetFunction(&b, m, "unit_b"), 0);
    CUdeviceptr d;
    cuMemAlloc_v2(&d, 8);
    void *args[] = {&d};
    cuLaunchKernel(a, 1, 1, 1, 1, 1, 1, 0, 0, args, 0);
    cuLaunchKernel(b, 1, 1, 1, 1, 1, 1, 0, 0, args, 0);
    unsigned int v[2] = {0, 0};
    check("read both results", cuMemcpyDtoH_v2(v, d, 8), 0);
    expect("both units ran", v[0] == 11 && v[1] == 22);
    cuMemFree_v2(d);
    cuModuleUnload(m);
}

static void modules(void) {
    int mode = 0;
    check("cuModuleGetLoadingMode", cuModuleGetLoadingMode(&mode), 0);
    expect("lazy loading, CUDA's default", mode == 2);

    CUmodule m;
    check("cuModuleLoadData", cuModuleLoadData(&m, MODULE), 0);
    unsigned int count = 0;
    check("cuModuleGetFunctionCount", cuModuleGetFunctionCount(&count, m), 0);
    expect("two kernels", count == 2);
    CUfunction fs[2] = {0};
    check("cuModuleEnumerateFunctions", cuModuleEnumerateFunctions(fs, 2, m), 0);
    const char *n0 = "", *n1 = "";
    check("cuFuncGetName", cuFuncGetName(&n0, fs[0]), 0);
    cuFuncGetName(&n1, fs[1]);
    expect("names in module order", !strcmp(n0, "add_one") && !strcmp(n1, "noop"));
    CUmodule owner = 0;
    check("cuFuncGetModule", cuFuncGetModule(&owner, fs[0]), 0);
    expect("the function's module", owner == m);
    size_t off = 99, size = 99;
    check("cuFuncGetParamInfo", cuFuncGetParamInfo(fs[0], 1, &off, &size), 0);
    expect("second parameter at 8, 4 bytes", off == 8 && size == 4);
    check("cuFuncGetParamInfo past the end", cuFuncGetParamInfo(fs[0], 2, &off, &size), 1);
    size_t params = 0;
    check("cuFuncGetParamCount (CUDA 13.2)", cuFuncGetParamCount(fs[0], &params), 0);
    expect("two parameters", params == 2);
    check("cuFuncGetParamCount of no function",
          cuFuncGetParamCount((CUfunction)0x7f0000001000ull, &params), 400);
    check("cuModuleGetFunctionCount of a forged module",
          cuModuleGetFunctionCount(&count, (CUmodule)0x7f0000001000ull), 400);
    check("cuModuleUnload", cuModuleUnload(m), 0);

    /* From a file, and a file that does not exist. */
    char path[] = "/tmp/vgpu-module-XXXXXX";
    int fd = mkstemp(path);
    expect("temporary file", fd >= 0);
    expect("module written", write(fd, MODULE, strlen(MODULE)) == (ssize_t)strlen(MODULE));
    close(fd);
    check("cuModuleLoad", cuModuleLoad(&m, path), 0);
    unlink(path);
    check("cuModuleUnload (file)", cuModuleUnload(m), 0);
    check("cuModuleLoad of a missing file", cuModuleLoad(&m, "/nonexistent/vgpu.ptx"),
          301 /* FILE_NOT_FOUND */);

    /* A register limit given to the JIT reaches the kernel. */
    int opts[1] = {0 /* CU_JIT_MAX_REGISTERS */};
    void *vals[1] = {(void *)(uintptr_t)16};
    check("cuModuleLoadDataEx with CU_JIT_MAX_REGISTERS", cuModuleLoadDataEx(&m, MODULE, 1, opts, vals), 0);
    CUfunction noop;
    cuModuleGetFunction(&noop, m, "noop");
    int regs = 0;
    check("cuFuncGetAttribute NUM_REGS", cuFuncGetAttribute(&regs, 4, noop), 0);
    expect("at most 16 registers", regs > 0 && regs <= 16);
    cuModuleUnload(m);
}

static void libraries(CUcontext ctx) {
    /* CUDA 12 runtimes load libraries before any context is current. */
    check("no current context", cuCtxSetCurrent(NULL), 0);
    CUlibrary lib;
    check("cuLibraryLoadData without a context", cuLibraryLoadData(&lib, MODULE, 0, 0, 0, 0, 0, 0), 0);
    unsigned int count = 0;
    check("cuLibraryGetKernelCount", cuLibraryGetKernelCount(&count, lib), 0);
    expect("two kernels in the library", count == 2);
    CUkernel ks[2] = {0};
    check("cuLibraryEnumerateKernels", cuLibraryEnumerateKernels(ks, 2, lib), 0);
    const char *name = "";
    check("cuKernelGetName", cuKernelGetName(&name, ks[1]), 0);
    expect("kernel name", !strcmp(name, "noop"));
    CUkernel k;
    check("cuLibraryGetKernel", cuLibraryGetKernel(&k, lib, "add_one"), 0);
    size_t kparams = 0;
    check("cuKernelGetParamCount (CUDA 13.2)", cuKernelGetParamCount(k, &kparams), 0);
    expect("the kernel's two parameters", kparams == 2);
    int max_threads = 0;
    check("cuKernelGetAttribute", cuKernelGetAttribute(&max_threads, 0, k, 0), 0);
    expect("max threads per block", max_threads >= 128);
    check("cuKernelGetAttribute of another device", cuKernelGetAttribute(&max_threads, 0, k, 1),
          101 /* INVALID_DEVICE */);
    CUdeviceptr g = 0;
    size_t gsize = 0;
    check("cuLibraryGetGlobal", cuLibraryGetGlobal(&g, &gsize, lib, "counter"), 0);
    unsigned int value = 0;
    check("set a context", cuCtxSetCurrent(ctx), 0);

    CUmodule m;
    check("cuLibraryGetModule", cuLibraryGetModule(&m, lib), 0);
    CUfunction f;
    check("the library's module has the kernel", cuModuleGetFunction(&f, m, "add_one"), 0);
    check("cuKernelGetFunction", cuKernelGetFunction(&f, k), 0);
    check("read the library's global", cuMemcpyDtoH_v2(&value, g, 4), 0);
    expect("global initialised", gsize == 4 && value == 7);
    unsigned int n = 1;
    void *args[] = {&g, &n};
    check("launch the library's kernel", cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, args, 0), 0);
    check("read it back", cuMemcpyDtoH_v2(&value, g, 4), 0);
    expect("the kernel ran", value == 8);
    check("cuLibraryUnload", cuLibraryUnload(lib), 0);
    check("cuLibraryGetModule after unload", cuLibraryGetModule(&m, lib), 400);
}

static void linker(void) {
    char info[256] = "", error[256] = "";
    int opts[5] = {3, 4, 5, 6, 0};
    void *vals[5] = {info, (void *)(uintptr_t)sizeof info, error, (void *)(uintptr_t)sizeof error,
                     (void *)(uintptr_t)24};
    CUlinkState st;
    check("cuLinkCreate (CUDA 5.5's name)", cuLinkCreate(5, opts, vals, &st), 0);
    check("cuLinkAddData caller (CUDA 5.5's name)",
          cuLinkAddData(st, 1, (void *)CALLER, sizeof CALLER, "caller", 0, 0, 0), 0);
    check("cuLinkAddData callee", cuLinkAddData_v2(st, 1, (void *)CALLEE, sizeof CALLEE, "callee", 0, 0, 0), 0);
    check("cuLinkAddData of a cubin is refused",
          cuLinkAddData_v2(st, 0, (void *)"\x7f" "ELF", 4, "cubin", 0, 0, 0), 801 /* NOT_SUPPORTED */);
    expect("the error log says why", strstr(error, "cannot be linked") != NULL);
    check("a library without PTX is refused",
          cuLinkAddData_v2(st, 4 /* LIBRARY */, (void *)"!<arch>\n", 8, "empty.a", 0, 0, 0),
          801 /* NOT_SUPPORTED */);
    expect("... the error log says why", strstr(error, "holds no PTX") != NULL);
    check("a library that is no archive is refused",
          cuLinkAddData_v2(st, 4, (void *)"junk", 4, "junk.a", 0, 0, 0), 200 /* INVALID_IMAGE */);
    void *image = 0;
    size_t size = 0;
    check("cuLinkComplete", cuLinkComplete(st, &image, &size), 0);
    expect("an image", image && size > 0);
    expect("the info log", strstr(info, "linked 2 PTX inputs") != NULL);
    CUmodule m;
    check("load the linked image", cuModuleLoadData(&m, image), 0);
    check("cuLinkDestroy", cuLinkDestroy(st), 0);
    CUfunction f;
    check("the linked kernel", cuModuleGetFunction(&f, m, "apply"), 0);
    int regs = 0;
    cuFuncGetAttribute(&regs, 4, f);
    expect("the link's register limit", regs > 0 && regs <= 24);
    CUdeviceptr d;
    cuMemAlloc_v2(&d, 4);
    unsigned int v = 21;
    cuMemcpyHtoD_v2(d, &v, 4);
    void *args[] = {&d};
    check("launch across modules", cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, args, 0), 0);
    check("read the result", cuMemcpyDtoH_v2(&v, d, 4), 0);
    expect("twice(21) == 42", v == 42);
    cuMemFree_v2(d);
    cuModuleUnload(m);
}

static void copies(void) {
    enum { W = 24, H = 5, DPITCH = 64, D = 3 };
    unsigned char src[H][W + 8], back[H][W], host3[D][H][W], out3[D][H][W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W + 8; x++) src[y][x] = (unsigned char)(y * 40 + x);
    CUdeviceptr dev;
    check("allocate a pitched area", cuMemAlloc_v2(&dev, DPITCH * H * D), 0);
    cuMemsetD8_v2(dev, 0xee, DPITCH * H * D);

    CUDA_MEMCPY2D up = {0};
    up.srcMemoryType = HOST; up.srcHost = src; up.srcPitch = W + 8; up.srcXInBytes = 4;
    up.dstMemoryType = DEVICE; up.dstDevice = dev; up.dstPitch = DPITCH;
    up.WidthInBytes = W; up.Height = H;
    check("cuMemcpy2D host to device", cuMemcpy2D_v2(&up), 0);
    CUDA_MEMCPY2D down = {0};
    down.srcMemoryType = DEVICE; down.srcDevice = dev; down.srcPitch = DPITCH;
    down.dstMemoryType = HOST; down.dstHost = back; down.dstPitch = W;
    down.WidthInBytes = W; down.Height = H;
    check("cuMemcpy2D device to host", cuMemcpy2D_v2(&down), 0);
    int same = 1;
    for (int y = 0; y < H; y++) same &= !memcmp(back[y], &src[y][4], W);
    expect("2-D round trip", same);
    unsigned char gap = 0;
    cuMemcpyDtoH_v2(&gap, dev + W, 1);
    expect("bytes between rows untouched", gap == 0xee);
    check("cuMemcpy2D with a pitch narrower than a row",
          cuMemcpy2D_v2(&(CUDA_MEMCPY2D){.srcMemoryType = HOST, .srcHost = src, .srcPitch = 8,
                                         .dstMemoryType = DEVICE, .dstDevice = dev, .dstPitch = DPITCH,
                                         .WidthInBytes = W, .Height = H}),
          1);

    /* Device to device, asynchronously on a stream, at an offset row. */
    CUstream s;
    cuStreamCreate(&s, 0);
    CUDA_MEMCPY2D dd = {0};
    dd.srcMemoryType = DEVICE; dd.srcDevice = dev; dd.srcPitch = DPITCH;
    dd.dstMemoryType = DEVICE; dd.dstDevice = dev + DPITCH * H; dd.dstPitch = DPITCH; dd.dstY = 1;
    dd.WidthInBytes = W; dd.Height = H - 1;
    check("cuMemcpy2DAsync device to device", cuMemcpy2DAsync_v2(&dd, s), 0);
    check("cuStreamSynchronize", cuStreamSynchronize(s), 0);
    unsigned char row[W];
    cuMemcpyDtoH_v2(row, dev + DPITCH * H + DPITCH * 2, W);
    expect("device rows moved", !memcmp(row, &src[1][4], W));

    /* 2-D memsets. */
    check("cuMemsetD2D32", cuMemsetD2D32_v2(dev, DPITCH, 0x01020304u, W / 4, H), 0);
    unsigned int words[W / 4];
    cuMemcpyDtoH_v2(words, dev + DPITCH * (H - 1), W);
    expect("last row set", words[0] == 0x01020304u && words[W / 4 - 1] == 0x01020304u);
    check("cuMemsetD2D8Async", cuMemsetD2D8Async(dev, DPITCH, 0x5a, 3, H, s), 0);
    cuStreamSynchronize(s);
    unsigned char b[4];
    cuMemcpyDtoH_v2(b, dev + DPITCH * 2, 4);
    expect("bytes set, the rest kept", b[0] == 0x5a && b[2] == 0x5a && b[3] == 0x01);

    /* 3-D: slices of H rows, DPITCH bytes each, on the device. */
    for (int z = 0; z < D; z++)
        for (int y = 0; y < H; y++)
            for (int x = 0; x < W; x++) host3[z][y][x] = (unsigned char)(z * 77 + y * 7 + x);
    CUDA_MEMCPY3D u3 = {0};
    u3.srcMemoryType = HOST; u3.srcHost = host3; u3.srcPitch = W; u3.srcHeight = H;
    u3.dstMemoryType = DEVICE; u3.dstDevice = dev; u3.dstPitch = DPITCH; u3.dstHeight = H;
    u3.WidthInBytes = W; u3.Height = H; u3.Depth = D;
    check("cuMemcpy3D host to device", cuMemcpy3D_v2(&u3), 0);
    CUDA_MEMCPY3D d3 = {0};
    d3.srcMemoryType = DEVICE; d3.srcDevice = dev; d3.srcPitch = DPITCH; d3.srcHeight = H;
    d3.dstMemoryType = HOST; d3.dstHost = out3; d3.dstPitch = W; d3.dstHeight = H;
    d3.WidthInBytes = W; d3.Height = H; d3.Depth = D;
    check("cuMemcpy3D device to host", cuMemcpy3D_v2(&d3), 0);
    expect("3-D round trip", !memcmp(host3, out3, sizeof host3));

    CUdeviceptr other;
    cuMemAlloc_v2(&other, 16);
    check("cuMemcpyPeer within the VM's device", cuMemcpyPeer(other, 0, dev, 0, 16), 0);
    cuMemFree_v2(other);
    cuStreamDestroy_v2(s);
    cuMemFree_v2(dev);
}

static void pointers(void) {
    CUdeviceptr dev;
    cuMemAlloc_v2(&dev, 4096);
    unsigned int type = 0;
    check("memory type of device memory", cuPointerGetAttribute(&type, 2, dev + 100), 0);
    expect("CU_MEMORYTYPE_DEVICE", type == 2);
    CUdeviceptr start = 0;
    size_t range = 0;
    cuPointerGetAttribute(&start, 11, dev + 100);
    cuPointerGetAttribute(&range, 12, dev + 100);
    expect("range of the allocation", start == dev && range >= 4096);
    void *pinned;
    cuMemAllocHost_v2(&pinned, 4096);
    check("memory type of pinned memory", cuPointerGetAttribute(&type, 2, (CUdeviceptr)pinned), 0);
    expect("CU_MEMORYTYPE_HOST", type == 1);
    int local;
    check("an unknown pointer alone", cuPointerGetAttribute(&type, 2, (CUdeviceptr)&local), 1);
    int attrs[3] = {2, 4, 9};
    unsigned int t = 99;
    void *hp = 0;
    int ordinal = 0;
    void *data[3] = {&t, &hp, &ordinal};
    check("an unknown pointer in a batch", cuPointerGetAttributes(3, attrs, data, (CUdeviceptr)&local), 0);
    expect("unregistered host memory", t == 0 && hp == (void *)&local && ordinal == -2);
    cuMemFreeHost(pinned);
    cuMemFree_v2(dev);
}

static void device_and_peers(CUcontext ctx) {
    char bus[32] = "";
    check("cuDeviceGetPCIBusId", cuDeviceGetPCIBusId(bus, sizeof bus, 0), 0);
    /* NVIDIA's format, "0000:3B:00.0": programs hand it 13 bytes. */
    char short_bus[13] = "";
    check("cuDeviceGetPCIBusId into 13 bytes", cuDeviceGetPCIBusId(short_bus, 13, 0), 0);
    expect("a four-digit domain, the whole id in 13 bytes",
           strlen(bus) == 12 && strcmp(bus, short_bus) == 0 && bus[4] == ':' && bus[7] == ':' &&
               bus[10] == '.');
    /* The VM's GPU is no PCI function of the machine: its location names none (NCCL reads the
       class of whatever sysfs has there and took a host bridge for the GPU). */
    char sys_path[64];
    snprintf(sys_path, sizeof sys_path, "/sys/bus/pci/devices/%s", bus);
    for (char *c = sys_path; *c; c++) *c = (char)tolower((unsigned char)*c);
    expect("the bus id names no PCI device here", access(sys_path, F_OK) != 0);
    CUdevice d = -1;
    check("cuDeviceGetByPCIBusId", cuDeviceGetByPCIBusId(&d, bus), 0);
    expect("the same device", d == 0);
    check("cuDeviceGetByPCIBusId of another bus", cuDeviceGetByPCIBusId(&d, "00ff:1f:1f.0"), 101);
    int can = 1;
    check("cuDeviceCanAccessPeer", cuDeviceCanAccessPeer(&can, 0, 0), 0);
    expect("no peer", can == 0);
    int v;
    check("cuDeviceGetP2PAttribute of one device", cuDeviceGetP2PAttribute(&v, 1, 0, 0), 101);
    check("cuCtxEnablePeerAccess", cuCtxEnablePeerAccess(ctx, 0), 217);
    check("cuCtxDisablePeerAccess", cuCtxDisablePeerAccess(ctx), 705);
    /* CUDA 13's atomic capabilities: none reach host memory natively, no peer. */
    int atomic_ops[2] = {0 /* INTEGER_ADD */, 9 /* CAS */};
    unsigned caps[2] = {7, 7};
    check("cuDeviceGetHostAtomicCapabilities", cuDeviceGetHostAtomicCapabilities(caps, atomic_ops, 2, 0), 0);
    expect("no native host atomics", caps[0] == 0 && caps[1] == 0);
    check("... of another device", cuDeviceGetHostAtomicCapabilities(caps, atomic_ops, 2, 5), 101);
    check("... of no operations", cuDeviceGetHostAtomicCapabilities(caps, atomic_ops, 0, 0), 1);
    atomic_ops[1] = 13;
    check("... of an unknown operation", cuDeviceGetHostAtomicCapabilities(caps, atomic_ops, 2, 0), 1);
    check("cuDeviceGetP2PAtomicCapabilities of one device",
          cuDeviceGetP2PAtomicCapabilities(caps, atomic_ops, 1, 0, 0), 101);
    /* Multicast objects span devices: none on a VM's device (PyTorch resolves the functions). */
    check("MULTICAST_SUPPORTED", cuDeviceGetAttribute(&v, 132, 0), 0);
    expect("no multicast", v == 0);
    CUmulticastObjectProp mc = {1, 2 << 20, 1, 0};
    unsigned long long mch = 0;
    size_t gran = 0;
    check("cuMulticastCreate", cuMulticastCreate(&mch, &mc), 801);
    check("cuMulticastGetGranularity", cuMulticastGetGranularity(&gran, &mc, 0), 801);
    check("cuMulticastCreate without properties", cuMulticastCreate(&mch, NULL), 1);
    mc.size = 0;
    check("cuMulticastCreate of 0 bytes", cuMulticastCreate(&mch, &mc), 1);
    check("cuMulticastAddDevice", cuMulticastAddDevice(1, 0), 801);
    check("cuMulticastAddDevice of another device", cuMulticastAddDevice(1, 3), 101);
    check("cuMulticastBindMem", cuMulticastBindMem(1, 0, 2, 0, 2 << 20, 0), 801);
    check("cuMulticastBindAddr", cuMulticastBindAddr(1, 0, 0x1000, 2 << 20, 0), 801);
    check("cuMulticastUnbind", cuMulticastUnbind(1, 0, 0, 2 << 20), 801);

    CUstream s;
    cuStreamCreate(&s, 0);
    int status = 7;
    check("cuStreamIsCapturing", cuStreamIsCapturing(s, &status), 0);
    expect("not capturing", status == 0);
    cuStreamDestroy_v2(s);

    check("cuCtxSynchronize_v2 (current)", cuCtxSynchronize_v2(NULL), 0);
    check("cuCtxSynchronize_v2 (given)", cuCtxSynchronize_v2(ctx), 0);
    d = -1;
    check("cuCtxGetDevice_v2", cuCtxGetDevice_v2(&d, ctx), 0);
    expect("device 0", d == 0);
    CUcontext c4;
    check("cuCtxCreate_v4 without parameters", cuCtxCreate_v4(&c4, NULL, 0, 0), 0);
    check("destroy it", cuCtxDestroy_v2(c4), 0);
    cuCtxSetCurrent(ctx);

    /* Execution affinity (SM partitions, as under MPS): an SM count (tests/c/green_ctx.c runs
     * kernels on one). */
    int supported = -1, sms = 0;
    cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, 0);
    check("cuDeviceGetExecAffinitySupport (SM count)", cuDeviceGetExecAffinitySupport(&supported, 0, 0), 0);
    expect("... is supported", supported == 1);
    check("an unknown affinity type", cuDeviceGetExecAffinitySupport(&supported, 1, 0), 1);
    check("another device", cuDeviceGetExecAffinitySupport(&supported, 0, 1), 101);
    struct { int type; unsigned val; } affinity = {0, 0}, two[2] = {{0, 1}, {0, 1}};
    check("cuCtxGetExecAffinity", cuCtxGetExecAffinity(&affinity, 0), 0);
    expect("... all the device's SMs", affinity.type == 0 && (int)affinity.val == sms);
    check("cuCtxGetExecAffinity of an unknown type", cuCtxGetExecAffinity(&affinity, 7), 1);
    CUcontext c3 = NULL;
    affinity.val = 0;
    check("cuCtxCreate_v3 with an SM count of 0", cuCtxCreate_v3(&c3, &affinity, 1, 0, 0), 1);
    check("... with the SM count twice", cuCtxCreate_v3(&c3, two, 2, 0, 0), 1);
    affinity.val = 1000;
    check("cuCtxCreate_v3 with more SMs than the device has", cuCtxCreate_v3(&c3, &affinity, 1, 0, 0), 0);
    expect("... made a current context", c3 != NULL);
    check("cuCtxGetExecAffinity of it", cuCtxGetExecAffinity(&affinity, 0), 0);
    expect("... has the device's SMs", (int)affinity.val == sms);
    check("destroy it", cuCtxDestroy_v2(c3), 0);
    cuCtxSetCurrent(ctx);
}


/* CUDA 12's IDs and loading queries, occupancy with flags and by shared
 * memory, 3-D peer copies and event records with flags. */
static void newer_queries(CUcontext ctx) {
    unsigned long long ids[4] = {0}, again = 0;
    CUstream a, b;
    cuStreamCreate(&a, 0);
    cuStreamCreate(&b, 0);
    check("cuStreamGetId", cuStreamGetId(a, &ids[0]), 0);
    check("cuStreamGetId of another stream", cuStreamGetId(b, &ids[1]), 0);
    check("cuStreamGetId of the legacy stream", cuStreamGetId(NULL, &ids[2]), 0);
    check("cuStreamGetId of the per-thread stream", cuStreamGetId((CUstream)0x2, &ids[3]), 0);
    int distinct = 1;
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++) distinct &= ids[i] != ids[j];
    expect("stream IDs differ", distinct && ids[0] && ids[2]);
    cuStreamGetId(a, &again);
    expect("a stream's ID stays", again == ids[0]);
    check("cuStreamGetId_ptsz of stream 0 is the per-thread stream's",
          cuStreamGetId_ptsz(NULL, &again), 0);
    expect("the same ID", again == ids[3]);
    check("cuStreamGetId of a forged stream",
          cuStreamGetId((CUstream)(uintptr_t)0x7000deadbeefULL, &again), 400);
    /* Stream attributes: 1 access policy window, 4 synchronization policy,
     * 8 priority, 10 memory synchronization domain. */
    CUlaunchAttributeValue v;
    memset(&v, 0x55, sizeof v);
    check("cuStreamGetAttribute (synchronization policy)", cuStreamGetAttribute(a, 4, &v), 0);
    expect("automatic until set", v.syncPolicy == 1);
    v.syncPolicy = 4;
    check("cuStreamSetAttribute (blocking synchronization)", cuStreamSetAttribute(a, 4, &v), 0);
    v.syncPolicy = 0;
    cuStreamGetAttribute(a, 4, &v);
    expect("kept", v.syncPolicy == 4);
    check("cuStreamCopyAttributes", cuStreamCopyAttributes(b, a), 0);
    check("cuCtxResetPersistingL2Cache", cuCtxResetPersistingL2Cache(), 0);
    v.syncPolicy = 0;
    cuStreamGetAttribute(b, 4, &v);
    expect("copied", v.syncPolicy == 4);
    v.syncPolicy = 7;
    check("cuStreamSetAttribute of an unknown policy", cuStreamSetAttribute(a, 4, &v), 1);
    memset(&v, 0x55, sizeof v);
    check("cuStreamGetAttribute (access policy window)", cuStreamGetAttribute(a, 1, &v), 0);
    expect("no window", v.accessPolicyWindow.num_bytes == 0 && v.accessPolicyWindow.base_ptr == NULL);
    v.accessPolicyWindow.num_bytes = 0;
    v.accessPolicyWindow.hitRatio = 0.5f;
    v.accessPolicyWindow.hitProp = 2;
    v.accessPolicyWindow.missProp = 1;
    check("cuStreamSetAttribute (an empty window)", cuStreamSetAttribute(a, 1, &v), 0);
    memset(&v, 0, sizeof v);
    cuStreamGetAttribute(a, 1, &v);
    expect("kept", v.accessPolicyWindow.hitRatio == 0.5f && v.accessPolicyWindow.hitProp == 2);
    int max_window = -1;
    cuDeviceGetAttribute(&max_window, 109, 0);
    v.accessPolicyWindow.num_bytes = (size_t)max_window + 1;
    check("cuStreamSetAttribute (a window larger than the device's)",
          cuStreamSetAttribute(a, 1, &v), 1);
    v.accessPolicyWindow.num_bytes = 0;
    v.accessPolicyWindow.hitRatio = 2.0f;
    check("cuStreamSetAttribute (a hit ratio above 1)", cuStreamSetAttribute(a, 1, &v), 1);
    CUstream prio;
    cuStreamCreateWithPriority(&prio, 0, -1);
    check("cuStreamGetAttribute (priority)", cuStreamGetAttribute(prio, 8, &v), 0);
    expect("the stream's priority", v.priority == -1);
    check("cuStreamSetAttribute (priority)", cuStreamSetAttribute(prio, 8, &v), 801);
    check("cuStreamGetAttribute (memory synchronization domain)",
          cuStreamGetAttribute(a, 10, &v), 801);
    check("cuStreamGetAttribute of a launch-only attribute", cuStreamGetAttribute(a, 2, &v), 1);
    cuStreamDestroy_v2(prio);
    check("cuStreamGetAttribute of a destroyed stream", cuStreamGetAttribute(prio, 4, &v), 400);

    CUdevice dev = -1;
    check("cuStreamGetDevice", cuStreamGetDevice(a, &dev), 0);
    expect("device 0", dev == 0);
    unsigned long long cid = 0, cid2 = 0;
    check("cuCtxGetId (current)", cuCtxGetId(NULL, &cid), 0);
    check("cuCtxGetId (given)", cuCtxGetId(ctx, &cid2), 0);
    expect("the same context ID", cid && cid == cid2);
    CUcontext other;
    cuCtxCreate_v2(&other, 0, 0);
    check("cuCtxGetId of another context", cuCtxGetId(other, &cid2), 0);
    expect("another context, another ID", cid2 && cid2 != cid);
    cuCtxDestroy_v2(other);
    cuCtxSetCurrent(ctx);
    check("cuCtxGetId of a destroyed context", cuCtxGetId(other, &cid2), 201);

    /* Context flags: as created, then as set (scheduling mode 0x7 mask,
     * 0x8 map host). */
    unsigned int flags = 99;
    check("cuCtxGetFlags", cuCtxGetFlags(&flags), 0);
    expect("created with none", flags == 0);
    cuCtxCreate_v2(&other, 0x4 | 0x8, 0);
    check("cuCtxGetFlags of a context created with flags", cuCtxGetFlags(&flags), 0);
    expect("blocking sync and map host", flags == 0xc);
    check("cuCtxSetFlags", cuCtxSetFlags(0x1), 0);
    cuCtxGetFlags(&flags);
    expect("spin now", flags == 0x1);
    check("cuCtxSetFlags of no scheduling mode", cuCtxSetFlags(0x3), 1);
    check("cuCtxSetFlags of an unknown flag", cuCtxSetFlags(0x100), 1);
    cuCtxDestroy_v2(other);
    CUcontext primary;
    cuDevicePrimaryCtxRetain(&primary, 0);
    cuCtxSetCurrent(primary);
    check("cuCtxSetFlags of the primary context", cuCtxSetFlags(0x4), 0);
    unsigned int pflags = 0;
    int active = 0;
    cuDevicePrimaryCtxGetState(0, &pflags, &active);
    cuCtxGetFlags(&flags);
    expect("the primary context's flags", pflags == 0x4 && flags == 0x4 && active);
    cuCtxSetFlags(0);
    cuDevicePrimaryCtxRelease_v2(0);
    cuCtxSetCurrent(ctx);

    CUmodule m;
    CUfunction add_one;
    cuModuleLoadData(&m, MODULE);
    cuModuleGetFunction(&add_one, m, "add_one");
    /* CUdevprop: attributes 1 (MAX_THREADS_PER_BLOCK) to 14 (TEXTURE_ALIGNMENT). */
    int prop[14], same_props = 1;
    memset(prop, 0xff, sizeof prop);
    check("cuDeviceGetProperties", cuDeviceGetProperties(prop, 0), 0);
    for (int i = 0; i < 14; i++) {
        int a = -2;
        cuDeviceGetAttribute(&a, i + 1, 0);
        same_props &= prop[i] == a && a > 0;
    }
    expect("the properties are the attributes", same_props);
    check("cuDeviceGetProperties of another device", cuDeviceGetProperties(prop, 9), 101);
    int banks = -1;
    check("cuCtxGetSharedMemConfig", cuCtxGetSharedMemConfig(&banks), 0);
    expect("four-byte banks", banks == 1);
    check("cuCtxSetSharedMemConfig", cuCtxSetSharedMemConfig(2), 0);
    check("cuCtxSetSharedMemConfig of an unknown value", cuCtxSetSharedMemConfig(3), 1);
    check("cuFuncSetSharedMemConfig", cuFuncSetSharedMemConfig(add_one, 0), 0);
    check("cuFuncSetSharedMemConfig of a forged function",
          cuFuncSetSharedMemConfig((CUfunction)(uintptr_t)0x7000deadbeefULL, 0), 400);

    int state = -1;
    check("cuFuncIsLoaded", cuFuncIsLoaded(&state, add_one), 0);
    expect("loaded", state == 1);
    check("cuFuncLoad", cuFuncLoad(add_one), 0);
    int grid0 = 0, block0 = 0, grid1 = 0, block1 = 0;
    check("cuOccupancyMaxPotentialBlockSize",
          cuOccupancyMaxPotentialBlockSize(&grid0, &block0, add_one, NULL, 0, 0), 0);
    check("cuOccupancyMaxPotentialBlockSizeWithFlags",
          cuOccupancyMaxPotentialBlockSizeWithFlags(&grid1, &block1, add_one, NULL, 0, 0, 1), 0);
    expect("the same answer with the flag", grid0 == grid1 && block0 == block1 && block0 > 0);
    check("cuOccupancyMaxPotentialBlockSizeWithFlags with an unknown flag",
          cuOccupancyMaxPotentialBlockSizeWithFlags(&grid1, &block1, add_one, NULL, 0, 0, 4), 1);
    size_t avail = 0;
    check("cuOccupancyAvailableDynamicSMemPerBlock",
          cuOccupancyAvailableDynamicSMemPerBlock(&avail, add_one, 2, 128), 0);
    int n = 0;
    cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, add_one, 128, avail);
    expect("two blocks fit with that much", avail > 0 && n >= 2);
    cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, add_one, 128, avail + 1024);
    size_t more = 0;
    cuOccupancyAvailableDynamicSMemPerBlock(&more, add_one, 1, 128);
    expect("and not with a kilobyte more, unless that is the limit", n < 2 || avail == more);
    expect("one block may have at least as much", more >= avail);
    check("cuOccupancyAvailableDynamicSMemPerBlock of no blocks",
          cuOccupancyAvailableDynamicSMemPerBlock(&avail, add_one, 0, 128), 1);

    /* Cluster occupancy on a device without clusters (compute capability 8.0): clusters of one
     * block. cuBLASLt's heuristics call these through the runtime. */
    struct {
        unsigned id;
        unsigned pad;
        unsigned value[16];
    } cluster_attr = {4 /* CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION */, 0, {1, 1, 1}};
    struct {
        unsigned grid[3], block[3], shared;
        void *stream;
        void *attrs;
        unsigned num_attrs;
    } config = {{8, 1, 1}, {128, 1, 1}, 0, NULL, NULL, 0};
    int cluster_size = -1, clusters = -1, per_sm = 0, sm_count = 0;
    check("cuOccupancyMaxPotentialClusterSize",
          cuOccupancyMaxPotentialClusterSize(&cluster_size, add_one, (void *)&config), 0);
    expect("... one block", cluster_size == 1);
    check("cuOccupancyMaxActiveClusters without a cluster size",
          cuOccupancyMaxActiveClusters(&clusters, add_one, (void *)&config), 912 /* INVALID_CLUSTER_SIZE */);
    config.attrs = &cluster_attr;
    config.num_attrs = 1;
    check("cuOccupancyMaxActiveClusters of one-block clusters",
          cuOccupancyMaxActiveClusters(&clusters, add_one, (void *)&config), 0);
    cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, add_one, 128, 0);
    cuDeviceGetAttribute(&sm_count, 16 /* MULTIPROCESSOR_COUNT */, 0);
    expect("... every block that fits the device at once", clusters == per_sm * sm_count && clusters > 0);
    cluster_attr.value[0] = 2;
    check("clusters of two blocks", cuOccupancyMaxActiveClusters(&clusters, add_one, (void *)&config),
          912);

    /* CUDA_MEMCPY3D_PEER: CUDA_MEMCPY3D with the contexts where the reserved
     * pointers are. */
    enum { W = 16, H = 3 };
    unsigned char src[H][W], back[H][W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) src[y][x] = (unsigned char)(7 * y + x);
    CUdeviceptr d;
    cuMemAlloc_v2(&d, 64 * H);
    CUDA_MEMCPY3D up = {0};
    up.srcMemoryType = HOST; up.srcHost = src; up.srcPitch = W; up.srcHeight = H;
    up.reserved0 = ctx;
    up.dstMemoryType = DEVICE; up.dstDevice = d; up.dstPitch = 64; up.dstHeight = H;
    up.reserved1 = ctx;
    up.WidthInBytes = W; up.Height = H; up.Depth = 1;
    check("cuMemcpy3DPeer host to device", cuMemcpy3DPeer(&up), 0);
    CUDA_MEMCPY3D down = {0};
    down.srcMemoryType = DEVICE; down.srcDevice = d; down.srcPitch = 64; down.srcHeight = H;
    down.reserved0 = ctx;
    down.dstMemoryType = HOST; down.dstHost = back; down.dstPitch = W; down.dstHeight = H;
    down.reserved1 = ctx;
    down.WidthInBytes = W; down.Height = H; down.Depth = 1;
    memset(back, 0, sizeof back);
    check("cuMemcpy3DPeerAsync device to host", cuMemcpy3DPeerAsync(&down, a), 0);
    cuStreamSynchronize(a);
    expect("3-D peer round trip", !memcmp(back, src, sizeof src));
    check("cuMemcpy3DPeer of NULL", cuMemcpy3DPeer(NULL), 1);
    cuMemFree_v2(d);

    CUevent e;
    cuEventCreate(&e, 0);
    check("cuEventRecordWithFlags (default)", cuEventRecordWithFlags(e, a, 0), 0);
    check("cuEventRecordWithFlags (external, not capturing)", cuEventRecordWithFlags(e, a, 1), 0);
    check("and the event completes", cuEventSynchronize(e), 0);
    check("cuEventRecordWithFlags with an unknown flag", cuEventRecordWithFlags(e, a, 4), 1);
    check("begin a capture", cuStreamBeginCapture_v2(b, 0), 0);
    check("cuEventRecordWithFlags (external) in a capture",
          cuEventRecordWithFlags(e, b, 1), 900);
    void *graph = NULL;
    check("the capture was invalidated", cuStreamEndCapture(b, &graph), 901);
    cuEventDestroy_v2(e);
    cuModuleUnload(m);
    cuStreamDestroy_v2(a);
    cuStreamDestroy_v2(b);
}

/* The launch API of CUDA before 4.0: parameters set by offset, then a grid. */
static void legacy_launch(void) {
    CUmodule m;
    CUfunction add_one;
    cuModuleLoadData(&m, MODULE);
    cuModuleGetFunction(&add_one, m, "add_one");
    enum { N = 300 };
    unsigned int v[N];
    for (int i = 0; i < N; i++) v[i] = (unsigned int)i;
    CUdeviceptr d;
    cuMemAlloc_v2(&d, sizeof v);
    cuMemcpyHtoD_v2(d, v, sizeof v);
    check("cuLaunchGrid before a block shape", cuLaunchGrid(add_one, 1, 1), 1);
    check("cuFuncSetBlockShape", cuFuncSetBlockShape(add_one, 64, 1, 1), 0);
    check("cuFuncSetSharedSize", cuFuncSetSharedSize(add_one, 0), 0);
    check("cuParamSetv (the pointer)", cuParamSetv(add_one, 0, &d, sizeof d), 0);
    check("cuLaunchGrid with too few parameter bytes", cuLaunchGrid(add_one, 1, 1), 1);
    check("cuParamSeti (the count)", cuParamSeti(add_one, 8, 200), 0);
    check("cuParamSetSize", cuParamSetSize(add_one, 12), 0);
    check("cuLaunchGrid", cuLaunchGrid(add_one, 4, 1), 0);
    check("cuLaunch (one block)", cuLaunch(add_one), 0);
    CUstream s;
    cuStreamCreate(&s, 0);
    check("cuParamSetf over the count (as bits)", cuParamSetf(add_one, 8, 0.0f), 0);
    check("cuParamSeti (the count again)", cuParamSeti(add_one, 8, 10), 0);
    check("cuLaunchGridAsync", cuLaunchGridAsync(add_one, 1, 1, s), 0);
    cuStreamSynchronize(s);
    cuMemcpyDtoH_v2(v, d, sizeof v);
    int right = 1;
    for (int i = 0; i < N; i++) {
        unsigned int want = (unsigned int)i + (i < 200) + (i < 64) + (i < 10);
        right &= v[i] == want;
    }
    expect("each launch incremented its threads' elements", right);
    check("cuParamSetv past the parameter space", cuParamSetv(add_one, 4094, &d, 8), 1);
    check("cuParamSeti at a negative offset", cuParamSeti(add_one, -4, 1), 1);
    check("cuFuncSetBlockShape of zero threads", cuFuncSetBlockShape(add_one, 0, 1, 1), 1);
    check("cuLaunchGrid of a forged function",
          cuLaunchGrid((CUfunction)(uintptr_t)0x7000deadbeefULL, 1, 1), 400);
    cuStreamDestroy_v2(s);
    cuMemFree_v2(d);
    cuModuleUnload(m);
    check("cuLaunch of an unloaded module's function", cuLaunch(add_one), 400);
}

/* CUDA arrays and texture and surface objects through the driver API. */
/* Mipmapped arrays through the driver API: levels, their descriptors, what CUDA refuses, a
 * texture over the chain, the chain's memory. */
static void mipmapped_arrays(const CUDA_TEXTURE_DESC *td) {
    enum { FLOAT = 0x20, W = 12, H = 6 };
    const int INVALID_VALUE = 1, INVALID_HANDLE = 400;
    size_t free0, free1, total;
    cuMemGetInfo_v2(&free0, &total);
    CUDA_ARRAY3D_DESCRIPTOR d = {W, H, 0, FLOAT, 1, 0};
    void *mip = NULL;
    check("cuMipmappedArrayCreate of three levels", cuMipmappedArrayCreate(&mip, &d, 3), 0);
    cuMemGetInfo_v2(&free1, &total);
    expect("the chain is charged to the slice", free0 - free1 >= (W * H + 6 * 3 + 3 * 1) * 4);
    CUarray levels[3] = {NULL, NULL, NULL};
    for (unsigned l = 0; l < 3; l++)
        check("cuMipmappedArrayGetLevel", cuMipmappedArrayGetLevel(&levels[l], mip, l), 0);
    CUarray past = NULL;
    check("a level past the last", cuMipmappedArrayGetLevel(&past, mip, 3), INVALID_VALUE);
    CUDA_ARRAY3D_DESCRIPTOR back;
    check("cuArray3DGetDescriptor of level 2", cuArray3DGetDescriptor_v2(&back, levels[2]), 0);
    expect("level 2 is a quarter of the first each way (12x6 -> 3x1)",
           back.Width == 3 && back.Height == 1 && back.Depth == 0 && back.Format == FLOAT);
    expect("the levels are distinct arrays", levels[0] != levels[1] && levels[1] != levels[2]);
    float in[3] = {1.5f, 2.5f, 3.5f}, out[3] = {0, 0, 0};
    check("cuMemcpyHtoA into level 2", cuMemcpyHtoA_v2(levels[2], 0, in, sizeof in), 0);
    check("cuMemcpyAtoH out of level 2", cuMemcpyAtoH_v2(out, levels[2], 0, sizeof out), 0);
    expect("a level holds what was copied in", memcmp(in, out, sizeof in) == 0);
    check("cuArrayDestroy of a level", cuArrayDestroy(levels[1]), INVALID_VALUE);
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    check("cuMipmappedArrayGetMemoryRequirements",
          cuMipmappedArrayGetMemoryRequirements(&req, mip, 0), 0);
    expect("the requirements cover the chain", req.size >= (W * H + 6 * 3 + 3) * 4 && req.alignment > 0);
    char sparse[64];
    check("cuMipmappedArrayGetSparseProperties of an array that is not sparse",
          cuMipmappedArrayGetSparseProperties(sparse, mip), INVALID_VALUE);
    /* A texture over the chain. */
    CUDA_RESOURCE_DESC rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = 1;
    rd.res.array.hArray = (CUarray)mip;
    CUDA_TEXTURE_DESC mtd = *td;
    mtd.addressMode[2] = 1;
    mtd.maxMipmapLevelClamp = 2.0f;
    CUtexObject t = 0;
    check("cuTexObjectCreate over a mipmapped array", cuTexObjectCreate(&t, &rd, &mtd, NULL), 0);
    CUDA_RESOURCE_DESC rback;
    check("cuTexObjectGetResourceDesc", cuTexObjectGetResourceDesc(&rback, t), 0);
    expect("the resource is the mipmapped array", rback.resType == 1 && rback.res.array.hArray == (CUarray)mip);
    check("cuMipmappedArrayDestroy while a texture names it", cuMipmappedArrayDestroy(mip), INVALID_VALUE);
    check("cuTexObjectDestroy", cuTexObjectDestroy(t), 0);
    check("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy(mip), 0);
    check("cuMipmappedArrayDestroy twice", cuMipmappedArrayDestroy(mip), INVALID_HANDLE);
    check("a level of a destroyed chain", cuMipmappedArrayGetLevel(&past, mip, 0), INVALID_HANDLE);
    check("a destroyed chain's level array", cuArray3DGetDescriptor_v2(&back, levels[0]), INVALID_HANDLE);
    size_t free2;
    cuMemGetInfo_v2(&free2, &total);
    expect("destroying the chain gives the slice back", free2 == free0);
    /* More levels than the extents halve into: clamped, as CUDA documents. */
    CUDA_ARRAY3D_DESCRIPTOR d1 = {8, 0, 0, FLOAT, 4, 0};
    check("a 1-D chain asked for 30 levels", cuMipmappedArrayCreate(&mip, &d1, 30), 0);
    check("its last level is the fourth (8, 4, 2, 1)", cuMipmappedArrayGetLevel(&past, mip, 3), 0);
    check("and there is no fifth", cuMipmappedArrayGetLevel(&past, mip, 4), INVALID_VALUE);
    check("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy(mip), 0);
    check("a forged mipmapped array handle", cuMipmappedArrayDestroy((void *)(uintptr_t)0x0a77b000beefULL),
          INVALID_HANDLE);
}

static void arrays(void) {
    enum { FLOAT = 0x20, U8 = 0x01, W = 10, H = 3 };
    const int INVALID_VALUE = 1, INVALID_HANDLE = 400, NOT_SUPPORTED = 801;
    /* 10 floats a row: 40 bytes, which the array pads to its pitch. */
    float in[H][W], out[H][W];
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) in[y][x] = (float)(y * 100 + x);
    size_t free0, total;
    cuMemGetInfo_v2(&free0, &total);
    CUDA_ARRAY_DESCRIPTOR d2 = {W, H, FLOAT, 1};
    CUarray a = NULL;
    check("cuArrayCreate of a 2-D float array", cuArrayCreate_v2(&a, &d2), 0);
    CUDA_ARRAY_DESCRIPTOR d2back;
    check("cuArrayGetDescriptor", cuArrayGetDescriptor_v2(&d2back, a), 0);
    expect("the descriptor is the one created",
           d2back.Width == W && d2back.Height == H && d2back.Format == FLOAT && d2back.NumChannels == 1);
    CUDA_ARRAY3D_DESCRIPTOR d3back;
    check("cuArray3DGetDescriptor", cuArray3DGetDescriptor_v2(&d3back, a), 0);
    expect("the 3-D descriptor has no depth and no flags", d3back.Depth == 0 && d3back.Flags == 0);
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    check("cuArrayGetMemoryRequirements", cuArrayGetMemoryRequirements(&req, a, 0), 0);
    expect("an array needs at least its texels", req.size >= sizeof in && req.alignment > 0);
    size_t free1;
    cuMemGetInfo_v2(&free1, &total);
    expect("an array is charged to the slice", free0 - free1 >= req.size);

    /* Bytes in and out by offset, across the padded rows. */
    check("cuMemcpyHtoA of the whole array", cuMemcpyHtoA_v2(a, 0, in, sizeof in), 0);
    memset(out, 0, sizeof out);
    check("cuMemcpyAtoH of the whole array", cuMemcpyAtoH_v2(out, a, 0, sizeof out), 0);
    expect("an array gives back its rows", memcmp(in, out, sizeof in) == 0);
    float part[6];
    check("cuMemcpyAtoH across a row's end", cuMemcpyAtoH_v2(part, a, 7 * 4, sizeof part), 0);
    expect("the bytes after a row's end are the next row's",
           part[0] == in[0][7] && part[2] == in[0][9] && part[3] == in[1][0] && part[5] == in[1][2]);
    check("cuMemcpyAtoH past the end", cuMemcpyAtoH_v2(part, a, sizeof in - 8, sizeof part),
          INVALID_VALUE);
    CUdeviceptr dev;
    check("allocate linear memory", cuMemAlloc_v2(&dev, sizeof in), 0);
    check("cuMemcpyAtoD", cuMemcpyAtoD_v2(dev, a, 0, sizeof in), 0);
    CUarray b = NULL;
    check("cuArrayCreate of a second array", cuArrayCreate_v2(&b, &d2), 0);
    check("cuMemcpyDtoA", cuMemcpyDtoA_v2(b, 4, dev, sizeof in - 4), 0);
    CUarray c = NULL;
    check("cuArrayCreate of a third array", cuArrayCreate_v2(&c, &d2), 0);
    check("cuMemcpyAtoA shifted by one texel", cuMemcpyAtoA_v2(c, 0, b, 4, sizeof in - 4), 0);
    memset(out, 0, sizeof out);
    check("cuMemcpyAtoH of the copy", cuMemcpyAtoH_v2(out, c, 0, sizeof in - 4), 0);
    expect("array to device to array to array keeps every texel",
           memcmp(in, out, sizeof in - 4) == 0);
    CUstream s;
    cuStreamCreate(&s, 0);
    float twos[W];
    for (int i = 0; i < W; i++) twos[i] = 2.0f;
    check("cuMemcpyHtoAAsync of the second row", cuMemcpyHtoAAsync_v2(c, W * 4, twos, sizeof twos, s), 0);
    cuStreamSynchronize(s);
    check("cuMemcpyAtoH after the async copy", cuMemcpyAtoH_v2(out, c, W * 4, sizeof twos), 0);
    expect("the async copy landed", out[0][0] == 2.0f && out[0][W - 1] == 2.0f);

    /* A 2-D copy into the middle of the array through cuMemcpy2D. */
    float patch[2][2] = {{-1, -2}, {-3, -4}};
    CUDA_MEMCPY2D cp = {0};
    cp.srcMemoryType = HOST; cp.srcHost = patch; cp.srcPitch = sizeof patch[0];
    cp.dstMemoryType = 3; cp.dstArray = a; cp.dstXInBytes = 4 * 4; cp.dstY = 1;
    cp.WidthInBytes = sizeof patch[0]; cp.Height = 2;
    check("cuMemcpy2D into an array", cuMemcpy2D_v2(&cp), 0);
    check("cuMemcpyAtoH after it", cuMemcpyAtoH_v2(out, a, 0, sizeof out), 0);
    expect("the patch landed at (4, 1)", out[1][4] == -1 && out[1][5] == -2 && out[2][4] == -3 &&
                                          out[2][5] == -4 && out[1][3] == in[1][3] && out[0][4] == in[0][4]);
    cp.dstXInBytes = 9 * 4;
    check("cuMemcpy2D past an array's row", cuMemcpy2D_v2(&cp), INVALID_VALUE);

    /* Refusals. */
    CUarray bad = NULL;
    CUDA_ARRAY_DESCRIPTOR zero = {0, 1, FLOAT, 1}, three = {4, 4, FLOAT, 3}, fmt = {4, 4, 0x77, 1};
    check("an array of width 0", cuArrayCreate_v2(&bad, &zero), INVALID_VALUE);
    check("an array of three channels", cuArrayCreate_v2(&bad, &three), INVALID_VALUE);
    check("an array of an unknown format", cuArrayCreate_v2(&bad, &fmt), NOT_SUPPORTED);
    CUDA_ARRAY3D_DESCRIPTOR cube = {4, 4, 6, FLOAT, 1, 0x04}, layered0 = {4, 4, 0, FLOAT, 1, 0x01};
    CUDA_ARRAY3D_DESCRIPTOR depth = {4, 4, 0, FLOAT, 1, 0x10}, cube7 = {4, 4, 7, FLOAT, 1, 0x04};
    CUDA_ARRAY3D_DESCRIPTOR cube_layers = {4, 4, 18, FLOAT, 1, 0x05}, oblong = {4, 2, 6, FLOAT, 1, 0x04};
    CUarray ca = NULL;
    check("a cube map array", cuArray3DCreate_v2(&ca, &cube), 0);
    CUDA_ARRAY3D_DESCRIPTOR cback;
    check("cuArray3DGetDescriptor of a cube map", cuArray3DGetDescriptor_v2(&cback, ca), 0);
    expect("a cube map's descriptor reads back", cback.Depth == 6 && cback.Flags == 0x04);
    check("cuArrayDestroy of a cube map", cuArrayDestroy(ca), 0);
    check("a layered cube map of three cubes", cuArray3DCreate_v2(&ca, &cube_layers), 0);
    check("cuArrayDestroy of a layered cube map", cuArrayDestroy(ca), 0);
    check("a cube map of seven faces", cuArray3DCreate_v2(&bad, &cube7), INVALID_VALUE);
    check("a cube map of oblong faces", cuArray3DCreate_v2(&bad, &oblong), INVALID_VALUE);
    check("a depth texture array", cuArray3DCreate_v2(&bad, &depth), NOT_SUPPORTED);
    check("a layered array without layers", cuArray3DCreate_v2(&bad, &layered0), INVALID_VALUE);
    CUDA_ARRAY3D_DESCRIPTOR wide = {1 << 20, 0, 0, FLOAT, 1, 0};
    check("a 1-D array wider than the device's limit", cuArray3DCreate_v2(&bad, &wide), INVALID_VALUE);
    void *mip = NULL;
    check("a mipmapped cube map", cuMipmappedArrayCreate(&mip, &cube, 2), 0);
    check("its level 1", cuMipmappedArrayGetLevel(&ca, mip, 1), 0);
    check("cuArray3DGetDescriptor of level 1", cuArray3DGetDescriptor_v2(&cback, ca), 0);
    expect("level 1 of a cube map keeps its six faces",
           cback.Width == 2 && cback.Height == 2 && cback.Depth == 6 && cback.Flags == 0x04);
    check("cuMipmappedArrayDestroy of a cube map", cuMipmappedArrayDestroy(mip), 0);
    check("a mipmapped depth texture", cuMipmappedArrayCreate(&mip, &depth, 2), NOT_SUPPORTED);
    check("a mipmapped array without a descriptor", cuMipmappedArrayCreate(&mip, NULL, 2), INVALID_VALUE);
    check("cuArrayGetPlane of a single-plane array", cuArrayGetPlane(&bad, a, 0), INVALID_VALUE);
    check("a forged array handle", cuArrayDestroy((CUarray)(uintptr_t)0x0a77a000deadULL), INVALID_HANDLE);

    /* Texture and surface objects. */
    CUDA_RESOURCE_DESC rd;
    memset(&rd, 0, sizeof rd);
    rd.resType = 0;
    rd.res.array.hArray = a;
    CUDA_TEXTURE_DESC td;
    memset(&td, 0, sizeof td);
    td.addressMode[0] = td.addressMode[1] = 1;
    td.filterMode = 1;
    td.flags = 2;
    CUtexObject t = 0;
    check("cuTexObjectCreate over an array", cuTexObjectCreate(&t, &rd, &td, NULL), 0);
    expect("a texture object is a non-zero handle", t != 0);
    CUDA_RESOURCE_DESC rback;
    CUDA_TEXTURE_DESC tback;
    CUDA_RESOURCE_VIEW_DESC vback;
    check("cuTexObjectGetResourceDesc", cuTexObjectGetResourceDesc(&rback, t), 0);
    check("cuTexObjectGetTextureDesc", cuTexObjectGetTextureDesc(&tback, t), 0);
    check("cuTexObjectGetResourceViewDesc of an object made without a view",
          cuTexObjectGetResourceViewDesc(&vback, t), INVALID_VALUE);
    expect("the descriptors read back", rback.resType == 0 && rback.res.array.hArray == a &&
                                            tback.filterMode == 1 && tback.flags == 2);
    check("cuArrayDestroy while a texture names it", cuArrayDestroy(a), INVALID_VALUE);
    CUsurfObject so = 0;
    check("a surface over an array made without SURFACE_LDST", cuSurfObjectCreate(&so, &rd), INVALID_VALUE);
    CUDA_ARRAY3D_DESCRIPTOR sd = {W, H, 0, FLOAT, 1, 0x02};
    CUarray sa = NULL;
    check("cuArray3DCreate for surface load/store", cuArray3DCreate_v2(&sa, &sd), 0);
    CUDA_RESOURCE_DESC rd_float = rd;
    rd.res.array.hArray = sa;
    check("cuSurfObjectCreate", cuSurfObjectCreate(&so, &rd), 0);
    check("cuSurfObjectGetResourceDesc", cuSurfObjectGetResourceDesc(&rback, so), 0);
    expect("the surface names its array", rback.res.array.hArray == sa);
    check("cuSurfObjectDestroy", cuSurfObjectDestroy(so), 0);
    check("cuSurfObjectDestroy twice", cuSurfObjectDestroy(so), INVALID_VALUE);

    CUDA_RESOURCE_DESC lin;
    memset(&lin, 0, sizeof lin);
    lin.resType = 2;
    lin.res.linear.devPtr = dev;
    lin.res.linear.format = U8;
    lin.res.linear.numChannels = 4;
    lin.res.linear.sizeInBytes = sizeof in;
    CUtexObject tl = 0;
    check("cuTexObjectCreate over linear memory", cuTexObjectCreate(&tl, &lin, &td, NULL), 0);
    lin.res.linear.devPtr = dev + 4;
    check("linear memory off the texture alignment", cuTexObjectCreate(&tl, &lin, &td, NULL), INVALID_VALUE);
    lin.res.linear.devPtr = dev;
    lin.resType = 1;
    check("a mipmapped resource naming no mipmapped array", cuTexObjectCreate(&tl, &lin, &td, NULL),
          INVALID_HANDLE);
    lin.resType = 2;
    CUDA_RESOURCE_VIEW_DESC view;
    memset(&view, 0, sizeof view);
    view.format = 0x16;
    check("a resource view of linear memory", cuTexObjectCreate(&tl, &lin, &td, &view), INVALID_VALUE);
    /* Views of the float array: its texels read as 32-bit integers, back as given. */
    CUtexObject tv = 0;
    view.format = 0x0d; /* CU_RES_VIEW_FORMAT_UINT_1X32 */
    view.width = W;
    view.height = H;
    check("a view reading floats as 32-bit integers", cuTexObjectCreate(&tv, &rd_float, &td, &view), 0);
    check("cuTexObjectGetResourceViewDesc", cuTexObjectGetResourceViewDesc(&vback, tv), 0);
    expect("the view reads back", vback.format == 0x0d && vback.width == W && vback.height == H);
    check("cuTexObjectDestroy of the view", cuTexObjectDestroy(tv), 0);
    view.format = 0x13; /* FLOAT_1X16: half the texel */
    check("a view of another texel size", cuTexObjectCreate(&tv, &rd_float, &td, &view), INVALID_VALUE);
    view.format = 0x19; /* UNSIGNED_BC1 */
    check("a block-compressed view", cuTexObjectCreate(&tv, &rd_float, &td, &view), NOT_SUPPORTED);
    view.format = 0;
    view.width = W + 1;
    check("a view wider than its array", cuTexObjectCreate(&tv, &rd_float, &td, &view), INVALID_VALUE);
    view.width = W;
    view.lastLayer = 1;
    check("a layer range of an array without layers", cuTexObjectCreate(&tv, &rd_float, &td, &view), INVALID_VALUE);
    view.lastLayer = 0;
    view.lastMipmapLevel = 1;
    check("a level range of an array without levels", cuTexObjectCreate(&tv, &rd_float, &td, &view), INVALID_VALUE);
    td.addressMode[2] = 7;
    check("an address mode CUDA does not have", cuTexObjectCreate(&tl, &rd, &td, NULL), INVALID_VALUE);
    mipmapped_arrays(&td);
    size_t maxw = 0;
    check("cuDeviceGetTexture1DLinearMaxWidth", cuDeviceGetTexture1DLinearMaxWidth(&maxw, FLOAT, 4, 0), 0);
    expect("a linear texture may be millions of texels wide", maxw >= (1u << 27));
    check("cuDeviceGetTexture1DLinearMaxWidth of three channels",
          cuDeviceGetTexture1DLinearMaxWidth(&maxw, FLOAT, 3, 0), INVALID_VALUE);
    check("cuTexObjectDestroy", cuTexObjectDestroy(t), 0);
    check("cuTexObjectDestroy twice", cuTexObjectDestroy(t), INVALID_VALUE);
    check("cuTexObjectDestroy of a forged handle", cuTexObjectDestroy(0x7777), INVALID_VALUE);

    check("cuArrayDestroy", cuArrayDestroy(a), 0);
    check("cuArrayDestroy twice", cuArrayDestroy(a), INVALID_HANDLE);
    cuArrayDestroy(b);
    cuArrayDestroy(c);
    cuArrayDestroy(sa);
    cuMemFree_v2(dev);
    cuStreamDestroy_v2(s);
    cuMemGetInfo_v2(&free1, &total);
    expect("arrays give their memory back", free1 == free0);
}

/* A stream's context is the one it was created in, whichever is current; CUDA 12.5's
 * cuStreamGetCtx_v2 adds no green context; CUDA 12.8's cuEventElapsedTime_v2 measures. */
static void stream_contexts(CUcontext ctx) {
    CUcontext other = NULL, got = NULL;
    void *green = (void *)1;
    CUstream s;
    check("a second context", cuCtxCreate_v2(&other, 0, 0), 0);
    check("a stream in it", cuStreamCreate(&s, 0), 0);
    check("back to the first context", cuCtxSetCurrent(ctx), 0);
    check("cuStreamGetCtx", cuStreamGetCtx(s, &got), 0);
    expect("a stream's context is the one it was made in", got == other);
    got = NULL;
    check("cuStreamGetCtx_v2", cuStreamGetCtx_v2(s, &got, &green), 0);
    expect("cuStreamGetCtx_v2: the context, and no green context", got == other && green == NULL);
    check("cuStreamGetCtx of the default stream", cuStreamGetCtx(NULL, &got), 0);
    expect("the default stream's context is the current one", got == ctx);
    check("cuStreamGetCtx of a forged stream", cuStreamGetCtx((CUstream)(uintptr_t)0x51deadULL, &got), 400);
    CUevent a, b;
    cuEventCreate(&a, 0);
    cuEventCreate(&b, 0);
    cuEventRecord(a, NULL);
    cuEventRecord(b, NULL);
    cuEventSynchronize(b);
    float ms = -1;
    check("cuEventElapsedTime_v2", cuEventElapsedTime_v2(&ms, a, b), 0);
    expect("a non-negative time", ms >= 0);
    cuEventDestroy_v2(a);
    cuEventDestroy_v2(b);
    check("cuCtxDestroy of the second context", cuCtxDestroy_v2(other), 0);
    cuCtxSetCurrent(ctx);
}

/* The multi-device cooperative launch of CUDA 9 (deprecated since 11.3), on the VM's one
 * device. */
static void multi_device_launch(void) {
    CUmodule m;
    CUfunction add_one;
    cuModuleLoadData(&m, MODULE);
    cuModuleGetFunction(&add_one, m, "add_one");
    enum { N = 128 };
    unsigned int v[N];
    for (int i = 0; i < N; i++) v[i] = (unsigned int)i * 3;
    CUdeviceptr d;
    cuMemAlloc_v2(&d, sizeof v);
    cuMemcpyHtoD_v2(d, v, sizeof v);
    CUstream s;
    cuStreamCreate(&s, 0);
    unsigned int n = N;
    void *args[] = {&d, &n};
    CUDA_LAUNCH_PARAMS lp = {add_one, 2, 1, 1, 64, 1, 1, 0, s, args};
    check("cuLaunchCooperativeKernelMultiDevice on one device",
          cuLaunchCooperativeKernelMultiDevice(&lp, 1, 0), 0);
    check("... with both no-sync flags", cuLaunchCooperativeKernelMultiDevice(&lp, 1, 3), 0);
    check("... on two devices of a VM that has one", cuLaunchCooperativeKernelMultiDevice(&lp, 2, 0), 1);
    check("... with an unknown flag", cuLaunchCooperativeKernelMultiDevice(&lp, 1, 4), 1);
    cuStreamSynchronize(s);
    cuMemcpyDtoH_v2(v, d, sizeof v);
    int right = 1;
    for (int i = 0; i < N; i++) right &= v[i] == (unsigned int)i * 3 + 2;
    expect("both launches added one to every element", right);
    cuStreamDestroy_v2(s);
    cuMemFree_v2(d);
    cuModuleUnload(m);
}

/* A texture reference (CUDA 11's texture<>) through the driver API: found by name, its state
 * set and read back, bound to linear memory and fetched by a kernel, rebound, refusals. */
static const char TEXREF_MODULE[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".global .texref t;\n"
    ".visible .entry fetch(.param .u64 out)\n"
    "{\n"
    "  .reg .b32 %r<6>; .reg .b64 %rd<6>;\n"
    "  ld.param.u64 %rd1, [out]; mov.u32 %r1, %tid.x;\n"
    "  tex.1d.v4.s32.s32 {%r2, %r3, %r4, %r5}, [t, {%r1}];\n"
    "  cvta.to.global.u64 %rd3, %rd1; mul.wide.u32 %rd4, %r1, 4; add.s64 %rd5, %rd3, %rd4;\n"
    "  st.global.u32 [%rd5], %r2;\n"
    "  ret;\n"
    "}\n";

static void texture_references(void) {
    const int INVALID_VALUE = 1, NOT_FOUND = 500;
    CUmodule m;
    CUfunction fetch;
    check("load a module with a texture reference", cuModuleLoadData(&m, TEXREF_MODULE), 0);
    cuModuleGetFunction(&fetch, m, "fetch");
    CUtexref t = NULL, again = NULL;
    check("cuModuleGetTexRef", cuModuleGetTexRef(&t, m, "t"), 0);
    check("cuModuleGetTexRef again", cuModuleGetTexRef(&again, m, "t"), 0);
    expect("one reference, one handle", t != NULL && t == again);
    CUsurfref sr = NULL;
    check("cuModuleGetSurfRef of a texture reference", cuModuleGetSurfRef(&sr, m, "t"), NOT_FOUND);
    check("cuModuleGetTexRef of no such name", cuModuleGetTexRef(&again, m, "missing"), NOT_FOUND);
    CUdeviceptr g;
    size_t gs;
    check("cuModuleGetGlobal of a reference", cuModuleGetGlobal_v2(&g, &gs, m, "t"), NOT_FOUND);
    enum { S32 = 0x0a, N = 32 };
    check("cuTexRefSetFormat", cuTexRefSetFormat(t, S32, 1), 0);
    check("cuTexRefSetFormat of three channels", cuTexRefSetFormat(t, S32, 3), INVALID_VALUE);
    check("cuTexRefSetAddressMode", cuTexRefSetAddressMode(t, 0, 3), 0);
    check("cuTexRefSetAddressMode of dimension 3", cuTexRefSetAddressMode(t, 3, 1), INVALID_VALUE);
    check("cuTexRefSetFilterMode", cuTexRefSetFilterMode(t, 0), 0);
    check("cuTexRefSetFlags", cuTexRefSetFlags(t, 1), 0);
    float border[4] = {1, 2, 3, 4}, bback[4] = {0};
    check("cuTexRefSetBorderColor", cuTexRefSetBorderColor(t, border), 0);
    int fmt = 0, ch = 0, am = 0, fm = 9;
    unsigned fl = 0;
    cuTexRefGetFormat(&fmt, &ch, t);
    cuTexRefGetAddressMode(&am, t, 0);
    cuTexRefGetFilterMode(&fm, t);
    cuTexRefGetFlags(&fl, t);
    cuTexRefGetBorderColor(bback, t);
    expect("a reference's state reads back",
           fmt == S32 && ch == 1 && am == 3 && fm == 0 && fl == 1 && bback[3] == 4);
    CUdeviceptr addr;
    check("cuTexRefGetAddress of an unbound reference", cuTexRefGetAddress_v2(&addr, t), INVALID_VALUE);
    int vals[N], got[N];
    for (int i = 0; i < N; i++) vals[i] = 7 * i + 1;
    CUdeviceptr d, out;
    cuMemAlloc_v2(&d, sizeof vals);
    cuMemAlloc_v2(&out, sizeof got);
    cuMemcpyHtoD_v2(d, vals, sizeof vals);
    size_t offset = 9;
    check("cuTexRefSetAddress", cuTexRefSetAddress_v2(&offset, t, d, sizeof vals), 0);
    check("cuTexRefGetAddress", cuTexRefGetAddress_v2(&addr, t), 0);
    expect("bound at the pointer, no offset", addr == d && offset == 0);
    check("cuParamSetTexRef of the default unit", cuParamSetTexRef(fetch, -1, t), 0);
    check("cuParamSetTexRef of unit 0", cuParamSetTexRef(fetch, 0, t), INVALID_VALUE);
    void *args[] = {&out};
    check("launch a kernel that fetches through the reference",
          cuLaunchKernel(fetch, 1, 1, 1, N, 1, 1, 0, NULL, args, NULL), 0);
    cuMemcpyDtoH_v2(got, out, sizeof got);
    expect("the kernel read the bound memory", !memcmp(got, vals, sizeof vals));
    for (int i = 0; i < N; i++) vals[i] = -i;
    cuMemcpyHtoD_v2(out, vals, sizeof vals);
    check("rebind to other memory", cuTexRefSetAddress_v2(&offset, t, out, sizeof vals), 0);
    check("launch again", cuLaunchKernel(fetch, 1, 1, 1, N, 1, 1, 0, NULL, (void *[]){&d}, NULL), 0);
    cuMemcpyDtoH_v2(got, d, sizeof got);
    expect("the kernel read the newly bound memory", !memcmp(got, vals, sizeof vals));
    check("cuTexRefSetArray with an unknown flag", cuTexRefSetArray(t, NULL, 2), INVALID_VALUE);
    /* A mipmapped array bound to the reference, in the array's format. */
    CUDA_ARRAY3D_DESCRIPTOR md = {N, 0, 0, S32, 1, 0};
    void *mip = NULL, *mback = NULL;
    check("cuMipmappedArrayCreate for a reference", cuMipmappedArrayCreate(&mip, &md, 2), 0);
    check("cuTexRefSetMipmappedArray", cuTexRefSetMipmappedArray(t, mip, 1), 0);
    check("cuTexRefGetMipmappedArray", cuTexRefGetMipmappedArray(&mback, t), 0);
    expect("the reference names the mipmapped array", mback == mip);
    check("cuTexRefGetAddress of a reference bound to a mipmapped array", cuTexRefGetAddress_v2(&addr, t),
          INVALID_VALUE);
    check("cuTexRefSetMipmappedArray of a forged handle",
          cuTexRefSetMipmappedArray(t, (void *)(uintptr_t)0x0a77b000beefULL, 1), 400);
    check("cuModuleUnload", cuModuleUnload(m), 0);
    check("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy(mip), 0);
    check("a reference of an unloaded module", cuTexRefSetFlags(t, 0), 400);
    cuMemFree_v2(d);
    cuMemFree_v2(out);
}

/* CUDA 12.8's batched copies: host to device, device to device and device to host in one batch
 * on a stream, with two runs of attributes; CUDA's refusals and the failing copy's index. */
static void batch_copies(void) {
    enum { N = 256 };
    unsigned char in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = (unsigned char)(i * 7 + 3);
    memset(out, 0, sizeof out);
    CUdeviceptr a, b;
    cuMemAlloc_v2(&a, N);
    cuMemAlloc_v2(&b, N);
    CUstream s;
    cuStreamCreate(&s, 0);
    CUmemcpyAttributes attrs[2];
    memset(attrs, 0, sizeof attrs);
    attrs[0].srcAccessOrder = 2; /* during the call: a stack buffer */
    attrs[1].srcAccessOrder = 1; /* stream order */
    size_t idxs[2] = {0, 1};
    /* The batch's copies may run in any order: the second reads what the first wrote, so they
     * go in two batches, the second after the first on the stream. */
    CUdeviceptr d1[1] = {a}, s1[1] = {(CUdeviceptr)(uintptr_t)in};
    size_t z1[1] = {N}, fail = 0;
    check("cuMemcpyBatchAsync of one host-to-device copy", cuMemcpyBatchAsync(d1, s1, z1, 1, attrs, idxs, 1, &fail, s), 0);
    CUdeviceptr d2[2] = {b, (CUdeviceptr)(uintptr_t)out}, s2[2] = {a, a};
    size_t z2[2] = {N, N};
    check("cuMemcpyBatchAsync of two copies with two attribute runs",
          cuMemcpyBatchAsync(d2, s2, z2, 2, attrs, idxs, 2, &fail, s), 0);
    cuStreamSynchronize(s);
    unsigned char back[N];
    cuMemcpyDtoH_v2(back, b, N);
    expect("every batched copy landed", !memcmp(out, in, N) && !memcmp(back, in, N));
    unsigned char one[N];
    memset(one, 0, sizeof one);
    check("cuMemcpyWithAttributesAsync device to host",
          cuMemcpyWithAttributesAsync((CUdeviceptr)(uintptr_t)one, b, N, &attrs[1], s), 0);
    cuStreamSynchronize(s);
    expect("... landed", !memcmp(one, in, N));
    check("cuMemcpyWithAttributesAsync without attributes",
          cuMemcpyWithAttributesAsync((CUdeviceptr)(uintptr_t)one, b, N, NULL, s), 1);
    fail = 0;
    check("a batch on the legacy stream", cuMemcpyBatchAsync(d2, s2, z2, 2, attrs, idxs, 2, &fail, NULL), 1);
    expect("... is about no copy", fail == (size_t)-1);
    size_t bad_idxs[2] = {1, 0};
    check("attribute runs not starting at 0", cuMemcpyBatchAsync(d2, s2, z2, 2, attrs, bad_idxs, 2, &fail, s), 1);
    attrs[1].srcAccessOrder = 0;
    check("an invalid source access order", cuMemcpyBatchAsync(d2, s2, z2, 2, attrs, idxs, 2, &fail, s), 1);
    expect("... is about the copy its run starts at", fail == 1);
    cuStreamSynchronize(s);
    cuStreamDestroy_v2(s);
    cuMemFree_v2(a);
    cuMemFree_v2(b);
}

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    check("cuInit", cuInit(0), 0);
    check("cuDeviceGet", cuDeviceGet(&dev, 0), 0);
    check("cuCtxCreate", cuCtxCreate_v2(&ctx, 0, dev), 0);
    modules();
    translation_units();
    libraries(ctx);
    linker();
    copies();
    pointers();
    device_and_peers(ctx);
    newer_queries(ctx);
    legacy_launch();
    arrays();
    stream_contexts(ctx);
    multi_device_launch();
    texture_references();
    batch_copies();
    check("cuCtxDestroy", cuCtxDestroy_v2(ctx), 0);
    printf("# driver_api_ext: %d failed\n", failures);
    return failures;
}
