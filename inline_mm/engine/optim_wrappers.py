"""Mixed precision on CPU machines.

mmengine's ``AmpOptimWrapper`` is built on ``torch.cuda.amp`` and refuses to
start without a GPU.  On CPUs with bf16 instructions (AVX512-BF16, AMX)
autocasting the forward pass to bfloat16 shortens a training iteration
(matmuls and convolutions run on the bf16 units); bf16 has fp32's exponent
range, so no loss scaling is needed.  ``tools/train.py --amp`` picks this wrapper when no GPU is present.
"""
from contextlib import contextmanager
from typing import Union

import torch
import torch.nn as nn
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class CPUAutocastOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose forward passes run under ``torch.autocast('cpu')``.

    Parameters, gradients and the optimiser state stay in fp32; only the
    autocast-eligible operations (matmuls, convolutions) run in ``dtype``.

    Args:
        dtype: ``'bfloat16'`` (default) or ``'float16'``.
        **kwargs: as for :class:`mmengine.optim.OptimWrapper`.
    """

    def __init__(self, *args, dtype: Union[str, torch.dtype] = 'bfloat16', **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(dtype, str):
            if dtype not in ('bfloat16', 'float16'):
                raise ValueError(f"dtype of CPUAutocastOptimWrapper is 'bfloat16' or "
                                 f"'float16', got {dtype!r}")
            dtype = getattr(torch, dtype)
        self.cast_dtype = dtype

    @contextmanager
    def optim_context(self, model: nn.Module):
        with super().optim_context(model), torch.autocast('cpu', dtype=self.cast_dtype):
            yield
