"""``runner_type='FlexibleRunner'`` in a config, as mmdet's and mmseg's own tools build it.

mmengine's FlexibleRunner loads the checkpoint of ``--resume`` before the ``before_run``
hooks (mmengine's Runner after them), and its DeepSpeed / FSDP / ColossalAI strategies
write checkpoints on every process, where the project's checkpoint hooks write on
process 0.  The toy detector of tests/test_fault_tolerance.py (8 images of 128 px), run
through tools/train.py.
"""
import glob
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import (REPO_ROOT, TOY_DET_CONFIG, TRAIN_TOOL, assert_same_weights, free_port,
                      scalars, tool_env, toy_det_options)
from test_fault_tolerance import (assert_preempted_launch, dist_train, finish, train_workers,
                                  wait_for)

from inline_mm.engine.signals import PREEMPTED_EXIT_CODE

FLEXIBLE = {'runner_type': 'FlexibleRunner'}


def train(work, root, *args, **extra):
    return subprocess.run([sys.executable, TRAIN_TOOL, TOY_DET_CONFIG, '--work-dir', work,
                           *args] + toy_det_options(root, **{'train_dataloader.batch_size': 2,
                                                             **FLEXIBLE, **extra}),
                          capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT,
                          timeout=600)


def checkpoint_meta(path):
    from inline_mm.checkpoint import load_checkpoint_file
    return load_checkpoint_file(path)['meta']


@pytest.mark.slow
def test_flexible_runner_resumes_from_the_newest_readable_checkpoint(toy_root, tmp_path):
    """--resume under FlexibleRunner: the torn newest checkpoint is skipped before the
    load, mmengine's checkpoint types load on torch >= 2.6, and the resumed run ends
    with the weights of a straight one."""
    extra = {'train_cfg.max_iters': 4, 'default_hooks.checkpoint.interval': 2}
    straight = str(tmp_path / 'straight')
    run = train(straight, toy_root, **extra)
    assert run.returncode == 0, run.stderr[-3000:]
    # a strategy's save records the version as 'mmengine' (the Runner's: 'mmengine_version')
    meta = checkpoint_meta(os.path.join(straight, 'iter_4.pth'))
    assert 'mmengine' in meta and 'mmengine_version' not in meta, sorted(meta)
    work = str(tmp_path / 'resumed')
    os.makedirs(work)
    shutil.copy(os.path.join(straight, 'iter_2.pth'), work)
    with open(os.path.join(work, 'iter_3.pth'), 'wb') as f:  # torn, newer than iter_2
        f.write(open(os.path.join(work, 'iter_2.pth'), 'rb').read()[:5000])
    with open(os.path.join(work, 'last_checkpoint'), 'w') as f:
        f.write(os.path.join(work, 'iter_3.pth'))
    run = train(work, toy_root, '--resume', **extra)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert 'iter_3.pth is unreadable' in out
    assert 'resumed epoch: 0, iter: 2' in out
    assert_same_weights(os.path.join(straight, 'iter_4.pth'), os.path.join(work, 'iter_4.pth'))


@pytest.mark.slow
def test_two_processes_under_the_ddp_strategy_are_preempted_and_resume_exactly(toy_root,
                                                                             tmp_path):
    """tools/dist_train.sh, 2 gloo processes, FlexibleRunner's default DDPStrategy (its
    model wrapper made to take CPU modules): SIGTERM to one process, then --resume."""
    extra = {'train_cfg.max_iters': 6, 'default_hooks.checkpoint.interval': 100,
             'train_dataloader.batch_size': 1, **FLEXIBLE}
    straight = str(tmp_path / 'straight')
    out = finish(dist_train(straight, toy_root, 2, free_port(), extra))
    assert 'exitcode' not in out and os.path.isfile(os.path.join(straight, 'iter_6.pth')), \
        out[-3000:]
    meta = checkpoint_meta(os.path.join(straight, 'iter_6.pth'))
    assert 'mmengine' in meta and 'mmengine_version' not in meta, sorted(meta)

    work = str(tmp_path / 'preempted')
    proc = dist_train(work, toy_root, 2, free_port(), extra)
    try:
        started = wait_for(lambda: any(r.get('iter', 0) >= 2 for r in scalars(work)), proc)
        assert started, 'training did not start'
        os.kill(train_workers(proc.pid)[1], signal.SIGTERM)
    finally:
        out = finish(proc)
    assert f'exiting with status {PREEMPTED_EXIT_CODE}' in out, out[-3000:]
    assert_preempted_launch(out)
    preempt = glob.glob(os.path.join(work, 'iter_*.pth'))
    assert len(preempt) == 1 and not preempt[0].endswith('iter_6.pth'), out[-3000:]
    out = finish(dist_train(work, toy_root, 2, free_port(), extra, '--resume'))
    assert 'resumed epoch: 0, iter:' in out and 'exitcode' not in out, out[-3000:]
    assert_same_weights(os.path.join(straight, 'iter_6.pth'), os.path.join(work, 'iter_6.pth'))


@pytest.mark.parametrize('strategy', ['FSDPStrategy', 'DeepSpeedStrategy'])
def test_a_strategy_that_saves_on_every_process_is_refused_before_the_run(
        toy_root, tmp_path, strategy):
    work = str(tmp_path / 'work')
    run = train(work, toy_root, **{'strategy.type': strategy})
    assert run.returncode == 2, run.stderr[-3000:]
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith('error: AtomicCheckpointHook writes checkpoints on process 0 '
                           f'only, but the FlexibleRunner strategy {strategy} saves on every '
                           'process'), line
    assert "strategy=dict(type='DDPStrategy')" in line
    assert not os.path.exists(work)  # nothing built or written


#: build_runner and the checkpoint hooks under an FSDP config, in a process of its own (a
#: test run's view: no process state left by other tests)
TEST_RUN_UNDER_FSDP = textwrap.dedent('''
    import sys
    from inline_mm.engine.hooks.atomic_checkpoint import AtomicCheckpointHook
    from inline_mm.engine.hooks.preemption import PreemptionHook
    from inline_mm.engine.launch import read_config
    from inline_mm.engine.runners import build_runner
    from inline_mm.errors import ConfigError
    config, work, root = sys.argv[1:4]
    cfg = read_config(config)
    cfg.merge_from_dict(dict(work_dir=work, runner_type='FlexibleRunner',
                             strategy=dict(type='FSDPStrategy')))
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = root + '/'
    try:
        build_runner(cfg)
    except ConfigError as err:
        print('@ training:', err)
    runner = build_runner(cfg, training=False)
    print('@ strategy:', type(runner.strategy).__name__)
    for hook in runner.hooks:
        if isinstance(hook, (AtomicCheckpointHook, PreemptionHook)):
            hook.before_run(runner)
            print('@ before_run:', type(hook).__name__)
            try:
                hook.before_train(runner)
            except ConfigError as err:
                print('@ before_train:', err)
            hook.after_run(runner)
''')


def test_a_test_run_is_not_refused_for_a_strategy_that_saves_on_every_process(toy_root,
                                                                             tmp_path):
    """tools/test.py writes no checkpoints: build_runner(training=False) builds the
    FlexibleRunner of an FSDP config, and the hooks refuse the strategy when training
    starts (before_train), not in before_run, which a test run calls too."""
    run = subprocess.run([sys.executable, '-c', TEST_RUN_UNDER_FSDP, TOY_DET_CONFIG,
                          str(tmp_path / 'work'), toy_root], capture_output=True, text=True,
                         env=tool_env(), cwd=REPO_ROOT, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line[2:] for line in run.stdout.splitlines() if line.startswith('@ ')]
    refusal = 'writes checkpoints on process 0 only, but the FlexibleRunner strategy ' \
              'FSDPStrategy saves on every process'
    assert len(lines) == 6, lines
    assert lines[0].startswith(f'training: AtomicCheckpointHook {refusal}')
    assert lines[1] == 'strategy: FSDPStrategy'
    assert lines[2] == 'before_run: AtomicCheckpointHook'
    assert lines[3].startswith(f'before_train: AtomicCheckpointHook {refusal}')
    assert lines[4] == 'before_run: PreemptionHook'
    assert lines[5].startswith(f'before_train: PreemptionHook {refusal}')


def test_only_strategies_that_save_on_process_0_pass_the_check():
    from mmengine.registry import STRATEGIES

    from inline_mm.engine.hooks.atomic_checkpoint import check_rank0_saves
    from inline_mm.errors import ConfigError

    class MyDDP(STRATEGIES.get('DDPStrategy')):  # a user's strategy, mmengine's save
        pass

    for name in ('SingleDeviceStrategy', 'DDPStrategy'):
        check_rank0_saves(STRATEGIES.get(name), 'PreemptionHook')
    check_rank0_saves(MyDDP, 'PreemptionHook')
    for name in ('FSDPStrategy', 'DeepSpeedStrategy', 'ColossalAIStrategy'):
        with pytest.raises(ConfigError, match=f'PreemptionHook writes checkpoints on process 0 '
                           f'only, but the FlexibleRunner strategy {name} saves on every'):
            check_rank0_saves(STRATEGIES.get(name), 'PreemptionHook')
