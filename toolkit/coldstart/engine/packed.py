"""The packed copies inside vLLM's oneDNN GEMM handles, as tensors a sleep can release and a reload
can refill from a file, so that a reload need not pack the weights again.

vLLM's CPU linear layers serve through a oneDNN handle that holds its own packed (reordered) copy of
the weight. Packing it again after every reload is a real copy of every weight: on the Zen 5 host
~1.1 CPU-seconds for the bench model, more than the disk needs for the whole file (0.42 s), so a
cold reload could not keep up with the device. The packed bytes depend only on the weights, their
shapes and the CPU's ISA, so they can be dumped once and read back into the same handles.

No vLLM API reaches a handle's buffer. oneDNN's own C API does (``dnnl_memory_get_data_handle``,
``dnnl_memory_set_data_handle``, ``dnnl_memory_get_memory_desc``, ``dnnl_memory_desc_get_size``):
vLLM's extension links oneDNN in statically and does not export those symbols, so they are found in
the extension's symbol table (pyelftools reads the ELF sections). The path from vLLM's handler
object to the weights' oneDNN memory (the handler's map of memories, key DNNL_ARG_WEIGHTS) is
checked at every step: the handler must carry
the layer's dimensions where this build keeps them, and the buffer must be as large as its memory
descriptor says and at least the weight's size. Anything else raises ``Unsupported``, and the
caller packs as before.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

DNNL_ARG_WEIGHTS = 33
PREFIX = "packed-"  # <flat dump>/packed-<signature>: the packed copies of the handles built from it
_SYMBOLS = ("dnnl_memory_get_data_handle", "dnnl_memory_get_memory_desc", "dnnl_memory_desc_get_size",
            "dnnl_memory_set_data_handle")


class Unsupported(Exception):
    """The handles' buffers cannot be reached safely here (the reason is the message)."""


@dataclass(frozen=True)
class _Api:
    get_data: object
    get_md: object
    md_size: object
    set_data: object
    library: str


def _loaded_extension() -> tuple[str, int]:
    """(path, load address) of the vLLM extension loaded in this process (vllm/_C*.so)."""
    spans: dict[str, int] = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 6:
                continue
            path = parts[5]
            name = Path(path).name
            if "/vllm/" in path and name.startswith("_C") and name.endswith(".so") and int(parts[2], 16) == 0:
                addr = int(parts[0].split("-")[0], 16)
                spans[path] = min(addr, spans.get(path, addr))
    if len(spans) != 1:
        raise Unsupported(f"expected one vLLM extension library loaded, found {sorted(spans) or 'none'}")
    return next(iter(spans.items()))


@functools.lru_cache(maxsize=1)
def _api() -> _Api:
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError as e:
        raise Unsupported(f"pyelftools is not installed ({e})") from None
    path, mapped_at = _loaded_extension()
    with open(path, "rb") as f:
        elf = ELFFile(f)
        first_load = min(s["p_vaddr"] for s in elf.iter_segments() if s["p_type"] == "PT_LOAD")
        table = elf.get_section_by_name(".symtab")
        if table is None:
            raise Unsupported(f"{Path(path).name} has no symbol table (stripped)")
        if elf.elfclass == 64 and elf.little_endian:
            found = _find_functions(table.data(), elf.get_section(table["sh_link"]).data())
        else:  # (pyelftools' own walk: ~0.6 s for vLLM's extension, so only where the fast one cannot read)
            found = {sym.name: sym["st_value"] for sym in table.iter_symbols()
                     if sym.name in _SYMBOLS and sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"]}
    missing = [s for s in _SYMBOLS if s not in found]
    if missing:
        raise Unsupported(f"{Path(path).name} does not link oneDNN's {', '.join(missing)}")
    base = mapped_at - first_load
    vp = ctypes.c_void_p

    def fn(name: str, restype, *argtypes):
        return ctypes.CFUNCTYPE(restype, *argtypes)(base + found[name])

    return _Api(get_data=fn("dnnl_memory_get_data_handle", ctypes.c_int, vp, ctypes.POINTER(vp)),
                get_md=fn("dnnl_memory_get_memory_desc", ctypes.c_int, vp, ctypes.POINTER(vp)),
                md_size=fn("dnnl_memory_desc_get_size", ctypes.c_size_t, vp),
                set_data=fn("dnnl_memory_set_data_handle", ctypes.c_int, vp, vp), library=Path(path).name)


def _find_functions(symtab: bytes, strtab: bytes) -> dict[str, int]:
    """_SYMBOLS' addresses (st_value) in a little-endian ELF64 symbol table, read as one numpy array
    (pyelftools parses each of its ~100 k entries in Python: 0.6 s at a server's first sleep)."""
    import numpy as np

    sym = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                    ("size", "<u8")])
    entries = np.frombuffer(symtab, dtype=sym, count=len(symtab) // sym.itemsize)
    funcs = entries[((entries["info"] & 0xF) == 2) & (entries["value"] != 0)]  # STT_FUNC, defined
    found = {}
    for name in _SYMBOLS:
        key = name.encode() + b"\0"
        at, pos = [], strtab.find(key)
        while pos >= 0:  # (a table may share one string's tail between several names)
            at.append(pos)
            pos = strtab.find(key, pos + 1)
        hit = funcs[np.isin(funcs["name"], at)]
        if len(hit):
            found[name] = int(hit["value"][0])
    return found


def _handler(layer: torch.nn.Module):
    """The vLLM oneDNN handler object (CPUDNNLGEMMHandler) the layer's cpu_linear closes over."""
    for cell in getattr(getattr(layer, "cpu_linear", None), "__closure__", None) or ():
        try:
            obj = cell.cell_contents
        except ValueError:
            continue
        if getattr(obj, "handler_tensor", None) is not None and hasattr(obj, "n") and hasattr(obj, "k"):
            return obj
    return None


def buffer_of(layer: torch.nn.Module) -> tuple[int, int]:
    """(address, bytes) of the packed weight inside the layer's oneDNN handle."""
    return _weights_memory(layer)[1:]


def _weights_memory(layer: torch.nn.Module) -> tuple[int, int, int]:
    """(oneDNN memory, its buffer's address, bytes) of the packed weight in the layer's handle."""
    h = _handler(layer)
    if h is None:
        raise Unsupported(f"{type(layer).__name__} serves through no oneDNN handle (vLLM chose another kernel)")
    api = _api()
    ptr = int(h.handler_tensor.item())
    head = (ctypes.c_int64 * 10).from_address(ptr)
    # DNNLMatMulPrimitiveHandler: vtable, b_n_size, b_n_stride, b_k_size, b_k_stride, types, then
    # memory_cache_ (an unordered_map<int, dnnl::memory>: buckets, count, first node, size, ...)
    if head[1] != h.n or head[3] != h.k:
        raise Unsupported(f"vLLM's oneDNN handler does not hold its dimensions where this build expects "
                          f"({head[1]}x{head[3]} against {h.n}x{h.k})")
    node, count = head[8], head[9]
    if not 0 < count <= 64:
        raise Unsupported(f"vLLM's oneDNN handler holds {count} memories (expected a few)")
    mem = None
    for _ in range(count):
        if not node:
            break
        if ctypes.c_int32.from_address(node + 8).value == DNNL_ARG_WEIGHTS:
            mem = ctypes.c_uint64.from_address(node + 16).value
            break
        node = ctypes.c_uint64.from_address(node).value
    if not mem:
        raise Unsupported("vLLM's oneDNN handler holds no weights memory")
    data, md = ctypes.c_void_p(), ctypes.c_void_p()
    if api.get_data(mem, ctypes.byref(data)) != 0 or api.get_md(mem, ctypes.byref(md)) != 0 or not data.value:
        raise Unsupported("oneDNN did not answer for the handler's weights memory")
    size = int(api.md_size(md))
    weight = layer.weight
    need = h.n * h.k * weight.element_size()
    if not need <= size <= 2 * need + (1 << 20):
        raise Unsupported(f"the packed weight is {size} bytes for a {h.n}x{h.k} weight ({need} bytes)")
    return mem, data.value, size


def views(layers: dict[str, torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Each layer's packed weight as a uint8 tensor over the handle's own buffer (name -> tensor):
    what a sleep releases and a reload refills. The tensors are valid while the handles live."""
    out = {}
    for name, layer in layers.items():
        addr, size = buffer_of(layer)
        out[name] = torch.frombuffer((ctypes.c_uint8 * size).from_address(addr), dtype=torch.uint8)
    return out


def signature(packed_from: str, tensors: dict[str, torch.Tensor]) -> str:
    """What a packed dump must match to refill these handles: the flat dump they were packed from
    (its index identity), the packed sizes, the vLLM build and the CPU features oneDNN packs for."""
    import vllm

    cpu = {"capability": torch.backends.cpu.get_cpu_capability(),
           "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
           "amx": bool(torch.cpu._is_amx_tile_supported())}
    key = {"from": packed_from, "vllm": vllm.__version__, "library": _api().library, "cpu": cpu,
           "sizes": sorted((n, t.numel()) for n, t in tensors.items())}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def dump_dir(flat_dir: Path, sig: str) -> Path:
    return Path(flat_dir) / f"{PREFIX}{sig}"


def adopt(layers: dict[str, torch.nn.Module], copy: bool = True, into=None):
    """Move the layers' packed weights into one new WeightArena laid out like their packed dump
    (sorted by name, page-aligned: ``views``/``dump_dir`` write the same layout), so that a sleep
    releases them whole and a reload maps the dump over them, as for the plain weights (oneDNN's
    own buffers are 64-byte aligned; a cold refill into them went through the page cache at
    0.58-1.66x the device on the Zen 5 host). ``copy``: with their bytes; without, the buffers read
    zeros until refilled (a sleep releases them anyway). oneDNN frees each handle's old buffer as
    its memory is pointed here (one already here is pointed at the same place). ``into``: an arena an earlier set of handles (since packed anew, so
    gone) was moved into; reused when its layout is the same (its mappings are never unmapped)."""
    from coldstart.engine.arena import WeightArena

    api = _api()
    found = {name: _weights_memory(layers[name]) for name in sorted(layers)}
    sizes = {name: size for name, (_, _, size) in found.items()}
    same = into is not None and [(s.name, s.nbytes) for s in into.spans] == list(sizes.items())
    arena = into if same else WeightArena.empty(sizes)
    for name, (mem, addr, size) in found.items():
        dest = arena.tensors[name].data_ptr()
        if copy:
            ctypes.memmove(dest, addr, size)
        if api.set_data(mem, dest) != 0:
            raise Unsupported(f"oneDNN refused to point {name}'s packed weight at a new buffer")
    return arena
