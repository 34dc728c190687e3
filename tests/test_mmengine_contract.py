"""The public mmengine API the training extensions build on, as they call it.

``inline_mm.engine`` uses no private Runner / hook / loop member: it overrides public
methods (``CheckpointHook.after_train_iter`` / ``after_train_epoch`` / ``after_val_epoch``,
``EpochBasedTrainLoop.run_epoch`` / ``run_iter``), wraps public ones on the instance
(``Runner.load_or_resume`` and ``FlexibleRunner``'s, ``OptimWrapper.update_params`` / ``step``),
calls public ones (``Runner.save_checkpoint`` and ``FlexibleRunner``'s, the ``Hook`` interval
helpers), sets ``train_loop.stop_training``
as mmengine's ``EarlyStoppingHook`` does (tests/test_fault_tolerance.py fails when the loop then
fetches another batch) and relies on mmengine's
``last_checkpoint`` protocol for ``--resume`` (and on ``after_val_epoch`` writing the periodic
checkpoint again only when ``last_ckpt`` is set: tests/test_best_checkpoint.py fails when it
does otherwise).  Each test fails when the installed
mmengine, or the oldest one supported (from its inventory in ``tests/data/api_floors/``),
changes a signature or behaviour relied on.
"""
import glob
import inspect
import os

import pytest
from mmengine.hooks import CheckpointHook, Hook
from mmengine.optim import OptimWrapper
from mmengine.runner import (EpochBasedTrainLoop, FlexibleRunner, IterBasedTrainLoop, Runner,
                             find_latest_checkpoint)

from conftest import DATA_DIR

#: the inventory of the oldest mmengine supported (scripts/dump_api_inventory.py)
OLDEST = (glob.glob(os.path.join(DATA_DIR, 'api_floors', 'mmengine-*.txt')) or [''])[0]

#: (class, method) -> the parameter names our code calls / overrides it with
RELIED_ON = {
    (Runner, 'load_or_resume'): ['self'],
    (Runner, 'save_checkpoint'): ['self', 'out_dir', 'filename', 'file_client_args',
                                  'save_optimizer', 'save_param_scheduler', 'meta',
                                  'by_epoch', 'backend_args'],
    (FlexibleRunner, 'load_or_resume'): ['self'],
    (FlexibleRunner, 'save_checkpoint'): ['self', 'out_dir', 'filename', 'file_client_args',
                                          'save_optimizer', 'save_param_scheduler', 'meta',
                                          'by_epoch', 'backend_args'],
    (CheckpointHook, 'before_train'): ['self', 'runner'],
    (CheckpointHook, 'after_train_iter'): ['self', 'runner', 'batch_idx', 'data_batch',
                                           'outputs'],
    (CheckpointHook, 'after_train_epoch'): ['self', 'runner'],
    (CheckpointHook, 'after_val_epoch'): ['self', 'runner', 'metrics'],
    (Hook, 'every_n_train_iters'): ['self', 'runner', 'n', 'start'],
    (Hook, 'every_n_epochs'): ['self', 'runner', 'n', 'start'],
    (Hook, 'is_last_train_iter'): ['self', 'runner'],
    (Hook, 'is_last_train_epoch'): ['self', 'runner'],
    (EpochBasedTrainLoop, 'run_epoch'): ['self'],
    (EpochBasedTrainLoop, 'run_iter'): ['self', 'idx', 'data_batch'],
    (OptimWrapper, 'update_params'): ['self', 'loss', 'step_kwargs', 'zero_kwargs'],
    (OptimWrapper, 'step'): ['self', '**'],
}

#: the CheckpointHook settings AtomicCheckpointHook and PreemptionHook read
HOOK_SETTINGS = ['interval', 'by_epoch', 'save_begin', 'save_last', 'filename_tmpl', 'out_dir',
                 'max_keep_ckpts', 'save_optimizer', 'save_param_scheduler', 'args',
                 'backend_args', 'file_client_args', 'last_ckpt', 'save_best']


def _params(func) -> list:
    return [('**' if p.kind is p.VAR_KEYWORD else '*' if p.kind is p.VAR_POSITIONAL else p.name)
            for p in inspect.signature(func).parameters.values()]


def _oldest_signature(cls, method: str) -> list:
    """The method's parameters in the oldest mmengine (its inventory: ``name (a,b,**)``)."""
    path = OLDEST
    section = f'[{cls.__module__.split(".")[0]}.{cls.__module__.split(".")[1]}.{cls.__name__}]'
    current = None
    with open(path) as f:
        for line in f:
            line = line.rstrip('\n')
            if line.startswith('['):
                current = line
            elif current == section and line.startswith(method + ' ('):
                inside = line[len(method) + 2:line.rindex(')')]
                return inside.split(',') if inside else []
    raise AssertionError(f'{section} {method} is not in the inventory {OLDEST}')


@pytest.mark.parametrize('cls,method', list(RELIED_ON), ids=lambda x: getattr(x, '__name__', x))
def test_signature_of_what_we_call(cls, method):
    expected = RELIED_ON[cls, method]
    assert _params(getattr(cls, method)) == expected, \
        f'mmengine changed {cls.__name__}.{method}: inline_mm.engine calls it as {expected}'
    assert _oldest_signature(cls, method) == expected


def _oldest_constructor(name: str) -> list:
    """A class's constructor arguments in the oldest mmengine (listed under its package)."""
    path = OLDEST
    with open(path) as f:
        for line in f:
            if line.startswith(name + ' ('):
                return line[len(name) + 2:line.rindex(')')].split(',')
    raise AssertionError(f'{name} is not in the inventory {OLDEST}')


def test_epoch_loop_constructor_is_what_the_resumable_loop_passes_on():
    """ResumableEpochBasedTrainLoop takes mmengine's constructor arguments by position and
    passes them on, with ``exact_resume`` of its own."""
    from inline_mm.engine.loops import ResumableEpochBasedTrainLoop
    ours = _params(ResumableEpochBasedTrainLoop.__init__)
    assert ours[-1] == 'exact_resume'
    expected = ours[1:-1]
    assert _params(EpochBasedTrainLoop.__init__)[1:] == expected
    assert _oldest_constructor('EpochBasedTrainLoop') == expected


def test_iteration_loop_validation_settings_are_public():
    """PreemptionHook tells from them whether a validation follows the stopped iteration
    (a wrong answer costs a checkpoint write, tests/test_fault_tolerance.py)."""
    for name in ('val_begin', 'val_interval'):
        assert name in _params(IterBasedTrainLoop.__init__), name
        assert name in _oldest_constructor('IterBasedTrainLoop'), name
    assert isinstance(IterBasedTrainLoop.max_iters, property)


def test_checkpoint_hook_settings_are_public_attributes():
    hook = CheckpointHook(interval=2, by_epoch=False, max_keep_ckpts=1)
    missing = [name for name in HOOK_SETTINGS if not hasattr(hook, name)]
    assert not missing, f'CheckpointHook no longer has {missing}'
    for name in ('interval', 'by_epoch', 'save_begin', 'save_last', 'max_keep_ckpts',
                 'filename_tmpl', 'out_dir', 'backend_args', 'file_client_args', 'save_best'):
        assert name in _params(CheckpointHook.__init__), name
        assert name in _oldest_constructor('CheckpointHook'), name


def test_resume_without_a_file_follows_last_checkpoint(tmp_path):
    """--resume without a file resumes from what ``last_checkpoint`` names, and from
    nothing without it: AtomicCheckpointHook points it at the newest readable one."""
    assert find_latest_checkpoint(str(tmp_path)) is None
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_4.pth'))
    assert find_latest_checkpoint(str(tmp_path)) == str(tmp_path / 'iter_4.pth')


def test_runner_loads_after_the_before_run_hooks():
    """AtomicCheckpointHook.before_run prepares the load that ``load_or_resume`` makes
    (the allow-list, the pointer): the Runner must call it after ``before_run``."""
    for action in ('train', 'val', 'test'):
        source = inspect.getsource(getattr(Runner, action))
        assert "call_hook('before_run')" in source and 'self.load_or_resume()' in source, action
        assert source.index("call_hook('before_run')") < source.index('self.load_or_resume()')


def test_config_to_dict_is_plain_nested_dicts_and_lists():
    """launch.py walks ``cfg.to_dict()`` for the ``--cfg-options`` key check."""
    from mmengine.config import Config, ConfigDict
    cfg = Config(dict(model=dict(backbone=dict(type='X', out=[1, 2])),
                      pipeline=[dict(type='A'), dict(type='B', keys=('img',))]))
    tree = cfg.to_dict()

    def walk(node):
        assert not isinstance(node, (Config, ConfigDict)), type(node)
        if isinstance(node, dict):
            assert type(node) is dict
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(tree)
    assert tree['model']['backbone'] == {'type': 'X', 'out': [1, 2]}
    assert [p['type'] for p in tree['pipeline']] == ['A', 'B']


def test_base_dataset_keeps_its_indices_in_underscore_indices(tmp_path):
    """bad_samples.py reads ``_indices`` of a dataset built before the wrapper (mmengine
    has no public getter); from a config it reads ``indices``."""
    import json
    from mmengine.dataset import BaseDataset
    ann = tmp_path / 'ann.json'
    ann.write_text(json.dumps(dict(metainfo={}, data_list=[dict(img_path=f'{i}.jpg')
                                                            for i in range(5)])))
    dataset = BaseDataset(ann_file=str(ann), indices=[0, 2], lazy_init=True)
    assert dataset._indices == [0, 2]
    dataset.full_init()
    assert len(dataset) == 2
