"""ONNX deployment of InLine backbones, segmentors and detector features.

Nothing here is imported by ``import inline_mm``; ``onnx`` and ``onnxruntime``
(the ``deploy`` extra) are imported only when a function needs them.
"""
from .onnx_export import (PARTS, DeployError, build_model, check_onnx_fits, compare_outputs,
                          export_onnx, onnx_session, part_output_shapes, require_onnx,
                          run_onnxruntime, time_onnxruntime, torch_outputs, verify_onnx,
                          wrap_part)

__all__ = ['PARTS', 'DeployError', 'build_model', 'check_onnx_fits', 'compare_outputs',
           'export_onnx', 'onnx_session', 'part_output_shapes', 'require_onnx',
           'run_onnxruntime', 'time_onnxruntime', 'torch_outputs', 'verify_onnx', 'wrap_part']
