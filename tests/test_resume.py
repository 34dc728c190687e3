"""Runner checkpoints resume under torch's weights_only loading where the plugin allows it
(its own loads, AtomicCheckpointHook's resume, the explicit opt-ins), and only there:
``import inline_mm`` changes nothing in torch; foreign pickles never load."""
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import REPO_ROOT
from inline_mm.checkpoint import load_checkpoint_file, mmengine_checkpoint_globals

PLUGINS = os.path.join(REPO_ROOT, 'tests', 'plugins')

# subprocess runs (training, a fresh interpreter): the slow tier
pytestmark = pytest.mark.slow

RUNNER_SCRIPT = textwrap.dedent('''
    import contextlib
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    sys.path.insert(0, {plugins!r})
    from linear_model import LinearModel, collate


    def allowed():
        """torch's weights_only allow-list by name (None on torch < 2.5: no getter)."""
        if not hasattr(torch.serialization, 'get_safe_globals'):
            return None
        return {{f'{{getattr(g, "__module__", "")}}.{{getattr(g, "__qualname__", g)}}'
                if not isinstance(g, tuple) else f'{{g[1]}} (as {{g[0]!r}})'
                for g in torch.serialization.get_safe_globals()}}

    BEFORE = allowed()
    from mmengine.runner import Runner
    plugin = {plugin!r}
    checkpoint_hook = 'CheckpointHook'
    allowing = contextlib.nullcontext()
    if plugin != 'none':
        import inline_mm
    if plugin == 'hook':
        import inline_mm.engine  # noqa: F401
        checkpoint_hook = 'AtomicCheckpointHook'
    elif plugin == 'context':
        from inline_mm.checkpoint import mmengine_checkpoint_globals
        allowing = mmengine_checkpoint_globals()
    elif plugin == 'allow':
        inline_mm.allow_mmengine_checkpoints()

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    runner = Runner(
        model=LinearModel(), work_dir={work_dir!r},
        train_dataloader=DataLoader(data, batch_size=4, collate_fn=collate),
        train_cfg=dict(by_epoch=False, max_iters={max_iters}),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        param_scheduler=dict(type='LinearLR', start_factor=0.5, by_epoch=False, end=4),
        default_hooks=dict(checkpoint=dict(type=checkpoint_hook, interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        load_from={load_from!r}, resume={resume}, randomness=dict(seed=0))
    with allowing:
        runner.train()
    print('ITER', runner.iter)
    print('LR', runner.optim_wrapper.get_lr()['lr'][0])
    print('LOSS_HISTORY', len(runner.message_hub.get_scalar('train/loss').data[0]))
    if BEFORE is not None:  # torch adds types of its own as its submodules are imported
        print('SAFE_GLOBALS', len([n for n in allowed() - BEFORE if not n.startswith('torch.')]))
''')


def _run(tmp_path, **kwargs):
    script = tmp_path / f"run_{kwargs['max_iters']}_{kwargs['plugin']}.py"
    script.write_text(RUNNER_SCRIPT.format(plugins=PLUGINS, **kwargs))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path)


def _value(stdout, name):
    return [line.split()[1] for line in stdout.splitlines() if line.startswith(name + ' ')][-1]


def test_runner_resumes_from_its_own_checkpoint(tmp_path):
    work = str(tmp_path / 'work')
    first = _run(tmp_path, work_dir=work, max_iters=2, load_from=None, resume=False,
                 plugin='hook')
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = os.path.join(work, 'iter_2.pth')
    assert os.path.isfile(ckpt)

    import mmengine.runner.checkpoint as mmengine_checkpoint
    # OneDL's mmengine loads its checkpoints under an allow-list of its own (and falls
    # back to weights_only=False); OpenMMLab's calls torch.load plainly
    own_allow_list = hasattr(mmengine_checkpoint, 'get_torch_safe_globals')
    if WEIGHTS_ONLY_BY_DEFAULT and not own_allow_list:
        # torch's weights_only default refuses mmengine's own objects, with or without
        # ``import inline_mm``: the import allow-lists nothing
        for plugin in ('none', 'import'):
            plain = _run(tmp_path, work_dir=work, max_iters=4, load_from=ckpt, resume=True,
                         plugin=plugin)
            assert plain.returncode != 0, plugin
            assert 'weights_only' in plain.stderr or 'HistoryBuffer' in plain.stderr

    uninterrupted = _run(tmp_path, work_dir=str(tmp_path / 'straight'), max_iters=4,
                         load_from=None, resume=False, plugin='none')
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    # AtomicCheckpointHook allows the types for the Runner's load only; the explicit
    # opt-ins: the context around the run, the process-wide allow-list
    for plugin in ('hook', 'context', 'allow'):
        resumed = _run(tmp_path, work_dir=str(tmp_path / plugin), max_iters=4, load_from=ckpt,
                       resume=True, plugin=plugin)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert _value(resumed.stdout, 'ITER') == '4'
        # the scheduler and message hub came back: 4 loss values, LR at the end of warm-up
        assert _value(resumed.stdout, 'LOSS_HISTORY') == '4'
        assert float(_value(resumed.stdout, 'LR')) == pytest.approx(
            float(_value(uninterrupted.stdout, 'LR')))
        if plugin != 'allow' and hasattr(torch.serialization, 'get_safe_globals'):
            assert _value(resumed.stdout, 'SAFE_GLOBALS') == '0', plugin  # all undone


PLAIN_LOAD_SCRIPT = textwrap.dedent('''
    import sys
    import torch

    def allowed():
        """torch's allow-list, by name (None on torch < 2.5, which has no getter)."""
        if not hasattr(torch.serialization, 'get_safe_globals'):
            return None
        return {f'{getattr(g, "__module__", "")}.{getattr(g, "__qualname__", g)}'
                if not isinstance(g, tuple) else f'{g[1]} (as {g[0]!r})'
                for g in torch.serialization.get_safe_globals()}

    before = allowed()
    for name in sys.argv[2:]:
        __import__(name)
    after = allowed()
    # torch registers types of its own when its submodules are imported (torch.distributed
    # .tensor, torch._dynamo, which mmengine imports): only those may appear
    added = sorted(n for n in (after or set()) - (before or set()) if not n.startswith('torch.'))
    print('ADDED', added)
    print('REMOVED', sorted((before or set()) - (after or set())))
    try:
        torch.load(sys.argv[1], weights_only=True)
        print('LOADED')
    except Exception as err:
        print('ERROR', type(err).__name__, str(err).replace(chr(10), ' '))
''')


def test_importing_the_plugin_changes_nothing_in_torch(tmp_path):
    """A plain weights_only load of a runner checkpoint fails the same way with and
    without ``import inline_mm`` / ``inline_mm.engine``; torch's allow-list is unchanged."""
    work = str(tmp_path / 'work')
    first = _run(tmp_path, work_dir=work, max_iters=2, load_from=None, resume=False,
                 plugin='none')
    assert first.returncode == 0, first.stderr[-3000:]
    script = tmp_path / 'plain_load.py'
    script.write_text(PLAIN_LOAD_SCRIPT)
    outputs = {}
    for imports in ((), ('inline_mm',), ('inline_mm', 'inline_mm.engine')):
        run = subprocess.run([sys.executable, str(script), os.path.join(work, 'iter_2.pth'),
                              *imports], capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
        assert 'ADDED []' in run.stdout and 'REMOVED []' in run.stdout, (imports, run.stdout)
        outputs[imports] = [line for line in run.stdout.splitlines()
                            if line.startswith(('ERROR', 'LOADED'))]
    assert outputs[()][0].startswith('ERROR'), outputs[()]  # mmengine's objects are refused
    assert outputs[('inline_mm',)] == outputs[()]
    assert outputs[('inline_mm', 'inline_mm.engine')] == outputs[()]
    # the plugin's own loader reads it, and leaves the allow-list as it was (torch keeps
    # it in a set: entries added and removed again may change its order, not its members)
    if hasattr(torch.serialization, 'get_safe_globals'):
        before = list(torch.serialization.get_safe_globals())
    assert 'message_hub' in load_checkpoint_file(os.path.join(work, 'iter_2.pth'))
    if hasattr(torch.serialization, 'get_safe_globals'):
        after = list(torch.serialization.get_safe_globals())
        assert len(after) == len(before) and set(after) == set(before), (
            sorted(map(str, set(after) ^ set(before))))


class Exploit:
    """An object whose unpickling would run code (here: write a marker file)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, 'w'))


class GetattrGadget:
    """Unpickles as getattr(HistoryBuffer, 'update'): a getattr outside the allow-list."""

    def __reduce__(self):
        from mmengine.logging import HistoryBuffer
        return (getattr, (HistoryBuffer, 'update'))


#: torch >= 2.6 loads with weights_only=True by default (what mmengine's resume calls);
#: older torch unpickles anything there, and the allow-list under test does not apply
WEIGHTS_ONLY_BY_DEFAULT = tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) \
    >= (2, 6)
requires_weights_only_default = pytest.mark.skipif(
    not WEIGHTS_ONLY_BY_DEFAULT, reason=f'torch {torch.__version__} loads with '
    'weights_only=False by default (torch.load and mmengine resume unpickle anything; the '
    "weights_only default and its allow-list arrived in torch 2.6); inline-mm's own loads "
    'are restricted on every torch (tests/test_checkpoints.py)')


@requires_weights_only_default
def test_getattr_only_resolves_history_buffer_statistics(tmp_path):
    path = tmp_path / 'gadget.pth'
    torch.save({'meta': GetattrGadget()}, path)
    with mmengine_checkpoint_globals():
        with pytest.raises(pickle.UnpicklingError, match="refused getattr.*'update'"):
            torch.load(path)


@requires_weights_only_default
def test_arbitrary_pickled_object_is_refused(tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'meta': Exploit(str(marker))}, path)
    assert not marker.exists()
    with mmengine_checkpoint_globals():  # the allow-list admits mmengine's types only
        with pytest.raises(pickle.UnpicklingError, match='weights_only|Unsupported global'):
            torch.load(path)
    with pytest.raises(RuntimeError, match='refused to load .*evil.pth.*it pickles io.open'):
        load_checkpoint_file(str(path))
    assert not marker.exists()
