"""Training that survives a cluster: real processes, real signals, gloo on the CPU.

Each test injects one fault into a tiny run of the toy Mask R-CNN config (8 images of
128 px) and checks what survives; see docs/reliability.md.  Faults that only code can
make (a slow or failing checkpoint write, a NaN loss) come from the test-only hooks of
tests/plugins/fault_hooks.py, added to the config of the run.
"""
import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from conftest import (REPO_ROOT, TOY_DET_CONFIG, TRAIN_TOOL, assert_same_weights,
                      checkpoint_weights, free_port, tool_env, toy_det_options)
from conftest import scalars as all_scalars

from inline_mm.engine.atomic_io import atomic_write
from inline_mm.engine.checkpoint_files import (checkpoint_problem, newest_readable_checkpoint,
                                               point_to, read_pointer)
from inline_mm.engine.signals import PREEMPTED_EXIT_CODE, PREEMPTED_MARKER

CONFIG, TRAIN = TOY_DET_CONFIG, TRAIN_TOOL
DIST_TRAIN = os.path.join(REPO_ROOT, 'tools', 'dist_train.sh')
#: the test-only hooks (fault_hooks.py, preempt_at.py)
PLUGINS = os.path.join(REPO_ROOT, 'tests', 'plugins')
sys.path.insert(0, PLUGINS)
from fault_hooks import checkpoint_write_faults  # noqa: E402


def options(root, flip=False, **extra):
    return toy_det_options(root, flip, **{'train_dataloader.batch_size': 2, **extra})


def with_faults(work, *fault_hooks, hooks=None):
    """The toy config with the test-only ``fault_hooks`` added (none: the config itself),
    after its own custom hooks or after ``hooks`` in their place.

    Written beside ``work``; the run needs :func:`fault_env` to import them.
    """
    if not fault_hooks and hooks is None:
        return CONFIG
    from inline_mm.engine.launch import read_config
    base = read_config(CONFIG)
    imports = list(base.custom_imports['imports']) + ['fault_hooks', 'preempt_at']
    if hooks is None:
        hooks = [dict(h) for h in base.custom_hooks]  # indices kept
    hooks = list(hooks) + list(fault_hooks)
    path = work.rstrip(os.sep) + '_faults.py'
    with open(path, 'w') as f:
        f.write(f'_base_ = [{CONFIG!r}]\n'
                f'custom_imports = dict(imports={imports!r}, allow_failed_imports=False)\n'
                f'custom_hooks = {hooks!r}\n')
    return path


def fault_env():
    """:func:`tool_env` with tests/plugins importable."""
    env = tool_env()
    env['PYTHONPATH'] = os.pathsep.join(p for p in (PLUGINS, env.get('PYTHONPATH')) if p)
    return env


def train(work, root, *args, faults=(), hooks=None, **extra):
    """tools/train.py on the toy set; ``faults``: test-only hooks (fault_hooks.py), after
    the config's custom hooks or after ``hooks`` in their place."""
    return subprocess.run([sys.executable, TRAIN, with_faults(work, *faults, hooks=hooks),
                           '--work-dir', work, *args] + options(root, **extra),
                          capture_output=True, text=True, env=fault_env(), cwd=REPO_ROOT,
                          timeout=600)


def slow_writes(seconds, from_write):
    """Checkpoint writes of the run take ``seconds`` from its ``from_write``-th on."""
    return dict(type='CheckpointWriteFaultHook', slow=seconds, from_write=from_write)


def failing_writes(error, from_write):
    """Checkpoint writes of the run fail with ``error`` from its ``from_write``-th on."""
    return dict(type='CheckpointWriteFaultHook', error=error, from_write=from_write)


def nan_losses(*iterations):
    """The losses of these 0-based iterations are NaN."""
    return dict(type='NaNLossHook', iterations=list(iterations))


def signal_at(iteration, rank=None):
    """SIGTERM to the training process before the 0-based ``iteration`` (to process
    ``rank`` only, if given; preempt_at.py)."""
    return dict(type='SignalAtIterationHook', iteration=iteration, rank=rank)


def signal_in_validation(after_iteration, rank=None):
    """SIGTERM before the first batch of the validation after ``after_iteration``
    iterations (to process ``rank`` only, if given; preempt_at.py)."""
    return dict(type='SignalInValidationHook', after_iteration=after_iteration, rank=rank)


def val_rows(rows):
    """The COCO metrics of the validation rows of scalars.json rows, in order (the toy
    config logs them by epoch: the row's step does not tell which validation it was)."""
    rows = [{k: v for k, v in r.items() if k.startswith('coco/')} for r in rows]
    return [r for r in rows if r]


def scalars(work_dir):
    return all_scalars(work_dir, all_runs=True)


def losses(work_dir):
    return {r['iter']: r['loss'] for r in scalars(work_dir) if 'loss' in r}


def pointer(work):
    with open(os.path.join(work, 'last_checkpoint')) as f:
        return f.read().strip()


def wait_for(predicate, proc, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def children(pid):
    try:
        with open(f'/proc/{pid}/task/{pid}/children') as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def train_workers(launcher_pid):
    """The tools/train.py processes below a dist_train.sh launch, by LOCAL_RANK."""
    found = {}
    stack = [launcher_pid]
    while stack:
        pid = stack.pop()
        for child in children(pid):
            try:
                with open(f'/proc/{child}/cmdline', 'rb') as f:
                    cmd = f.read().split(b'\0')
                with open(f'/proc/{child}/environ', 'rb') as f:
                    environ = dict(kv.split(b'=', 1) for kv in f.read().split(b'\0') if b'=' in kv)
            except OSError:
                continue
            if any(c.endswith(b'train.py') for c in cmd) and b'LOCAL_RANK' in environ and \
                    b'torch.distributed.run' not in b' '.join(cmd):
                found.setdefault(int(environ[b'LOCAL_RANK']), child)
            else:
                stack.append(child)
    return found


# -- unit level ----------------------------------------------------------------------------

def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path):
    path = str(tmp_path / 'iter_1.pth')
    atomic_write(b'old', path)
    with checkpoint_write_faults(error='ENOSPC'), \
            pytest.raises(OSError, match='No space left') as err:
        atomic_write(b'new' * 1000, path)
    assert err.value.filename == path
    assert open(path, 'rb').read() == b'old'
    assert os.listdir(tmp_path) == ['iter_1.pth']  # no temp file left behind


@pytest.mark.parametrize('umask', [0o022, 0o002, 0o077])
def test_atomic_write_gives_the_mode_of_the_umask(tmp_path, umask):
    """Checkpoints are readable as mmengine's own (open(): 0666 less the umask), not 0600."""
    previous = os.umask(umask)
    try:
        atomic_write(b'data', str(tmp_path / 'iter_1.pth'))
        with open(tmp_path / 'plain', 'wb'):
            pass
    finally:
        os.umask(previous)
    mode = os.stat(tmp_path / 'iter_1.pth').st_mode & 0o777
    assert mode == 0o666 & ~umask
    assert mode == os.stat(tmp_path / 'plain').st_mode & 0o777


def test_newest_readable_checkpoint_skips_torn_files(tmp_path):
    good, torn = str(tmp_path / 'iter_2.pth'), str(tmp_path / 'iter_4.pth')
    torch.save({'state_dict': {'w': torch.ones(1000)}}, good)
    torch.save({'state_dict': {'w': torch.zeros(1000)}}, torn)
    data = open(torn, 'rb').read()
    open(torn, 'wb').write(data[:len(data) // 2])
    (tmp_path / 'last_checkpoint').write_text(torn)
    assert checkpoint_problem(good) is None and checkpoint_problem(torn)
    assert newest_readable_checkpoint(str(tmp_path)) == good


def test_the_last_checkpoint_pointer_is_read_and_set(tmp_path, caplog):
    """read_pointer: None without the file, '' for an empty one; point_to writes the name
    (atomically: no temp file left), leaves an equal pointer untouched and removes it,
    with a warning, when there is nothing readable to name."""
    folder, pointer = str(tmp_path), tmp_path / 'last_checkpoint'
    assert read_pointer(folder) is None
    pointer.write_text('')
    assert read_pointer(folder) == ''
    point_to(folder, str(tmp_path / 'iter_4.pth'))
    assert read_pointer(folder) == str(tmp_path / 'iter_4.pth')
    assert sorted(os.listdir(folder)) == ['last_checkpoint']
    mtime = os.stat(pointer).st_mtime_ns
    os.utime(pointer, ns=(mtime - 10 ** 9, mtime - 10 ** 9))
    point_to(folder, str(tmp_path / 'iter_4.pth'))
    assert os.stat(pointer).st_mtime_ns == mtime - 10 ** 9  # not written again
    logger = logging.getLogger('pointer-test')
    with caplog.at_level(logging.WARNING, logger='pointer-test'):
        point_to(folder, None, logger)
    assert not pointer.exists()
    assert f'--resume: removed {pointer}, which names no readable checkpoint' in caplog.text
    point_to(folder, None, logger)  # nothing to remove
    assert not pointer.exists()


# -- checkpoints -----------------------------------------------------------------------------

@pytest.mark.slow
def test_kill_during_a_checkpoint_save_resumes_from_a_readable_one(toy_root, tmp_path):
    """kill -9 while iter_4.pth is being written, keeping one checkpoint: iter_2 survives."""
    work = str(tmp_path / 'work')
    extra = {'train_cfg.max_iters': 6, 'default_hooks.checkpoint.interval': 2,
             'default_hooks.checkpoint.max_keep_ckpts': 1}
    # the 2nd save takes a minute
    proc = subprocess.Popen([sys.executable, TRAIN, with_faults(work, slow_writes(60, 2)),
                             '--work-dir', work] + options(toy_root, **extra),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=REPO_ROOT, env=fault_env())
    try:
        writing = wait_for(lambda: glob.glob(os.path.join(work, '.iter_4.pth.*.tmp')), proc)
        assert writing, 'the save of iter_4.pth never started'
        time.sleep(1)
    finally:
        proc.kill()
        proc.wait()
    assert pointer(work).endswith('iter_2.pth')
    assert checkpoint_problem(os.path.join(work, 'iter_2.pth')) is None
    # a torn file newer than every good one (as a non-atomic writer leaves it)
    with open(os.path.join(work, 'iter_5.pth'), 'wb') as f:
        f.write(open(os.path.join(work, 'iter_2.pth'), 'rb').read()[:5000])

    resumed = train(work, toy_root, '--resume', **extra)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert 'iter_5.pth is unreadable' in out
    assert 'resumed epoch: 0, iter: 2' in out  # lost at most one interval (iterations 3-4)
    assert pointer(work).endswith('iter_6.pth')
    assert not glob.glob(os.path.join(work, '.*.tmp'))


@pytest.mark.slow
@pytest.mark.parametrize('fault', ['immutable-dir', 'ENOSPC'])
def test_unwritable_work_dir_at_save_time(toy_root, tmp_path, fault):
    """A save that cannot write stops the run with the path; iter_2 and the pointer stay."""
    work = str(tmp_path / 'work')
    extra = {'train_cfg.max_iters': 4, 'default_hooks.checkpoint.interval': 2}
    if fault == 'ENOSPC':
        run = train(work, toy_root, faults=[failing_writes('ENOSPC', 2)], **extra)
        reason = 'No space left on device'
    else:
        if shutil.which('chattr') is None:
            pytest.skip('chattr not available')
        proc = subprocess.Popen([sys.executable, TRAIN, with_faults(work, slow_writes(5, 2)),
                                 '--work-dir', work] + options(toy_root, **extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO_ROOT, env=fault_env())
        try:
            assert wait_for(lambda: os.path.exists(os.path.join(work, 'last_checkpoint')), proc)
            # chmod does not stop root; an immutable folder does (checked here)
            subprocess.run(['chattr', '+i', work], check=True)
            probe = os.path.join(work, 'probe')
            with pytest.raises(OSError):
                open(probe, 'w').close()
            out, err = proc.communicate(timeout=600)
        finally:
            subprocess.run(['chattr', '-i', work])
            if proc.poll() is None:
                proc.kill()
        run = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        reason = 'Operation not permitted'
    assert run.returncode != 0
    assert f'cannot write checkpoint {os.path.join(work, "iter_4.pth")}: {reason}' in run.stderr
    assert pointer(work) == os.path.join(work, 'iter_2.pth')
    assert checkpoint_problem(os.path.join(work, 'iter_2.pth')) is None
    assert not os.path.exists(os.path.join(work, 'iter_4.pth'))
    assert not glob.glob(os.path.join(work, '.*.tmp'))


# -- non-finite losses ---------------------------------------------------------------------------

@pytest.mark.slow
def test_nan_loss_skips_the_step_and_too_many_stop_the_run(toy_root, tmp_path):
    work = str(tmp_path / 'once')
    extra = {'train_cfg.max_iters': 5, 'default_hooks.checkpoint.interval': 1,
             'default_hooks.checkpoint.max_keep_ckpts': -1}
    run = train(work, toy_root, faults=[nan_losses(3)], **extra)  # 0-based: iteration 4
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert 'non-finite loss or gradient at iteration 4: optimizer step skipped' in out
    assert_same_weights(os.path.join(work, 'iter_3.pth'), os.path.join(work, 'iter_4.pth'))
    after = checkpoint_weights(os.path.join(work, 'iter_5.pth'))
    before = checkpoint_weights(os.path.join(work, 'iter_4.pth'))
    assert any(not torch.equal(after[k], before[k]) for k in after)  # training went on
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())

    work = str(tmp_path / 'three')
    run = train(work, toy_root, faults=[nan_losses(2, 3, 4)],
                **{**extra, 'custom_hooks.3.max_consecutive': 3})
    assert run.returncode != 0
    assert 'not finite in 3 iterations in a row (3-5' in run.stderr
    assert_same_weights(os.path.join(work, 'iter_2.pth'), pointer(work))
    assert not os.path.exists(os.path.join(work, 'iter_5.pth'))


# -- bad samples -------------------------------------------------------------------------------

def _corrupt_copy(toy_root, dest):
    shutil.copytree(toy_root, dest)
    ann_path = os.path.join(dest, 'annotations', 'instances_train.json')
    with open(ann_path) as f:
        coco = json.load(f)
    files = [os.path.join(dest, 'train', img['file_name']) for img in coco['images']]
    data = open(files[0], 'rb').read()
    open(files[0], 'wb').write(data[:len(data) // 2])  # truncated JPEG
    open(files[1], 'wb').close()  # zero-byte file
    ann = dict(coco['annotations'][0], id=10 ** 6, image_id=coco['images'][2]['id'],
               bbox=[10, 10, 0, 0], area=0)  # zero-area box
    coco['annotations'].append(ann)
    with open(ann_path, 'w') as f:
        json.dump(coco, f)
    return files[:3]


def test_the_bad_sample_record_is_removed(tmp_path):
    """The file the data-loader workers share is made by the first bad sample only; it is
    removed when the wrapper is collected, by the process that made it when it exits with
    the wrapper still alive, and before the os._exit of the bounded teardown."""
    code = (
        'import gc, os, sys\n'
        'from inline_mm.engine.bad_samples import SkipBadSamples\n'
        'from inline_mm.engine.dist import _exit_now\n'
        'a = SkipBadSamples(list(range(10)))\n'
        'b = SkipBadSamples(list(range(10)))\n'
        'assert not [n for n in os.listdir(os.environ["TMPDIR"]) if "bad_samples" in n]\n'
        'a._add_bad(1, "x.jpg", "broken"); b._add_bad(2, "y.jpg", "broken")\n'
        'assert os.path.isfile(a._record) and os.path.isfile(b._record)\n'
        'if os.fork() == 0:\n'  # a forked worker exiting must not remove it
        '    b._add_bad(3, "z.jpg", "broken")\n'
        '    del b; gc.collect(); os._exit(0)\n'
        'os.wait()\n'
        'assert sorted(b.bad_samples) == [2, 3], b.bad_samples\n'
        'path = a._record; del a; gc.collect()\n'
        'assert not os.path.exists(path), path\n'
        'print(b._record, flush=True)\n'
        'if sys.argv[1] == "os._exit": _exit_now(0, "stuck teardown")\n')  # b is alive
    for end in ('exit', 'os._exit'):
        tmp = tmp_path / end
        tmp.mkdir()
        run = subprocess.run([sys.executable, '-c', code, end], capture_output=True, text=True,
                             env=dict(os.environ, TMPDIR=str(tmp)), cwd=REPO_ROOT, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.strip().splitlines()[-1].startswith(str(tmp)), run.stdout
        # (torch 2.1 makes a temp folder of its own at import, removed at exit too)
        assert [n for n in os.listdir(tmp) if 'bad_samples' in n] == [], end


@pytest.mark.slow
def test_bad_samples_are_skipped_once_and_too_many_stop_the_run(toy_root, tmp_path):
    root = str(tmp_path / 'bad')
    bad = _corrupt_copy(toy_root, root)
    extra = {'train_cfg.max_iters': 8, 'default_hooks.checkpoint.interval': 100,
             'train_dataloader.dataset.max_bad_count': 3,
             'train_dataloader.num_workers': 2}
    run = train(str(tmp_path / 'ok'), root, **extra)  # two epochs of 4 iterations
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    for path in bad:
        assert out.count(f'skipped bad sample {path}:') == 1, path
    assert 'truncated JPEG' in out and 'empty file' in out and 'zero-area box' in out

    run = train(str(tmp_path / 'stop'), root, **{**extra, 'train_dataloader.num_workers': 0,
                                                  'train_dataloader.dataset.max_bad_count': 2})
    assert run.returncode != 0
    assert 'BadSampleLimitError' in run.stderr and 'more than the limit of 2' in run.stderr
    for path in bad:
        assert path in run.stderr


# -- exact resumption -------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize('num_workers', [0, 2])
def test_resume_with_random_flip_matches_a_straight_run(toy_root, tmp_path, num_workers):
    extra = {'train_cfg.max_iters': 10, 'default_hooks.checkpoint.interval': 5,
             'train_dataloader.num_workers': num_workers}
    straight = str(tmp_path / 'straight')
    run = train(straight, toy_root, flip=True, **extra)
    assert run.returncode == 0, run.stderr[-3000:]
    work = str(tmp_path / 'resumed')
    os.makedirs(work)
    shutil.copy(os.path.join(straight, 'iter_5.pth'), work)
    run = train(work, toy_root, '--resume', os.path.join(work, 'iter_5.pth'), flip=True,
                **extra)
    assert run.returncode == 0, run.stderr[-3000:]
    a, b = losses(straight), losses(work)
    assert [b[i] for i in range(6, 11)] == [a[i] for i in range(6, 11)]
    assert_same_weights(os.path.join(straight, 'iter_10.pth'), os.path.join(work, 'iter_10.pth'))


# -- preemption and several processes ----------------------------------------------------------

def dist_train(work, root, nproc, port, extra, *args, faults=(), hooks=None, **env_extra):
    """tools/dist_train.sh on the toy set; ``faults``: test-only hooks (fault_hooks.py),
    after the config's custom hooks or after ``hooks`` in their place."""
    return subprocess.Popen(
        ['bash', DIST_TRAIN, with_faults(work, *faults, hooks=hooks), str(nproc), '--work-dir',
         work,
         *args] + options(root, **extra),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
        env=dict(fault_env(), PORT=str(port), **env_extra), start_new_session=True)


@pytest.mark.slow
def test_sigterm_checkpoints_exits_75_and_the_relaunch_matches(toy_root, tmp_path):
    """SIGTERM to rank 1 of a 2-process run (flip on, 2 loader workers each), then a new
    launch with --resume (what tools/slurm_train.sh does after a requeue)."""
    extra = {'train_cfg.max_iters': 6, 'default_hooks.checkpoint.interval': 100,
             'train_dataloader.batch_size': 1, 'train_dataloader.num_workers': 2, 'flip': True}
    flip = extra.pop('flip')
    straight = str(tmp_path / 'straight')
    proc = dist_train(straight, toy_root, 2, free_port(), dict(extra, flip=flip))
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]

    work = str(tmp_path / 'preempted')
    proc = dist_train(work, toy_root, 2, free_port(), dict(extra, flip=flip))
    try:
        started = wait_for(lambda: any(r.get('iter', 0) >= 2 for r in scalars(work)), proc)
        assert started, 'training did not start'
        workers = train_workers(proc.pid)
        os.kill(workers[1], signal.SIGTERM)  # one process only: the flag is agreed on
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0  # torchrun reports its workers' failure
    assert f'exiting with status {PREEMPTED_EXIT_CODE}' in out, out[-3000:]
    assert_preempted_launch(out)
    preempt = glob.glob(os.path.join(work, 'iter_*.pth'))
    assert len(preempt) == 1 and not preempt[0].endswith('iter_6.pth'), out[-3000:]
    with open(os.path.join(work, PREEMPTED_MARKER)) as f:  # what slurm_train.sh requeues on
        assert preempt[0] in f.read()
    proc = dist_train(work, toy_root, 2, free_port(), dict(extra, flip=flip), '--resume')
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert 'resumed epoch: 0, iter:' in out
    assert not os.path.exists(os.path.join(work, PREEMPTED_MARKER))
    assert_same_weights(os.path.join(straight, 'iter_6.pth'), os.path.join(work, 'iter_6.pth'))


@pytest.mark.slow
def test_a_signal_before_the_first_iteration_ends_exits_75_at_once(toy_root, tmp_path):
    """Nothing is trained between the checkpoint a run resumes from and the end of its
    first iteration (which can outlast a scheduler's grace period: the replay of the
    batches already trained, torch.compile): the run exits 75 at once, so that
    tools/slurm_train.sh requeues it, and the checkpoint it resumed from stays as it was."""
    work = str(tmp_path / 'work')
    extra = {'train_cfg.max_iters': 2, 'default_hooks.checkpoint.interval': 2}
    out = train(work, toy_root, **extra)
    assert out.returncode == 0, out.stderr[-3000:]
    checkpoint = os.path.join(work, 'iter_2.pth')
    with open(checkpoint, 'rb') as f:
        written = f.read()

    out = train(work, toy_root, '--resume', faults=[signal_at(2)],
                **dict(extra, **{'train_cfg.max_iters': 4}))
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr[-3000:]
    assert 'preempted (received SIGTERM) with no training iteration finished in this run: ' \
           f'nothing new to save; exiting with status {PREEMPTED_EXIT_CODE}' in out.stderr
    assert 'Traceback' not in out.stderr, out.stderr[-3000:]
    assert 'Iter(train) [3/4]' not in out.stdout + out.stderr  # stopped before it ended
    assert glob.glob(os.path.join(work, '*.pth')) == [checkpoint]
    with open(checkpoint, 'rb') as f:
        assert f.read() == written
    assert pointer(work) == checkpoint


def finish(proc, timeout=600):
    """The output of a dist_train launch; its process group is killed if it outlasts
    ``timeout`` (a hang must not leave torchrun and its workers behind)."""
    try:
        return proc.communicate(timeout=timeout)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def assert_preempted_launch(out):
    """torchrun's report of a preempted launch: the first process to end exited with 75
    (torchrun then stops the others), and none aborted (an abort in a process's teardown,
    ``terminate called without an active exception``, is not requeued as 75 is)."""
    assert f'failed (exitcode: {PREEMPTED_EXIT_CODE})' in out, out[-3000:]
    assert 'terminate called' not in out and 'SIGABRT' not in out, out[-3000:]


def pending_validation(checkpoint):
    """What the checkpoint's message hub records as a pending validation (or None)."""
    from inline_mm.engine.hooks.preemption import PENDING_VALIDATION
    hub = torch.load(checkpoint, map_location='cpu', weights_only=False)['message_hub']
    return hub['runtime_info'].get(PENDING_VALIDATION)


#: 4 iterations of batch 2, random flip on, a validation after iterations 2 and 4
VALIDATED = {'train_cfg.max_iters': 4, 'train_cfg.val_interval': 2,
             'default_hooks.checkpoint.interval': 100, 'flip': True}


def toy_hooks(*more):
    """The toy config's custom hooks, and ``more`` after them."""
    from inline_mm.engine.launch import read_config
    return [dict(h) for h in read_config(CONFIG).custom_hooks] + list(more)


#: mmengine's EMAHook, averaging fast enough that the average differs from the weights
EMA = dict(type='EMAHook', momentum=0.5)


@pytest.mark.slow
@pytest.mark.parametrize('where', ['in the validation', 'in the iteration before it',
                                   'in the validation, with EMAHook'])
def test_a_preempted_validation_runs_when_the_run_resumes(toy_root, tmp_path, where):
    """SIGTERM during the validation after iteration 2 (or during iteration 2, which a
    validation follows): exit 75 without waiting for the validation, a checkpoint of
    iteration 2 that records the validation as pending; the resumed run validates first,
    with the metrics of an uninterrupted run, and ends with its weights bit for bit (also
    with an EMAHook, which has swapped the averaged weights into the model during the
    validation). The checkpoint is written once."""
    hooks = toy_hooks(EMA) if 'EMAHook' in where else None
    straight = str(tmp_path / 'straight')
    out = train(straight, toy_root, hooks=hooks, **VALIDATED)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = val_rows(scalars(straight))
    assert len(expected) == 2  # after iterations 2 and 4

    work = str(tmp_path / 'work')
    fault = signal_at(1) if where == 'in the iteration before it' else signal_in_validation(2)
    # the checkpoint is written once (a second write fails): a preemption in the iteration
    # before a validation writes it at the validation's start, with the validation pending
    out = train(work, toy_root, faults=[fault, failing_writes('ENOSPC', 2)], hooks=hooks,
                **VALIDATED)
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr[-3000:]
    checkpoint = os.path.join(work, 'iter_2.pth')
    assert f'preempted (received SIGTERM) at the validation after iteration 2: checkpoint ' \
           f'{checkpoint} written, the validation runs when the run resumes; exiting with ' \
           f'status {PREEMPTED_EXIT_CODE}' in out.stdout, out.stdout[-3000:]
    assert val_rows(scalars(work)) == [] and 'Iter(train) [3/4]' not in out.stdout
    assert glob.glob(os.path.join(work, '*.pth')) == [checkpoint]
    assert pointer(work) == checkpoint and pending_validation(checkpoint) == 2

    out = train(work, toy_root, '--resume', hooks=hooks, **VALIDATED)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'the validation after iteration 2 was interrupted by a preemption: running it ' \
           'before training goes on' in out.stdout
    assert val_rows(scalars(work)) == expected
    final = os.path.join(straight, 'iter_4.pth'), os.path.join(work, 'iter_4.pth')
    assert_same_weights(*final)
    if hooks is not None:  # the checkpoint's state_dict is the average, this the weights
        assert_same_weights(*final, key='ema_state_dict')
    assert pending_validation(os.path.join(work, 'iter_4.pth')) is None


@pytest.mark.slow
def test_a_validation_due_that_does_not_come_still_gets_its_checkpoint(toy_root, tmp_path):
    """SIGTERM in iteration 2, after which the interval of 2 would validate; a dynamic
    interval (100 from the count of 3 on) cancels that validation once the iteration has
    ended: the checkpoint of iteration 2 is written when the loop ends instead (once, with
    no validation pending), and the relaunch matches an uninterrupted run."""
    # mmengine decides the interval after each iteration for the next count: after
    # iteration 2 (counted 3) it becomes 100, after the hooks of iteration 2 have seen 2
    extra = dict(VALIDATED, **{'train_cfg.dynamic_intervals': '[(3,100)]'})
    straight = str(tmp_path / 'straight')
    out = train(straight, toy_root, **extra)
    assert out.returncode == 0, out.stderr[-3000:]
    # none after iteration 2; the last iteration's, depending on mmengine's version
    assert len(val_rows(scalars(straight))) <= 1
    work = str(tmp_path / 'work')
    out = train(work, toy_root, faults=[signal_at(1), failing_writes('ENOSPC', 2)], **extra)
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr[-3000:]
    checkpoint = os.path.join(work, 'iter_2.pth')
    assert f'preempted (received SIGTERM) after iteration 2: checkpoint {checkpoint} ' \
           'written' in out.stdout, out.stdout[-3000:]
    assert pointer(work) == checkpoint and pending_validation(checkpoint) is None
    out = train(work, toy_root, '--resume', **extra)
    assert out.returncode == 0, out.stderr[-3000:]
    assert_same_weights(os.path.join(straight, 'iter_4.pth'), os.path.join(work, 'iter_4.pth'))


@pytest.mark.parametrize('runner_kind', ['Runner', 'FlexibleRunner'])
def test_a_preemption_rewrite_through_mmengines_checkpoint_hook_never_tears_it(tmp_path,
                                                                             runner_kind):
    """mmengine's own CheckpointHook writes in place (and a FlexibleRunner's strategy through
    the plain local backend). A preemption in the validation after a checkpoint rewrites that
    checkpoint (with the validation pending) through the hook's settings: a write that fails
    (here ENOSPC at its fsync, where a kill could also land) leaves the checkpoint already
    there intact, and a write that succeeds replaces the file (a new inode) instead of
    writing into it, with the iteration the preemption records."""
    import mmengine.runner
    from linear_model import LinearModel, collate
    from mmengine.hooks import CheckpointHook
    from torch.utils.data import DataLoader, TensorDataset
    Runner = getattr(mmengine.runner, runner_kind)

    from inline_mm.engine.checkpoint_files import CheckpointWriteError
    from inline_mm.engine.hooks.atomic_checkpoint import save_checkpoint_now
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
    runner = Runner(
        model=LinearModel(), work_dir=str(tmp_path / 'work'),
        train_dataloader=DataLoader(data, batch_size=4, collate_fn=collate),
        train_cfg=dict(by_epoch=False, max_iters=2),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False)),
        experiment_name=f'plain_hook_{os.getpid()}_{time.time_ns()}')
    runner.train()
    hook = next(h for h in runner.hooks if type(h) is CheckpointHook)
    path = str(tmp_path / 'work' / 'iter_2.pth')
    with open(path, 'rb') as f:
        written = f.read()

    with checkpoint_write_faults(error='ENOSPC'), pytest.raises(CheckpointWriteError,
                                                                match='Nothing was overwritten'):
        save_checkpoint_now(hook, runner, during_validation=True)
    with open(path, 'rb') as f:
        assert f.read() == written
    assert not [name for name in os.listdir(tmp_path / 'work') if name.endswith('.tmp')]

    inode = os.stat(path).st_ino
    assert save_checkpoint_now(hook, runner, during_validation=True) == path
    assert os.stat(path).st_ino != inode
    assert checkpoint_problem(path) is None
    # the iterations the loop counted before the validation (FlexibleRunner's own count
    # would say 3)
    assert torch.load(path, weights_only=False)['meta']['iter'] == 2


def test_a_preempted_iteration_based_run_fetches_no_further_batch(tmp_path):
    """SIGTERM during the third of six iterations (no validation follows it): the run saves
    the checkpoint of iteration 3 and exits 75 without loading the fourth batch, whose
    loading can take long or fail (a bad sample) and turn the status into another."""
    from linear_model import LinearModel, collate
    from mmengine.runner import Runner
    from preempt_at import SignalAtIterationHook
    from torch.utils.data import DataLoader, Dataset

    from inline_mm.engine import PreemptionHook

    class CountingDataset(Dataset):
        fetched = 0

        def __len__(self):
            return 8

        def __getitem__(self, index):
            CountingDataset.fetched += 1
            return torch.full((4,), float(index)), torch.ones(1)

    work = tmp_path / 'work'
    work.mkdir()
    (work / PREEMPTED_MARKER).write_text('an earlier preemption\n')
    runner = Runner(
        model=LinearModel(), work_dir=str(work),
        train_dataloader=DataLoader(CountingDataset(), batch_size=1, collate_fn=collate),
        train_cfg=dict(by_epoch=False, max_iters=6),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=100,
                                           by_epoch=False)),
        custom_hooks=[PreemptionHook(), SignalAtIterationHook(2)],
        experiment_name=f'no_further_batch_{os.getpid()}_{time.time_ns()}')
    with pytest.raises(SystemExit) as stop:
        runner.train()
    assert stop.value.code == PREEMPTED_EXIT_CODE
    assert CountingDataset.fetched == 3
    assert os.path.isfile(work / 'iter_3.pth')
    # the marker tools/slurm_train.sh requeues on: this run's, naming its checkpoint
    marker = (work / PREEMPTED_MARKER).read_text()
    assert 'after iteration 3: checkpoint' in marker and 'iter_3.pth' in marker, marker


def test_the_preemption_marker_belongs_to_the_work_dirs_training_runs(tmp_path):
    """A test run in the work dir leaves the marker alone, also when it is itself preempted
    (tools/slurm_train.sh must not requeue a failed training run for it); a training run
    removes an earlier one when it starts, so that it is not requeued when it then fails
    or finishes."""
    from linear_model import LinearModel, collate
    from mmengine.evaluator import BaseMetric
    from mmengine.hooks import Hook
    from mmengine.runner import Runner
    from torch.utils.data import DataLoader, TensorDataset

    from inline_mm.engine import PreemptionHook

    class Count(BaseMetric):
        def process(self, data_batch, data_samples):
            self.results.append(len(data_samples))

        def compute_metrics(self, results):
            return dict(count=sum(results))

    class SignalInTest(Hook):
        def before_test_iter(self, runner, batch_idx, data_batch=None):
            if batch_idx == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    work = tmp_path / 'work'
    work.mkdir()
    earlier = 'preempted after iteration 4: an earlier training run\n'
    (work / PREEMPTED_MARKER).write_text(earlier)
    data = TensorDataset(torch.randn(4, 4), torch.ones(4, 1))

    def runner(name, hooks, **kwargs):
        return Runner(model=LinearModel(), work_dir=str(work), custom_hooks=hooks,
                      experiment_name=f'{name}_{os.getpid()}_{time.time_ns()}', **kwargs)

    test = dict(test_dataloader=DataLoader(data, batch_size=1, collate_fn=collate),
                test_cfg=dict(), test_evaluator=Count())
    runner('test', [PreemptionHook()], **test).test()
    assert (work / PREEMPTED_MARKER).read_text() == earlier
    with pytest.raises(SystemExit) as stop:  # preempted in its second batch
        runner('test_preempted', [PreemptionHook(), SignalInTest()], **test).test()
    assert stop.value.code == PREEMPTED_EXIT_CODE
    assert (work / PREEMPTED_MARKER).read_text() == earlier

    runner('train', [PreemptionHook()],
           train_dataloader=DataLoader(data, batch_size=1, collate_fn=collate),
           train_cfg=dict(by_epoch=False, max_iters=2),
           optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01))).train()
    assert not (work / PREEMPTED_MARKER).exists()


#: one of two gloo processes: rank 0 ends as a preempted run does (finish_preempted), rank 1
#: never comes to the barrier (a peer lost after the processes agreed to stop)
LOST_PEER = textwrap.dedent('''
    import sys, time
    import torch.distributed as dist
    from inline_mm.engine.dist import finish_preempted
    rank = int(sys.argv[1])
    dist.init_process_group('gloo', init_method='tcp://127.0.0.1:' + sys.argv[2], rank=rank,
                            world_size=2)
    if rank == 1:
        time.sleep(300)
    finish_preempted(timeout=2)
    print('not reached')
''')


def test_a_preempted_exit_does_not_wait_for_a_lost_peer():
    """The barrier of a preempted run's exit (run_with_runner) waits a bounded time: a peer
    that never comes neither holds the process past the scheduler's grace period (torch
    2.1's gloo waits for it at interpreter exit) nor changes the status from 75."""
    port = str(free_port())
    peer = subprocess.Popen([sys.executable, '-c', LOST_PEER, '1', port], env=tool_env())
    try:
        out = subprocess.run([sys.executable, '-c', LOST_PEER, '0', port], env=tool_env(),
                             capture_output=True, text=True, timeout=60)
    finally:
        peer.kill()
        peer.wait()
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr[-2000:]
    assert 'warning: not every process reached the end of the preempted run' in out.stderr
    assert 'timed out' in out.stderr and 'not reached' not in out.stdout


#: a one-process gloo group whose teardown never returns (a sleep stands in for torch 2.1's
#: gloo destructor waiting for peers that have gone; it releases the GIL as that does)
STUCK_TEARDOWN = textwrap.dedent('''
    import sys, time
    import torch.distributed as dist
    from inline_mm.engine import dist as inline_dist
    dist.init_process_group('gloo', init_method='tcp://127.0.0.1:' + sys.argv[2], rank=0,
                            world_size=1)
    dist.destroy_process_group = lambda: time.sleep(300)
    if sys.argv[1] in ('finished', 'log_lock_held'):
        if sys.argv[1] == 'log_lock_held':  # a thread stuck in a log write holds its lock
            import logging
            handler = logging.StreamHandler()
            logging.getLogger('held').addHandler(handler)
            handler.acquire()
        inline_dist.finish_distributed(teardown_timeout=2)
    elif sys.argv[1] == 'preempted':
        inline_dist.finish_preempted(timeout=2)
    elif sys.argv[1] == 'barrier_ignores_timeout':  # NCCL without TORCH_NCCL_BLOCKING_WAIT
        dist.barrier = lambda *args, **kwargs: time.sleep(300)
        inline_dist.finish_preempted(timeout=2)
    else:  # a tool's check of the input fails (the teardown, in run_with_runner's finally)
        from functools import partial
        from mmengine.config import Config
        from inline_mm.engine.launch import run_with_runner
        from inline_mm.errors import ConfigError

        def check():
            raise ConfigError('the input is bad: fix it')
        inline_dist.finish_distributed = partial(inline_dist.finish_distributed,
                                                 teardown_timeout=2)
        run_with_runner(Config(dict(work_dir=sys.argv[3])), 'none', (), print, check=check,
                        check_data=False)
    print('not reached')
''')


@pytest.mark.parametrize('end,status', [('finished', 0), ('preempted', PREEMPTED_EXIT_CODE),
                                        ('user_error', 2), ('log_lock_held', 0),
                                        ('barrier_ignores_timeout', PREEMPTED_EXIT_CODE)])
def test_a_stuck_teardown_does_not_hold_the_process(end, status, tmp_path):
    """A process group whose teardown hangs after the barrier (torch 2.1's gloo on a loaded
    machine, once the peers have exited) holds the process a bounded time, then it exits
    with its run's status: 0 for a finished run, 75 for a preempted one, 2 with the error
    line for a user error found before the run (which the tool would print after it); a
    log handler's lock held by a stuck thread does not stop the exit; nor does a preempted
    run's barrier that ignores its timeout (NCCL without TORCH_NCCL_BLOCKING_WAIT)."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, '-c', STUCK_TEARDOWN, end, str(free_port()),
                          str(tmp_path / 'work')],
                         env=tool_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == status, out.stderr[-2000:]
    warning = ('warning: not every process reached the barrier within 2 s (a peer is '
               f'gone); exiting with status {status} all the same'
               if end == 'barrier_ignores_timeout' else
               'warning: the process group was not torn down within 2 s (its peers have '
               f'gone); exiting with status {status} all the same')
    assert warning in out.stderr
    if end == 'user_error':
        assert out.stderr.strip().splitlines()[-2:] == ['error: the input is bad: fix it',
                                                        warning]
    assert 'not reached' not in out.stdout
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_a_signal_to_one_process_in_a_validation_stops_both(toy_root, tmp_path):
    """Two processes: SIGTERM to rank 1 only, during a validation inside training; the
    processes agree after its batch, rank 0 writes the checkpoint with the validation
    pending, both exit 75; a relaunch with --resume validates first and ends with the
    weights of an uninterrupted run."""
    extra = dict(VALIDATED, **{'train_dataloader.batch_size': 1})
    straight = str(tmp_path / 'straight')
    proc = dist_train(straight, toy_root, 2, free_port(), extra)
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]

    work = str(tmp_path / 'work')
    proc = dist_train(work, toy_root, 2, free_port(), extra,
                      faults=[signal_in_validation(2, rank=1)])
    out = finish(proc)
    assert proc.returncode != 0  # torchrun reports its workers' failure
    assert_preempted_launch(out)
    assert 'preempted (another process received a stop signal) at the validation after ' \
           'iteration 2' in out, out[-3000:]
    checkpoint = os.path.join(work, 'iter_2.pth')
    assert glob.glob(os.path.join(work, '*.pth')) == [checkpoint]
    assert pending_validation(checkpoint) == 2

    proc = dist_train(work, toy_root, 2, free_port(), extra, '--resume')
    out = finish(proc)
    assert proc.returncode == 0, out[-3000:]
    assert 'the validation after iteration 2 was interrupted by a preemption' in out
    assert len(val_rows(scalars(work))) == 2
    assert_same_weights(os.path.join(straight, 'iter_4.pth'), os.path.join(work, 'iter_4.pth'))


@pytest.mark.slow
def test_a_check_interval_agrees_on_the_same_iterations_in_every_process(toy_root, tmp_path):
    """PreemptionHook(check_interval=2) without NonFiniteLossHook (which agrees at every
    step): SIGTERM to rank 1 before iteration 3 of 6; both processes agree after iteration 4
    (rank 1 alone agreeing after iteration 3 would be a collective rank 0 is not in) and
    exit 75 with the checkpoint of iteration 4."""
    hooks = [dict(type='MeanLossLoggerHook'), dict(type='RNGStateHook'),
             dict(type='PreemptionHook', check_interval=2)]
    work = str(tmp_path / 'work')
    extra = {'train_cfg.max_iters': 6, 'default_hooks.checkpoint.interval': 100,
             'train_dataloader.batch_size': 1}
    proc = dist_train(work, toy_root, 2, free_port(), extra, hooks=hooks,
                      faults=[signal_at(2, rank=1)])
    out = finish(proc, timeout=180)  # it hung with the agreement off the interval
    assert_preempted_launch(out)
    checkpoint = os.path.join(work, 'iter_4.pth')
    assert f'preempted (another process received a stop signal) after iteration 4: ' \
           f'checkpoint {checkpoint} written' in out, out[-3000:]
    assert glob.glob(os.path.join(work, '*.pth')) == [checkpoint]


@pytest.mark.slow
def test_two_nodes_on_loopback_match_one_two_process_launch(toy_root, tmp_path):
    extra = {'train_cfg.max_iters': 3, 'default_hooks.checkpoint.interval': 100,
             'train_dataloader.batch_size': 1}
    one = str(tmp_path / 'one')
    proc = dist_train(one, toy_root, 2, free_port(), extra)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]

    two = str(tmp_path / 'two')
    port = free_port()
    nodes = [dist_train(two, toy_root, 1, port, extra, NNODES='2', NODE_RANK=str(rank),
                        MASTER_ADDR='127.0.0.1') for rank in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    assert losses(two) == pytest.approx(losses(one), rel=1e-6)
    assert_same_weights(os.path.join(one, 'iter_3.pth'), os.path.join(two, 'iter_3.pth'),
                        exact=False)


@pytest.mark.slow
def test_torchrun_restarts_the_workers_after_a_preemption_and_matches(toy_root, tmp_path):
    """MAX_RESTARTS=1: SIGTERM to rank 1 of a 2-process run; torchrun restarts both processes
    with --resume, they join a new process group and the run finishes by itself."""
    extra = {'train_cfg.max_iters': 6, 'default_hooks.checkpoint.interval': 100,
             'train_dataloader.batch_size': 1, 'env_cfg.dist_cfg.timeout': 60, 'flip': True}
    straight = str(tmp_path / 'straight')
    proc = dist_train(straight, toy_root, 2, free_port(), extra)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]

    work = str(tmp_path / 'restarted')
    proc = dist_train(work, toy_root, 2, free_port(), extra, MAX_RESTARTS='1')
    try:
        started = wait_for(lambda: any(r.get('iter', 0) >= 2 for r in scalars(work)), proc)
        assert started, 'training did not start'
        os.kill(train_workers(proc.pid)[1], signal.SIGTERM)
        # a restart that cannot form its process group fails after the 60 s timeout
        out, _ = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert f'exiting with status {PREEMPTED_EXIT_CODE}' in out, out[-3000:]
    assert proc.returncode == 0, out[-3000:]
    preempt = [p for p in glob.glob(os.path.join(work, 'iter_*.pth'))
               if not p.endswith('iter_6.pth')]
    assert len(preempt) == 1, out[-3000:]
    assert f'--resume: resuming from {preempt[0]}' in out, out[-3000:]
    assert pointer(work).endswith('iter_6.pth')
    assert_same_weights(os.path.join(straight, 'iter_6.pth'), os.path.join(work, 'iter_6.pth'))


def node_processes(launcher_pid):
    """Process groups of a dist_train.sh launch: its own and its workers' (torchrun starts
    each worker in a session of its own, so killing the launch's group leaves them running)."""
    return [launcher_pid] + list(train_workers(launcher_pid).values())


def signal_group_or_process(pid, sig):
    """Signal the process group ``pid`` leads (a worker and its data-loader workers), or the
    process alone where it leads none (torch 2.1's torchrun keeps its workers in its own
    group); nothing when it is gone already (killed with its launcher's group)."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.parametrize('fault', ['killed', 'frozen'])
def test_a_lost_node_ends_the_other_and_the_job_resumes(toy_root, tmp_path, fault):
    """Two one-process launches with NNODES=2 on the loopback.  Node 1 is lost at iteration 3:
    killed (kill -9 of the launch and its worker: its connections close) or frozen (SIGSTOP:
    its connections stay open and nothing answers, as after a power loss or a network cut;
    the collective gives up after env_cfg.dist_cfg.timeout, 20 s here).  Node 0 must end with
    a clear message, and a relaunch with --resume finishes the run."""
    extra = {'train_cfg.max_iters': 8, 'default_hooks.checkpoint.interval': 2,
             'train_dataloader.batch_size': 1, 'env_cfg.dist_cfg.timeout': 20}
    work = str(tmp_path / 'work')
    port = free_port()
    nodes = [dist_train(work, toy_root, 1, port, extra, NNODES='2', NODE_RANK=str(rank))
             for rank in (0, 1)]
    lost = []
    try:
        assert wait_for(lambda: any(r.get('iter', 0) >= 3 for r in scalars(work)), nodes[0])
        lost = node_processes(nodes[1].pid)
        assert len(lost) == 2, 'node 1 has no worker'
        for pid in lost:
            signal_group_or_process(pid, signal.SIGKILL if fault == 'killed' else signal.SIGSTOP)
        stopped = time.time()
        out, _ = nodes[0].communicate(timeout=120)
        took = time.time() - stopped
    finally:
        for pid in lost:
            signal_group_or_process(pid, signal.SIGKILL)
        for p in nodes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert nodes[0].returncode != 0
    assert took < 60, f'node 0 took {took:.0f} s to stop'
    saved = pointer(work)
    assert checkpoint_problem(saved) is None
    assert 'error: lost contact with another training process (process 0 of 2)' in out, \
        out[-3000:]
    assert f'start the job again with --resume to continue from {saved}' in out, out[-3000:]
    if fault == 'frozen':
        assert 'Timed out waiting 20000ms' in out, out[-3000:]

    port = free_port()
    nodes = [dist_train(work, toy_root, 1, port, extra, NNODES='2', NODE_RANK=str(rank),
                        MAX_RESTARTS='1') for rank in (0, 1)]
    outs = [p.communicate(timeout=600)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][-3000:]
    assert f'resuming from {saved}' in outs[0]
    assert pointer(work).endswith('iter_8.pth')
