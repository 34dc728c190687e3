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
