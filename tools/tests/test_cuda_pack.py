"""The CUDA provider cut down for a lease: only the other architectures' kernels are zeroed."""

from __future__ import annotations

import struct

import pytest

from nmt_tools.device.cuda_pack import FATBIN_MAGIC, fatbin_section, keep_arch


def entry(arch: int, payload: bytes) -> bytes:
    """A 64-byte entry header (kind 2 = machine code) and its payload."""
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, 2, 0x0101, 64, len(payload))
    struct.pack_into("<I", header, 28, arch)
    return bytes(header) + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def elf_with(section: bytes) -> bytearray:
    """A minimal ELF64 file: a header, the section, its name table and three section headers."""
    names = b"\0.nv_fatbin\0.shstrtab\0"
    data_at = 64
    names_at = data_at + len(section)
    headers_at = names_at + len(names)
    elf = bytearray(64)
    elf[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", elf, 0x28, headers_at)
    struct.pack_into("<HHH", elf, 0x3A, 64, 3, 2)
    elf += section + names
    for name, offset, size in ((0, 0, 0), (1, data_at, len(section)), (12, names_at, len(names))):
        header = bytearray(64)
        struct.pack_into("<IIQQQQ", header, 0, name, 1, 0, 0, offset, size)
        elf += header
    return elf


def test_only_other_architectures_are_zeroed() -> None:
    sm80, sm90, sm90_too, sm120 = b"\x11" * 40, b"\x22" * 24, b"\x33" * 8, b"\x44" * 16
    # Two fatbins with padding between them, as the linker aligns them.
    section = fatbin(entry(80, sm80), entry(90, sm90)) + bytes(8) + fatbin(entry(90, sm90_too), entry(120, sm120))
    library = elf_with(section)
    before = bytes(library)
    kept = keep_arch(library, 90)
    assert (kept.entries_kept, kept.entries_zeroed) == (2, 2)
    assert (kept.bytes_kept, kept.bytes_zeroed) == (32, 56)
    assert len(library) == len(before)
    assert sm90 in library and sm90_too in library
    assert sm80 not in library and sm120 not in library
    # Nothing but the other payloads changed: headers, offsets and the kept kernels stay.
    changed = [i for i, (a, b) in enumerate(zip(before, library, strict=True)) if a != b]
    assert len(changed) == 56


def test_a_library_without_the_architecture_is_refused() -> None:
    library = elf_with(fatbin(entry(80, b"\x11" * 8)))
    with pytest.raises(ValueError, match="sm_90"):
        keep_arch(library, 90)


def test_a_library_without_kernels_is_refused() -> None:
    elf = elf_with(b"")
    renamed = elf.index(b".nv_fatbin") + 9
    elf[renamed] = ord("x")  # `.nv_fatbix`: an ELF file with no fatbin section
    with pytest.raises(ValueError, match="no .nv_fatbin"):
        fatbin_section(elf)
    with pytest.raises(ValueError, match="not a 64-bit"):
        fatbin_section(b"#!/bin/sh\n")
