"""``save_best`` through AtomicCheckpointHook: the previous best checkpoint survives a failed
or interrupted replacement.

mmengine's ``CheckpointHook`` deletes the previous best checkpoint before it writes the new
one.  These runs use the real mmengine Runner on a one-layer model with a metric that
improves at every validation, so every validation replaces the best checkpoint; the faults
(a full disk, a kill) come from tests/plugins/fault_hooks.py.
"""
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from conftest import REPO_ROOT
from inline_mm.engine.checkpoint_files import HELD_SUFFIX, checkpoint_problem

PLUGINS = os.path.join(REPO_ROOT, 'tests', 'plugins')

#: trains ``max_iters`` iterations (or epochs) of a linear model, validating after each from
#: ``val_begin``, with ``save_best`` ('score', or both metrics); both metrics are the number of
#: validations so far.  With ``world_size`` 2 it is one of two gloo processes, and rank 0's
#: ``fail_call``-th checkpoint save raises a TypeError (a bug, not a full disk).
RUN = textwrap.dedent('''
    import os
    import sys
    sys.path.insert(0, {plugins!r})
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset
    from mmengine.evaluator import BaseMetric, Evaluator
    from mmengine.runner import Runner
    from fault_hooks import checkpoint_write_faults
    from linear_model import LinearModel, collate
    from inline_mm.engine import AtomicCheckpointHook


    class ValidationCount(BaseMetric):
        """'score' and 'other': how many validations ran, so each one is a new best."""
        count = 0

        def process(self, data_batch, data_samples):
            self.results.append(1)

        def compute_metrics(self, results):
            ValidationCount.count += 1
            return dict(score=float(ValidationCount.count), other=float(ValidationCount.count))


    launch = dict()
    if {world_size} > 1:
        dist.init_process_group('gloo', rank=int(os.environ['RANK']), world_size={world_size})
        launch = dict(launcher='pytorch',
                      cfg=dict(model_wrapper_cfg=dict(type='AnyDeviceDistributedDataParallel')))
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    runner = Runner(
        model=LinearModel(), work_dir={work_dir!r},
        train_dataloader=DataLoader(data, batch_size=4, collate_fn=collate),
        train_cfg={loop},
        val_dataloader=DataLoader(data, batch_size=4, collate_fn=collate),
        val_evaluator=Evaluator(ValidationCount()), val_cfg=dict(),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(checkpoint=AtomicCheckpointHook(
            interval={interval}, max_keep_ckpts={max_keep}, by_epoch={by_epoch}, save_last=False,
            save_best={save_best!r}, rule='greater')),
        randomness=dict(seed=0), **launch)
    if {fail_call} and int(os.environ.get('RANK', 0)) == 0:
        save, calls = runner.save_checkpoint, []

        def failing_save(*args, **kwargs):
            calls.append(1)
            if len(calls) == {fail_call}:
                raise TypeError("cannot pickle 'generator' object")
            return save(*args, **kwargs)

        runner.save_checkpoint = failing_save
    with checkpoint_write_faults(slow={slow}, error={error!r}, from_write={from_write}):
        runner.train()
    print('DONE')
''')


def _script(tmp_path, max_iters=3, val_begin=1, slow=0.0, error=None, from_write=1,
            by_epoch=False, interval=100, max_keep=-1, save_best='score', world_size=1,
            fail_call=0):
    """The run's script; ``by_epoch``: ``max_iters`` epochs of 2 iterations each."""
    length = f'max_epochs={max_iters}' if by_epoch else f'max_iters={max_iters}'
    loop = f'dict(by_epoch={by_epoch}, {length}, val_begin={val_begin}, val_interval=1)'
    path = tmp_path / f'run_{len(list(tmp_path.glob("run_*.py")))}.py'
    path.write_text(RUN.format(plugins=PLUGINS, work_dir=str(tmp_path / 'work'),
                               loop=loop, by_epoch=by_epoch, slow=slow,
                               error=error, from_write=from_write, interval=interval,
                               max_keep=max_keep, save_best=save_best,
                               world_size=world_size, fail_call=fail_call))
    return [sys.executable, str(path)]


def _run(tmp_path, **kwargs):
    return subprocess.run(_script(tmp_path, **kwargs), capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=300)


def _files(work):
    return sorted(os.listdir(work))


def _meta(path):
    return torch.load(path, map_location='cpu', weights_only=False)['meta']


@pytest.mark.slow
def test_each_new_best_replaces_the_previous_one(tmp_path):
    run = _run(tmp_path)
    assert run.returncode == 0, run.stderr
    work = str(tmp_path / 'work')
    assert [f for f in _files(work) if f.endswith('.pth') or HELD_SUFFIX in f] == \
        ['best_score_iter_3.pth']
    assert checkpoint_problem(os.path.join(work, 'best_score_iter_3.pth')) is None


@pytest.mark.slow
@pytest.mark.parametrize('unit', ['iter', 'epoch'])
def test_a_failed_write_of_the_new_best_keeps_the_previous_one(tmp_path, unit):
    """mmengine deletes best_score_<unit>_1.pth before writing the disk-full <unit>_2's."""
    run = _run(tmp_path, max_iters=2, error='ENOSPC', from_write=2, by_epoch=unit == 'epoch')
    work = str(tmp_path / 'work')
    best = os.path.join(work, f'best_score_{unit}_1.pth')
    assert run.returncode != 0
    assert (f'CheckpointWriteError: cannot write the best checkpoint in {work}: No space left '
            f'on device. The previous best checkpoint {best} is kept.') in run.stderr
    assert checkpoint_problem(best) is None
    assert not os.path.exists(os.path.join(work, f'best_score_{unit}_2.pth'))
    assert not [f for f in _files(work) if HELD_SUFFIX in f or f.endswith('.tmp')]
    assert _meta(best)[unit] == 1


@pytest.mark.slow
def test_a_run_killed_while_replacing_the_best_gets_it_back(tmp_path):
    """Killed while best_score_iter_2.pth is written: the next run restores iter_1's."""
    work = str(tmp_path / 'work')
    proc = subprocess.Popen(_script(tmp_path, max_iters=2, slow=60, from_write=2),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not glob.glob(os.path.join(work, '.best_score_iter_2.pth*.tmp')):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    best = os.path.join(work, 'best_score_iter_1.pth')
    # mmengine had deleted it; the data are in the held link
    assert not os.path.exists(best)
    assert os.path.exists(best + HELD_SUFFIX)

    # the next run in the work dir (no validation in it) puts it back first
    run = _run(tmp_path, max_iters=1, val_begin=10)
    assert run.returncode == 0, run.stderr
    assert checkpoint_problem(best) is None
    assert not os.path.exists(best + HELD_SUFFIX)
    assert f'restored the best checkpoint {best}' in run.stdout + run.stderr


@pytest.mark.slow
def test_a_finished_replacement_drops_the_held_link(tmp_path):
    """Killed after the new best was written: the old best is not brought back."""
    first = _run(tmp_path, max_iters=2)
    assert first.returncode == 0, first.stderr
    work = str(tmp_path / 'work')
    new = os.path.join(work, 'best_score_iter_2.pth')
    # the state of a run stopped between writing best_2 and dropping best_1's link: the
    # link made first, best_2 written after it
    with open(os.path.join(work, 'best_score_iter_1.pth' + HELD_SUFFIX), 'wb') as f:
        f.write(b'previous best')
    future = time.time() + 100
    os.utime(new, (future, future))
    run = _run(tmp_path, max_iters=1, val_begin=10)
    assert run.returncode == 0, run.stderr
    assert [f for f in _files(work) if f.endswith('.pth') or HELD_SUFFIX in f] == \
        ['best_score_iter_2.pth']


@pytest.mark.parametrize('tmpl,name', [('iter_{}.pth', 'best_score_iter_1.pth'),
                                       ('iter_{}.pth', 'best_coco_bbox_mAP_iter_12.pth'),
                                       ('iter_{:06d}.pth', 'best_score_iter_000012.pth')])
def test_held_names_follow_mmengine(tmpl, name):
    """The names the hook holds are mmengine's: best_<key>_<filename_tmpl>."""
    from inline_mm.engine.checkpoint_files import _best_regex
    match = _best_regex(tmpl).match(name)
    assert match is not None and match.group('key') == name[5:name.rindex('_iter_')]
    assert int(match.group('step')) == int(name[name.rindex('_') + 1:-4])
    assert _best_regex(tmpl).match(tmpl.format(1)) is None


def test_a_best_older_than_the_hold_is_not_taken_for_the_replacement(tmp_path):
    """Best files of a metric written before the hold (a stale one of an earlier run, also
    at a later step; one whose link could not be made) do not count as the replacement of
    the held best_score_iter_2.pth: that one is put back.  best_other_iter_3.pth, written
    after its hold, replaces best_other_iter_2.pth."""
    from inline_mm.engine.checkpoint_files import settle_held_best
    now = time.time()
    for name in ('best_score_iter_1.pth', 'best_score_iter_12.pth'):
        (tmp_path / name).write_bytes(b'old')
        os.utime(tmp_path / name, (now - 100, now - 100))
    (tmp_path / ('best_score_iter_2.pth' + HELD_SUFFIX)).write_bytes(b'held')
    (tmp_path / ('best_other_iter_2.pth' + HELD_SUFFIX)).write_bytes(b'replaced')
    (tmp_path / 'best_other_iter_3.pth').write_bytes(b'new')
    os.utime(tmp_path / 'best_other_iter_3.pth', (now + 100, now + 100))
    assert settle_held_best(str(tmp_path), 'iter_{}.pth') == \
        [str(tmp_path / 'best_score_iter_2.pth')]
    assert _files(tmp_path) == ['best_other_iter_3.pth', 'best_score_iter_1.pth',
                                'best_score_iter_12.pth', 'best_score_iter_2.pth']
    assert (tmp_path / 'best_score_iter_2.pth').read_bytes() == b'held'
