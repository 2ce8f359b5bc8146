"""CuPy in a QEMU guest on vgpu: a few arrays and kernels, checked against
NumPy. The guest runs under emulation, so this keeps to four NVRTC
compilations. Prints one line per check and PASS at the end."""

import sys

import cupy as cp
import numpy as np

checks = 0


def check(what, ok):
    global checks
    checks += 1
    print(("ok " if ok else "FAIL ") + what, flush=True)
    if not ok:
        sys.exit(1)


check("one device", cp.cuda.runtime.getDeviceCount() == 1)
h = np.arange(256, dtype=np.float32)
a = cp.asarray(h)
check("elementwise", np.allclose((a * 2 + 1).get(), h * 2 + 1))
check("reduction", float(a.sum()) == float(h.sum()))
raw = cp.RawKernel(r'''
extern "C" __global__ void twice(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2;
}''', "twice")
raw((2,), (128,), (a, cp.int32(256)))
check("RawKernel", np.allclose(a.get(), 2 * h))
print(f"PASS {checks} checks", flush=True)
