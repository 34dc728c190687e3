"""ONNX deployment of InLine backbones, segmentors and detector features.

Nothing here is imported by ``import inline_mm``; ``onnx`` and ``onnxruntime``
(the ``deploy`` extra) are imported only when a function needs them.
:mod:`.onnx_export` writes the file (with :mod:`.traced_ops` in place of the
toolkits' layers that do not export at traced sizes), :mod:`.onnx_check` runs it in
onnxruntime and checks it, :mod:`.segmentor` / :mod:`.detector` predict with it.
"""
from .onnx_check import (check_onnx_fits, compare_outputs, onnx_session, part_output_shapes,
                         run_onnxruntime, time_onnxruntime, torch_outputs, verify_onnx)
from .onnx_export import (PARTS, TOLERANCE, DeployError, build_model, example_input,
                          export_onnx, require_onnx, wrap_part)

__all__ = ['PARTS', 'TOLERANCE', 'DeployError', 'build_model', 'check_onnx_fits',
           'compare_outputs', 'example_input', 'export_onnx', 'onnx_session',
           'part_output_shapes', 'require_onnx', 'run_onnxruntime', 'time_onnxruntime',
           'torch_outputs', 'verify_onnx', 'wrap_part']
