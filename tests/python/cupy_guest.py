"""CuPy in a QEMU guest on vgpu: a few arrays and kernels, checked against
NumPy, with CuPy's default accelerators (a sum runs CUB's compute 10.0 PTX, a sort Thrust's,
whose module goes to vgpud in parts). The guest runs under emulation, so this keeps to four NVRTC
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
# With CuPy's default accelerators a sum goes through its CUB module (compute 10.0 PTX).
from cupy._core import _accelerator

check("CUB is CuPy's accelerator", _accelerator.ACCELERATOR_CUB in _accelerator.get_routine_accelerators())
check("reduction", float(a.sum()) == float(h.sum()))
# Thrust's module (14.2 MB sent) is larger than one request: it travels in parts.
check("sort", np.array_equal(cp.sort(a[::-1]).get(), h))
raw = cp.RawKernel(r'''
extern "C" __global__ void twice(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2;
}''', "twice")
raw((2,), (128,), (a, cp.int32(256)))
check("RawKernel", np.allclose(a.get(), 2 * h))
print(f"PASS {checks} checks", flush=True)
