"""Dynamic parallelism and the device heap from Python, unmodified cuda-python: NVRTC compiles
CUDA C++ with -rdc=true, the driver's linker links it with CUDA 12's libcudadevrt.a (from the
nvidia-cuda-runtime-cu12 wheel), and the kernels launch kernels (on device-side streams too,
ordered by an event) and malloc memory on vgpu.

Prints one line per check and PASS at the end; exits 1 on the first failure."""
import array
import ctypes
import os
import sys

from cuda.bindings import driver as cu
from cuda.bindings import nvrtc
import nvidia.cuda_runtime as rt

SRC = b"""
extern "C" __global__ void child(int *out, int base) {
    out[base + threadIdx.x] = 2 * (base + threadIdx.x);
}
extern "C" __global__ void parent(int *out) {
    if (threadIdx.x == 0) child<<<1, blockDim.x>>>(out, blockIdx.x * blockDim.x);
}
extern "C" __global__ void nested(int *levels, int *errs, int depth, int max) {
    levels[depth] = depth + 1;
    if (depth + 1 < max) {
        nested<<<1, 1>>>(levels, errs, depth + 1, max);
        errs[depth] = (int)cudaGetLastError();
    }
}
// Children on a device-side stream, ordered after another stream's child by an event.
extern "C" __global__ void add_one(int *c) { c[0] += 1; }
extern "C" __global__ void times_ten(int *c) { c[0] *= 10; }
extern "C" __global__ void streamed(int *c) {
    c[0] = 5;
    cudaStream_t a, b;
    cudaEvent_t e;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    add_one<<<1, 1, 0, a>>>(c);
    cudaEventRecord(e, a);
    cudaStreamWaitEvent(b, e, 0);
    times_ten<<<1, 1, 0, b>>>(c);
    cudaEventDestroy(e);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    c[1] = (int)cudaGetLastError();
}
// Each thread mallocs a block, a child grid fills it, a grandchild frees it.
extern "C" __global__ void fill(int *p, int n, int v) { for (int i = 0; i < n; i++) p[i] = v + i; }
extern "C" __global__ void sum_free(int *p, int n, long long *out) {
    long long s = 0;
    for (int i = 0; i < n; i++) s += p[i];
    *out = s;
    free(p);
}
extern "C" __global__ void with_heap(long long *sums) {
    int t = threadIdx.x;
    int *p = (int *)malloc(100 * sizeof(int));
    if (p == nullptr) { sums[t] = -1; return; }
    fill<<<1, 1>>>(p, 100, t);
    sum_free<<<1, 1>>>(p, 100, sums + t);
}
// A kernel's attributes, its occupancy and a limit, as kernels ask CUDA 12's device runtime.
extern "C" __global__ void queries(int *out, unsigned long long *heap) {
    cudaFuncAttributes a;
    out[0] = (int)cudaFuncGetAttributes(&a, (const void *)child);
    out[1] = a.maxThreadsPerBlock;
    out[2] = a.numRegs;
    out[3] = (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&out[4], (const void *)child, 256, 0);
    size_t h = 0;
    out[5] = (int)cudaDeviceGetLimit(&h, cudaLimitMallocHeapSize);
    *heap = h;
}
"""


def ok(r):
    if int(r[0]) != 0:
        print(f"FAIL: {r[0]}", flush=True)
        sys.exit(1)
    return r[1] if len(r) == 2 else r[1:]


checks = 0


def check(what, cond, detail=""):
    global checks
    checks += 1
    if not cond:
        print(f"FAIL {what} {detail}", flush=True)
        sys.exit(1)
    print(f"ok {what}", flush=True)


def launch(mod, name, grid, block, *args):
    f = ok(cu.cuModuleGetFunction(mod, name))
    # Device pointers as 64-bit values, integers as C ints.
    vals = [ctypes.c_uint64(int(a)) if isinstance(a, cu.CUdeviceptr) else ctypes.c_int32(a) for a in args]
    ptrs = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
    ok(cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, 0, ptrs, 0))


def read_ints(d, n, code="i"):
    h = array.array(code, [0] * n)
    ok(cu.cuMemcpyDtoH(h, d, n * h.itemsize))
    return list(h)


base = list(rt.__path__)[0]
opts = [b"--gpu-architecture=compute_80", b"-rdc=true", b"-I" + os.path.join(base, "include").encode()]
err, prog = nvrtc.nvrtcCreateProgram(SRC, b"dynamic.cu", 0, [], [])
(err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
if int(err) != 0:
    _, n = nvrtc.nvrtcGetProgramLogSize(prog)
    log = b" " * n
    nvrtc.nvrtcGetProgramLog(prog, log)
    print(f"FAIL nvrtc: {log.decode()}")
    sys.exit(1)
_, size = nvrtc.nvrtcGetPTXSize(prog)
ptx = b" " * size
nvrtc.nvrtcGetPTX(prog, ptx)

ok(cu.cuInit(0))
ctx = ok(cu.cuCtxCreate(0, ok(cu.cuDeviceGet(0))))
state = ok(cu.cuLinkCreate(0, [], []))
ok(cu.cuLinkAddData(state, cu.CUjitInputType.CU_JIT_INPUT_PTX, ptx, len(ptx), b"dynamic.ptx", 0, [], []))
devrt = os.path.join(base, "lib", "libcudadevrt.a").encode()
ok(cu.cuLinkAddFile(state, cu.CUjitInputType.CU_JIT_INPUT_LIBRARY, devrt, 0, [], []))
image, size = ok(cu.cuLinkComplete(state))
mod = ok(cu.cuModuleLoadData(image))
ok(cu.cuLinkDestroy(state))
check("a module linked with libcudadevrt loads", True)

heap = ok(cu.cuCtxGetLimit(cu.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE))
check("the device heap is 8 MiB", heap == 8 << 20, heap)
ok(cu.cuCtxSetLimit(cu.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE, 4 << 20))
check("its size is set", ok(cu.cuCtxGetLimit(cu.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE)) == 4 << 20)

out = ok(cu.cuMemAlloc(256 * 4))
launch(mod, b"parent", 4, 64, out)
ok(cu.cuCtxSynchronize())
check("a child grid per block", read_ints(out, 256) == [2 * i for i in range(256)])

levels = ok(cu.cuMemAlloc(64 * 4))
errs = ok(cu.cuMemAlloc(64 * 4))
ok(cu.cuMemsetD32(levels, 0, 64))
ok(cu.cuMemsetD32(errs, 0, 64))
launch(mod, b"nested", 1, 1, levels, errs, 0, 30)
ok(cu.cuCtxSynchronize())
lv, ev = read_ints(levels, 64), read_ints(errs, 64)
check("launches nest 24 deep", lv[:25] == list(range(1, 26)) and all(e == 0 for e in ev[:24]), lv[:26])
check("and no deeper (cudaErrorLaunchMaxDepthExceeded)", lv[25] == 0 and ev[24] == 65, (lv[25], ev[24]))

cell = ok(cu.cuMemAlloc(8))
launch(mod, b"streamed", 1, 1, cell)
ok(cu.cuCtxSynchronize())
check("device-side streams ordered by an event", read_ints(cell, 2) == [60, 0], read_ints(cell, 2))
ok(cu.cuMemFree(cell))

sums = ok(cu.cuMemAlloc(32 * 8))
launch(mod, b"with_heap", 1, 32, sums)
ok(cu.cuCtxSynchronize())
want = [sum(t + i for i in range(100)) for t in range(32)]
check("malloc'd memory filled by a child and freed by another", read_ints(sums, 32, "q") == want)
e = cu.cuCtxSetLimit(cu.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE, 8 << 20)[0]
check("the heap size is fixed once used", e == cu.CUresult.CUDA_ERROR_INVALID_VALUE, e)

q, qheap = ok(cu.cuMemAlloc(8 * 4)), ok(cu.cuMemAlloc(8))
launch(mod, b"queries", 1, 1, q, qheap)
ok(cu.cuCtxSynchronize())
got = read_ints(q, 6)
child = ok(cu.cuModuleGetFunction(mod, b"child"))
attr = cu.CUfunction_attribute
threads = ok(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, child))
regs = ok(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, child))
occupancy = ok(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(child, 256, 0))
heap = ok(cu.cuCtxGetLimit(cu.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE))
check(
    "a kernel reads a kernel's attributes, its occupancy and the heap size as the host does",
    got == [0, threads, regs, 0, occupancy, 0] and read_ints(qheap, 1, "Q") == [heap],
    (got, threads, regs, occupancy, read_ints(qheap, 1, "Q"), heap),
)
ok(cu.cuMemFree(q))
ok(cu.cuMemFree(qheap))

for d in (out, levels, errs, sums):
    ok(cu.cuMemFree(d))
ok(cu.cuModuleUnload(mod))
ok(cu.cuCtxDestroy(ctx))
print(f"{checks} checks")
print("PASS")
