"""Runner checkpoints resume under torch's weights_only loading; foreign pickles do not load."""
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import inline_mm  # noqa: F401  (allow-lists mmengine's checkpoint types)
from inline_mm.checkpoint import load_checkpoint_file

# subprocess runs (training, a fresh interpreter): the slow tier
pytestmark = pytest.mark.slow

RUNNER_SCRIPT = textwrap.dedent('''
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from mmengine.model import BaseModel
    from mmengine.runner import Runner
    if {import_plugin}:
        import inline_mm  # noqa: F401

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, y, mode='tensor'):
            out = self.linear(x)
            if mode == 'loss':
                return dict(loss=((out - y) ** 2).mean())
            return out

    def collate(batch):
        x, y = zip(*batch)
        return dict(x=torch.stack(x), y=torch.stack(y))

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    runner = Runner(
        model=Toy(), work_dir={work_dir!r},
        train_dataloader=DataLoader(data, batch_size=4, collate_fn=collate),
        train_cfg=dict(by_epoch=False, max_iters={max_iters}),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        param_scheduler=dict(type='LinearLR', start_factor=0.5, by_epoch=False, end=4),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        load_from={load_from!r}, resume={resume}, randomness=dict(seed=0))
    runner.train()
    print('ITER', runner.iter)
    print('LR', runner.optim_wrapper.get_lr()['lr'][0])
    print('LOSS_HISTORY', len(runner.message_hub.get_scalar('train/loss').data[0]))
''')


def _run(tmp_path, **kwargs):
    script = tmp_path / f"run_{kwargs['max_iters']}_{kwargs['import_plugin']}.py"
    script.write_text(RUNNER_SCRIPT.format(**kwargs))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path)


def _value(stdout, name):
    return [line.split()[1] for line in stdout.splitlines() if line.startswith(name + ' ')][-1]


def test_runner_resumes_from_its_own_checkpoint(tmp_path):
    work = str(tmp_path / 'work')
    first = _run(tmp_path, work_dir=work, max_iters=2, load_from=None, resume=False,
                 import_plugin=True)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = os.path.join(work, 'iter_2.pth')
    assert os.path.isfile(ckpt)

    if WEIGHTS_ONLY_BY_DEFAULT:
        # Without the plugin, torch's weights_only default refuses mmengine's own objects.
        plain = _run(tmp_path, work_dir=work, max_iters=4, load_from=ckpt, resume=True,
                     import_plugin=False)
        assert plain.returncode != 0
        assert 'weights_only' in plain.stderr or 'HistoryBuffer' in plain.stderr

    resumed = _run(tmp_path, work_dir=work, max_iters=4, load_from=ckpt, resume=True,
                   import_plugin=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _value(resumed.stdout, 'ITER') == '4'
    # the scheduler and message hub came back: 4 loss values, LR at the end of warm-up
    assert _value(resumed.stdout, 'LOSS_HISTORY') == '4'
    uninterrupted = _run(tmp_path, work_dir=str(tmp_path / 'straight'), max_iters=4,
                         load_from=None, resume=False, import_plugin=True)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    assert float(_value(resumed.stdout, 'LR')) == pytest.approx(
        float(_value(uninterrupted.stdout, 'LR')))


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
    with pytest.raises(pickle.UnpicklingError, match="refused getattr.*'update'"):
        torch.load(path)


@requires_weights_only_default
def test_arbitrary_pickled_object_is_refused(tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'meta': Exploit(str(marker))}, path)
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError, match='weights_only|Unsupported global'):
        torch.load(path)
    with pytest.raises(RuntimeError, match='refused to load .*evil.pth.*it pickles io.open'):
        load_checkpoint_file(str(path))
    assert not marker.exists()
