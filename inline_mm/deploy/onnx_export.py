"""Export a backbone, a segmentor or a detector's features to ONNX and check it.

The export traces the model with torch's TorchScript-based ONNX exporter
(``torch.onnx.export(..., dynamo=False)`` where torch also has the dynamo-based
one) with dynamic height and width.
Under tracing the InLine layers compute padding, window clipping, masks,
relative position indices and position-table resizing from size tensors in
the graph (:mod:`inline_mm.models.layers.symbolic`), so one file serves every
input size; the batch size is fixed at export (1 by default).

Parity is the largest absolute difference between onnxruntime's and
PyTorch's outputs divided by the largest absolute PyTorch output value, taken
over all outputs.
"""
import inspect
import os
import os.path as osp
import time
import warnings
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..errors import UserInputError

#: What ``--part`` can export.
PARTS = ('backbone', 'backbone_neck', 'model')

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
                cfg_options: Optional[dict] = None) -> Tuple[nn.Module, object, str]:
    """Build the detector / segmentor of a config in eval mode.

    Without ``checkpoint`` the weights are random and ``model.backbone.init_cfg``
    is dropped (no ImageNet weights are read).  ``cfg_options`` are the tools'
    ``--cfg-options``, checked as :func:`~inline_mm.engine.launch.load_config` does.

    Returns:
        (model, cfg, task) with ``task`` ``'mmdet'`` or ``'mmseg'``.
    """
    if not osp.isfile(config):
        raise DeployError(f'config file {config!r} not found')
    if checkpoint is not None and not osp.isfile(checkpoint):
        raise DeployError(f'checkpoint file {checkpoint!r} not found')
    from inline_mm.engine.launch import load_config
    from inline_mm.engine.runner_utils import task_of
    cfg = load_config(config, cfg_options)
    task = task_of(cfg)
    if checkpoint is None:
        cfg.model.backbone.init_cfg = None
    if task == 'mmdet':
        from mmdet.apis import init_detector as init_model
    else:
        from mmseg.apis import init_model
    from ..checkpoint import mmengine_checkpoint_globals
    with mmengine_checkpoint_globals():  # a runner checkpoint's types, this load only
        model = init_model(cfg, checkpoint, device=device)
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


class _SegmentorLogits(nn.Module):
    """A whole encoder-decoder segmentor: normalised image -> logits at the input size.

    The same computation as mmseg's ``whole`` inference on one padded batch:
    decode head on the features, bilinear resize to the input size.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

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
def _as_tuple(out) -> Tuple[Tensor, ...]:
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
      runs :func:`~inline_mm.models.layers.symbolic.adaptive_avg_pool2d`, the
      same bins computed in the graph.
    """
    from inline_mm.models.layers.symbolic import adaptive_avg_pool2d
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
        num_outputs = len(_as_tuple(module(x)))
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


# ---------------------------------------------------------------- run / compare
def onnx_session(path: str, threads: Optional[int] = None):
    """An onnxruntime CPU session for ``path`` (``threads`` intra-op threads if given)."""
    require_onnx()
    import onnxruntime as ort
    if not osp.isfile(path):
        raise DeployError(f'ONNX file {path!r} not found')
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])
    except Exception as err:  # onnxruntime's own classes: InvalidProtobuf, Fail ...
        reason = ' '.join(str(err).split())[:200]
        raise DeployError(f'cannot load ONNX file {path!r}: it is not an ONNX model or it is '
                          f'corrupt ({type(err).__name__}: {reason}); export it again with '
                          f'tools/deployment/export_onnx.py') from None


def _dims(shape: Sequence) -> str:
    return 'x'.join(str(d) if isinstance(d, int) else '?' for d in shape)


def _signature(shapes: Sequence[Sequence[int]]) -> List[Tuple[int, Optional[int]]]:
    """(rank, channels) of each output: what tells the exported parts apart."""
    return [(len(s), s[1] if len(s) > 1 else None) for s in shapes]


def part_output_shapes(model: nn.Module, part: str, task: Optional[str] = None,
                       size: Tuple[int, int] = (64, 64), batch: int = 1
                       ) -> List[Tuple[int, ...]]:
    """The output shapes of ``part`` of ``model`` at ``size`` (one small PyTorch run)."""
    x = example_input(size, batch)
    return [tuple(o.shape) for o in torch_outputs(wrap_part(model, part, task), x)]


def check_onnx_fits(session, model: nn.Module, part: str, task: Optional[str] = None,
                    path: str = 'the ONNX file', config: str = 'the config') -> None:
    """Refuse an ONNX file that is not ``part`` of ``model`` as :func:`export_onnx` writes it.

    The file runs once on a small input (the graph's own shape records leave
    the channels unknown with dynamic sizes); compared are the number of
    outputs, their rank and their channels (``'model'`` of a segmentor: one
    NCHW output with one channel per class; other parts: what the PyTorch part
    returns on the same input), then the batch size baked into the input,
    which must be 1.  The message names the part the file's outputs fit
    instead, if any (a backbone export given for the whole segmentor, for
    example).

    Raises:
        DeployError: the file does not fit.
    """
    inputs = [tuple(i.shape) for i in session.get_inputs()]
    if len(inputs) != 1 or len(inputs[0]) != 4:
        raise DeployError(f'{path} does not fit {config}: it takes '
                          f"{', '.join(_dims(i) for i in inputs) or 'no input'}, not one "
                          f'NCHW image batch; export it with tools/deployment/export_onnx.py')
    batch, _, height, width = inputs[0]
    batch = batch if isinstance(batch, int) else 1
    size = (height if isinstance(height, int) else 64, width if isinstance(width, int) else 64)
    got = [tuple(o.shape) for o in run_onnxruntime(session, example_input(size, batch))]
    whole_segmentor = part == 'model' and hasattr(model, 'decode_head')
    if whole_segmentor:
        expected = [(4, model.decode_head.out_channels)]
    else:
        expected = _signature(part_output_shapes(model, part, task, size, batch))
    if _signature(got) == expected:
        if batch != 1:
            raise DeployError(f'{path} was exported for batches of {batch} images; this tool '
                              f'runs one image at a time: export it with --batch 1')
        return
    want = f"{len(expected)} output(s) with {', '.join(str(c) for _, c in expected)} channels"
    if whole_segmentor:
        want = f'one output with {expected[0][1]} channels (one per class)'
    other = None
    for candidate in PARTS:
        if candidate == part:
            continue
        try:
            shapes = part_output_shapes(model, candidate, task, size, batch)
        except DeployError:  # a part this model has not
            continue
        if _signature(shapes) == _signature(got):
            other = candidate
            break
    like = f"what `export_onnx.py {config} --part {other}` writes" if other else \
        'what no part of this config gives (an export of another config?)'
    raise DeployError(f'{path} does not fit {config}: on a {size[0]}x{size[1]} input it gives '
                      f"{len(got)} output(s) ({', '.join(_dims(s) for s in got)}), {like}; "
                      f'this tool needs --part {part}, {want}: export it with `python '
                      f'tools/deployment/export_onnx.py {config} CHECKPOINT --part {part} '
                      f'--dynamic --out FILE.onnx`')


def run_onnxruntime(session_or_path, x: np.ndarray | Tensor, threads: Optional[int] = None
                    ) -> List[np.ndarray]:
    """Run a session (or an ONNX file) on one input; returns all outputs."""
    session = session_or_path
    if isinstance(session_or_path, (str, os.PathLike)):
        session = onnx_session(str(session_or_path), threads)
    if isinstance(x, Tensor):
        x = x.detach().cpu().numpy()
    expected = tuple(session.get_inputs()[0].shape)
    if len(expected) == x.ndim and any(isinstance(e, int) and e != d
                                       for e, d in zip(expected, x.shape)):
        batch_only = all(not isinstance(e, int) or e == d
                         for e, d in zip(expected[1:], x.shape[1:]))
        fix = f'export it with --batch {x.shape[0]}' if batch_only else \
            'export it with --dynamic (or at this size)'
        raise DeployError(f'the ONNX file takes inputs of {_dims(expected)} (fixed at export) '
                          f'and this input is {_dims(x.shape)}: {fix}')
    name = session.get_inputs()[0].name
    return session.run(None, {name: np.ascontiguousarray(x, dtype=np.float32)})


def torch_outputs(module: nn.Module, x: Tensor) -> List[np.ndarray]:
    """PyTorch eager outputs of ``module`` as numpy arrays."""
    with torch.no_grad():
        return [o.detach().cpu().float().numpy() for o in _as_tuple(module.eval()(x))]


def compare_outputs(reference: Sequence[np.ndarray], actual: Sequence[np.ndarray]) -> float:
    """Max abs difference over all outputs relative to the reference's max abs value.

    Shapes must agree, and a NaN in either output (which ``max`` would skip) is
    a failure too: both are reported as ``inf``.
    """
    if len(reference) != len(actual):
        return float('inf')
    worst = 0.0
    for ref, out in zip(reference, actual):
        if tuple(ref.shape) != tuple(out.shape):
            return float('inf')
        scale = float(np.abs(ref).max()) or 1.0
        diff = float(np.abs(ref.astype(np.float64) - out).max()) / scale
        if np.isnan(diff) or np.isnan(scale):
            return float('inf')
        worst = max(worst, diff)
    return worst


def verify_onnx(module: nn.Module, path: str, shapes: Sequence[Tuple[int, int]],
                batch: int = 1, threads: Optional[int] = None) -> Dict[Tuple[int, int], float]:
    """Relative max abs difference onnxruntime vs PyTorch for each (H, W) in ``shapes``."""
    session = onnx_session(path, threads)
    result = {}
    for i, shape in enumerate(shapes):
        x = example_input(tuple(shape), batch, seed=i + 1)
        result[tuple(shape)] = compare_outputs(torch_outputs(module, x),
                                               run_onnxruntime(session, x))
    return result


def time_onnxruntime(onnx_path: str, size: Tuple[int, int], batch: int = 1, warmup: int = 1,
                     repeats: int = 5, threads: Optional[int] = None) -> List[float]:
    """Seconds per onnxruntime run of ``onnx_path`` on a ``(batch, 3, H, W)`` input.

    ``warmup`` untimed runs first (onnxruntime allocates and plans on the first
    runs of a shape), then ``repeats`` timed ones.
    """
    session = onnx_session(onnx_path, threads)
    name = session.get_inputs()[0].name
    x = example_input(size, batch).numpy()
    for _ in range(warmup):
        session.run(None, {name: x})
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, {name: x})
        times.append(time.perf_counter() - start)
    return times
