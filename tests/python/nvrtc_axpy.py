"""An unmodified cuda-python program: NVRTC compiles CUDA C++ to PTX, and
cuda.bindings.driver (which resolves every driver function through
cuGetProcAddress_v2) runs it on vgpu's libcuda.so.1, then orders two streams
with stream memory operations.

Prints "PASS" and exits 0 when the results match the CPU."""
import array
import sys
import time

from cuda.bindings import driver as cu
from cuda.bindings import nvrtc

SRC = b"""
extern "C" __global__ void axpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def ok(r):
    err = r[0]
    if int(err) != 0:
        sys.exit(f"FAIL: {err}")
    return r[1] if len(r) == 2 else r[1:]


err, prog = nvrtc.nvrtcCreateProgram(SRC, b"axpy.cu", 0, [], [])
(err,) = nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=compute_80"])
assert int(err) == 0, err
err, size = nvrtc.nvrtcGetPTXSize(prog)
ptx = b" " * size
(err,) = nvrtc.nvrtcGetPTX(prog, ptx)

ok(cu.cuInit(0))
dev = ok(cu.cuDeviceGet(0))
name = ok(cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
ctx = ok(cu.cuCtxCreate(0, dev))
free, total = ok(cu.cuMemGetInfo())
print(f"device {name}, slice {total >> 20} MiB")
mod = ok(cu.cuModuleLoadData(ptx))
fn = ok(cu.cuModuleGetFunction(mod, b"axpy"))

n = 5000
x = array.array("f", (float(i) for i in range(n)))
y = array.array("f", (1.0 for _ in range(n)))
nbytes = n * 4
dx = ok(cu.cuMemAlloc(nbytes))
dy = ok(cu.cuMemAlloc(nbytes))
ok((cu.cuMemcpyHtoD(dx, x.buffer_info()[0], nbytes)[0], None))
ok((cu.cuMemcpyHtoD(dy, y.buffer_info()[0], nbytes)[0], None))

a = array.array("f", [2.5])
nn = array.array("i", [n])
pdx = array.array("Q", [int(dx)])
pdy = array.array("Q", [int(dy)])
args = array.array("Q", [a.buffer_info()[0], pdx.buffer_info()[0], pdy.buffer_info()[0], nn.buffer_info()[0]])
stream = ok(cu.cuStreamCreate(0))
ok((cu.cuLaunchKernel(fn, (n + 255) // 256, 1, 1, 256, 1, 1, 0, stream, args.buffer_info()[0], 0)[0], None))
ok((cu.cuStreamSynchronize(stream)[0], None))
out = array.array("f", bytes(nbytes))
ok((cu.cuMemcpyDtoH(out.buffer_info()[0], dy, nbytes)[0], None))
bad = [i for i in range(n) if out[i] != 2.5 * x[i] + 1.0]
if bad:
    sys.exit(f"FAIL: {len(bad)} wrong results, first at {bad[0]}: {out[bad[0]]}")

# Stream memory operations (resolved through cuGetProcAddress, as every call here): a stream
# waits for a flag that another stream writes.
flag = ok(cu.cuMemAlloc(8))
ok((cu.cuMemsetD32(flag, 0, 2)[0], None))
non_blocking = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
waiter = ok(cu.cuStreamCreate(non_blocking))
writer = ok(cu.cuStreamCreate(non_blocking))
eq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_EQ
ok((cu.cuStreamWaitValue32(waiter, flag, 1, eq)[0], None))
ok((cu.cuStreamWriteValue32(waiter, int(flag) + 4, 7, 0)[0], None))
time.sleep(0.05)
if cu.cuStreamQuery(waiter)[0] != cu.CUresult.CUDA_ERROR_NOT_READY:
    sys.exit("FAIL: cuStreamWaitValue32 did not hold its stream")
ok((cu.cuStreamWriteValue32(writer, flag, 1, 0)[0], None))
ok((cu.cuStreamSynchronize(waiter)[0], None))
words = array.array("I", [0, 0])
ok((cu.cuMemcpyDtoH(words.buffer_info()[0], flag, 8)[0], None))
if list(words) != [1, 7]:
    sys.exit(f"FAIL: stream memory operations left {list(words)}")
ok((cu.cuMemFree(flag)[0], None))
ok((cu.cuMemFree(dx)[0], None))
ok((cu.cuMemFree(dy)[0], None))
print("PASS")
