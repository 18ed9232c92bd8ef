#!/usr/bin/env python3
"""Print the first bytes of named functions in ELF files (a probe's entry
instruction decides how the kernel handles a uprobe trap: emulated, or
single-stepped out of line at about twice the cost).
  entry_bytes.py FILE SYMBOL [SYMBOL...] [-- FILE SYMBOL...]"""
import struct, sys

def symbols(path):
    data = open(path, 'rb').read()
    assert data[:4] == b'\x7fELF' and data[4] == 2, 'ELF64 only'
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    secs = [struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize) for i in range(shnum)]
    phoff, = struct.unpack_from('<Q', data, 0x20)
    phentsize, phnum = struct.unpack_from('<HH', data, 0x36)
    loads = []
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from('<IIQQQQQQ', data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
    out = {}
    for name, typ, flags, addr, off, size, link, info, align, entsize in secs:
        if typ not in (2, 11):  # SYMTAB, DYNSYM
            continue
        stroff = secs[link][4]
        for j in range(size // 24):
            st_name, st_info, _, _, st_value, _ = struct.unpack_from('<IBBHQQ', data, off + j * 24)
            if st_value == 0:
                continue
            end = data.index(b'\0', stroff + st_name)
            sym = data[stroff + st_name:end].decode(errors='replace')
            for vaddr, foff, fsz in loads:
                if vaddr <= st_value < vaddr + fsz:
                    out.setdefault(sym.split('@')[0], foff + st_value - vaddr)
    return data, out

args = sys.argv[1:]
groups, cur = [], []
for a in args:
    if a == '--':
        groups.append(cur); cur = []
    else:
        cur.append(a)
groups.append(cur)
for g in groups:
    if not g:
        continue
    path, names = g[0], g[1:]
    try:
        data, syms = symbols(path)
    except Exception as e:
        print(f"{path}: {e}"); continue
    for n in names:
        o = syms.get(n)
        print(f"{path} {n}: " + ("not found" if o is None else f"offset {o:#x} bytes {data[o:o+12].hex(' ')}"))
