"""Shared test settings: CPU only, deterministic, few threads (CI has 2 cores)."""
import os
import sys

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


def cpu_autocast_enabled() -> bool:
    """Whether CPU autocast is on now (``torch.is_autocast_enabled('cpu')``; torch < 2.4
    takes no device there and has ``torch.is_autocast_cpu_enabled()`` instead)."""
    try:
        return torch.is_autocast_enabled('cpu')
    except TypeError:
        return torch.is_autocast_cpu_enabled()


#: fp16 tests run on the CPU where torch supports it (on GPUs fp16 always works)
requires_cpu_fp16 = pytest.mark.skipif(not _cpu_fp16_supported(),
                                       reason=f'torch {torch.__version__} has no fp16 matmul '
                                       'kernels / fp16 autocast on the CPU (the fp16 path is '
                                       'the GPU one)')


# ------------------------------------------------ runs of the tools on the toy detector
#: what the subprocess tests train: the toy Mask R-CNN config through tools/train.py
TOY_DET_CONFIG = os.path.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')
TRAIN_TOOL = os.path.join(REPO_ROOT, 'tools', 'train.py')


@pytest.fixture(scope='module')
def toy_root(tmp_path_factory):
    """A tiny toy COCO set (8 train / 2 val images of 128 px), once per test module."""
    from inline_mm.datasets import make_coco_toy
    root = str(tmp_path_factory.mktemp('data') / 'coco_toy')
    make_coco_toy(root, num_train=8, num_val=2, image_size=128, seed=1)
    return root


def toy_det_options(root: str, flip: bool = False, **extra) -> list:
    """``--cfg-options`` for the toy detector on ``root``: deterministic kernels,
    a loss logged every iteration, no validation, random flip off unless ``flip``."""
    opts = {
        'train_dataloader.dataset.data_root': root + '/',
        'val_dataloader.dataset.data_root': root + '/',
        'test_dataloader.dataset.data_root': root + '/',
        'val_evaluator.ann_file': root + '/annotations/instances_val.json',
        'test_evaluator.ann_file': root + '/annotations/instances_val.json',
        'train_cfg.val_interval': 1000,
        'default_hooks.logger.interval': 1,
        'randomness.deterministic': True,
    }
    if not flip:
        opts['train_dataloader.dataset.pipeline.3.prob'] = 0.0
    opts.update(extra)
    return ['--cfg-options'] + [f'{k}={v}' for k, v in opts.items()]


def tool_env() -> dict:
    """The environment of a tool subprocess: unbuffered, one OpenMP thread per process
    (faults are test-only hooks in the run's config: tests/plugins/fault_hooks.py)."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', OMP_NUM_THREADS='1')
    # the launchers (tools/dist_*.sh) run $PYTHON: the interpreter of this test run, not
    # whatever .venv/ or PATH has (make test-compat runs the suite in .venv-compat)
    env['PYTHON'] = sys.executable
    return env


def scalars(work_dir: str, all_runs: bool = False) -> list:
    """The rows of ``scalars.json`` of the newest run in ``work_dir`` (of every run,
    oldest first, with ``all_runs``: a resumed run logs into a new timestamped folder);
    ``[]`` while nothing is logged yet."""
    import glob
    import json
    files = sorted(glob.glob(os.path.join(work_dir, '*', 'vis_data', 'scalars.json')))
    rows = []
    for path in files if all_runs else files[-1:]:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def checkpoint_weights(path, key: str = 'state_dict') -> dict:
    """``key`` of a checkpoint this test run wrote (a full unpickle: our own files)."""
    return torch.load(path, map_location='cpu', weights_only=False)[key]


def assert_same_weights(a, b, exact: bool = True, key: str = 'state_dict') -> None:
    """The two checkpoints hold the same ``key`` tensors: bit for bit (``exact``), or
    within float rounding."""
    wa, wb = checkpoint_weights(a, key), checkpoint_weights(b, key)
    assert wa.keys() == wb.keys()
    for name in wa:
        if exact:
            assert torch.equal(wa[name], wb[name]), name
        else:
            torch.testing.assert_close(wa[name], wb[name], rtol=1e-5, atol=1e-6, msg=name)


def free_port() -> int:
    """A TCP port free on the loopback now (for a torch.distributed master)."""
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def site_packages_farm(folder, hide=()):
    """``folder`` filled with symlinks to this environment's site-packages entries, less
    those matching a glob pattern of ``hide``: an environment that sees the installed
    packages without copying them (packaging and stack-check tests)."""
    import fnmatch
    import sysconfig
    site = sysconfig.get_paths()['purelib']
    folder.mkdir()
    for name in os.listdir(site):
        if not any(fnmatch.fnmatch(name, pattern) for pattern in hide):
            os.symlink(os.path.join(site, name), folder / name)
    return folder
