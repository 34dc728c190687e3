"""Multi-process runs without GPUs (CPU + gloo), e.g. tests and CPU clusters.

mmengine 0.10.7 assumes CUDA once a launcher is set: its ``init_dist`` calls
``torch.cuda.set_device`` and its runner wraps the model in DDP with
``device_ids=[LOCAL_RANK]``.  :func:`prepare_distributed` initialises the
process group itself (gloo) when no GPU is present, and points the runner at
:class:`AnyDeviceDistributedDataParallel`, which drops ``device_ids`` for CPU
modules; on GPU machines both leave mmengine's behaviour untouched.
"""
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS

from ..errors import ConfigError


@MODEL_WRAPPERS.register_module()
class AnyDeviceDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that also wraps CPU modules."""

    def __init__(self, module, device_ids=None, **kwargs):
        if next(module.parameters()).device.type == 'cpu':
            device_ids = None  # DDP takes no device ids for CPU modules
        super().__init__(module=module, device_ids=device_ids, **kwargs)


def prepare_distributed(cfg: Config, launcher: str) -> None:
    """Set up a CPU-only multi-process run (no-op with GPUs or without a launcher)."""
    if launcher == 'none' or torch.cuda.is_available():
        return
    if launcher != 'pytorch':
        raise ConfigError(f'launcher {launcher!r} needs GPUs; on CPUs use --launcher pytorch '
                          f'(tools/dist_train.sh)')
    if not dist.is_initialized():  # gloo whatever the config says: nccl needs GPUs
        # the config's timeout bounds how long a process waits for a dead peer
        timeout = ((cfg.get('env_cfg') or {}).get('dist_cfg') or {}).get('timeout', 1800)
        dist.init_process_group(backend='gloo', rank=int(os.environ['RANK']),
                                world_size=int(os.environ['WORLD_SIZE']),
                                timeout=timedelta(seconds=timeout))
    if cfg.get('model_wrapper_cfg') is None:
        cfg.model_wrapper_cfg = dict(type='AnyDeviceDistributedDataParallel')


def finish_distributed(barrier: bool = True) -> None:
    """Wait for every process (``barrier``), then tear the process group down.

    Leaving a gloo group alive until interpreter exit lets its background
    threads be destroyed in arbitrary order, which can abort a process
    (``terminate called without an active exception``) after its work is done.
    After an error on one process, pass ``barrier=False``: the others may
    never reach the barrier.
    """
    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()
