"""Importing inline_mm registers into both the mmdet and mmseg registries."""
import subprocess
import sys

import pytest
import torch.nn as nn
from mmdet.registry import MODELS as MMDET_MODELS
from mmengine.registry import DefaultScope
from mmseg.registry import MODELS as MMSEG_MODELS

import inline_mm
from inline_mm.registry import register_model


@register_model
class _RegistryProbe(nn.Module):
    def __init__(self, width: int = 3):
        super().__init__()
        self.layer = nn.Linear(width, width)


@register_model(name='_RegistryProbeByName')
class _NamedProbe(_RegistryProbe):
    pass


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_helper_registers_into_both_scopes(scope):
    registry = MMDET_MODELS if scope == 'mmdet' else MMSEG_MODELS
    with DefaultScope.overwrite_default_scope(scope):
        module = registry.build(dict(type='_RegistryProbe', width=5))
        named = registry.build(dict(type='_RegistryProbeByName'))
    assert isinstance(module, _RegistryProbe)
    assert module.layer.in_features == 5
    # register_model(name=...) registers under that name only
    assert type(named) is _NamedProbe
    assert '_RegistryProbeByName' in registry.module_dict
    assert '_NamedProbe' not in registry.module_dict


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
@pytest.mark.parametrize('name', ['InLinePVT', 'InLineSwin', 'InLineCSWin', 'InLineDeiT'])
def test_backbones_in_both_registries(scope, name):
    registry = MMDET_MODELS if scope == 'mmdet' else MMSEG_MODELS
    assert registry.get(name) is getattr(inline_mm, name)


def test_import_registers_in_a_fresh_process():
    code = ('import inline_mm\n'
            'from mmdet.registry import MODELS as D\n'
            'from mmseg.registry import MODELS as S\n'
            'assert D.get("InLinePVT") is inline_mm.InLinePVT\n'
            'assert S.get("InLineSwin") is inline_mm.InLineSwin\n'
            'print("ok")\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'ok'


@pytest.mark.slow
def test_custom_imports_in_a_config(tmp_path):
    """A config with custom_imports builds the backbone without importing it first."""
    cfg_file = tmp_path / 'cfg.py'
    cfg_file.write_text("custom_imports = dict(imports=['inline_mm'], allow_failed_imports=False)\n"
                        "default_scope = 'mmseg'\n"
                        "model = dict(type='InLinePVT', arch='tiny', depths=[1, 1, 1, 1])\n")
    code = ('import sys\n'
            'from mmengine.config import Config\n'
            'from mmengine.registry import init_default_scope\n'
            f'cfg = Config.fromfile({str(cfg_file)!r})\n'
            'assert "inline_mm" in sys.modules\n'
            'init_default_scope(cfg.default_scope)\n'
            'from mmseg.registry import MODELS\n'
            'm = MODELS.build(cfg.model)\n'
            'print(type(m).__name__)\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith('InLinePVT')
