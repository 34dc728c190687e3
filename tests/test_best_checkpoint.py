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
from inline_mm.engine.checkpoint_files import HELD_MANIFEST, HELD_SUFFIX, checkpoint_problem

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
    # hold's list names best_1 only
    with open(os.path.join(work, 'best_score_iter_1.pth' + HELD_SUFFIX), 'wb') as f:
        f.write(b'previous best')
    with open(os.path.join(work, HELD_MANIFEST), 'w') as f:
        f.write('best_score_iter_1.pth\n')
    assert os.path.exists(new)
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


@pytest.mark.parametrize('listed', [True, False], ids=['hold-list', 'no-hold-list'])
def test_only_a_best_written_after_the_hold_is_taken_for_the_replacement(tmp_path, listed):
    """Best files the folder held when the hold began (a stale one of an earlier run, also
    at a later step; one whose link could not be made) are not the replacement of the held
    best_score_iter_2.pth: that one is put back.  best_other_iter_3.pth, not in the hold's
    list, replaces best_other_iter_2.pth; without the list nothing counts as a replacement
    (a duplicate at worst, never a lost best)."""
    from inline_mm.engine.checkpoint_files import settle_held_best
    for name in ('best_score_iter_1.pth', 'best_score_iter_12.pth'):
        (tmp_path / name).write_bytes(b'old')
    (tmp_path / ('best_score_iter_2.pth' + HELD_SUFFIX)).write_bytes(b'held')
    (tmp_path / ('best_other_iter_2.pth' + HELD_SUFFIX)).write_bytes(b'replaced')
    (tmp_path / 'best_other_iter_3.pth').write_bytes(b'new')
    if listed:
        (tmp_path / HELD_MANIFEST).write_text(
            'best_other_iter_2.pth\nbest_score_iter_1.pth\nbest_score_iter_12.pth\n'
            'best_score_iter_2.pth\n')
    restored = ['best_score_iter_2.pth'] + ([] if listed else ['best_other_iter_2.pth'])
    assert sorted(settle_held_best(str(tmp_path), 'iter_{}.pth')) == \
        sorted(str(tmp_path / name) for name in restored)
    assert _files(tmp_path) == sorted(['best_other_iter_3.pth', 'best_score_iter_1.pth',
                                       'best_score_iter_12.pth'] + restored)
    assert (tmp_path / 'best_score_iter_2.pth').read_bytes() == b'held'


@pytest.mark.slow
def test_a_failed_write_for_one_metric_puts_back_that_metrics_previous_best_only(tmp_path):
    """Two metrics improve; 'score''s new best is written, 'other''s write fails: the old
    'other' best comes back, the old 'score' best (replaced) does not."""
    run = _run(tmp_path, max_iters=2, save_best=['score', 'other'], error='ENOSPC',
               from_write=4)  # 1, 2: both bests of iteration 1; 3: score's of iteration 2
    work = str(tmp_path / 'work')
    assert run.returncode != 0
    kept = os.path.join(work, 'best_other_iter_1.pth')
    assert f'The previous best checkpoint {kept} is kept.' in run.stderr
    assert [f for f in _files(work) if f.endswith('.pth') or HELD_SUFFIX in f] == \
        ['best_other_iter_1.pth', 'best_score_iter_2.pth']


@pytest.mark.slow
def test_the_periodic_checkpoint_written_again_after_a_new_best(tmp_path):
    """After a new best, the periodic checkpoint is written again so that it records it.

    Checkpoints every 2 iterations, one kept, a new best at each: at iteration 3 the
    checkpoint written again is iter_3.pth, which replaces iter_2.pth.
    """
    run = _run(tmp_path, max_iters=3, interval=2, max_keep=1)
    assert run.returncode == 0, run.stderr
    work = str(tmp_path / 'work')
    assert [f for f in _files(work) if f.endswith('.pth')] == \
        ['best_score_iter_3.pth', 'iter_3.pth']
    state = torch.load(os.path.join(work, 'iter_3.pth'), map_location='cpu',
                       weights_only=False)
    assert state['message_hub']['runtime_info']['best_ckpt'] == \
        os.path.join(work, 'best_score_iter_3.pth')
    with open(os.path.join(work, 'last_checkpoint')) as f:
        assert f.read() == os.path.join(work, 'iter_3.pth')


@pytest.mark.slow
def test_a_failed_write_of_the_periodic_checkpoint_after_a_new_best_keeps_the_old_one(
        tmp_path):
    """mmengine deletes iter_2.pth before it writes iter_3.pth again after iteration 3's new
    best; here iter_3's write fails on a full disk and iter_2.pth stays, named by the pointer.

    Writes: 1 best_1; 2 iter_2, 3 best_2, 4 iter_2 again; 5 best_3, 6 iter_3.
    """
    run = _run(tmp_path, max_iters=3, interval=2, max_keep=1, error='ENOSPC', from_write=6)
    work = str(tmp_path / 'work')
    assert run.returncode != 0
    assert (f'CheckpointWriteError: cannot write checkpoint {work}/iter_3.pth: No space left on '
            f'device. Nothing was overwritten') in run.stderr
    assert checkpoint_problem(os.path.join(work, 'iter_2.pth')) is None
    assert not os.path.exists(os.path.join(work, 'iter_3.pth'))
    with open(os.path.join(work, 'last_checkpoint')) as f:
        assert f.read() == os.path.join(work, 'iter_2.pth')


@pytest.mark.slow
@pytest.mark.parametrize('fail_call', [1, 2], ids=['periodic', 'best'])
def test_an_error_of_rank_0_while_saving_stops_both_processes(tmp_path, fail_call):
    """Rank 0's save raises a non-OSError (a bug): it keeps its traceback, rank 1 stops with
    a CheckpointWriteError at once instead of waiting in its next collective."""
    from conftest import free_port
    script = _script(tmp_path, max_iters=2, interval=1, world_size=2, fail_call=fail_call)
    env = dict(os.environ, WORLD_SIZE='2', MASTER_ADDR='127.0.0.1', MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS='1')
    procs = [subprocess.Popen(script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)))
             for r in range(2)]
    try:
        # long below the process group's timeout (30 minutes)
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode != 0 for p in procs] == [True, True]
    assert "TypeError: cannot pickle 'generator' object" in outs[0][1]
    assert 'CheckpointWriteError: cannot write' in outs[1][1]
    assert 'the process of rank 0 could not write it (its log says why)' in outs[1][1]
    assert not [f for f in _files(str(tmp_path / 'work')) if HELD_SUFFIX in f]
