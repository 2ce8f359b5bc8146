#!/usr/bin/env python3
"""Prints the fatbin containers in a raw `.nv_fatbin` section (or a single
fatbin): each container header, each entry's header (hex and fields), and
whether its payload is LZ4-compressed; PTX payloads are decompressed (a small
LZ4 block decoder, no dependencies) and can be written out.

    objcopy -O binary --only-section=.nv_fatbin PROGRAM section.bin
    tests/cuda/fatbin_dump.py section.bin [--ptx-out PREFIX]

A reference for vgpu's fatbin parser, checked against nvcc 11.8 output.
"""
import argparse
import struct

FATBIN_MAGIC = 0xBA55ED50
FLAG_64BIT, FLAG_LINUX, FLAG_COMPRESS = 0x1, 0x10, 0x2000
KINDS = {1: "PTX", 2: "ELF"}


def lz4_block(src, out_size):
    """Decodes one raw LZ4 block (no frame header)."""
    dst = bytearray()
    i = 0
    while i < len(src):
        tok = src[i]
        i += 1
        lit = tok >> 4
        if lit == 15:
            while True:
                b = src[i]
                i += 1
                lit += b
                if b != 255:
                    break
        dst += src[i:i + lit]
        i += lit
        if i >= len(src) or len(dst) >= out_size:
            break
        off = src[i] | (src[i + 1] << 8)
        i += 2
        ml = tok & 15
        if ml == 15:
            while True:
                b = src[i]
                i += 1
                ml += b
                if b != 255:
                    break
        start = len(dst) - off
        for k in range(ml + 4):
            dst.append(dst[start + k])
    return bytes(dst)


def dump(buf, ptx_out=None):
    pos, nptx = 0, 0
    while pos + 16 <= len(buf):
        magic, ver, hsz, fsz = struct.unpack_from("<IHHQ", buf, pos)
        if magic != FATBIN_MAGIC:
            print(f"@0x{pos:x}: 0x{magic:08x} is not a fatbin magic; stopping")
            return
        print(f"@0x{pos:x}: fatbin version={ver} header_size={hsz} fat_size={fsz}")
        e, end = pos + hsz, pos + hsz + fsz
        while e < end:
            kind, ever, ehs, psz = struct.unpack_from("<HHIQ", buf, e)
            (csize, unk14, minor, major, arch, name_off, name_len, flags, unk30,
             usize) = struct.unpack_from("<IIHHIIIQQQ", buf, e + 16)
            print(f"  entry @0x{e:x}: kind={kind} ({KINDS.get(kind, '?')}) version=0x{ever:04x}"
                  f" header_size={ehs} payload_size={psz}")
            raw = buf[e:e + ehs]
            for r in range(0, len(raw), 16):
                print("    +%02x: %s" % (r, " ".join(f"{b:02x}" for b in raw[r:r + 16])))
            print(f"    compressed_size={csize} +0x14={unk14} version={major}.{minor} sm_{arch}"
                  f" name_off={name_off} name_len={name_len} flags=0x{flags:x} +0x30={unk30}"
                  f" uncompressed_size={usize}")
            payload = buf[e + ehs:e + ehs + psz]
            if flags & FLAG_COMPRESS:
                data = lz4_block(payload[:csize], usize)
                print(f"    LZ4: {csize} -> {len(data)} bytes")
            else:
                data = payload
            if kind == 1:
                text = data.rstrip(b"\0")
                print(f"    PTX: {len(text)} bytes of text + {len(data) - len(text)} NUL")
                if ptx_out:
                    path = f"{ptx_out}.{nptx}.sm_{arch}.ptx"
                    with open(path, "wb") as f:
                        f.write(text)
                    print(f"    wrote {path}")
                    nptx += 1
            elif kind == 2:
                print(f"    ELF: starts {data[:4]!r}")
            e += ehs + psz
        pos = (end + 7) & ~7  # containers in a section are 8-byte aligned


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--ptx-out", help="write each PTX entry to PREFIX.N.sm_XX.ptx")
    args = ap.parse_args()
    with open(args.file, "rb") as f:
        dump(f.read(), args.ptx_out)


if __name__ == "__main__":
    main()
