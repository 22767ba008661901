"""What this machine has for the tests: a CUDA GPU (through torch) and nvcc. A module of its
own, because test files can't import ``conftest`` reliably (pytest imports every folder's
conftest.py under that one name)."""

import shutil
from pathlib import Path


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


HAS_GPU = _has_gpu()
HAS_NVCC = shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()
