"""The split build (NOTE [Split builds] in evtc/compiler/nvcc.py): a source that says it can is
built as a device half (``-cubin``) and a host half (``-c``) at once, then linked with the cubin
as the bytes of ``evtc_device_image``; failures name the half; a time limit kills both halves."""

from __future__ import annotations

import ctypes
import re
import time

import pytest

from cache_helpers import fake_nvcc, needs_nvcc, process_state, tiny_source
from evtc.compiler import build, kernel_key, key_material, nvcc
from evtc.errors import BuildError

FATBIN_MAGIC = 0xBA55ED50  # the first word of nvcc's -fatbin output (fatbinary's container)


def split_source(tag: str, device_error: bool = False) -> str:
    """A tiny ``.cu`` following the split contract of the sm90 GEMM template: its device half is one
    ``extern "C"`` kernel, its host half exports evtc's C ABI and, here, a peek at the image."""
    device = '#error "the device half is broken on purpose"\n' if device_error else ""
    return (tiny_source(tag) + "\n#define EVTC_SUPPORTS_SPLIT_BUILD 1\n" + f"""\
#if defined(EVTC_SPLIT_DEVICE)
{device}extern "C" __global__ void evtc_gemm_kernel(float* out) {{ out[threadIdx.x] = 1.0f; }}
#elif defined(EVTC_SPLIT_HOST)
extern "C" unsigned char const evtc_device_image[];
EVTC_EXPORT unsigned char const* evtc_test_image() {{ return evtc_device_image; }}
#endif
""")


def test_only_sources_that_say_so_are_split():
    assert nvcc.supports_split_build(split_source("x"))
    assert not nvcc.supports_split_build(tiny_source("x"))
    assert not nvcc.supports_split_build("// #define EVTC_SUPPORTS_SPLIT_BUILD 1\n")


def test_the_commands_of_a_split_build(tmp_path):
    cmds = nvcc.split_build_commands("sm90", tmp_path / "k.cu", tmp_path / "k.so", tmp_path / "w", nvcc="N",
                                     extra_flags=["-DX=1"])
    dev, host, link = cmds["device"], cmds["host"], cmds["link"]
    assert dev[0] == host[0] == link[0] == "N"
    assert "-fatbin" in dev and "-DEVTC_SPLIT_DEVICE" in dev and "-shared" not in dev
    assert "-c" in host and "-DEVTC_SPLIT_HOST" in host and "-shared" not in host
    assert "-shared" in link and link[-2:] == [str(tmp_path / "w" / "host.o"), str(tmp_path / "w" / "image.o")]
    for c in (dev, host, link):  # the same code generation and extra flags everywhere
        assert "-gencode=arch=compute_90a,code=sm_90a" in c and "-DX=1" in c and "-O3" in c and "-DNDEBUG" in c
    assert cmds["image"][1:] == ["-c", "-o", "image.o", "image.S"]


def test_the_device_image_is_assembled_by_nvcc_s_host_compiler(tmp_path, monkeypatch):
    """-ccbin (a program or, as nvcc allows, its folder) or NVCC_CCBIN names the assembler too."""
    monkeypatch.delenv("NVCC_CCBIN", raising=False)
    fake = tmp_path / "bin"
    fake.mkdir()
    gcc = fake / "gcc"
    gcc.write_text("#!/bin/sh\n")
    gcc.chmod(0o755)
    w = tmp_path / "w"
    for flags in (["-ccbin", str(fake)], [f"--compiler-bindir={gcc}"]):
        assert nvcc.split_build_commands("sm80", tmp_path / "k.cu", tmp_path / "k.so", w, nvcc="N",
                                         extra_flags=flags)["image"][0] == str(gcc)
    monkeypatch.setenv("NVCC_CCBIN", str(gcc))
    assert nvcc.split_build_commands("sm80", tmp_path / "k.cu", tmp_path / "k.so", w, nvcc="N")["image"][0] == str(gcc)


def test_a_split_build_is_another_key(cache_env):
    """The same text built in one command or split is not the same binary: the key says which."""
    material = key_material(split_source("k"), arch="sm80")
    assert material["build"] == nvcc.SPLIT_BUILD
    assert "build" not in key_material(tiny_source("k"), arch="sm80")


@needs_nvcc
def test_split_build_links_the_device_image_into_the_library(cache_env):
    src = split_source("split")
    a = build(src, "sm80", name="split")
    assert a.key == kernel_key(src, arch="sm80")
    cmd = a.meta["command"]
    assert "-DEVTC_SPLIT_DEVICE" in cmd and "-DEVTC_SPLIT_HOST" in cmd and "-fatbin" in cmd
    log = a.log.read_text()
    assert "# device" in log and "# host" in log and "# link" in log and "split build" in log
    lib = ctypes.CDLL(str(a.verified_library_path()))
    lib.evtc_test_image.restype = ctypes.POINTER(ctypes.c_ubyte)
    image = lib.evtc_test_image()
    assert int.from_bytes(bytes(image[i] for i in range(4)), "little") == FATBIN_MAGIC
    assert ctypes.cast(image, ctypes.c_void_p).value % 128 == 0  # .balign 128
    # the host half has no kernel of its own: every mention of the kernel's name is in the image
    # (the fatbin header: magic u32, version u16, header size u16, payload size u64)
    data = a.library.read_bytes()
    magic = FATBIN_MAGIC.to_bytes(4, "little")
    starts = [i for i in range(0, len(data), 128) if data[i:i + 4] == magic]
    assert len(starts) == 1
    start = starts[0]
    end = start + int.from_bytes(data[start + 6:start + 8], "little") + int.from_bytes(data[start + 8:start + 16], "little")
    name = b"evtc_gemm_kernel"
    mentions = [m.start() for m in re.finditer(name, data)]
    assert mentions and all(start <= i < end for i in mentions)
    assert build(src, "sm80", name="split").cached


@needs_nvcc
def test_a_failing_half_is_named_and_stops_the_other(cache_env):
    t0 = time.monotonic()
    with pytest.raises(BuildError, match=r"nvcc failed .*\(the device half\).*broken on purpose") as e:
        build(split_source("broken", device_error=True), "sm80", name="broken")
    assert "log:" in str(e.value) and time.monotonic() - t0 < 60
    failed = next((cache_env / "failed").iterdir())
    log = (failed / "build.log").read_text()
    assert "-DEVTC_SPLIT_DEVICE" in log and "broken on purpose" in log


def test_a_split_build_past_its_time_limit_kills_both_halves(cache_env, tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    fake = fake_nvcc(tmp_path, f"sleep 300 & echo $! >> {pids}\necho $$ >> {pids}\nwait")
    monkeypatch.setenv("EVTC_NVCC", str(fake))
    t0 = time.monotonic()
    with pytest.raises(BuildError, match=r"nvcc timed out after 1 s"):
        build(split_source("hang"), "sm80", name="hang", timeout=1)
    assert time.monotonic() - t0 < 30
    children = [int(x) for x in pids.read_text().split()]
    assert len(children) == 4  # two halves, each nvcc and its sleep
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(process_state(p) not in (None, "Z") for p in children):
        time.sleep(0.1)
    assert not any(process_state(p) not in (None, "Z") for p in children)


@needs_nvcc
def test_a_split_build_travels_through_export_and_import(cache_env, tmp_path, monkeypatch):
    """The split library is one self-contained kernel.so: exported, imported into a cache on a
    machine without nvcc, found by its key and loaded with its device image in it."""
    from evtc.compiler import archive, lookup, store

    src = split_source("travel")
    a = build(src, "sm80", name="travel")
    file = tmp_path / "k.tar.xz"
    archive.export_entries(store.cache_root(), file)
    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("EVTC_NVCC", "none")
    s = archive.import_entries(store.cache_root(), file)
    assert [n for _, _, n in s.imported] == ["travel"]
    b = lookup(src, "sm80", name="travel")
    assert b is not None and b.key == a.key and b.library.read_bytes() == a.library.read_bytes()
    lib = ctypes.CDLL(str(b.verified_library_path()))
    lib.evtc_test_image.restype = ctypes.POINTER(ctypes.c_ubyte)
    image = lib.evtc_test_image()
    assert int.from_bytes(bytes(image[i] for i in range(4)), "little") == FATBIN_MAGIC


def test_default_workers_fit_the_available_memory(monkeypatch):
    """build_many's default: the CPU count, but no more builds than the memory holds at about 5 GB
    each (a split build's two halves at once)."""
    from evtc.compiler import cache

    monkeypatch.setattr(cache.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(cache, "_available_memory", lambda: 128 << 30)
    assert cache.default_workers() == 16
    monkeypatch.setattr(cache, "_available_memory", lambda: 12 << 30)
    assert cache.default_workers() == 2
    monkeypatch.setattr(cache, "_available_memory", lambda: 1 << 30)
    assert cache.default_workers() == 1
    monkeypatch.setattr(cache, "_available_memory", lambda: None)  # not Linux: the CPU count
    assert cache.default_workers() == 16
