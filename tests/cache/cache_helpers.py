"""Helpers of the kernel-cache tests: tiny ``.cu`` sources that define evtc's C ABI trivially
(they build in a second or two, so these tests run in CI without a GPU), a private cache per
test, and fake nvcc programs."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from evtc.abi import ABI_VERSION

REAL_NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
needs_nvcc = pytest.mark.skipif(REAL_NVCC is None, reason="needs nvcc")

CACHE_ENV = ("EVTC_CACHE_DIR", "EVTC_SHARED_CACHE", "EVTC_CACHE_SECRET", "EVTC_OVERRIDE_DIR", "EVTC_DUMP_DIR",
             "EVTC_NVCC", "EVTC_NVCC_TIMEOUT", "EVTC_LOCK_TIMEOUT", "EVTC_CACHE_TOOLCHAIN", "NVCC_APPEND_FLAGS",
             "NVCC_PREPEND_FLAGS", "NVCC_CCBIN", "CUTLASS_PATH", "EVTC_PROGRESS")


def tiny_source(tag: str, abi_version: int = ABI_VERSION) -> str:
    from evtc.abi import CallLayout

    """A ``.cu`` that exports evtc's C ABI and does nothing; ``evtc_info`` names ``tag``."""
    info = '{"static":{"abi":[],"tag":"%s"},"epilogue_smem_bytes":0,"kernel_smem_bytes":0,"mainloop_stages":0,' \
           '"args_size":0}' % tag
    c_info = info.replace('"', '\\"')
    return textwrap.dedent(f"""\
        // evtc cache test kernel {tag}
        #include <cstddef>
        #define EVTC_EXPORT extern "C" __attribute__((visibility("default")))
        EVTC_EXPORT int evtc_abi_version() {{ return {abi_version}; }}
        EVTC_EXPORT size_t evtc_args_size() {{ return 0; }}
        EVTC_EXPORT char const* evtc_last_error() {{ return ""; }}
        EVTC_EXPORT char const* evtc_info() {{ return "{c_info}"; }}
        EVTC_EXPORT int evtc_can_implement(void const*, int) {{ return 0; }}
        EVTC_EXPORT size_t evtc_workspace_size(void const*, int) {{ return 0; }}
        EVTC_EXPORT int evtc_run(void const*, void*, size_t, void*, int) {{ return 0; }}
        EVTC_EXPORT size_t evtc_call_size() {{ return {CallLayout.of(()).size}; }}
        EVTC_EXPORT int evtc_prepare(void const*, int, long long*, size_t*) {{ return 0; }}
        EVTC_EXPORT int evtc_launch(void const*) {{ return 0; }}
        """)


def loaded_tag(path) -> str:
    """dlopen ``path`` and return the tag its ``evtc_info`` reports."""
    from evtc.runtime.launch import KernelLibrary

    return KernelLibrary(path).info["static"]["tag"]



def copy_prebuilt(prebuilt: Path, dest: Path) -> None:
    """Copy the prebuilt cache to ``dest`` with its modes (0700 folders, 0600 files)."""
    shutil.copytree(prebuilt, dest, symlinks=True)


def fake_nvcc(tmp_path: Path, body: str, name: str = "nvcc", real_version: bool = False) -> Path:
    """An executable ``nvcc`` whose ``--version`` answers like nvcc (release 99.0, or the real
    nvcc's with ``real_version``: the same toolchain id) and which otherwise runs ``body`` (sh)."""
    d = tmp_path / "fakebin"
    d.mkdir(exist_ok=True)
    p = d / name
    version = (f'exec {REAL_NVCC} --version' if real_version else
               'echo "Cuda compilation tools, release 99.0"; echo "Build cuda_99.0.fake"; exit 0')
    p.write_text("#!/bin/sh\n"
                 f'if [ "$1" = "--version" ]; then {version}; fi\n' + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return p


PYTHON = sys.executable


def copying_nvcc(tmp_path: Path, library: Path, real_version: bool = True) -> Path:
    """A stand-in nvcc that "builds" by copying ``library`` to its ``-o`` output in a few
    milliseconds (for tests of the cache around a build, not of nvcc); its ``--version`` is the
    real nvcc's (the same toolchain id) unless ``real_version`` is False (release 99.0)."""
    return fake_nvcc(tmp_path, textwrap.dedent(f"""\
        out=""
        while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
        echo "copying nvcc: {library} -> $out"
        cp "{library}" "$out"
        """), name="nvcc-copy", real_version=real_version)


def prebuilt_library(prebuilt: Path, tag: str) -> Path:
    """The ``kernel.so`` of the prebuilt kernel ``tag``."""
    import json

    for meta in prebuilt.rglob("meta.json"):
        if json.loads(meta.read_text())["name"] == tag:
            return meta.parent / "kernel.so"
    raise AssertionError(f"no prebuilt kernel {tag}")


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` in /proc (``Z`` for a zombie), or None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return None
