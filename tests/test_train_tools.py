"""The training tools end to end on tiny toy data: multi-process, resume, bad data."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import (REPO_ROOT, TOY_DET_CONFIG, TRAIN_TOOL, free_port, scalars,
                      tool_env, toy_det_options)

from inline_mm.errors import ConfigError


# subprocess runs (training, a fresh interpreter): the slow tier
pytestmark = pytest.mark.slow

CONFIG, TRAIN = TOY_DET_CONFIG, TRAIN_TOOL
SEG_CONFIG = os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py')


options = toy_det_options


def test_two_processes_log_the_same_first_loss_as_one(toy_root, tmp_path):
    single_dir, dist_dir = str(tmp_path / 'single'), str(tmp_path / 'dist')
    common = dict(**{'train_cfg.max_iters': 2, 'default_hooks.checkpoint.interval': 2})
    one = subprocess.run(
        [sys.executable, TRAIN, CONFIG, '--work-dir', single_dir] +
        options(toy_root, **common, **{'train_dataloader.batch_size': 2}),
        capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT)
    assert one.returncode == 0, one.stderr[-3000:]
    two = subprocess.run(
        ['bash', os.path.join(REPO_ROOT, 'tools', 'dist_train.sh'), CONFIG, '2',
         '--work-dir', dist_dir] +
        options(toy_root, **common, **{'train_dataloader.batch_size': 1}),
        capture_output=True, text=True, env=dict(tool_env(), PORT=str(free_port())), cwd=REPO_ROOT)
    assert two.returncode == 0, two.stderr[-3000:]
    assert 'GPU number: 2' in two.stdout + two.stderr  # mmengine's name for the world size
    loss_one = [r for r in scalars(single_dir) if r.get('iter') == 1][0]['loss']
    loss_two = [r for r in scalars(dist_dir) if r.get('iter') == 1][0]['loss']
    # same weights, same images; only the RPN / RoI sampling draws differ per process
    assert loss_two == pytest.approx(loss_one, rel=0.05)
    # checkpoints are written once (by rank 0)
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(dist_dir, '*.pth'))) == \
        ['iter_2.pth']


def _weights(path):
    # a runner checkpoint: mmengine's types allowed for this load only (torch >= 2.6)
    from inline_mm.checkpoint import mmengine_checkpoint_globals
    with mmengine_checkpoint_globals():
        return torch.load(path, map_location='cpu')['state_dict']


def test_killed_run_resumes_to_the_same_weights(toy_root, tmp_path):
    extra = {'train_cfg.max_iters': 6, 'default_hooks.checkpoint.interval': 2,
             'train_dataloader.batch_size': 2}
    straight = str(tmp_path / 'straight')
    run = subprocess.run([sys.executable, TRAIN, CONFIG, '--work-dir', straight] +
                         options(toy_root, **extra), capture_output=True, text=True, env=tool_env(),
                         cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-3000:]

    work = str(tmp_path / 'interrupted')
    proc = subprocess.Popen([sys.executable, TRAIN, CONFIG, '--work-dir', work] +
                            options(toy_root, **extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=tool_env(), cwd=REPO_ROOT)
    deadline = time.time() + 300
    marker = os.path.join(work, 'last_checkpoint')
    while not os.path.exists(marker) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = open(marker).read().strip()
    assert not saved.endswith('iter_6.pth'), 'the run finished before it could be killed'

    resumed = subprocess.run([sys.executable, TRAIN, CONFIG, '--work-dir', work, '--resume'] +
                             options(toy_root, **extra), capture_output=True, text=True,
                             env=tool_env(), cwd=REPO_ROOT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert 'resumed' in (resumed.stdout + resumed.stderr).lower()
    a = _weights(os.path.join(straight, 'iter_6.pth'))
    b = _weights(os.path.join(work, 'iter_6.pth'))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)


def test_missing_data_folder_stops_before_training(tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    (work / 'keep.txt').write_text('earlier results')
    run = subprocess.run([sys.executable, TRAIN, CONFIG, '--work-dir', str(work)] +
                         options(str(tmp_path / 'no_such_data')), capture_output=True,
                         text=True, env=tool_env(), cwd=REPO_ROOT)
    assert run.returncode != 0
    assert 'no_such_data' in run.stderr and 'COCO layout' in run.stderr
    assert sorted(os.listdir(work)) == ['keep.txt']
    assert (work / 'keep.txt').read_text() == 'earlier results'


def test_unreadable_annotation_file_is_named(toy_root, tmp_path):
    import shutil
    root = tmp_path / 'broken'
    shutil.copytree(toy_root, root)
    (root / 'annotations' / 'instances_train.json').write_text('{"images": [')
    run = subprocess.run([sys.executable, TRAIN, CONFIG, '--work-dir', str(tmp_path / 'w')] +
                         options(str(root)), capture_output=True, text=True, env=tool_env(),
                         cwd=REPO_ROOT)
    assert run.returncode != 0
    assert 'instances_train.json' in run.stderr and 'cannot be read' in run.stderr


def test_inference_benchmark_on_two_processes(toy_root, tmp_path):
    out = tmp_path / 'bench.json'
    opts = [o for o in options(toy_root) if 'pipeline.3' not in o and 'deterministic' not in o]
    run = subprocess.run(
        ['bash', os.path.join(REPO_ROOT, 'tools', 'dist_benchmark.sh'), CONFIG, '2',
         '--max-iter', '3', '--warmup', '1', '--log-interval', '2', '--out', str(out),
         '--peak-size', '256'] + opts,
        capture_output=True, text=True, env=dict(tool_env(), PORT=str(free_port())), cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result['world_size'] == 2
    assert [p['rank'] for p in result['per_process']] == [0, 1]
    for p in result['per_process']:
        assert p['images'] == 3 and p['img_per_s'] > 0 and 0 <= p['data_s'] < p['wall_s']
        assert p['img_per_s_model_only'] >= p['img_per_s']
    assert result['total_img_per_s'] == pytest.approx(
        sum(p['img_per_s'] for p in result['per_process']))
    assert 'total over 2 process(es)' in run.stdout + run.stderr


def test_test_and_infer_tools_on_a_trained_checkpoint(toy_root, tmp_path):
    work = str(tmp_path / 'work')
    extra = {'train_cfg.max_iters': 2, 'default_hooks.checkpoint.interval': 2}
    run = subprocess.run([sys.executable, TRAIN, CONFIG, '--work-dir', work] +
                         options(toy_root, **extra), capture_output=True, text=True, env=tool_env(),
                         cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    ckpt = os.path.join(work, 'iter_2.pth')
    out_pkl = str(tmp_path / 'results.pkl')
    test = subprocess.run([sys.executable, os.path.join(REPO_ROOT, 'tools', 'test.py'), CONFIG,
                           ckpt, '--work-dir', str(tmp_path / 'test'), '--out', out_pkl,
                           '--show-dir', 'vis'] + options(toy_root), capture_output=True,
                          text=True, env=tool_env(), cwd=REPO_ROOT)
    assert test.returncode == 0, test.stderr[-3000:]
    assert 'coco/bbox_mAP' in test.stdout + test.stderr
    # the trained weights are what is evaluated (mmengine's runner names the file it loads)
    assert f'Load checkpoint from {ckpt}' in test.stdout + test.stderr
    assert os.path.getsize(out_pkl) > 0
    assert glob.glob(str(tmp_path / 'test' / '*' / 'vis' / '*.jpg')) or \
        glob.glob(str(tmp_path / 'test' / '*' / 'vis' / '*.png'))
    images = sorted(glob.glob(os.path.join(toy_root, 'val', '*.jpg')))
    # an image of the same name from another folder: drawn beside, not over, the first
    os.makedirs(tmp_path / 'other')
    same_name = shutil.copy(images[0], tmp_path / 'other')
    infer = subprocess.run([sys.executable, os.path.join(REPO_ROOT, 'tools', 'infer.py')] +
                           images + [same_name] + ['--config', CONFIG, '--checkpoint', ckpt,
                                     '--out-dir', str(tmp_path / 'pred'), '--score-thr', '0.0'],
                           capture_output=True, text=True, env=tool_env(), cwd=REPO_ROOT)
    assert infer.returncode == 0, infer.stderr[-3000:]
    assert f'loaded the weights of {ckpt}' in infer.stdout + infer.stderr
    written = sorted(os.listdir(tmp_path / 'pred'))
    assert written == sorted([os.path.basename(p)[:-4] + '.png' for p in images] +
                             [os.path.basename(images[0])[:-4] + '_2.png'])


def test_drawings_of_images_that_share_a_name_get_their_own_files():
    from inline_mm.engine.runner_utils import drawing_names
    assert drawing_names(['a/x.jpg', 'b/x.jpg', 'x.png', 'c/x_2.jpg', 'y.jpg']) == \
        ['x.png', 'x_3.png', 'x_4.png', 'x_2.png', 'y.png']
    # one file on case-insensitive file systems
    assert drawing_names(['X.jpg', 'x.jpg', 'X_2.png']) == ['X.png', 'x_3.png', 'X_2.png']


def test_cpu_autocast_wrapper_runs_the_forward_in_bf16():
    from mmengine.optim import build_optim_wrapper

    import inline_mm.engine  # noqa: F401  (registers the wrapper, as custom_imports does)
    model = torch.nn.Linear(4, 2)
    before = model.weight.detach().clone()
    wrapper = build_optim_wrapper(model, dict(type='CPUAutocastOptimWrapper',
                                              optimizer=dict(type='SGD', lr=0.1)))
    with wrapper.optim_context(model):
        out = model(torch.randn(3, 4))
    assert out.dtype == torch.bfloat16
    wrapper.update_params(out.float().square().mean())
    # the parameters (and their update) stay fp32
    assert model.weight.dtype == torch.float32 and not torch.equal(model.weight, before)
    with pytest.raises(ValueError, match="'bfloat16' or 'float16'"):
        build_optim_wrapper(model, dict(type='CPUAutocastOptimWrapper', dtype='int8',
                                        optimizer=dict(type='SGD', lr=0.1)))
    # fp16 without a loss scaler would flush small gradients to zero
    with pytest.raises(ConfigError, match="without loss scaling.*dtype='bfloat16'.*--amp"):
        build_optim_wrapper(model, dict(type='CPUAutocastOptimWrapper', dtype='float16',
                                        optimizer=dict(type='SGD', lr=0.1)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path of --amp")
def test_amp_on_the_cpu(tmp_path):
    """--amp without a GPU: bf16 autocast of a whole segmentor, of the parts a detector's
    config names, on any CPU (the config's only_with_bf16_units yields to --amp)."""
    sys.path.insert(0, os.path.join(REPO_ROOT, 'tools'))
    import train
    args = train.parse_args([SEG_CONFIG, '--amp', '--work-dir', str(tmp_path / 'seg')])
    cfg = train.build_config(args)
    assert cfg.optim_wrapper.type == 'CPUAutocastOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'bfloat16' and 'loss_scale' not in cfg.optim_wrapper
    assert not cfg.optim_wrapper.get('parts')  # the whole forward
    cfg = train.build_config(train.parse_args([CONFIG, '--amp', '--work-dir', str(tmp_path)]))
    assert cfg.optim_wrapper.type == 'CPUAutocastOptimWrapper'
    assert list(cfg.optim_wrapper.parts) == [
        'backbone', 'neck', 'rpn_head', 'roi_head.bbox_head', 'roi_head.mask_head']
    assert 'only_with_bf16_units' not in cfg.optim_wrapper
    assert not os.path.exists(tmp_path / 'seg')  # nothing written before the run starts
