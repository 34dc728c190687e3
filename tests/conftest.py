"""Shared test settings: CPU only, deterministic, few threads (CI has 2 cores)."""
import os

import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: files the tests need, kept in the repository (see tests/data/README.md)
DATA_DIR = os.path.join(REPO_ROOT, 'tests', 'data')

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def _cpu_fp16_supported() -> bool:
    """Whether this torch runs fp16 matmuls and fp16 autocast on the CPU (torch >= 2.3 or so)."""
    try:
        with torch.autocast('cpu', dtype=torch.float16):
            torch.ones(2, 2) @ torch.ones(2, 2)
        torch.ones(1, 2, 2, dtype=torch.float16) @ torch.ones(1, 2, 2, dtype=torch.float16)
    except RuntimeError:
        return False
    return True


#: fp16 tests run on the CPU where torch supports it (on GPUs fp16 always works)
requires_cpu_fp16 = pytest.mark.skipif(not _cpu_fp16_supported(),
                                       reason='this torch has no fp16 kernels / autocast '
                                       'on the CPU (the fp16 path is the GPU one)')
