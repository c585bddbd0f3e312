"""Sleepable device memory through the CUDA driver's virtual memory API (ctypes on libcuda).

This is the mechanism of vLLM's CuMemAllocator, which our GPU sleep path relies on: sleep unmaps and
releases the physical memory behind a reserved virtual range, wake maps fresh memory at the same
addresses, so tensors that point there stay valid and our loader refills them in place. The kit
tests that contract with torch where vLLM is absent (tests/gpu/test_sleep_contract.py).
"""
from __future__ import annotations

import ctypes

from coldstart.engine.cuda_checkpoint import check, libcuda


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


ALLOC_PINNED, LOCATION_DEVICE, PROT_READWRITE = 1, 1, 3


class SleepableRegion:
    """``nbytes`` of device memory at a fixed virtual address that can be released and re-mapped."""

    def __init__(self, nbytes: int, device: int = 0):
        self.cu = libcuda()
        self._ensure_context(device)
        self.prop = _Prop(type=ALLOC_PINNED, requestedHandleTypes=0, location=_Location(LOCATION_DEVICE, device))
        gran = ctypes.c_size_t()
        check(self.cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self.prop), 0),
              "cuMemGetAllocationGranularity")
        self.size = -(-nbytes // gran.value) * gran.value
        self.device = device
        ptr = ctypes.c_uint64()
        check(self.cu.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                          ctypes.c_uint64(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        self.ptr = ptr.value
        self.handle: int | None = None
        self.wake()

    def _ensure_context(self, device: int) -> None:
        ctx = ctypes.c_void_p()
        check(self.cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            dev = ctypes.c_int()
            check(self.cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
            check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            check(self.cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    @property
    def awake(self) -> bool:
        return self.handle is not None

    def sleep(self) -> None:
        """Unmap and release the physical memory; the virtual range stays reserved."""
        if self.handle is None:
            return
        check(self.cu.cuMemUnmap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size)), "cuMemUnmap")
        check(self.cu.cuMemRelease(ctypes.c_ulonglong(self.handle)), "cuMemRelease")
        self.handle = None

    def wake(self) -> None:
        """Fresh physical memory mapped at the same addresses (contents undefined until refilled)."""
        if self.handle is not None:
            return
        h = ctypes.c_ulonglong()
        check(self.cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(self.size), ctypes.byref(self.prop),
                                  ctypes.c_ulonglong(0)), "cuMemCreate")
        check(self.cu.cuMemMap(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0), h,
                               ctypes.c_ulonglong(0)), "cuMemMap")
        desc = _AccessDesc(location=_Location(LOCATION_DEVICE, self.device), flags=PROT_READWRITE)
        check(self.cu.cuMemSetAccess(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size), ctypes.byref(desc),
                                     ctypes.c_size_t(1)), "cuMemSetAccess")
        self.handle = h.value

    def free(self) -> None:
        self.sleep()
        check(self.cu.cuMemAddressFree(ctypes.c_uint64(self.ptr), ctypes.c_size_t(self.size)), "cuMemAddressFree")

    def as_tensor(self):
        """A torch uint8 CUDA tensor over the whole range (no copy: __cuda_array_interface__)."""
        import torch

        class _CAI:
            __cuda_array_interface__ = {"shape": (self.size,), "typestr": "|u1", "data": (self.ptr, False),
                                        "version": 3, "strides": None}

        return torch.as_tensor(_CAI(), device=f"cuda:{self.device}")
