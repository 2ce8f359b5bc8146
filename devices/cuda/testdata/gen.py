#!/usr/bin/env python3
"""Compile layouts.cu with NVRTC into layouts.sm_90.ptx and layouts.sm_90.cubin.

Uses the NVRTC of the pip package nvidia-cuda-nvrtc-cu12 (as tests/kernels/gen-ptx.py
does); no GPU is needed. Run from anywhere: python3 devices/cuda/testdata/gen.py
"""

import ctypes
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OPTIONS = ("--std=c++17", "--gpu-architecture=sm_90")


def nvrtc():
    import nvidia.cuda_nvrtc as pkg

    lib = ctypes.CDLL(os.path.join(list(pkg.__path__)[0], "lib", "libnvrtc.so.12"))
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def check(lib, r, what):
    if r != 0:
        sys.exit(f"{what}: {lib.nvrtcGetErrorString(r).decode()}")


def main():
    lib = nvrtc()
    src = open(os.path.join(HERE, "layouts.cu"), "rb").read()
    prog = ctypes.c_void_p()
    check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"layouts.cu", 0, None, None), "create")
    opts = (ctypes.c_char_p * len(OPTIONS))(*[o.encode() for o in OPTIONS])
    r = lib.nvrtcCompileProgram(prog, len(OPTIONS), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if log.value.strip():
        print(log.value.decode(), file=sys.stderr)
    check(lib, r, "compile")
    for kind, getsize, get, ext in (
        ("ptx", lib.nvrtcGetPTXSize, lib.nvrtcGetPTX, "ptx"),
        ("cubin", lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN, "cubin"),
    ):
        getsize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        check(lib, get(prog, buf), kind)
        data = buf.raw
        if kind == "ptx":
            data = data.rstrip(b"\0")
        with open(os.path.join(HERE, f"layouts.sm_90.{ext}"), "wb") as f:
            f.write(data)
        print(f"wrote layouts.sm_90.{ext} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
