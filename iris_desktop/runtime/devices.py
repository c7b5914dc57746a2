"""The compute devices llama.cpp can use, as ggml lists them, with their free memory.

ggml keeps one registry of devices for every backend it has (``ggml_backend_dev_count``,
``ggml_backend_dev_get``): the CPU always, and a GPU backend's devices when llama.cpp was
built with one (Vulkan, CUDA, Metal) and its driver answers. :func:`list_devices` reads
them through ctypes on the libggml llama_cpp loaded (:mod:`.backends` finds it and loads
the installers' backend modules first), so a CPU-only build simply lists the CPU.

A Vulkan device's driver version is not in ggml's description: :func:`vulkan_drivers`
asks the Vulkan loader itself (``vkGetPhysicalDeviceProperties``), so that the first-use
check's record (:class:`.gpu.GpuChecks`) can tell a new driver from the one it checked.
Never imports PySide6.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
import sys
from typing import Any

from .backends import ggml_function, ggml_library, load_backends
from .gpu import DEVICE_KINDS, Device

log = logging.getLogger("iris.runtime.devices")

__all__ = ["device_handle", "list_devices", "vulkan_drivers"]


def list_devices() -> list[Device]:
    """Every device ggml has registered, in its order (the CPU among them). Loads the
    backends first (:func:`.backends.load_backends`). A device whose memory cannot be read
    reports 0 (unknown). Raises backends.BackendError when llama.cpp has no CPU backend."""
    load_backends()
    ggml = ggml_library()
    count = ggml_function(ggml, "ggml_backend_dev_count", ctypes.c_size_t)()
    get = ggml_function(ggml, "ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)
    name = ggml_function(ggml, "ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)
    describe = ggml_function(ggml, "ggml_backend_dev_description", ctypes.c_char_p, ctypes.c_void_p)
    kind = ggml_function(ggml, "ggml_backend_dev_type", ctypes.c_int, ctypes.c_void_p)
    memory = ggml_function(ggml, "ggml_backend_dev_memory", None, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
    reg_of = ggml_function(ggml, "ggml_backend_dev_backend_reg", ctypes.c_void_p, ctypes.c_void_p)
    reg_name = ggml_function(ggml, "ggml_backend_reg_name", ctypes.c_char_p, ctypes.c_void_p)
    devices = []
    for i in range(count):
        dev = get(i)
        if not dev:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        memory(dev, ctypes.byref(free), ctypes.byref(total))
        backend = _text(reg_name(reg_of(dev)))
        t = kind(dev)
        devices.append(Device(name=_text(name(dev)), description=_text(describe(dev)),
                              kind=DEVICE_KINDS[t] if 0 <= t < len(DEVICE_KINDS) else "accel",
                              backend=backend, free_bytes=int(free.value), total_bytes=int(total.value),
                              index=i))
    return _with_drivers(devices)


def device_handle(device: Device) -> int | None:
    """ggml's pointer for ``device`` (found again by index and name), for llama.cpp's
    ``devices`` model parameter; None when it is gone."""
    if device.index < 0:
        return None
    ggml = ggml_library()
    count = ggml_function(ggml, "ggml_backend_dev_count", ctypes.c_size_t)()
    if device.index >= count:
        return None
    dev = ggml_function(ggml, "ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)(device.index)
    name = ggml_function(ggml, "ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)
    return dev if dev and _text(name(dev)) == device.name else None


def _text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", "replace")


def _with_drivers(devices: list[Device]) -> list[Device]:
    """The devices with their driver's version where it can be told."""
    from dataclasses import replace

    drivers: dict[str, str] = {}
    if any(d.backend == "Vulkan" for d in devices):
        drivers = vulkan_drivers()
    out = []
    for d in devices:
        driver = ""
        if d.backend == "Vulkan":
            driver = drivers.get(d.description, "")
        elif d.backend == "Metal" and sys.platform == "darwin":
            driver = f"macOS {platform.mac_ver()[0]}"
        elif d.backend == "CUDA":
            driver = _cuda_driver()
        out.append(replace(d, driver=driver) if driver else d)
    return out


# -- Vulkan: the driver version of each physical device --------------------------------------


class _InstanceCreateInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                ("pApplicationInfo", ctypes.c_void_p), ("enabledLayerCount", ctypes.c_uint32),
                ("ppEnabledLayerNames", ctypes.c_void_p), ("enabledExtensionCount", ctypes.c_uint32),
                ("ppEnabledExtensionNames", ctypes.c_void_p)]


class _PropertiesHead(ctypes.Structure):
    """The start of VkPhysicalDeviceProperties (the limits that follow are not read)."""

    _fields_ = [("apiVersion", ctypes.c_uint32), ("driverVersion", ctypes.c_uint32),
                ("vendorID", ctypes.c_uint32), ("deviceID", ctypes.c_uint32),
                ("deviceType", ctypes.c_int), ("deviceName", ctypes.c_char * 256)]


class _ApplicationInfo(ctypes.Structure):
    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("pApplicationName", ctypes.c_char_p),
                ("applicationVersion", ctypes.c_uint32), ("pEngineName", ctypes.c_char_p),
                ("engineVersion", ctypes.c_uint32), ("apiVersion", ctypes.c_uint32)]


class _DriverProperties(ctypes.Structure):
    """VkPhysicalDeviceDriverProperties: the driver's own name and version text."""

    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("driverID", ctypes.c_int),
                ("driverName", ctypes.c_char * 256), ("driverInfo", ctypes.c_char * 256),
                ("conformanceVersion", ctypes.c_uint8 * 4)]


class _Properties2(ctypes.Structure):
    """VkPhysicalDeviceProperties2, its VkPhysicalDeviceProperties (824 bytes) kept as raw
    8-byte words (room to spare)."""

    _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("properties", ctypes.c_uint64 * 256)]


#: sizeof(VkPhysicalDeviceProperties) is 824 on 64-bit systems; room to spare
_PROPERTIES_BYTES = 4096
#: VK_STRUCTURE_TYPE_* of the structures above; Vulkan 1.1, where vkGetPhysicalDeviceProperties2 is core
_APPLICATION_INFO, _PROPERTIES_2, _DRIVER_PROPERTIES = 0, 1000059001, 1000196000
_VULKAN_1_1 = (1 << 22) | (1 << 12)
_VENDOR_NVIDIA, _VENDOR_INTEL = 0x10DE, 0x8086


def driver_version_text(vendor: int, version: int) -> str:
    """A Vulkan ``driverVersion`` as its vendor writes it (NVIDIA 10.8.8.6 bits, Intel's
    Windows driver 18.14, everyone else Vulkan's 10.10.12: Mesa 22.3.6)."""
    if vendor == _VENDOR_NVIDIA:
        return f"{version >> 22}.{(version >> 14) & 0xFF}.{(version >> 6) & 0xFF}.{version & 0x3F}"
    if vendor == _VENDOR_INTEL and sys.platform == "win32":
        return f"{version >> 14}.{version & 0x3FFF}"
    return f"{version >> 22}.{(version >> 12) & 0x3FF}.{version & 0xFFF}"


def _vulkan_loader() -> ctypes.CDLL | None:
    names = ["vulkan-1.dll"] if sys.platform == "win32" else (
        ["libvulkan.1.dylib", "libMoltenVK.dylib"] if sys.platform == "darwin" else ["libvulkan.so.1"])
    found = ctypes.util.find_library("vulkan")
    for name in [*names, *([found] if found else [])]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def vulkan_drivers() -> dict[str, str]:
    """Device name -> "<driver version> (vendor 0x10de, api 1.3.260)" for every Vulkan
    physical device; empty when there is no Vulkan loader or it fails."""
    lib = _vulkan_loader()
    if lib is None:
        return {}
    try:
        create = lib.vkCreateInstance
        create.restype, create.argtypes = ctypes.c_int, [ctypes.POINTER(_InstanceCreateInfo),
                                                         ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
        enumerate_ = lib.vkEnumeratePhysicalDevices
        enumerate_.restype = ctypes.c_int
        enumerate_.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p]
        properties = lib.vkGetPhysicalDeviceProperties
        properties.restype, properties.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
        destroy = lib.vkDestroyInstance
        destroy.restype, destroy.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
    except AttributeError:
        return {}
    app = _ApplicationInfo(sType=_APPLICATION_INFO, apiVersion=_VULKAN_1_1)
    info = _InstanceCreateInfo(sType=1, pApplicationInfo=ctypes.addressof(app))  # INSTANCE_CREATE_INFO
    instance = ctypes.c_void_p()
    if create(ctypes.byref(info), None, ctypes.byref(instance)) != 0 or not instance:
        return {}
    try:
        count = ctypes.c_uint32(0)
        if enumerate_(instance, ctypes.byref(count), None) != 0 or not count.value:
            return {}
        handles = (ctypes.c_void_p * count.value)()
        if enumerate_(instance, ctypes.byref(count), handles) not in (0, 5):  # VK_INCOMPLETE
            return {}
        out = {}
        for handle in handles[:count.value]:
            buffer = ctypes.create_string_buffer(_PROPERTIES_BYTES)
            properties(handle, buffer)
            head = _PropertiesHead.from_buffer_copy(buffer.raw[:ctypes.sizeof(_PropertiesHead)])
            api = head.apiVersion
            name = head.deviceName.decode("utf-8", "replace")
            driver = _driver_info(lib, handle) if api >= _VULKAN_1_1 else ""
            out[name] = (f"{driver + '; ' if driver else ''}{driver_version_text(head.vendorID, head.driverVersion)} "
                         f"(vendor 0x{head.vendorID:04x}, Vulkan {api >> 22 & 0x7F}.{api >> 12 & 0x3FF}."
                         f"{api & 0xFFF})")
        return out
    finally:
        destroy(instance, None)


def _driver_info(lib: ctypes.CDLL, handle: int) -> str:
    """The driver's name and version as it writes them ("llvmpipe Mesa 22.3.6 (LLVM 15.0.6)",
    "NVIDIA 550.54.14"): Mesa's software driver reports the same driverVersion for every
    release, this text does not. "" where the device does not say (Vulkan 1.1 without
    VK_KHR_driver_properties)."""
    try:
        get = lib.vkGetPhysicalDeviceProperties2
    except AttributeError:
        return ""
    get.restype, get.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p]
    driver = _DriverProperties(sType=_DRIVER_PROPERTIES)
    props = _Properties2(sType=_PROPERTIES_2, pNext=ctypes.addressof(driver))
    get(handle, ctypes.byref(props))
    words = [driver.driverName.decode("utf-8", "replace").strip(), driver.driverInfo.decode("utf-8", "replace").strip()]
    return " ".join(w for w in words if w)


def _cuda_driver() -> str:
    """The CUDA driver's version (cuDriverGetVersion: 12040 -> "CUDA 12.4"), or ""."""
    name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
    try:
        lib: Any = ctypes.CDLL(name)
        version = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return ""
    except (OSError, AttributeError):
        return ""
    return f"CUDA {version.value // 1000}.{version.value % 1000 // 10}"
