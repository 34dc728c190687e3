"""Conventions every tool shares: what the log says about mixed precision, one `error:`
line for a file that is not a fitting checkpoint."""
import os
import re
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
from mmengine.logging import MMLogger

from conftest import REPO_ROOT
from inline_mm.engine.launch import read_config
from inline_mm.engine.amp import configure_amp

DET_CONFIG = os.path.join(REPO_ROOT, 'configs', 'det', 'toy', 'mask_rcnn_inline_pvt_toy.py')


def test_amp_says_in_the_log_what_it_turned_on(tmp_path):
    log = tmp_path / 'amp.log'
    MMLogger.get_instance('amp_log_test', log_file=str(log), log_level='INFO')
    configure_amp(read_config(DET_CONFIG), 'mmdet', device='cpu')
    configure_amp(read_config(DET_CONFIG), 'mmdet', device='cuda')
    text = log.read_text()
    assert '--amp: bfloat16 autocast on the CPU for backbone and neck' in text
    assert '--amp: fp16 mixed precision on cuda (AmpOptimWrapper, loss scale dynamic)' in text


def _tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(REPO_ROOT, 'tools', name), *args],
                          capture_output=True, text=True, cwd=REPO_ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS='1'), timeout=600)


@pytest.mark.parametrize('content', [b'not a checkpoint\n', b'PK\x03\x04truncated'])
def test_infer_refuses_a_file_that_is_not_a_checkpoint(tmp_path, content):
    ckpt, image, out = tmp_path / 'model.pth', tmp_path / 'img.png', tmp_path / 'out'
    ckpt.write_bytes(content)
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    proc = _tool('infer.py', str(image), '--config', DET_CONFIG, '--checkpoint', str(ckpt),
                 '--out-dir', str(out))
    _one_error_line(proc, str(ckpt))
    assert not out.exists()


SEG_CONFIG = os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py')


def _one_error_line(proc, *expected):
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr
    # ours, or argparse's 'PROG: error: ...' (after its usage line); warnings that an old
    # interpreter prints at exit (torch 2.1: ResourceWarning) may follow
    errors = [line for line in proc.stderr.splitlines()
              if line.startswith('error: ') or line.split(': ', 1)[-1].startswith('error: ')]
    assert len(errors) == 1, proc.stderr[-3000:]
    line = errors[0]
    for text in expected:
        assert text in line, line
    return line


def test_test_tool_refuses_unreadable_and_other_models_checkpoints(tmp_path):
    """tools/test.py: a text file, and a segmentor's checkpoint on a detector config
    (mmengine alone loads it with a warning and evaluates 0 mAP), stop before anything
    is written; train.py --resume with a text file too."""
    from inline_mm.engine.launch import read_config
    from inline_mm.engine.runner_utils import build_model
    text = tmp_path / 'notes.pth'
    text.write_bytes(b'the weights are on the shared drive\n')
    seg = tmp_path / 'seg.pth'
    torch.save({'state_dict': build_model(read_config(SEG_CONFIG)).state_dict(),
                'meta': {}}, str(seg))
    work = tmp_path / 'work'
    _one_error_line(_tool('test.py', DET_CONFIG, str(text), '--work-dir', str(work)),
                    str(text))
    line = _one_error_line(_tool('test.py', DET_CONFIG, str(seg), '--work-dir', str(work)),
                           str(seg))
    assert 'segmentor' in line, line
    _one_error_line(_tool('train.py', DET_CONFIG, '--resume', str(text), '--work-dir',
                          str(work)), str(text))
    assert not work.exists()


FULL_DET = os.path.join(REPO_ROOT, 'configs', 'det', 'mask-rcnn_inline-pvt-t_fpn_1x_coco.py')


@pytest.mark.parametrize('tool,args,expected', [
    # an option without '=' (was a ValueError traceback from mmengine's DictAction)
    ('train.py', [DET_CONFIG, '--cfg-options', 'train_cfg.max_iters'],
     ["--cfg-options takes KEY=VALUE pairs, got 'train_cfg.max_iters'"]),
    # the schedule key of the other kind of loop (was the loop's TypeError)
    ('train.py', [FULL_DET, '--cfg-options', 'train_cfg.max_iters=4'],
     ['this config trains by epochs', 'set train_cfg.max_epochs=N instead']),
    # --cfg-options reaches the config in the tools that had none
    ('infer.py', ['img.png', '--config', DET_CONFIG, '--checkpoint', 'x.pth',
                  '--out-dir', 'out', '--cfg-options', 'model.backbone.drop_path_rat=0.1'],
     ["did you mean 'model.backbone.drop_path_rate'"]),
    ('deployment/export_onnx.py', [DET_CONFIG, '--out', 'x.onnx', '--cfg-options',
                                   'model.backbone.drop_path_rat=0.1'],
     ["did you mean 'model.backbone.drop_path_rate'"]),
    ('demo.py', ['--work-dir', 'out', '--data-dir', 'out', '--cfg-options',
                 'model.backbone.drop_path_rat=0.1'],
     ["did you mean 'model.backbone.drop_path_rate'"]),
    ('analysis/benchmark_train.py',
     [SEG_CONFIG, '--cfg-options', 'model.backbone.drop_path_rat=0.1'],
     ["did you mean 'model.backbone.drop_path_rate'"]),
    ('analysis/benchmark_train.py', [SEG_CONFIG], ['is a mmseg config: this benchmark']),
    # a file that is not an image (was the image loader's AssertionError after the model)
    ('infer.py', ['img.png', 'notes.txt', 'empty.jpg', '--config', DET_CONFIG, '--checkpoint',
                  'x.pth', '--out-dir', 'out'],
     ['2 of the 3 file(s) given are not images mmcv can read: ', 'notes.txt, ',
      'empty.jpg; pass image files']),
    ('deployment/infer_onnx.py', ['notes.txt', '--config', SEG_CONFIG, '--onnx', 'x.onnx',
                                  '--out-dir', 'out'],
     ['1 of the 1 file(s) given are not images mmcv can read: ']),
    # a backbone name that is not one (was a KeyError traceback)
    ('analysis/vis_attention.py', ['img.png', '--backbone', 'inline_pvt_x'],
     ["unknown model 'inline_pvt_x': the InLine backbones are inline_pvt_t, inline_pvt_s"]),
])
def test_user_errors_of_the_tools_are_one_line(tmp_path, tool, args, expected):
    image = tmp_path / 'img.png'
    cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
    (tmp_path / 'x.pth').write_bytes(b'')
    (tmp_path / 'notes.txt').write_text('not an image')
    (tmp_path / 'empty.jpg').write_bytes(b'')  # a download that never started
    args = [str(tmp_path / a) if a in ('img.png', 'x.pth', 'out', 'x.onnx', 'notes.txt',
                                       'empty.jpg') else a
            for a in args]
    _one_error_line(_tool(tool, *args), *expected)
    assert not (tmp_path / 'out').exists() and not (tmp_path / 'x.onnx').exists()


@pytest.mark.parametrize('config,options,error', [
    # an argument of the node's type that the config does not spell out, next to a key it
    # is close to (dtype / type): taken, for the type the same call sets too
    (FULL_DET, {'optim_wrapper.type': 'AmpOptimWrapper', 'optim_wrapper.dtype': 'bfloat16'},
     None),
    # entries under a None (the toy backbone's init_cfg = None): mmengine's merge refuses
    # them (was an AttributeError of the check, then mmengine's TypeError)
    (DET_CONFIG, {'model.backbone.init_cfg.type': 'Pretrained',
                  'model.backbone.init_cfg.checkpoint': 'x.pth'},
     "model.backbone.init_cfg is None in the config, not a dict, so --cfg-options cannot set "
     'entries under it; in a config whose _base_ is this one write model = '
     'dict(backbone=dict(init_cfg=dict(_delete_=True, ...)))'),
    # plain OptimWrapper takes no dtype: a typo of type as far as the check can tell, and
    # the message says the type does not take it either
    (FULL_DET, {'optim_wrapper.dtype': 'bfloat16'},
     "optim_wrapper has no entry 'dtype'; OptimWrapper takes no argument 'dtype' "
     "(did you mean 'optim_wrapper.type'?)"),
    (FULL_DET, {'optim_wrapper.typ': 'AmpOptimWrapper'}, "did you mean 'optim_wrapper.type'"),
    (FULL_DET, {'model.backbone.drop_path_rat': 0.1},
     "did you mean 'model.backbone.drop_path_rate'"),
])
def test_options_that_are_arguments_of_the_type_are_not_typos(config, options, error):
    from inline_mm.engine.launch import load_config
    from inline_mm.errors import ConfigError
    if error is None:
        cfg = load_config(config, options)
        for key, value in options.items():  # every option landed where it says
            node = cfg
            for part in key.split('.'):
                node = node[part]
            assert node == value, key
    else:
        with pytest.raises(ConfigError, match=re.escape(error)):
            load_config(config, options)


def test_the_advice_for_entries_under_a_none_works(tmp_path):
    """What the error above says to write, written in a derived config, loads."""
    from inline_mm.engine.launch import load_config
    derived = tmp_path / 'derived.py'
    derived.write_text(f'_base_ = [{DET_CONFIG!r}]\nmodel = dict(backbone=dict(init_cfg=dict('
                       "_delete_=True, type='Pretrained', checkpoint='x.pth')))\n")
    cfg = load_config(str(derived))
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint='x.pth')


def test_train_refuses_a_missing_pretrained_checkpoint_before_writing(tmp_path, toy_root):
    """The backbone's init_cfg checkpoint absent: one line, after the data checks passed and
    before the Runner writes the work dir and its log (mmengine reads it only then)."""
    from conftest import toy_det_options
    config = tmp_path / 'pretrained.py'
    config.write_text(f"_base_ = {DET_CONFIG!r}\nmodel = dict(backbone=dict(init_cfg=dict("
                      "_delete_=True, type='Pretrained',\n"
                      "checkpoint='checkpoints/no_such_weights.pth')))\n")
    work = tmp_path / 'work'
    _one_error_line(_tool('train.py', str(config), '--work-dir', str(work),
                          *toy_det_options(toy_root)),
                    "checkpoint file not found: 'checkpoints/no_such_weights.pth', named by "
                    'model.backbone.init_cfg.checkpoint')
    assert not work.exists()


# ---------------------------------------------------------------- one input-size convention
sys.path[:0] = [os.path.join(REPO_ROOT, 'tools', 'analysis'),
                os.path.join(REPO_ROOT, 'tools', 'deployment')]
SIZE_RULE = 'sizes are WIDTHxHEIGHT, e.g. 1333x800, or N for NxN'
#: every tool that takes an input size: (its module, arguments before the size, the option)
SIZE_TOOLS = {
    'deployment/export_onnx.py': ('export_onnx', [DET_CONFIG, '--out', 'x.onnx'], '--size'),
    'analysis/get_flops.py': ('get_flops', [DET_CONFIG, '--out', 'x.json'], '--size'),
    'analysis/benchmark.py': ('benchmark', ['--models', 'inline_pvt_t', '--out', 'out'],
                              '--sizes'),
    'analysis/benchmark_train.py': ('benchmark_train', [DET_CONFIG, '--out', 'x.json'],
                                    '--size'),
    'analysis/gpu_report.py': ('gpu_report', ['--out', 'out'], '--size'),
    'analysis/vis_attention.py': ('vis_attention', ['img.png', '--out', 'x.png'], '--size'),
    'analysis/benchmark_startup.py': ('benchmark_startup', ['--out', 'out'], '--size'),
}
#: the options that took sizes in another form, and what replaced them
RENAMED = [('export_onnx', '--shape', ['800', '1344']), ('get_flops', '--shape', ['800', '1333']),
           ('export_onnx', '--verify-shapes', ['131x97']),
           ('benchmark_startup', '--input-size', ['128'])]


def _parse(module_name, argv):
    import importlib
    return importlib.import_module(module_name).parse_args(argv)


@pytest.mark.parametrize('tool', sorted(SIZE_TOOLS))
def test_every_tool_takes_sizes_as_width_x_height(tool):
    name, before, option = SIZE_TOOLS[tool]
    value = getattr(_parse(name, before + [option, '96x64']), option.lstrip('-'))
    assert value == ([(64, 96)] if option == '--sizes' else (64, 96))  # (height, width)
    value = getattr(_parse(name, before + [option, '48']), option.lstrip('-'))
    assert value == ([(48, 48)] if option == '--sizes' else (48, 48))


def test_size_options_of_several_sizes_and_the_reports_arguments():
    assert _parse('benchmark', ['--models', 'x', '--sizes', '1333x800', '224']).sizes == \
        [(800, 1333), (224, 224)]
    assert _parse('export_onnx', [DET_CONFIG, '--out', 'x', '--verify-sizes', '131x97',
                                  '33']).verify_sizes == [(97, 131), (33, 33)]
    import gpu_report
    args = gpu_report.parse_args(['--size', '96x64'])
    backbone = gpu_report.backbone_argv(args, 'out')
    train = gpu_report.train_argv(args, DET_CONFIG, 1, 'x.json')
    assert backbone[backbone.index('--sizes') + 1] == train[train.index('--size') + 1] == '96x64'


@pytest.mark.parametrize('tool', sorted(SIZE_TOOLS))
@pytest.mark.parametrize('bad', [['800,1333'], ['0x5'], ['1333', '800'], ['1333x'], ['x800']])
def test_a_malformed_size_is_one_argparse_error(tool, bad, capsys):
    name, before, option = SIZE_TOOLS[tool]
    if option == '--sizes' and len(bad) == 2:
        bad = ['1333x800', '1333,800']  # two tokens are two sizes there: the second is bad
    with pytest.raises(SystemExit) as exit_info:
        _parse(name, before + [option, *bad])
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if 'error: ' in line]
    assert len(errors) == 1 and SIZE_RULE in errors[0] and option in errors[0], errors


@pytest.mark.parametrize('name,option,values', RENAMED)
def test_renamed_size_options_name_their_replacement(name, option, values, capsys):
    before = next(b for n, b, _ in SIZE_TOOLS.values() if n == name)
    with pytest.raises(SystemExit) as exit_info:
        _parse(name, before + [option, *values])
    assert exit_info.value.code == 2
    (error, ) = [line for line in capsys.readouterr().err.splitlines() if 'error: ' in line]
    new = '--verify-sizes WxH ...' if option == '--verify-shapes' else '--size WxH'
    assert f'{option} is now {new}: {SIZE_RULE}' in error


@pytest.mark.parametrize('tool,bad', [(t, b) for t, b in zip(
    sorted(SIZE_TOOLS), [['800,1333'], ['0x5'], ['1333', '800']] * 3)])
def test_a_malformed_size_stops_the_tool_before_it_writes(tmp_path, tool, bad):
    """The whole command line, in a subprocess: exit status 2, one error line, no
    traceback, no output file."""
    _, before, option = SIZE_TOOLS[tool]
    if option == '--sizes' and len(bad) == 2:
        bad = ['1333x800', '0x800']
    (tmp_path / 'img.png').write_bytes(b'')
    args = [str(tmp_path / a) if a in ('img.png', 'out', 'x.onnx', 'x.json', 'x.png') else a
            for a in before]
    _one_error_line(_tool(tool, *args, option, *bad), SIZE_RULE)
    assert sorted(os.listdir(tmp_path)) == ['img.png']


@pytest.mark.parametrize('units,only_with_units,said', [
    (True, True, 'bf16 autocast of backbone + neck + rpn_head'),
    (False, True, 'fp32 (this CPU has no bf16 units'),
    # no CPU flags to read: the wrapper autocasts (it turns off only on a known "no")
    (None, True, 'bf16 units unknown'),
    # the config asks for bf16 on any CPU: the wrapper autocasts there too
    (False, False, 'the config asks for it on any CPU'),
])
def test_the_demo_says_the_precision_the_wrapper_runs(monkeypatch, units, only_with_units,
                                                       said):
    """tools/demo.py's log line against what CPUAutocastOptimWrapper does on that CPU."""
    sys.path.insert(0, os.path.join(REPO_ROOT, 'tools'))
    import demo
    from inline_mm.engine import amp
    monkeypatch.setattr(demo, 'cpu_has_fast_bf16', lambda: units)
    monkeypatch.setattr(amp, 'cpu_has_fast_bf16', lambda: units)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = read_config(DET_CONFIG)
    cfg.optim_wrapper.only_with_bf16_units = only_with_units
    text = demo.set_precision(cfg, 'det', 'auto')
    assert said in text, text
    options = {k: v for k, v in cfg.optim_wrapper.items() if k not in ('type', 'optimizer')}
    wrapper = amp.CPUAutocastOptimWrapper(optimizer=torch.optim.SGD(
        [torch.nn.Parameter(torch.zeros(1))], lr=0.1), **{
            k: v for k, v in options.items() if k in ('dtype', 'parts', 'only_with_bf16_units')})
    assert wrapper.autocast_enabled == text.startswith('bf16'), text


@pytest.mark.parametrize('config', [DET_CONFIG, SEG_CONFIG])
def test_the_demo_fits_the_schedule_to_a_run_length_set_through_cfg_options(config):
    """A run shortened with ``--cfg-options train_cfg.max_iters=N`` gets the same warm-up,
    decay end and logger interval as one shortened with ``--iters N``; the config's own
    length leaves the schedule as written."""
    sys.path.insert(0, os.path.join(REPO_ROOT, 'tools'))
    import demo
    from inline_mm.engine.launch import load_config
    as_written = read_config(config)
    demo.fit_schedule(as_written)
    assert as_written.param_scheduler == read_config(config).param_scheduler
    assert as_written.default_hooks.logger == read_config(config).default_hooks.logger

    cfg = load_config(config, {'train_cfg.max_iters': 7})
    demo.fit_schedule(cfg)
    warmup, decay = cfg.param_scheduler
    assert (warmup.begin, warmup.end, decay.begin, decay.end) == (0, 1, 1, 7)
    assert cfg.default_hooks.logger.interval == 7
