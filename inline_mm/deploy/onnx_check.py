"""An exported ONNX file run in onnxruntime, checked against PyTorch and the config.

torch exports a graph and onnxruntime runs one, but neither says whether a
file is the part of the model the tool was given (a detector's features fed
to a segmentor's tool run and give nonsense), nor how far it is from
PyTorch at other input sizes than the traced one.  :func:`check_onnx_fits`
refuses a file that is not ``part`` of the config's model with one line,
:func:`verify_onnx` measures parity at several sizes, and
:func:`time_onnxruntime` times a session.

Parity is the largest absolute difference between onnxruntime's and
PyTorch's outputs divided by the largest absolute PyTorch output value, taken
over all outputs.
"""
import os
import os.path as osp
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
from torch import Tensor

from .onnx_export import PARTS, DeployError, example_input, output_tuple, require_onnx, wrap_part


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
        return [o.detach().cpu().float().numpy() for o in output_tuple(module.eval()(x))]


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
