"""A backbone, a segmentor or a detector's features to ONNX: one file for every input size.

mmdeploy has no rewrites of the InLine layers, and a plain trace bakes the traced
size into every window and mask computation.

The export traces the model with torch's TorchScript-based ONNX exporter
(``torch.onnx.export(..., dynamo=False)`` where torch also has the dynamo-based
one) with dynamic height and width.
Under tracing the InLine layers compute padding, window clipping, masks,
relative position indices and position-table resizing from size tensors in
the graph (:mod:`inline_mm.models.layers.symbolic`), so one file serves every
input size; the batch size is fixed at export (1 by default).  Running and
checking the file in onnxruntime is :mod:`inline_mm.deploy.onnx_check`.
"""
import inspect
import os
import os.path as osp
import warnings
from contextlib import contextmanager
from typing import Iterator, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserInputError
from .traced_ops import adaptive_avg_pool2d

#: What ``--part`` can export.
PARTS = ('backbone', 'backbone_neck', 'model')

#: the model's top-level modules each part holds (None: all of them)
_PART_KEYS = dict(backbone=('backbone',), backbone_neck=('backbone', 'neck'), model=None)

#: Default ONNX opset (onnxruntime >= 1.14 runs it; torch's legacy exporter writes it).
OPSET = 17

#: The parity bound the tools and tests check: max |ort - torch| / max |torch|.
TOLERANCE = 1e-4

#: newer torch has a second, dynamo-based exporter (the default from 2.9): ask for the
#: TorchScript one; older torch (2.1 included) has only that one and no ``dynamo`` argument
_TORCHSCRIPT_EXPORTER = ({'dynamo': False}
                         if 'dynamo' in inspect.signature(torch.onnx.export).parameters else {})

INSTALL_HINT = 'run `make install` (it installs the deploy extra) or `pip install -e ".[deploy]"`'


class DeployError(UserInputError, RuntimeError):
    """A problem with what the user asked for (missing file, wrong part, missing extra).

    A :class:`~inline_mm.errors.UserInputError`: the tools print it as one line (``cli_main``).
    """


def require_onnx() -> None:
    """Import ``onnx`` and ``onnxruntime`` or raise :class:`DeployError` saying how to install."""
    missing = []
    for name in ('onnx', 'onnxruntime'):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise DeployError(f"{' and '.join(missing)} not installed: {INSTALL_HINT}")


# ---------------------------------------------------------------- models
def build_model(config: str, checkpoint: Optional[str] = None, device: str = 'cpu',
                cfg_options: Optional[dict] = None,
                part: str = 'model') -> Tuple[nn.Module, object, str]:
    """Build the detector / segmentor of a config in eval mode.

    Without ``checkpoint`` the weights are random and ``model.backbone.init_cfg``
    is dropped (no ImageNet weights are read).  ``cfg_options`` are the tools'
    ``--cfg-options``, checked as :func:`~inline_mm.engine.launch.load_config` does.
    The checkpoint must fit the ``part`` (one of :data:`PARTS`) that is used: the
    backbone of another task's model exports as ``'backbone'``.

    Returns:
        (model, cfg, task) with ``task`` ``'mmdet'`` or ``'mmseg'``.
    """
    if part not in PARTS:
        raise DeployError(f"part {part!r} is not one of {', '.join(PARTS)}")
    if not osp.isfile(config):
        raise DeployError(f'config file {config!r} not found')
    if checkpoint is not None and not osp.isfile(checkpoint):
        raise DeployError(f'checkpoint file {checkpoint!r} not found')
    from inline_mm.engine.launch import load_config
    from inline_mm.engine.runner_utils import task_of
    cfg = load_config(config, cfg_options)
    task = task_of(cfg)
    if checkpoint is not None:
        # the toolkits' init_model loads with strict=False: a text file would raise a
        # KeyError, another model's checkpoint would export random heads that then pass
        # the parity check.  Refused here in one line
        from inline_mm.engine.runner_utils import load_trained_model
        return load_trained_model(cfg, checkpoint, device, parts=_PART_KEYS[part]), cfg, task
    cfg.model.backbone.init_cfg = None
    if task == 'mmdet':
        from mmdet.apis import init_detector as init_model
    else:
        from mmseg.apis import init_model
    model = init_model(cfg, None, device=device)
    return model.eval(), cfg, task


class _Backbone(nn.Module):
    """The backbone alone: image -> tuple of feature maps."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.backbone = getattr(model, 'backbone', model)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        return tuple(self.backbone(x))


class _BackboneNeck(nn.Module):
    """Backbone + neck (``extract_feat``): the detector's FPN maps; heads stay in PyTorch."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        return tuple(self.model.extract_feat(x))


class _SegmentorLogits(_BackboneNeck):
    """A whole encoder-decoder segmentor: normalised image -> logits at the input size.

    The same computation as mmseg's ``whole`` inference on one padded batch:
    decode head on the features, bilinear resize to the input size.
    """

    def forward(self, x: Tensor) -> Tensor:
        from mmseg.models.utils import resize
        head = self.model.decode_head
        logits = head(self.model.extract_feat(x))
        return resize(logits, size=x.shape[2:], mode='bilinear',
                      align_corners=head.align_corners)


def wrap_part(model: nn.Module, part: str, task: Optional[str] = None) -> nn.Module:
    """The module to export for ``part`` (one of :data:`PARTS`), in eval mode.

    ``model`` is a detector / segmentor, or a bare backbone for ``'backbone'``.
    Whole detectors are not exported here: their RoI / NMS post-processing
    needs mmdeploy's rewrites; export ``'backbone_neck'`` and keep the heads in
    PyTorch (:func:`inline_mm.deploy.detector.predict_with_features`).
    """
    if part not in PARTS:
        raise DeployError(f"unknown part {part!r}: choose one of {', '.join(PARTS)}")
    if part == 'backbone':
        return _Backbone(model).eval()
    if not hasattr(model, 'extract_feat'):
        raise DeployError(f'--part {part} needs a detector or segmentor config')
    if part == 'backbone_neck':
        return _BackboneNeck(model).eval()
    if task == 'mmdet' or not hasattr(model, 'decode_head'):
        raise DeployError('whole detectors do not export here (RoI heads and NMS need '
                          'mmdeploy); use --part backbone_neck and keep the heads in PyTorch')
    return _SegmentorLogits(model).eval()


# ---------------------------------------------------------------- export
def output_tuple(out) -> Tuple[Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def example_input(shape: Tuple[int, int], batch: int = 1, seed: int = 0) -> Tensor:
    """A reproducible normalised-image-like input ``(batch, 3, H, W)``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, shape[0], shape[1], generator=gen)


@contextmanager
def _traceable_toolkit_ops() -> Iterator[None]:
    """Keep the toolkits' size-dependent ops dynamic while exporting.

    * mmseg's ``Upsample`` (the scale heads of Semantic FPN's ``FPNHead``)
      turns the input size into Python ints before it resizes, which the
      tracer records as constants: the exported head would resize every input
      to the export size.  During the export it resizes by its scale factor
      instead, the same output size for every input (``floor(size * factor)``).
    * ``nn.AdaptiveAvgPool2d`` to more than 1x1 (UperNet's pyramid pooling
      module) does not export with dynamic input sizes; during the export it
      runs :func:`~inline_mm.deploy.traced_ops.adaptive_avg_pool2d`, the
      same bins computed in the graph.
    """
    patches = []
    try:
        from mmseg.models.utils import Upsample
    except ImportError:  # no segmentation toolkit: nothing to patch there
        Upsample = None
    if Upsample is not None:
        upsample = Upsample.forward

        def upsample_forward(self, x):
            if self.size or not self.scale_factor:
                return upsample(self, x)
            return F.interpolate(x, scale_factor=self.scale_factor, mode=self.mode,
                                 align_corners=self.align_corners)
        patches.append((Upsample, upsample, upsample_forward))

    pool = nn.AdaptiveAvgPool2d.forward

    def pool_forward(self, x):
        size = self.output_size
        sizes = (size, size) if isinstance(size, int) else tuple(size)
        if None in sizes or sizes == (1, 1):  # global pooling exports as it is
            return pool(self, x)
        return adaptive_avg_pool2d(x, sizes)
    patches.append((nn.AdaptiveAvgPool2d, pool, pool_forward))

    for cls, _, patched in patches:
        cls.forward = patched
    try:
        yield
    finally:
        for cls, original, _ in patches:
            cls.forward = original


def export_onnx(module: nn.Module, shape: Tuple[int, int], path: str, dynamic: bool = True,
                batch: int = 1, opset: int = OPSET) -> List[str]:
    """Trace ``module`` at ``shape`` = (H, W) and write an ONNX file.

    Args:
        module: what :func:`wrap_part` returns (or any image -> tensor(s) module).
        shape: the (H, W) of the traced example input.
        path: output ``.onnx`` file (its folder is created).
        dynamic: height and width of the input (and outputs) are dynamic axes.
        batch: the batch size baked into the graph.
        opset: ONNX opset.

    Returns:
        The output names (``out0``, ``out1``, ...).
    """
    module = module.eval()
    x = example_input(shape, batch)
    with torch.no_grad():
        num_outputs = len(output_tuple(module(x)))
    outputs = [f'out{i}' for i in range(num_outputs)]
    dynamic_axes = None
    if dynamic:
        dynamic_axes = {'input': {2: 'height', 3: 'width'}}
        dynamic_axes.update({name: {2: f'{name}_height', 3: f'{name}_width'}
                             for name in outputs})
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings(), _traceable_toolkit_ops():
        # The tracer warns about every size it turns into a Python value; the
        # sizes that matter are tensors under tracing, and the parity check at
        # other sizes is what proves the graph dynamic.
        warnings.simplefilter('ignore')
        torch.onnx.export(module, (x,), path, input_names=['input'],
                          output_names=outputs, dynamic_axes=dynamic_axes,
                          opset_version=opset, **_TORCHSCRIPT_EXPORTER)
    return outputs
