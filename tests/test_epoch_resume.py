"""The README's own-data config (an epoch-based full recipe) preempted in the middle of
an epoch: SIGTERM, exit 75, ``--resume``, and the same weights as an uninterrupted run."""
import glob
import os
import re

import pytest
import torch
from test_custom_data import readme_config, run, shapes_coco  # noqa: F401  (fixture)

from conftest import REPO_ROOT, assert_same_weights
from inline_mm.engine.hooks.preemption import PENDING_VALIDATION
from inline_mm.engine.signals import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.slow

PLUGINS = os.path.join(REPO_ROOT, 'tests', 'plugins')
BASE = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')


def write_config(path, root, signal=None):
    """The README's block, with its base named by full path; optionally a test-only hook
    of tests/plugins/preempt_at.py that sends SIGTERM (a config dict's text)."""
    text = readme_config('custom-coco-config').replace(
        "'./mask-rcnn_inline-pvt-t_fpn_1x_coco.py'", repr(BASE)).replace(
        "'data/my_set/'", repr(root + '/'))
    if signal is not None:
        text += ("\ncustom_imports = dict(imports=['inline_mm', 'inline_mm.engine', "
                 "'preempt_at'], allow_failed_imports=False)\n"
                 "custom_hooks = [dict(type='MeanLossLoggerHook'), dict(type='RNGStateHook'), "
                 f"dict(type='PreemptionHook'), dict(type='NonFiniteLossHook'), {signal}]\n")
    path.write_text(text)
    return str(path)


#: small for the CPU: no ImageNet weights, one block a stage, 128 px, epochs of 2 batches of
#: 2 (4 images), flip on
BASE_OPTIONS = ['--cfg-options', 'model.backbone.init_cfg=None',
                'model.backbone.depths=[1,1,1,1]',
                'train_dataloader.dataset.pipeline.2.scale=(128,128)',
                'train_dataloader.batch_size=2', 'default_hooks.logger.interval=1',
                'randomness.seed=0', 'randomness.deterministic=True']

#: (options, epochs): 2 epochs with the loader in the main process, no validation; or 3
#: epochs with the recipe's own loaders (2 persistent workers each, mmdet's dataset base:
#: the loop makes the training ones per-epoch) and a validation after each epoch, so the
#: resumed run validates (with fresh workers) before it trains epoch 3
LOADERS = {'main-process': (['train_dataloader.num_workers=0',
                             'train_dataloader.persistent_workers=False',
                             'train_cfg.max_epochs=2', 'train_cfg.val_interval=10'], 2),
           'recipe-workers-validating': (['train_cfg.max_epochs=3',
                                          'train_cfg.val_interval=1'], 3)}
#: mmengine's FlexibleRunner (runner_type, its single-device strategy) writes the epoch / iter
#: of its own count into every checkpoint: the preemption's must keep theirs
LOADERS['main-process-flexible-runner'] = (LOADERS['main-process'][0] +
                                           ['runner_type=FlexibleRunner'], 2)


def train(tmp_path, root, name, options, *args, signal=None):
    """tools/train.py on the own-data config in ``tmp_path / name`` (``signal``: a
    test-only hook's config text, see :func:`write_config`)."""
    config = write_config(tmp_path / f'{name}.py', root, signal)
    env = dict(PYTHONPATH=PLUGINS + os.pathsep + os.environ.get('PYTHONPATH', ''))
    return run([config, '--work-dir', str(tmp_path / name), *args, *options], **env)


@pytest.mark.parametrize('loader', list(LOADERS))
def test_mid_epoch_sigterm_resumes_exactly(shapes_coco, tmp_path, loader):  # noqa: F811
    OPTIONS, epochs = BASE_OPTIONS + LOADERS[loader][0], LOADERS[loader][1]
    out = train(tmp_path, shapes_coco, 'straight', OPTIONS)
    assert out.returncode == 0, out.stderr[-3000:]

    work = tmp_path / 'preempted'
    # iterations 0-1 are epoch 1, 2-3 epoch 2: the signal before iteration 2 stops the
    # run after it, with one batch of epoch 2 trained
    out = train(tmp_path, shapes_coco, 'preempted', OPTIONS,
                signal="dict(type='SignalAtIterationHook', iteration=2)")
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr[-3000:]
    assert sorted(os.path.basename(p) for p in glob.glob(str(work / '*.pth'))) == \
        ['epoch_1.pth', 'preempt_iter_3.pth']

    # the relaunch (the same command with --resume, as after a Slurm requeue)
    out = train(tmp_path, shapes_coco, 'preempted', OPTIONS, '--resume')
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert ('persistent_workers turned off' in log) == ('workers' in loader)
    trained = re.findall(r'Epoch\(train\) +\[(\d+)\]\[ *(\d+)/(\d+)\]', log)
    # only the batch after the stop, then the later epochs
    assert trained == [('2', '2', '2')] + [(str(e), str(b), '2') for e in range(3, epochs + 1)
                                          for b in (1, 2)], log[-3000:]
    assert 'day' not in ''.join(re.findall(r'eta: [^ ]+ [^ ]*', log))  # no negative ETA
    # the later checkpoint replaces the preemption's
    assert sorted(os.path.basename(p) for p in glob.glob(str(work / '*.pth'))) == \
        [f'epoch_{e}.pth' for e in range(1, epochs + 1)]
    last = f'epoch_{epochs}.pth'
    assert_same_weights(tmp_path / 'straight' / last, work / last)


@pytest.mark.parametrize('runner', ['Runner', 'FlexibleRunner'])
def test_a_sigterm_in_the_validation_after_an_epoch_resumes_with_it(shapes_coco,  # noqa: F811
                                                                     tmp_path, runner):
    """SIGTERM during the validation after epoch 1 (the recipe's loaders, a validation
    after each epoch): exit 75 at once with ``epoch_1.pth`` recording the validation as
    pending; the resumed run validates, then trains epochs 2 and 3 to the weights of an
    uninterrupted run."""
    OPTIONS, epochs = BASE_OPTIONS + LOADERS['recipe-workers-validating'][0], 3
    if runner == 'FlexibleRunner':
        OPTIONS = OPTIONS + ['runner_type=FlexibleRunner']
    validated = r'Epoch\(val\) \[\d+\]\[\d+/\d+\] +coco/bbox_mAP'
    out = train(tmp_path, shapes_coco, 'straight', OPTIONS)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(re.findall(validated, out.stdout + out.stderr)) == epochs

    work = tmp_path / 'preempted'
    out = train(tmp_path, shapes_coco, 'preempted', OPTIONS,
                signal="dict(type='SignalInValidationHook', after_iteration=2)")
    assert out.returncode == PREEMPTED_EXIT_CODE, out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert 'at the validation after iteration 2: checkpoint' in log, log[-3000:]
    assert [os.path.basename(p) for p in glob.glob(str(work / '*.pth'))] == ['epoch_1.pth']
    checkpoint = torch.load(work / 'epoch_1.pth', map_location='cpu', weights_only=False)
    assert checkpoint['meta']['epoch'] == 1 and checkpoint['meta']['iter'] == 2
    assert checkpoint['message_hub']['runtime_info'][PENDING_VALIDATION] == 2

    out = train(tmp_path, shapes_coco, 'preempted', OPTIONS, '--resume')
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert 'the validation after iteration 2 was interrupted by a preemption' in log
    assert len(re.findall(validated, log)) == epochs  # the one interrupted, then 2 and 3
    trained = re.findall(r'Epoch\(train\) +\[(\d+)\]\[ *(\d+)/(\d+)\]', log)
    assert trained == [(str(e), str(b), '2') for e in (2, 3) for b in (1, 2)], log[-3000:]
    assert_same_weights(tmp_path / 'straight' / 'epoch_3.pth', work / 'epoch_3.pth')
