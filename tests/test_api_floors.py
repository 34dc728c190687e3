"""The package and the tools use no torch / mmengine / timm / mmcv API newer than the floors.

``setup.cfg`` declares torch >= 2.1, mmengine >= 0.10, timm >= 1.0 (and mmcv < 2.2);
``make test-compat`` runs the suite on that oldest stack, but only where a test
reaches the code.  This check reads every ``.py`` file under ``inline_mm/`` and
``tools/`` with :mod:`ast`, resolves the imports (``import torch.nn.functional as F``,
``from torch import nn``, ``from mmengine.dist import all_reduce``) and the attribute
chains on them (``torch.a.b``, ``F.x``, ``nn.utils.y``, ``timm.layers.z``), and looks
each dotted name up in the inventories of the oldest stack,
``tests/data/api_floors/<package>-<version>.txt``
(written by ``scripts/dump_api_inventory.py`` inside ``.venv-compat``; no old torch
is needed here).  It fails listing ``file:line``, the name and ``not in torch 2.1.2``
for each name the old version lacks, and each keyword argument the old callable does
not take (``torch.onnx.export(dynamo=...)``).

A name newer than the floor is allowed behind an explicit version guard:

* inside a ``try`` whose ``except`` names ImportError, ModuleNotFoundError or
  AttributeError;
* in the body of ``if hasattr(X, 'a'):`` (or ``... if hasattr(X, 'a') else ...``, or
  after ``hasattr(X, 'a') and``) for the names ``X.a...``;
* on a line marked ``# api-floor: guarded``; on the first line of a statement, the
  mark covers the whole statement (``if TORCH_2_6:  # api-floor: guarded`` and its
  body).  Use it for guards the check cannot see: version flags, ``getattr`` defaults.

When the code references an object the inventory does not list (a module or class it
has never used before), the check says so and asks for a rerun of the dump script.
"""
import importlib.util
import os.path as osp
import re
import textwrap

import pytest

from conftest import REPO_ROOT

_spec = importlib.util.spec_from_file_location(
    'dump_api_inventory', osp.join(REPO_ROOT, 'scripts', 'dump_api_inventory.py'))
floors = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(floors)

INVENTORIES = floors.load_inventories()


def _pins(path: str) -> dict:
    with open(path) as f:
        return dict(re.findall(r'^([A-Za-z0-9_-]+)==(\S+)', f.read(), flags=re.M))


def _problems(tmp_path, source: str) -> list:
    """What the check reports for a module with ``source``."""
    path = tmp_path / 'mod.py'
    path.write_text(textwrap.dedent(source))
    refs = floors.collect_references([str(path)], root=str(tmp_path))
    return floors.find_violations(refs, INVENTORIES)


def test_inventories_are_the_oldest_stack():
    """One inventory per checked package, of the version the oldest stack pins, and
    that version is setup.cfg's floor (same major.minor)."""
    pins = _pins(osp.join(REPO_ROOT, 'scripts', 'constraints-oldest.txt'))
    with open(osp.join(REPO_ROOT, 'setup.cfg')) as f:
        floors_declared = dict(re.findall(r'^\s+(torch|mmengine|timm)>=([\d.]+)', f.read(),
                                          flags=re.M))
    assert sorted(INVENTORIES) == sorted(floors.PACKAGES)
    for name, inv in INVENTORIES.items():
        assert inv.version == pins[name], (name, inv.version, pins[name])
        if name in floors_declared:
            assert inv.version.split('.')[:2] == floors_declared[name].split('.')[:2], name
    # every inventory lists its package's root with its public namespace
    assert {'nn', 'load', 'Tensor'} <= INVENTORIES['torch'].sections['torch']


def test_package_and_tools_use_only_floor_apis():
    refs = floors.collect_references(floors.source_files())
    assert len(refs) > 300, 'the check found almost no references: is the resolver broken?'
    problems = floors.find_violations(refs, INVENTORIES)
    assert not problems, '\n' + '\n'.join(problems)


@pytest.mark.parametrize('source, line, name', [
    # torch 2.6
    ('import torch\nnorm = torch.nn.utils.get_total_norm(grads)\n', 2,
     'torch.nn.utils.get_total_norm'),
    ('from torch.nn.utils import get_total_norm\n', 1, 'torch.nn.utils.get_total_norm'),
    ('import torch.nn as nn\nnn.utils.get_total_norm(g)\n', 2, 'torch.nn.utils.get_total_norm'),
    # torch 2.3
    ('import torch\nif torch.compiler.is_compiling():\n    pass\n', 2,
     'torch.compiler.is_compiling'),
    # torch 2.5 / 2.4
    ('from torch import nn\nbuf = nn.Buffer(x)\n', 2, 'torch.nn.Buffer'),
    ('import torch.nn.functional as F\ny = F.rms_norm(x, (4,))\n', 2,
     'torch.nn.functional.rms_norm'),
    # an import inside a function, aliased
    ('def f():\n    from torch import compiler as c\n    return c.is_compiling()\n', 3,
     'torch.compiler.is_compiling'),
])
def test_newer_names_are_reported(tmp_path, source, line, name):
    problems = _problems(tmp_path, source)
    assert problems == [f'mod.py:{line}: {name} is not in torch 2.1.2 (guard it and mark '
                        f'the line `# api-floor: guarded`)']


def test_newer_keywords_are_reported(tmp_path):
    problems = _problems(tmp_path, """\
        import torch
        torch.onnx.export(m, (x,), 'm.onnx', dynamo=False, opset_version=17)
        """)
    assert problems == ["mod.py:2: torch.onnx.export() takes no keyword 'dynamo' in torch 2.1.2"]


def test_floor_apis_pass(tmp_path):
    """Names and keywords that torch 2.1 / timm 1.0.3 / mmengine 0.10.0 have."""
    assert _problems(tmp_path, """\
        import torch
        import torch.nn.functional as F
        from torch import nn
        from timm.layers import resample_abs_pos_embed, trunc_normal_
        from mmengine.dist import all_reduce
        state = torch.load('x.pth', map_location='cpu', weights_only=True, mmap=False)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=0.0, scale=0.5)
        norm = nn.LayerNorm(8, eps=1e-6, bias=False)
        total = torch.nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=False)
        flag = torch._dynamo.is_compiling() or torch.jit.is_tracing()
        torch.Tensor.add_
        """) == []


def test_guards_allow_newer_names(tmp_path):
    assert _problems(tmp_path, """\
        import torch
        try:
            from torch.nn.utils import get_total_norm
        except ImportError:
            get_total_norm = None
        try:
            fn = torch.compiler.is_compiling
        except (AttributeError, TypeError):
            fn = None
        if hasattr(torch.compiler, 'is_compiling'):
            torch.compiler.is_compiling()
        a = torch.compiler.is_compiling() if hasattr(torch.compiler, 'is_compiling') else 0
        b = hasattr(torch.compiler, 'is_compiling') and torch.compiler.is_compiling()
        c = torch.nn.Buffer(x)  # api-floor: guarded
        if TORCH_2_6:  # api-floor: guarded
            torch.nn.utils.get_total_norm(g)
            torch.onnx.export(m, x, 'm.onnx', dynamo=False)
        """) == []


def test_guards_are_not_blanket(tmp_path):
    """A guard covers only its own names and blocks; ``except Exception`` guards nothing."""
    problems = _problems(tmp_path, """\
        import torch
        if hasattr(torch.compiler, 'is_compiling'):
            torch.nn.Buffer(x)
        if not hasattr(torch.compiler, 'is_compiling'):
            torch.compiler.is_compiling()
        try:
            torch.nn.functional.rms_norm(x, (4,))
        except Exception:
            pass
        b = torch.nn.Buffer(x) and hasattr(torch.nn, 'Buffer')
        if TORCH_2_6:  # api-floor: guarded
            pass
        torch.compiler.is_compiling()
        """)
    assert [p.split(' is not')[0] for p in problems] == [
        'mod.py:3: torch.nn.Buffer', 'mod.py:5: torch.compiler.is_compiling',
        'mod.py:7: torch.nn.functional.rms_norm', 'mod.py:10: torch.nn.Buffer',
        'mod.py:13: torch.compiler.is_compiling']


def test_unlisted_objects_ask_for_a_new_inventory():
    inv = floors.Inventory('torch', '2.1.2', sections={'torch': {'nn', 'load'}},
                           params={'torch.load': ('f', 'map_location')})
    assert inv.check('torch.load', ['map_location']) == ('ok', None)
    assert inv.check('torch.load', ['weights_only']) == ('keyword', 'weights_only')
    assert inv.check('torch.compile') == ('absent', 'torch.compile')
    assert inv.check('torch.nn.Linear') == ('stale', 'torch.nn')
    assert inv.check('torch.__version__') == ('ok', None)
    ref = floors.Reference('a.py', 3, 'torch.nn.Linear')
    [problem] = floors.find_violations([ref], {'torch': inv})
    assert problem.startswith('a.py:3: torch.nn.Linear: the torch 2.1.2 inventory does not '
                              'list torch.nn; rerun')


def test_inventory_file_round_trip(tmp_path):
    inv = floors.Inventory('timm', '1.0.3', sections={'timm': {'layers'},
                                                      'timm.layers': {'DropPath', 'Mlp'}},
                           params={'timm.layers.DropPath': ('drop_prob', 'scale_by_keep'),
                                   'timm.layers.Mlp': ('in_features', '**')})
    path = str(tmp_path / 'timm-1.0.3.txt')
    inv.dump(path)
    back = floors.Inventory.load(path)
    assert (back.package, back.version, back.sections, back.params) == \
        (inv.package, inv.version, inv.sections, inv.params)
    assert back.check('timm.layers.Mlp', ['anything']) == ('ok', None)
    assert back.check('timm.layers.DropPath', ['p']) == ('keyword', 'p')
