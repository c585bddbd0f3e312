"""Real sleep mode on CPU: a ``--worker-cls`` subclass of vLLM's CPU worker.

vLLM's own CPU worker logs "sleep mode is not supported on CPU" and frees nothing. This worker gives
CPU the same contract as vLLM's GPU CuMemAllocator: ``sleep(1)`` releases the KV cache's physical
pages, ``sleep(2)`` also the weights'; every tensor keeps its address (madvise(MADV_DONTNEED) on the
page-aligned part of each storage: the virtual range stays mapped, the kernel drops the pages, and
the next touch maps a zero page). ``wake_up`` marks tags awake (pages come back zero-filled); the
weights are then refilled in place by ``coldstart_reload`` from a flat dump through our parallel
loader (or by vLLM's ``reload_weights``). A process asleep at level 2 is what CRIU dumps: released
pages are not in the image.

Reload modes (``coldstart_reload(mode=...)``; default ``$COLDSTART_RELOAD_MODE`` or ``auto``):
``map`` maps the flat file over the weight arena (coldstart.engine.arena: the weights were moved at
load time into one anonymous mapping laid out exactly like the flat file) and populates it: no
zero-fill faults, no copy; ``copy`` reads the file into the tensors through our parallel loader
(a cold file the way its device was probed to read faster, weights.readshape; O_DIRECT where it
was not probed: buffered cold copies ran 3x slower inside the worker on the first hosts, see
docs/engine.md);
``auto`` maps when the arena exists and the file's index matches its layout, else copies (the
result says why: ``auto_choice`` / ``map_refused``), cold or cached: a cold map reads the file once,
into the page cache, while a copy also faults in and fills every page of the released arena (see
``_auto_choice``). Set ``COLDSTART_WEIGHT_ARENA=0`` to keep vLLM's own allocation (copy only).
A map reads the file into 2 MiB page-cache folios (WeightArena.map_file ``huge``; off with
``coldstart_reload(huge=False)`` or ``COLDSTART_HUGE_FOLIOS=0``, which a restore passes on from its
own environment: a restored worker's is the checkpoint's).

Linear layers keep their weight as a plain tensor (the one sleep releases and a reload refills in
place) and, while awake, serve through vLLM's own prepacked oneDNN/SGL handle built from it: the
handle is built after loading and after every reload (``prepack``: its seconds are in the reload's
result); plain ``F.linear`` on the tensor was up to 1.56× slower per GEMM (docs/engine.md). At sleep
level 2 the handles are dropped before the weights are released, unless their buffers can be
reached (coldstart.engine.packed, oneDNN handles): then the buffers move into a packed arena of
their own and are released with the weights, and a reload from the dump they were packed from maps
them back from a packed dump beside it (``coldstart_dump_packed``) instead of packing again.

After a map reload the weights are page-cache pages of the flat file; ``coldstart_settle()`` copies
them into anonymous memory in a background thread and swaps the mapping in place (the restore asks
for it after its first token: a restored server then serves from memory like a stock one's).

Methods callable through POST /collective_rpc (arguments arrive as strings; JSON is decoded):
``coldstart_reload(path, mode)``, ``coldstart_settle()``, ``coldstart_dump_weights(out_dir)``,
``coldstart_dump_packed(path)``, ``coldstart_rss()``,
``coldstart_weights_bytes()``, ``coldstart_state()``, plus vLLM's ``sleep``/``wake_up``/``reload_weights``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import mmap
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterable

import torch

from vllm.v1.worker.cpu_worker import CPUWorker

from coldstart.cpulist import online_cpus, widen_thread
from coldstart.engine.plugin import decode_arg, find_flat_dir, model_tensor_objects, model_tensors

log = logging.getLogger("vllm.coldstart.sleep_worker")  # into the server log

MADV_DONTNEED = 4
PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int
_libc.malloc_trim.argtypes = [ctypes.c_size_t]
_libc.malloc_trim.restype = ctypes.c_int


def release_range(addr: int, nbytes: int) -> int:
    """MADV_DONTNEED the whole pages inside [addr, addr+nbytes); returns the bytes released."""
    start = (addr + PAGE - 1) & ~(PAGE - 1)
    end = (addr + nbytes) & ~(PAGE - 1)
    if end <= start:
        return 0
    if _libc.madvise(start, end - start, MADV_DONTNEED) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"madvise(MADV_DONTNEED, {end - start} bytes): {os.strerror(e)}")
    return end - start


def unique_storages(tensors: Iterable[torch.Tensor]) -> list[tuple[int, int]]:
    """(address, nbytes) of each distinct CPU storage behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            continue
        st = t.untyped_storage()
        ptr, n = st.data_ptr(), st.nbytes()
        if ptr and n:
            seen[ptr] = max(n, seen.get(ptr, 0))
    return sorted(seen.items())


def release_tensors(tensors: Iterable[torch.Tensor]) -> tuple[int, int]:
    """Release the pages of every distinct storage; returns (storage bytes, bytes released)."""
    total = released = 0
    for ptr, n in unique_storages(tensors):
        total += n
        released += release_range(ptr, n)
    return total, released


RELOAD_MODES = ("auto", "map", "copy")


def default_reload_mode() -> str:
    mode = os.environ.get("COLDSTART_RELOAD_MODE", "auto") or "auto"
    return mode if mode in RELOAD_MODES else "auto"


def _huge_folios(huge: Any) -> bool:
    """Whether a map reload asks for 2 MiB page-cache folios (None: ``$COLDSTART_HUGE_FOLIOS``, on
    unless "0")."""
    if huge is None:
        return os.environ.get("COLDSTART_HUGE_FOLIOS", "1") != "0"
    return bool(huge)


def _resident_fraction(flat: Path) -> float:
    """The share of the flat weights file in the page cache, sampled like the loader's O_DIRECT
    choice. Raises for an unreadable file (map_file's to report)."""
    from coldstart.warm.residency import sampled_resident_fraction
    from coldstart.weights.format import read_index

    return sampled_resident_fraction(read_index(flat).data_file)


def _left_out(flat: Path) -> str:
    """Why a reload cannot read every tensor of ``flat`` (weights.format.omit_tensors), or "" (also
    for an unreadable dump: the reload's own paths name that)."""
    from coldstart.errors import ColdstartError
    from coldstart.weights.format import read_index, require_present

    try:
        index = read_index(flat)
    except ColdstartError:
        return ""
    try:
        require_present(index, index.absent, "a reload")
    except ColdstartError as e:
        return str(e)
    return ""


def handles_hold_copies() -> bool:
    """Whether the layers serve from packed handles holding their own copy of each weight, so the
    weight tensors are read once, by the prepack: prepack on, vLLM's dispatch hooked, and a CPU
    with AVX-512 BF16, where vLLM's oneDNN handle is a packed copy (both hosts measured; elsewhere
    vLLM may fall back to F.linear on the tensor itself)."""
    return packing_active() and bool(torch.cpu._is_avx512_bf16_supported())


def _auto_choice(flat: Path) -> tuple[str, float | None]:
    """``auto`` with an arena maps, the flat file cached or cold; (why, the sampled residency or None:
    the overlap's choice and the stats share it). Cold, a map reads the file once, into the page
    cache, the prepack beside the populate; a copy reads it too and also faults in and fills every
    page of the released arena (~1 CPU-second for the bench model on 2 cores). Bench model, cold:
    Intel AMX host, map 0.86 s against 1.44 (a copy, then the prepack; results/reload-intel-2); AMD
    Zen 3 host (no copies in the handles: the layers serve from the mapped pages), map 0.87 and 1.14
    s against 1.42-1.63 for copies, 0.93x the device (results/reload-avx2-3, -4). The first
    completion after a map is 0.1-0.5 s slower there (not by page faults: cause not found), so reload +
    first completion gained 0-0.6 s in three runs (results/spot-checks/first-pass-after-map); a
    restore settles the mapped weights into anonymous memory after its first token
    (``coldstart_settle``)."""
    try:
        frac = _resident_fraction(flat)
    except Exception as e:  # noqa: BLE001 - an unreadable file is map_file's to report
        return f"auto: residency unknown ({e}) -> map", None
    return f"auto: {frac:.0%} of the weights file cached -> map", frac


def _overlap_prepack(overlap, flat: Path, frac: float | None = None) -> bool:
    """Whether a map reload prepacks beside the populate (True/False; None: $COLDSTART_PREPACK_OVERLAP,
    "1", "0" or "auto", its default). Auto: when a sample of the weights file finds some of it out of
    the page cache. Cold, the populate waits on the disk while the prepack needs the CPUs: side by
    side the bench model's map reload took 1.17 s against 1.86 (AVX-512 VM, in a container with host
    warming). Warm there is no wait to hide, and the populating threads only take CPU from the
    prepack: 1.03 s against 0.96. ``frac``: the residency already sampled (_auto_choice)."""
    if overlap is None:
        overlap = {"0": False, "1": True}.get(os.environ.get("COLDSTART_PREPACK_OVERLAP", "auto"), "auto")
    if overlap != "auto":
        return bool(overlap)
    try:
        return (frac if frac is not None else _resident_fraction(flat)) < 0.99
    except Exception:  # noqa: BLE001 - an unreadable file is map_file's to report
        return False


def arena_enabled() -> bool:
    return os.environ.get("COLDSTART_WEIGHT_ARENA", "1") not in ("0", "false", "no")


def rss_bytes() -> int:
    """This process's resident set size (from /proc/self: correct inside a PID namespace too)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _plain(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.nn.functional.linear(x, weight, bias)


def _plain_cpu_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
    """Replacement for vLLM's CPU GEMM dispatch: keep the weight tensor, use F.linear on it until
    ``prepack_linears`` gives the layer vLLM's own handle."""
    weight = getattr(layer, "weight", None)
    if weight is not None and weight.ndim != 2 and _ORIG_DISPATCH is not None:
        _ORIG_DISPATCH(layer, remove_weight)  # conv/MoE weights: vLLM's own handling
        return
    layer.cpu_linear = _plain
    if weight is not None and not weight.is_meta:
        _LINEARS.add(layer)


_ORIG_DISPATCH = None
_LINEARS: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def prepack_enabled() -> bool:
    """COLDSTART_PREPACK=0 serves from F.linear on the plain weights (to measure what the handles buy)."""
    return os.environ.get("COLDSTART_PREPACK", "1") != "0"


def packing_active() -> bool:
    """Whether the linear layers get packed handles: prepack on and vLLM's dispatch hooked."""
    return prepack_enabled() and _ORIG_DISPATCH is not None


def prepack_threads() -> int:
    """Threads that build the handles: one per online CPU (at most 8), or $COLDSTART_PREPACK_THREADS."""
    env = os.environ.get("COLDSTART_PREPACK_THREADS")
    if env:
        return max(1, int(env))
    return max(1, min(8, len(online_cpus())))


def prepack_linears(threads: int | None = None, touch=None) -> tuple[int, float, int, float]:
    """vLLM's prepacked GEMM handle for every linear layer, from its weight as it is now (vLLM's
    dispatch with remove_weight=False: the tensor stays, for the next sleep and reload). Returns
    (layers, seconds, threads used, thread-seconds spent in ``touch``).

    The layers are packed by ``threads`` threads allowed on every online CPU: on an AVX-512 BF16 host
    packing is a real copy of every weight (1.6 s for the bench model's 50 layers, most of its
    restore), and vLLM binds this worker, and so a single packing thread, to one core. Each layer
    is packed by vLLM's own dispatch, as before: the same handles, only built side by side.
    ``touch(weight)``: called before a layer is packed (WeightArena.populate_tensor: its weight
    faulted in while the rest of the file is still arriving); the layers then go in the order of
    their weights' addresses, the weights file's order, the order it arrives in. The thread-seconds
    spent in ``touch`` are what the packing waited for the file, apart from the packing itself."""
    t0 = time.perf_counter()
    if not packing_active():
        return 0, time.perf_counter() - t0, 0, 0.0
    waited = [0.0]
    waited_lock = threading.Lock()
    layers = list(_LINEARS)
    if touch is not None:
        layers.sort(key=lambda layer: layer.weight.data_ptr())
    n = max(1, min(threads or prepack_threads(), len(layers) or 1))

    def pack(layer) -> None:
        if touch is not None:
            t = time.perf_counter()
            touch(layer.weight)
            with waited_lock:
                waited[0] += time.perf_counter() - t
        _ORIG_DISPATCH(layer, False)

    if n == 1:
        for layer in layers:
            pack(layer)
        return len(layers), time.perf_counter() - t0, 1, waited[0]
    from concurrent.futures import ThreadPoolExecutor

    def pack_wide(layer) -> None:
        widen_thread()
        pack(layer)

    with ThreadPoolExecutor(n, thread_name_prefix="coldstart-prepack") as ex:
        list(ex.map(pack_wide, layers))
    return len(layers), time.perf_counter() - t0, n, waited[0]


def packed_linears() -> list[torch.nn.Module]:
    """The linear layers serving through a prepacked handle now."""
    return [layer for layer in list(_LINEARS) if layer.cpu_linear is not _plain]


def index_identity(index) -> str | None:
    """What a flat dump holds, as one digest (its index has one per chunk of every tensor); None for
    a dump without chunk digests (nothing to tell two dumps apart by)."""
    import hashlib

    if any(e.nbytes and not e.chunk_digests for e in index.tensors):
        return None
    return hashlib.sha256(index.to_json().encode()).hexdigest()


def trim_heap() -> None:
    """Before a dump: free Python's garbage and give malloc's free pages back to the kernel, so that
    they are not in the image."""
    gc.collect()
    _libc.malloc_trim(0)


def unpack_linears() -> int:
    """Back to F.linear on the plain weights; the handles (and their copies of the weights) go."""
    n = 0
    for layer in list(_LINEARS):
        if layer.cpu_linear is not _plain:
            layer.cpu_linear = _plain
            n += 1
    trim_heap()  # what the handles' allocations leave in malloc's free lists
    return n


@torch.inference_mode()
def holds_own_copy(layer: torch.nn.Module) -> bool:
    """With the layer's plain weight released (zeros), whether its handle still computes from a
    copy of its own: oneDNN may keep a shape's plain layout and read the weight where it lies, and
    then the weights file must keep it. (A weight of all zeros also answers False: keeping it costs
    only its bytes.)"""
    k = layer.weight.shape[1]
    return bool(layer.cpu_linear(torch.ones((1, k), dtype=layer.weight.dtype), layer.weight, None).any())


@torch.inference_mode()
def unpack_weight(layer: torch.nn.Module, block: int = 512) -> torch.Tensor:
    """A packed layer's plain weight, rebuilt from its handle: a GEMM against the identity, I @ W^T,
    each output one weight times 1.0 plus zeros, so exact (results/spot-checks/unpack-handles: 49 of
    49 bench-model layers bit for bit; 4.6 s per 1.13 GiB on 2 cores)."""
    n, k = layer.weight.shape
    dt = layer.weight.dtype
    out = torch.empty((k, n), dtype=dt)
    for i in range(0, k, block):
        rows = torch.zeros((min(block, k - i), k), dtype=dt)
        rows[:, i:i + rows.shape[0]].fill_diagonal_(1)
        out[i:i + rows.shape[0]] = layer.cpu_linear(rows, layer.weight, None)
    return out.t().contiguous()


def keep_plain_linear_weights() -> None:
    """Route vLLM's CPU linear layers through F.linear on their own weight (see module docstring)."""
    global _ORIG_DISPATCH
    from vllm.model_executor.layers import utils as layer_utils

    if _ORIG_DISPATCH is None:
        _ORIG_DISPATCH = layer_utils.dispatch_cpu_unquantized_gemm
        layer_utils.dispatch_cpu_unquantized_gemm = _plain_cpu_linear


class ColdstartRPCMixin:
    """The coldstart RPCs shared by our CPU and GPU workers (reload, dump, state)."""

    _cs_sleeping: set[str]
    _cs_saved_buffers: dict[str, torch.Tensor]
    _cs_last: dict[str, Any]
    _cs_arena: Any  # coldstart.engine.arena.WeightArena (CPU worker, map mode) or None

    def _cs_init(self) -> None:
        self._cs_sleeping = set()
        self._cs_saved_buffers = {}
        self._cs_last = {}
        self._cs_arena = None
        self._cs_settler: threading.Thread | None = None
        self._cs_settle_stop = threading.Event()
        self._cs_settled: dict[str, Any] = {}
        # Packed handles kept through sleep(2) (coldstart_keep_packed): the flat dump the handles were
        # last built from (index_identity), whether the next sleep(2) keeps them, and the dump a
        # kept set stands for until the next reload
        self._cs_packed_from: str | None = None
        self._cs_keep_next = False
        self._cs_kept: str | None = None
        # the weights file the arena maps leaves these out: the packed handles hold their only copy
        # (a snapshot checkpointed with --slim-weights); every sleep(2) then keeps the handles
        self._cs_absent: frozenset[str] = frozenset()
        # Handles kept through a sleep(2) with their buffers (moved into a packed arena) released
        # (coldstart.engine.packed): the flat dump's identity and the packed signature they stand for
        self._cs_released: tuple[str, str] | None = None
        self._cs_packed_arena = None  # the packed handles' buffers (a WeightArena), once a sleep moved them

    def coldstart_keep_packed(self, keep: Any = True) -> dict:
        """Whether the next sleep(2) keeps the linear layers' packed handles (the checkpoint asks
        before its last sleep). Kept, they are in the CRIU image, and the first reload from the same
        flat dump maps the file without reading the linear weights and skips the prepack: on an
        AVX-512 host packing is a real copy of every weight, most of a restore's CPU. Costs: the
        image grows by the packed copy (about the weights' size). Only handles built by a reload
        from a dump with chunk digests are kept (that dump's identity is what the reload checks)."""
        self._cs_keep_next = bool(decode_arg(keep))
        return {"keep_next_sleep": self._cs_keep_next, "packed_from": self._cs_packed_from,
                "packed_linears": len(packed_linears())}

    def _cs_packed_layers(self) -> tuple[dict[str, torch.nn.Module], str]:
        """The layers serving from packed handles holding copies, by their weight's name, or ({}, why not)."""
        layers = packed_linears()
        if not layers or not handles_hold_copies():
            return {}, "no packed handles holding copies"
        at = self._cs_span_at()
        named = {at.get(layer.weight.data_ptr()): layer for layer in layers}
        if None in named or len(named) != len(layers):
            return {}, "a packed layer's weight lies outside the weight arena"
        return named, ""

    def _cs_packed_views(self) -> tuple[dict[str, torch.Tensor], str]:
        """The packed handles' buffers as tensors named by their layer's weight (packed.views), or
        ({}, why not)."""
        from coldstart.engine import packed

        named, why = self._cs_packed_layers()
        if not named:
            return {}, why
        try:
            return packed.views(named), ""
        except packed.Unsupported as e:
            return {}, str(e)

    def _cs_adopt_packed(self) -> tuple[Any, str]:
        """Before a sleep releases them: the handles' buffers moved into the packed arena
        (packed.adopt: their contents are about to go, nothing is copied; handles already there are
        pointed at the same place). (the arena, "") or (None, why not: the handles are then dropped)."""
        from coldstart.engine import packed

        named, why = self._cs_packed_layers()
        if not named:
            return None, why
        try:
            self._cs_packed_arena = packed.adopt(named, copy=False, into=self._cs_packed_arena)
        except packed.Unsupported as e:
            return None, str(e)
        trim_heap()  # what oneDNN's freed buffers leave in malloc's free lists
        return self._cs_packed_arena, ""

    def coldstart_dump_packed(self, path: str | None = None) -> dict:
        """Write the packed handles' buffers beside the flat dump they were built from
        (<flat>/packed-<signature>, packed.dump_dir): a reload from that dump after a sleep(2) then
        reads them back instead of packing again. Returned, not raised, when it cannot."""
        from coldstart.engine import packed
        from coldstart.errors import ColdstartError
        from coldstart.weights.dump import dump_tensors
        from coldstart.weights.format import read_index

        # returned, not raised: an exception in a collective_rpc takes vLLM's engine down
        if "weights" in self._cs_sleeping:
            return {"error": "cannot dump packed handles while the weights are released (sleep level 2)"}
        extra = self.vllm_config.load_config.model_loader_extra_config or {}  # type: ignore[attr-defined]
        path = decode_arg(path)
        try:
            flat = find_flat_dir(path or self.model_config.model, None if path else extra)  # type: ignore[attr-defined]
            index = read_index(flat)
        except (ColdstartError, OSError) as e:
            return {"error": str(e)}
        ident = index_identity(index)
        if ident is None or ident != self._cs_packed_from:
            return {"error": f"the packed handles were not built from {flat} (dump the weights there, or reload from it)"}
        views, why = self._cs_packed_views()
        if not views:
            return {"error": f"no packed buffers to dump: {why}"}
        out_dir = packed.dump_dir(Path(index.data_file).parent, packed.signature(ident, views))
        t0 = time.perf_counter()
        if not (out_dir / "weights.index.json").is_file():
            try:
                dump_tensors(sorted(views.items()), out_dir)
            except (ColdstartError, OSError) as e:
                return {"error": f"writing {out_dir}: {e}"}
        return {"dir": str(out_dir), "tensors": len(views), "bytes": sum(t.numel() for t in views.values()),
                "seconds": round(time.perf_counter() - t0, 6)}

    def _cs_span_at(self) -> dict[int, str]:
        """The weight arena's in-place spans by address (a tensor's data_ptr -> its name); {} without
        an arena."""
        arena = self._cs_arena
        return {} if arena is None else {arena.addr + s.offset: s.name for s in arena.spans if s.inplace}

    def _cs_handle_weights(self) -> dict[str, torch.nn.Module]:
        """The weight arena's spans whose only reader is a packed handle, each with its layer: what
        a weights file may leave out while those handles live. Only linear layers and the LM head
        compute through their handle alone: an embedding gets one too (vLLM's embedding method
        dispatches like a linear layer) but looks its rows up in the weight; and a weight another
        module also reads (an embedding tied to the LM head) is not one of them either."""
        from vllm.model_executor.layers.linear import LinearBase
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        at = self._cs_span_at()
        if not at:
            return {}
        layers = [layer for layer in packed_linears() if isinstance(layer, (LinearBase, ParallelLMHead))]
        packed = {id(layer) for layer in layers}
        read = set()  # storages something other than a handle reads
        for mod in self._cs_model().modules():
            for pname, t in list(mod._parameters.items()) + list(mod._buffers.items()):
                if t is not None and not (id(mod) in packed and pname == "weight"):
                    read.add(t.data_ptr())
        out = {}
        for layer in layers:
            ptr = layer.weight.data_ptr()
            if ptr in at and ptr not in read:
                out[at[ptr]] = layer
        return out

    def coldstart_settle(self) -> dict:
        """Start copying mapped weights into anonymous memory in the background (``WeightArena.settle``)
        and return at once: the engine goes on serving meanwhile. The restore asks for it after its
        first token; ``coldstart_state()["settle"]`` says when it is done. The thread runs at nice 19
        on every CPU the process may use (vLLM binds this worker to one core: the copy must not take
        it from the forward passes)."""
        arena, parena = self._cs_arena, self._cs_packed_arena
        packed_mapped = parena is not None and bool(parena.mapped)
        if arena is None or not (arena.mapped or packed_mapped):
            return {"started": False, "why": "no arena mapped from a file (copy reload, GPU, or settled already)"}
        if arena.settled_partly and not packed_mapped:
            from coldstart.engine.arena import SETTLED_PARTLY

            return {"started": False, "why": SETTLED_PARTLY}
        if self._cs_settler is not None and self._cs_settler.is_alive():
            return {"started": False, "why": "already settling"}
        self._cs_settle_stop.clear()
        self._cs_settled = {"state": "running"}

        def work() -> None:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except OSError:
                pass
            widen_thread()
            try:
                out = arena.settle(stop=self._cs_settle_stop) if arena.mapped and not arena.settled_partly \
                    else {"settled": True, "bytes": 0}
                if packed_mapped and out.get("settled"):  # then the packed handles' buffers (_cs_reload_packed)
                    pout = parena.settle(stop=self._cs_settle_stop)
                    out.update(settled=pout.get("settled"), packed=pout)
                out["state"] = "done" if out.get("settled") else "stopped"
            except Exception as e:  # noqa: BLE001 - the mapped weights stay valid: log it, serve on
                out = {"state": "failed", "error": str(e)}
            self._cs_settled = out
            log.info("coldstart settle: %s", out)

        # the bytes it will copy: the spans map_file left lazy (those only kept handles read) stay mapped.
        # Counted before the thread starts: a small arena is settled (and reads as unmapped) at once
        nbytes = arena.settle_bytes() + (parena.settle_bytes() if packed_mapped else 0)
        self._cs_settler = threading.Thread(target=work, name="coldstart-settle", daemon=True)
        self._cs_settler.start()
        return {"started": True, "bytes": nbytes}

    def _cs_stop_settling(self) -> None:
        """Before a sleep or a reload changes the arena: stop a settle in flight and wait for it."""
        t = self._cs_settler
        if t is not None and t.is_alive():
            self._cs_settle_stop.set()
            t.join()
        self._cs_settler = None
        self._cs_settled = {}  # what it reported was about the weights that are about to change

    def _cs_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def _cs_weight_tensors(self) -> dict[str, torch.Tensor]:
        return {n: p.data for n, p in self._cs_model().named_parameters() if p.numel()}

    def _cs_kv_tensors(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        kv = getattr(self.model_runner, "kv_caches", None) or []  # type: ignore[attr-defined]
        for t in kv:
            if isinstance(t, torch.Tensor):
                out.append(t)
            elif isinstance(t, (list, tuple)):
                out += [x for x in t if isinstance(x, torch.Tensor)]
        return out

    @torch.inference_mode()
    def coldstart_reload(self, path: str | None = None, threads: Any = None, verify: Any = False,
                         direct: Any = None, chunk_bytes: Any = None, buffers: Any = None,
                         mode: Any = None, populate_threads: Any = 4, prepack_threads: Any = None,
                         overlap: Any = None, packed: Any = None, huge: Any = None) -> dict:
        """Refill every parameter and buffer from a flat dump (``mode``: map | copy | auto, see the
        module docstring); returns the stats. ``path`` defaults to the flat dir found for the served
        model (see plugin.find_flat_dir). ``overlap`` (map mode): prepack while the populating
        threads still fault the file in (_overlap_prepack; None: $COLDSTART_PREPACK_OVERLAP here).
        ``packed`` (map/auto): after a sleep(2) that released the packed handles' buffers, read them
        back from the packed dump beside the flat file (coldstart_dump_packed) instead of packing
        again, when it matches them (None/True); False packs again. ``huge`` (map/auto): 2 MiB
        page-cache folios under the mapping (_huge_folios; None: $COLDSTART_HUGE_FOLIOS here)."""
        from coldstart.weights.loader import load_into

        self._cs_stop_settling()
        extra = self.vllm_config.load_config.model_loader_extra_config or {}  # type: ignore[attr-defined]
        path = decode_arg(path)
        flat = find_flat_dir(path or self.model_config.model, None if path else extra)  # type: ignore[attr-defined]
        mode = str(decode_arg(mode) or default_reload_mode())
        if mode not in RELOAD_MODES:
            raise ValueError(f"reload mode {mode!r}: choose one of {', '.join(RELOAD_MODES)}")
        kept, self._cs_kept = self._cs_kept, None  # kept handles stand for one reload only
        huge = _huge_folios(decode_arg(huge))
        if kept is not None and mode in ("map", "auto") and not decode_arg(verify):
            out = self._cs_reload_kept(flat, kept, int(decode_arg(populate_threads)), huge=huge)
            if out is not None:
                return out
        released, self._cs_released = self._cs_released, None  # (any other reload packs anew)
        packed_why = ""  # why the packed handles' buffers were not mapped back (the usual path packs anew)
        if released is not None and mode in ("map", "auto") and decode_arg(packed) is not False:
            out = self._cs_reload_packed(flat, released, bool(decode_arg(verify)), int(decode_arg(populate_threads)),
                                         decode_arg(prepack_threads), decode_arg(overlap) is not False,
                                         huge=huge)
            if isinstance(out, dict):
                return out
            packed_why = out
            log.info("coldstart reload: packing anew: %s", out)
        left_out = _left_out(flat)
        if left_out:  # only kept handles can stand for those weights, and these cannot
            log.warning("coldstart reload refused: %s", left_out)
            return {"mode": mode, "error": f"reload refused: {left_out}", "flat": str(flat)}
        refused = None
        auto_choice = ""
        frac = None
        if mode == "auto" and self._cs_arena is not None:
            auto_choice, frac = _auto_choice(flat)  # (a refused map still falls back to a copy)
        if mode in ("map", "auto"):
            if self._cs_arena is None:
                refused = "no weight arena in this worker (GPU, or COLDSTART_WEIGHT_ARENA=0)"
            else:
                from coldstart.errors import ColdstartError
                from coldstart.weights.format import read_index

                t0 = time.perf_counter()
                check = bool(decode_arg(verify))
                if frac is None:  # (sampled once: the overlap's choice and the stats share it)
                    try:
                        frac = _resident_fraction(flat)
                    except Exception:  # noqa: BLE001 - an unreadable file is map_file's to report
                        pass
                # the prepack beside the populate (WeightArena.map_file, "background")
                side = packing_active() and not check \
                    and _overlap_prepack(decode_arg(overlap), flat, frac)
                try:
                    index = read_index(flat)
                    out = self._cs_arena.map_file(index, threads=int(decode_arg(populate_threads)),
                                                  verify=check, populate="background" if side else "now",
                                                  huge=huge)
                    if side:
                        out.update(self._cs_prepack(decode_arg(prepack_threads), touch=self._cs_arena.populate_tensor,
                                                    source=index))
                        out.update(populate_s=round(self._cs_arena.wait_populated(), 6), prepack_overlapped=True)
                except ColdstartError as e:
                    if self._cs_arena.mapped:  # half-done: back to an anonymous arena before copying
                        self._cs_arena.release()
                    refused = str(e)
                else:
                    if not side:
                        out.update(self._cs_prepack(decode_arg(prepack_threads), source=index))
                    out.update({"seconds_rpc": round(time.perf_counter() - t0, 6), "flat": str(flat)})
                    if frac is not None:
                        out["resident_at_start"] = round(frac, 3)  # of the weights file, when the reload began
                    if auto_choice:
                        out["auto_choice"] = auto_choice
                    if packed_why:
                        out["packed_refused"] = packed_why
                    self._cs_saved_buffers = {}
                    return out
            if mode == "map":
                # returned, not raised: an exception in a collective_rpc takes vLLM's engine down
                log.warning("coldstart reload: map mode refused: %s", refused)
                return {"mode": "map", "error": f"map reload refused: {refused}", "flat": str(flat)}
            log.warning("coldstart reload: map mode refused (%s); copying instead", refused)
        direct = decode_arg(direct)  # None: the loader's choice (by residency and the device's probe)
        threads = decode_arg(threads)  # None: the loader's default for the device
        kw: dict[str, Any] = {"threads": None if threads is None else int(threads), "verify": bool(decode_arg(verify)),
                              "direct": None if direct is None else bool(direct)}
        if chunk_bytes is not None:
            kw["chunk_bytes"] = int(decode_arg(chunk_bytes))
        if buffers is not None:
            kw["buffers"] = int(decode_arg(buffers))
        from coldstart.errors import ColdstartError
        from coldstart.weights.format import read_index

        t0 = time.perf_counter()
        side = packing_active() and not kw["verify"] and self._cs_arena is not None \
            and _overlap_prepack(decode_arg(overlap), flat, frac)
        try:
            index = read_index(flat)
            if side:
                stats, packed = self._cs_copy_packing(index, kw, decode_arg(prepack_threads))
            else:
                stats = load_into(index, model_tensors(self._cs_model()), **kw)
        except Exception as e:  # noqa: BLE001 - (the loader's own failures are ColdstartErrors; the
            # read-shape probe it may run is a choice): returned, not raised, since an exception in a
            # collective_rpc takes vLLM's engine down
            why = str(e) if isinstance(e, ColdstartError) else f"{type(e).__name__}: {e}"
            log.warning("coldstart reload: copy failed: %s", why)
            return {"mode": "copy", "error": f"copy reload failed: {why} (the weights may be partly overwritten: "
                                             "reload from a good dump before serving)", "flat": str(flat)}
        out = _as_dict(stats)
        out.update(packed if side else self._cs_prepack(decode_arg(prepack_threads), source=index))
        out.update({"seconds_rpc": round(time.perf_counter() - t0, 6), "flat": str(flat), "mode": "copy"})
        if refused:
            out["map_refused"] = refused
        if auto_choice:
            out["auto_choice"] = auto_choice
        if packed_why:
            out["packed_refused"] = packed_why
        self._cs_saved_buffers = {}
        return out

    def _cs_copy_packing(self, index, kw: dict, prepack_threads: Any) -> tuple[Any, dict]:
        """A copy reload with the prepack beside it: the loader copies the file in on a thread,
        in file order (its readers share one queue of pieces), and each layer is packed as soon as
        its weight has landed (load_into's ``on_landed``), so the packing's CPU runs while the disk
        still reads. (stats, the prepack's stats); raises the loader's ColdstartError."""
        from coldstart.weights.loader import load_into

        at = self._cs_span_at()
        landed = {name: threading.Event() for name in at.values()}
        result: dict[str, Any] = {}

        def load() -> None:
            try:
                result["stats"] = load_into(index, model_tensors(self._cs_model()), layout="shared",
                                            on_landed=lambda name: landed[name].set() if name in landed else None,
                                            **kw)
            except BaseException as e:  # noqa: BLE001 - raised below, on the caller's thread
                result["error"] = e
            finally:
                for ev in landed.values():  # no packing thread waits forever on a failed load
                    ev.set()

        th = threading.Thread(target=load, name="coldstart-reload-copy", daemon=True)

        def touch(weight) -> None:
            ev = landed.get(at.get(weight.data_ptr(), ""))
            if ev is not None:
                ev.wait()
            else:  # a weight outside the arena's spans: packed only once the whole file is in
                th.join()

        th.start()
        packed = self._cs_prepack(prepack_threads, touch=touch, source=index)
        th.join()
        if "error" in result:
            self._cs_packed_from = None  # (packed from weights partly overwritten)
            raise result["error"]
        packed["prepack_overlapped"] = True
        return result["stats"], packed

    def _cs_reload_kept(self, flat: Path, kept: str, populate_threads: int, huge: bool = True) -> dict | None:
        """The reload after a restore whose packed handles were kept through the checkpoint: the
        flat file mapped over the arena, only the spans no handle covers populated, no prepack.
        None (the caller reloads as usual, repacking) unless the file is the dump the handles were
        built from and every handle's weight lies in the arena."""
        from coldstart.errors import ColdstartError
        from coldstart.weights.format import read_index

        arena = self._cs_arena
        if arena is None:
            return None
        t0 = time.perf_counter()
        try:
            index = read_index(flat)
        except ColdstartError:
            return None  # the usual path reports it
        if index_identity(index) != kept:
            log.info("coldstart reload: %s is not the dump the kept packed handles were built from: repacking", flat)
            return None
        at = self._cs_span_at()
        layers = packed_linears()
        names = {at.get(layer.weight.data_ptr()) for layer in layers}
        if not layers or None in names or not index.absent <= names:
            return None  # (the usual path then refuses a file that leaves out weights no handle holds)
        try:
            out = arena.map_file(index, threads=populate_threads, skip=names, huge=huge)
        except ColdstartError as e:
            if arena.mapped:
                arena.release()
            log.warning("coldstart reload: mapping for the kept packed handles refused (%s): repacking", e)
            return None
        self._cs_packed_from = kept
        self._cs_absent = index.absent
        self._cs_saved_buffers = {}
        if index.absent:
            out["handles_only"] = len(index.absent)
        out.update({"prepacked_linears": 0, "prepack_s": 0.0, "prepack_threads": 0, "packed_kept": len(layers),
                    "seconds_rpc": round(time.perf_counter() - t0, 6), "flat": str(flat)})
        return out

    def _cs_reload_packed(self, flat: Path, released: tuple[str, str], verify: bool, populate_threads: int,
                          prepack_threads: Any, overlap: bool = True, huge: bool = True) -> dict | str:
        """The reload after a sleep(2) that kept the packed handles and released their buffers (the
        packed arena): the flat file mapped over the weight arena (the plain weights only a handle
        reads are mapped, not read) and the packed dump beside it (packed.dump_dir) over the packed
        arena, both populated side by side (``overlap`` False: one after the other): no packing.
        Unless the file is the dump the handles were built from and the packed dump matches them,
        why not (the caller then reloads as usual, packing anew)."""
        from coldstart.engine import packed
        from coldstart.errors import ColdstartError
        from coldstart.weights.format import read_index

        arena, parena = self._cs_arena, self._cs_packed_arena
        ident, sig = released
        if arena is None or parena is None:
            return "no weight arena or no packed arena"
        t0 = time.perf_counter()
        try:
            index = read_index(flat)
        except ColdstartError as e:
            return str(e)  # (the usual path reports it too)
        if index_identity(index) != ident:
            return f"{flat} is not the dump the packed handles were built from"
        pdir = packed.dump_dir(Path(index.data_file).parent, sig)
        try:
            pindex = read_index(pdir)
            parena.check_index(pindex)
        except ColdstartError as e:
            if not pdir.exists():
                return f"no packed dump for these handles beside {flat} (coldstart_dump_packed writes one)"
            log.warning("coldstart reload: packed dump %s refused: %s", pdir, e)
            return f"packed dump refused: {e}"
        if index.absent:  # (a sleep keeps the handles of such a file: only kept handles stand for them)
            return "the weights file leaves out weights"
        only = frozenset(self._cs_handle_weights()) & frozenset(s.name for s in parena.spans)
        background = overlap and not verify
        try:
            out = arena.map_file(index, threads=populate_threads, skip=only, verify=verify,
                                 populate="background" if background else "now", huge=huge)
        except ColdstartError as e:
            if arena.mapped:
                arena.release()
            return f"mapping the weights refused: {e}"
        try:
            parena.map_file(pindex, threads=populate_threads, verify=verify,
                           populate="background" if background else "now", huge=huge)
        except ColdstartError as e:  # pack them from the plain weights mapped above
            if parena.mapped:
                parena.release()
            log.warning("coldstart reload: packed dump %s refused (%s): packing anew", pdir, e)
            out.update(self._cs_prepack(prepack_threads, touch=arena.populate_tensor, source=index))
            out["packed_refused"] = f"packed dump refused: {e}"
        else:
            self._cs_packed_from = ident
            out.update({"prepacked_linears": 0, "prepack_s": 0.0, "prepack_threads": 0,
                        "packed_refilled": len(parena.spans), "packed_bytes": pindex.data_size})
        try:
            out["populate_s"] = round(arena.wait_populated(), 6)
            if "packed_refilled" in out:
                out["packed_populate_s"] = round(parena.wait_populated(), 6)
        except ColdstartError as e:
            for a in (arena, parena):
                a.release()
            self._cs_packed_from = None
            return f"populating failed: {e}"
        self._cs_absent = frozenset()  # (a file that leaves weights out was refused above)
        self._cs_saved_buffers = {}
        out.update({"bytes_read": sum(t.nbytes for t in index.tensors if t.name not in only)
                    + (pindex.data_size if "packed_refilled" in out else 0),
                    "mode": "map+packed" if "packed_refilled" in out else "map",
                    "seconds_rpc": round(time.perf_counter() - t0, 6), "flat": str(flat)})
        return out

    def reload_weights(self, *args, **kwargs) -> Any:
        """vLLM's reload_weights (timed); with ``weights_path`` at a flat dump, our loader instead."""
        wp = kwargs.get("weights_path")
        if wp is not None:
            wp = str(decode_arg(wp))
            p = Path(wp)
            if (p / "weights.flat").is_file() and (p / "weights.index.json").is_file():
                return self.coldstart_reload(wp)
            kwargs["weights_path"] = wp
        elif not args and self.vllm_config.load_config.load_format == "coldstart":  # type: ignore[attr-defined]
            # served from a flat dump: vLLM's reload cannot read it (kernel-format names); ours can
            return self.coldstart_reload()
        if "is_checkpoint_format" in kwargs:
            kwargs["is_checkpoint_format"] = bool(decode_arg(kwargs["is_checkpoint_format"]))
        t0 = time.perf_counter()
        self._cs_kept = None  # the weights change under any kept handles: they are rebuilt below
        super().reload_weights(*args, **kwargs)  # type: ignore[misc]
        out = self._cs_prepack()
        out["seconds_rpc"] = round(time.perf_counter() - t0, 6)
        return out

    def _cs_prepack(self, threads: Any = None, touch=None, source=None) -> dict:
        """Build the handles from the weights now in place; ``source``: the index (FlatIndex) of the
        flat dump they came from (its identity is what a kept set of handles is checked against),
        None for any other."""
        self._cs_packed_from = None
        self._cs_released = None  # (handles built anew below)
        self._cs_absent = frozenset()  # packed from weights in place: every one of them is there
        n, secs, used, waited = prepack_linears(int(threads) if threads else None, touch=touch)
        if source is not None and n:
            self._cs_packed_from = index_identity(source)
        out = {"prepacked_linears": n, "prepack_s": round(secs, 6), "prepack_threads": used}
        if touch is not None:
            out["prepack_waited_s"] = round(waited, 6)
        return out

    @torch.inference_mode()
    def coldstart_dump_weights(self, out_dir: str) -> dict:
        """Write the live model's parameters and buffers (kernel format) to a flat dump."""
        from coldstart.weights.dump import dump_tensors

        if "weights" in self._cs_sleeping:
            raise RuntimeError("cannot dump weights while they are released (sleep level 2)")
        tensors = model_tensors(self._cs_model())
        arena = self._cs_arena
        if arena is not None:  # the arena's order, so the file is a byte image of the arena
            tensors = {s.name: tensors[s.name] for s in arena.spans}
        t0 = time.perf_counter()
        rebuilt = 0
        if self._cs_absent:  # their mapped bytes are the file's holes: rebuilt from the handles
            held = self._cs_handle_weights()
            for name in sorted(self._cs_absent):
                if name not in held:
                    raise RuntimeError(f"cannot dump {name}: the weights file leaves it out and no packed handle holds it")
                tensors[name] = unpack_weight(held[name])
                rebuilt += 1
        index = dump_tensors(tensors.items(), Path(decode_arg(out_dir)), alignment=arena.alignment if arena else 4096)
        if arena is not None:
            arena.check_index(index)  # a bug if it fails: the layouts are computed the same way
        if packed_linears():  # built from the weights just written (any change of them repacks)
            self._cs_packed_from = index_identity(index)
        return {"tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                "seconds": round(time.perf_counter() - t0, 6), "rebuilt_from_handles": rebuilt, "index": _as_dict(index, shallow=True)}

    def coldstart_xstate(self, restore: Any = None) -> dict:
        """This worker's x86 xstate permissions (AMX); with ``restore`` (the mask recorded before a
        checkpoint) first ask again for the features a CRIU restore dropped (coldstart.engine.xstate)."""
        from coldstart.engine import xstate

        restore = decode_arg(restore)
        try:
            asked = xstate.restore_xcomp_perm(int(restore)) if restore is not None else []
        except OSError as e:  # returned, not raised: an exception in a collective_rpc kills the engine
            return {"perm": xstate.xcomp_perm(), "asked": [], "error": str(e)}
        if asked:
            log.info("coldstart: asked again for xstate features %s lost by the restore", asked)
        return {"perm": xstate.xcomp_perm(), "asked": asked}

    def coldstart_rss(self) -> int:
        """Resident bytes of this worker process."""
        return rss_bytes()

    def coldstart_weights_bytes(self) -> int:
        """Bytes of the distinct storages behind the model's parameters."""
        return sum(t.untyped_storage().nbytes() for t in
                   {t.untyped_storage().data_ptr(): t for t in self._cs_weight_tensors().values()}.values())

    def coldstart_state(self) -> dict:
        return {"sleeping": sorted(self._cs_sleeping), "rss": rss_bytes(), "pid": os.getpid(),
                "weights_bytes": self.coldstart_weights_bytes(),
                "kv_bytes": sum(n for _, n in unique_storages(self._cs_kv_tensors())),
                "arena": self._cs_arena.state() if self._cs_arena is not None else None,
                "packed_arena": self._cs_packed_arena.state() if self._cs_packed_arena is not None else None,
                "reload_mode": default_reload_mode(), "handles_hold_copies": handles_hold_copies(),
                "handles_only": len(self._cs_absent), "packed_released": self._cs_released is not None,
                "last": self._cs_last, "settle": self._cs_settled}


class SleepCPUWorker(ColdstartRPCMixin, CPUWorker):
    """vLLM's CPU worker with real sleep levels 1 and 2 and in-place fast reload."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from coldstart.engine import xstate

        xstate.ask_amx()  # before the first forward pass (see ask_amx)
        self._cs_init()

    def load_model(self, *args, **kwargs) -> None:
        keep_plain_linear_weights()
        super().load_model(*args, **kwargs)
        if arena_enabled():
            from coldstart.engine.arena import WeightArena

            t0 = time.perf_counter()
            self._cs_arena = WeightArena.build(model_tensor_objects(self._cs_model()))
            a = self._cs_arena
            log.info("coldstart: weights moved into one %d-byte arena (%d tensors, %d left in place: %s) in %.3f s",
                     a.size, len(a.spans), len(a.left_in_place()), a.left_in_place()[:5], time.perf_counter() - t0)
        n, secs, _, _ = prepack_linears()  # after the move: a handle copies the weight from where it is
        log.info("coldstart: %d linear layers prepacked in %.3f s", n, secs)

    # --- sleep / wake (same contract as vLLM's GPU worker)
    @torch.inference_mode()
    def sleep(self, level: int = 1) -> None:
        level = int(decode_arg(level))
        self._cs_stop_settling()
        t0 = time.perf_counter()
        rss0 = rss_bytes()
        kv_total, kv_rel = release_tensors(self._cs_kv_tensors())
        self._cs_sleeping.add("kv_cache")
        w_total = w_rel = 0
        unpacked = kept = released_packed = 0
        kept_weights: list[str] = []
        if level >= 2:
            keep, self._cs_keep_next = self._cs_keep_next, False
            if self._cs_absent and not keep:
                keep = True
                log.info("coldstart sleep(2): packed handles kept: they hold the only copy of %d weights "
                         "(the weights file leaves them out)", len(self._cs_absent))
            why_not = ("" if not keep else "no weight arena" if self._cs_arena is None else
                       "the handles were not built by a reload from a flat dump with digests"
                       if self._cs_packed_from is None else "")
            if keep and not why_not:
                kept = len(packed_linears())  # they stay, and stand for the dump they were built from
                self._cs_kept = self._cs_packed_from
                held = self._cs_handle_weights()
                trim_heap()  # free heap pages (the load's copies of the weights) out of the image
            else:
                if why_not:
                    log.warning("coldstart sleep(2): packed handles not kept: %s", why_not)
                parena, why = self._cs_adopt_packed() if self._cs_packed_from else (None, "")
                if parena is not None:
                    # the handles stay, their buffers go: a reload may map them back from a packed dump
                    from coldstart.engine.packed import signature

                    self._cs_released = (self._cs_packed_from, signature(self._cs_packed_from, parena.tensors))
                    released_packed = parena.release()
                else:
                    if why:
                        log.info("coldstart sleep(2): packed handles dropped: %s", why)
                    unpacked = unpack_linears()  # before the weights they were built from go
                    self._cs_packed_from = None
                self._cs_kept = None
            model = self._cs_model()
            # like vLLM's GPU worker: buffers (rotary caches...) are not in a checkpoint; keep a copy
            self._cs_saved_buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
            tensors = list(self._cs_weight_tensors().values()) + [b for _, b in model.named_buffers()]
            if self._cs_arena is not None:
                # the whole arena becomes a fresh anonymous mapping (also drops a mapped weights file)
                w_total = w_rel = self._cs_arena.release()
                inside = (self._cs_arena.addr, self._cs_arena.addr + self._cs_arena.size)
                tensors = [t for t in tensors if not inside[0] <= t.data_ptr() < inside[1]]
            t2, r2 = release_tensors(tensors)
            w_total += t2
            w_rel += r2
            self._cs_sleeping.add("weights")
            if kept:  # released, the plain weights read zeros: a handle still answering has its own copy
                kept_weights = sorted(n for n, layer in held.items() if holds_own_copy(layer))
        self._cs_last = {"op": "sleep", "level": level, "kv_bytes": kv_total, "kv_released": kv_rel,
                         "weights_bytes": w_total, "weights_released": w_rel, "unpacked_linears": unpacked,
                         "kept_linears": kept, "kept_weights": kept_weights,
                         "packed_released": released_packed,
                         "rss_before": rss0, "rss_after": rss_bytes(),
                         "seconds": round(time.perf_counter() - t0, 6)}
        log.info("coldstart sleep(%d): %s", level, self._cs_last)

    @torch.inference_mode()
    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = decode_arg(tags)
        if isinstance(tags, str):
            tags = [tags]
        wake = set(tags) if tags else {"weights", "kv_cache"}
        if "weights" in wake and self._cs_saved_buffers:
            model = self._cs_model()
            for name, buf in model.named_buffers():
                if name in self._cs_saved_buffers:
                    buf.data.copy_(self._cs_saved_buffers[name])
            self._cs_saved_buffers = {}
        if "kv_cache" in wake:
            # released pages read back as zeros already; nothing stale survives
            pass
        self._cs_sleeping -= wake


def _as_dict(obj: Any, shallow: bool = False) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        if shallow:
            return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
                    if isinstance(getattr(obj, f.name), (int, float, str, bool, type(None)))}
        return {k: v for k, v in dataclasses.asdict(obj).items()
                if isinstance(v, (int, float, str, bool, type(None), list, dict))}
    if isinstance(obj, dict):
        return obj
    return {"value": str(obj)}
