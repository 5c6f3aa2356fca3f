"""ONNX Runtime's CUDA provider, cut down to one GPU architecture so that it fits a lease's
transfers.

The `onnxruntime-gpu` wheel's `libonnxruntime_providers_cuda.so` is 284 MB (186 MB as zstd): its
`.nv_fatbin` section holds every kernel compiled for six architectures (sm_75 to sm_120), and a
lent machine's device tool carries at most 64 MiB a call, so session 25 sent it in four calls. A
GPU runs only the machine code of its own architecture (machine code is not forward compatible
across major versions, and this wheel carries no PTX to compile), so the entries of the others
can be zeroed in place: the library keeps its layout, every entry header and every offset, and
the zeros compress to nothing. For an H100 (sm_90) that is 52 MB as xz, one call.

    python3 -m nmt_tools.device.cuda_pack --library .../libonnxruntime_providers_cuda.so \\
        --arch 90 --out /tmp/lease/libonnxruntime_providers_cuda.so.xz

The fatbin layout (NVIDIA does not document it; as read from the CUDA 13 wheel and as tools
such as cuobjdump print it): a section of fatbins, each a 16-byte header (magic 0xBA55ED50,
version, header size, size of what follows) and then entries, each a header (kind at 0, header
size at 4, payload size at 8, architecture at 28) followed by its payload.
"""

from __future__ import annotations

import argparse
import lzma
import struct
from dataclasses import dataclass
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
_SECTION = ".nv_fatbin"


@dataclass(frozen=True)
class Kept:
    """What `keep_arch` left and what it zeroed, in payload bytes."""

    entries_kept: int
    entries_zeroed: int
    bytes_kept: int
    bytes_zeroed: int


def fatbin_section(elf: bytes | bytearray) -> tuple[int, int]:
    """(offset, size) of the `.nv_fatbin` section of a 64-bit little-endian ELF file."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def header(index: int) -> tuple[int, int, int]:
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", elf, shoff + index * shentsize)
        return name, offset, size

    names_at = header(shstrndx)[1]
    for index in range(shnum):
        name, offset, size = header(index)
        end = elf.index(b"\0", names_at + name)
        if elf[names_at + name : end] == _SECTION.encode():
            return offset, size
    raise ValueError(f"no {_SECTION} section: not a library with CUDA kernels")


def keep_arch(library: bytearray, arch: int) -> Kept:
    """Zeroes, in place, the payload of every fatbin entry not built for `arch` (90 for sm_90).

    Refuses a library with no entry for `arch`: zeroing all of them would leave nothing to run.
    """
    start, size = fatbin_section(library)
    end = start + size
    kept = zeroed = bytes_kept = bytes_zeroed = 0
    at = start
    while at + 16 <= end:
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", library, at)
        if magic != FATBIN_MAGIC:
            at += 8  # fatbins are 8-byte aligned and padded between
            continue
        entry, fat_end = at + header_size, at + header_size + fat_size
        while entry < fat_end:
            _, entry_header, payload = struct.unpack_from("<IIQ", library, entry)
            (entry_arch,) = struct.unpack_from("<I", library, entry + 28)
            body = entry + entry_header
            if entry_arch == arch:
                kept, bytes_kept = kept + 1, bytes_kept + payload
            else:
                library[body : body + payload] = bytes(payload)
                zeroed, bytes_zeroed = zeroed + 1, bytes_zeroed + payload
            entry = body + payload
        at = fat_end
    if kept == 0:
        raise ValueError(f"no kernels for sm_{arch} in this library")
    return Kept(kept, zeroed, bytes_kept, bytes_zeroed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--library", type=Path, required=True, help="libonnxruntime_providers_cuda.so")
    parser.add_argument("--arch", type=int, required=True, help="the GPU's architecture: 90 for an H100 or H200")
    parser.add_argument("--out", type=Path, required=True, help="the cut-down library, xz-compressed (.xz)")
    args = parser.parse_args()
    library = bytearray(args.library.read_bytes())
    kept = keep_arch(library, args.arch)
    with lzma.open(args.out, "wb", preset=6) as out:
        out.write(library)
    print(
        f"sm_{args.arch}: kept {kept.entries_kept} entries ({kept.bytes_kept / 1e6:.1f} MB), zeroed "
        f"{kept.entries_zeroed} ({kept.bytes_zeroed / 1e6:.1f} MB); {args.out}: {args.out.stat().st_size / 1e6:.1f} MB"
    )


if __name__ == "__main__":
    main()
