#!/usr/bin/env python3
"""Compile the conformance suite's own kernels (tests/gpu/kernels/*.cu) to PTX
with NVRTC for compute_52 (loads on the simulated GPU and JIT-compiles on any
NVIDIA GPU since Maxwell). Uses the NVRTC of the pip package
nvidia-cuda-nvrtc-cu12, like tests/kernels/gen-ptx.py; no GPU needed.

    python3 tests/gpu/kernels/gen.py
"""

import ctypes
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OPTIONS = ("--std=c++17", "--gpu-architecture=compute_52")
IGNORED = "Architectures prior to"


def nvrtc():
    import nvidia.cuda_nvrtc as pkg

    lib = ctypes.CDLL(os.path.join(list(pkg.__path__)[0], "lib", "libnvrtc.so.12"))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def compile_one(lib, path):
    src = open(path, "rb").read()
    prog = ctypes.c_void_p()
    name = os.path.basename(path).encode()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, name, 0, None, None):
        sys.exit(f"{path}: nvrtcCreateProgram failed")
    opts = (ctypes.c_char_p * len(OPTIONS))(*[o.encode() for o in OPTIONS])
    r = lib.nvrtcCompileProgram(prog, len(OPTIONS), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = "\n".join(l for l in log.value.decode().splitlines() if l.strip() and IGNORED not in l)
    if r or text:
        sys.exit(f"{path}: {lib.nvrtcGetErrorString(r).decode()}\n{text}")
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, buf)
    out = path[:-3] + ".sm_52.ptx"
    with open(out, "wb") as f:
        f.write(buf.raw.rstrip(b"\0"))
    print(f"wrote {os.path.relpath(out, HERE)}")


def main():
    lib = nvrtc()
    for path in sorted(glob.glob(os.path.join(HERE, "*.cu"))):
        compile_one(lib, path)


if __name__ == "__main__":
    main()
