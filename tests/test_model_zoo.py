"""tools/model_zoo: a finished run -> published checkpoint, metafile entry, README row; the
upstream projects/InLine/ folder, trained and tested with the toolkit's own tools."""
import glob
import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import REPO_ROOT, TOY_DET_CONFIG, scalars, tool_env, toy_det_options
from inline_mm.errors import ConfigError

PUBLISH = os.path.join(REPO_ROOT, 'tools', 'model_zoo', 'publish.py')
DEMO = os.path.join(REPO_ROOT, 'tools', 'demo.py')
EXPORT = os.path.join(REPO_ROOT, 'tools', 'model_zoo', 'export_project.py')
TOY = 'mask_rcnn_inline_pvt_toy'
ITERS = 2
# any import of inline_mm fails: the exported folder must stand alone
NO_INLINE_MM = "import runpy, sys; sys.modules['inline_mm'] = None; sys.argv = sys.argv[1:]; " \
               "runpy.run_path(sys.argv[0], run_name='__main__')"


def _module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zoo = _module(os.path.join(REPO_ROOT, 'tools', 'model_zoo', '_zoo.py'), 'model_zoo_helpers')
metafile = _module(os.path.join(REPO_ROOT, 'tools', 'model_zoo', '_metafile.py'),
                   'model_zoo_metafile')


def _run(args, cwd=REPO_ROOT, env=None, timeout=600):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env=env or tool_env(), timeout=timeout)


def _toolkit_dir(toolkit):
    module = importlib.import_module(toolkit)
    return os.path.join(os.path.dirname(module.__file__), '.mim')


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    """The main job's own run (tools/demo.py, what ``make demo`` runs) on a small toy set:
    ITERS iterations between its untrained and trained evaluations."""
    root = tmp_path_factory.mktemp('demo')
    work, data = str(root / 'work'), str(root / 'data')
    proc = _run([DEMO, '--task', 'det', '--work-dir', work, '--data-dir', data,
                 '--iters', str(ITERS), '--num-train', '8', '--num-val', '2',
                 '--image-size', '128', '--num-vis', '1'])
    # 1: trained no better than untrained, expected after ITERS iterations (said so)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert proc.returncode == 0 or 'did not improve' in proc.stderr, proc.stderr[-3000:]
    result = json.load(open(os.path.join(work, 'metrics.json')))
    return dict(work=work, data=os.path.join(data, 'coco_toy'), result=result)


@pytest.fixture(scope='module')
def run_dir(demo):
    """The demo's work dir: a finished run of the toy detector."""
    return demo['work']


@pytest.fixture
def zoo_root(tmp_path):
    """A copy of the repository's configs/ (their metafiles and READMEs) to publish into."""
    root = tmp_path / 'zoo'
    shutil.copytree(os.path.join(REPO_ROOT, 'configs'), root / 'configs',
                    ignore=shutil.ignore_patterns('__pycache__'))
    return str(root)


def _snapshot(root):
    return {p: open(p, 'rb').read() for p in sorted(
        glob.glob(os.path.join(root, 'configs', '**', '*.yml'), recursive=True) +
        glob.glob(os.path.join(root, 'configs', '**', '*.md'), recursive=True))}


def _final_metrics(work):
    rows = [r for r in scalars(work) if 'coco/bbox_mAP' in r]
    return rows[-1]


def _coco_line(text, kind='bbox'):
    """The numbers of mmdet's '..._mAP_copypaste' line (AP, AP50, AP75, APs, APm, APl)."""
    match = re.findall(rf'{kind}_mAP_copypaste: ([-\d. ]+)', text)
    assert match, text[-3000:]
    return [float(v) for v in match[-1].split()]


# ------------------------------------------------------------------ publish
@pytest.fixture(scope='module')
def published(run_dir, tmp_path_factory):
    """publish.py on the toy run, into a copy of the repository's configs/."""
    root = tmp_path_factory.mktemp('zoo_root')
    shutil.copytree(os.path.join(REPO_ROOT, 'configs'), root / 'configs',
                    ignore=shutil.ignore_patterns('__pycache__'))
    before = _snapshot(str(root))
    out = root / 'published'
    proc = _run([PUBLISH, run_dir, '--root', str(root), '--out-dir', str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = list(out.iterdir())
    assert len(files) == 1, files
    return dict(root=str(root), before=before, path=files[0], stdout=proc.stdout)


def test_publish_writes_checkpoint_entry_and_row(run_dir, published):
    zoo_root, before, published = published['root'], published['before'], published['path']
    assert re.fullmatch(rf'{TOY}_\d{{8}}-[0-9a-f]{{8}}\.pth', published.name)
    assert hashlib.sha256(published.read_bytes()).hexdigest()[:8] == published.name[-12:-4]

    # weights only, loadable with torch's weights_only and no allow-list
    ckpt = torch.load(str(published), map_location='cpu', weights_only=True)
    assert set(ckpt) == {'meta', 'state_dict'}
    assert ckpt['meta']['iter'] == ITERS and ckpt['meta']['dataset_meta']['classes']
    from inline_mm.checkpoint import load_checkpoint_file  # any torch: runner checkpoints
    original = load_checkpoint_file(os.path.join(run_dir, f'iter_{ITERS}.pth'))
    assert set(ckpt['state_dict']) == set(original['state_dict'])
    assert all(torch.equal(ckpt['state_dict'][k], v) for k, v in original['state_dict'].items())

    # the toy metafile's entry, read back by OpenMMLab's model-index loader
    metafile = os.path.join(zoo_root, 'configs', 'det', 'toy', 'metafile.yml')
    with open(os.path.join(zoo_root, 'model-index.yml'), 'w') as f:
        f.write('Import:\n  - configs/det/toy/metafile.yml\n')
    import modelindex
    index = modelindex.load(os.path.join(zoo_root, 'model-index.yml'))
    index.build_models_with_collections()
    model = next(m for m in index.models if m.name == TOY)
    logged = _final_metrics(run_dir)
    results = {r.task: r.metrics for r in model.results}
    for task, kind, prefix in (('Object Detection', 'bbox', 'box'),
                               ('Instance Segmentation', 'segm', 'mask')):
        for suffix, label in (('', 'AP'), ('_50', 'AP50'), ('_75', 'AP75'), ('_s', 'APs')):
            assert results[task][f'{prefix} {label}'] == \
                pytest.approx(round(100 * logged[f'coco/{kind}_mAP{suffix}'], 1))
    # inside the zoo's root: the path relative to it, as the metafiles write their paths
    assert model.weights == os.path.relpath(published, zoo_root)
    assert model.metadata.training_resources == '1x CPU'
    assert model.metadata.training_data == 'inline-mm toy COCO'
    entry = yaml.safe_load(open(metafile))['Models'][0]
    meta = entry['Metadata']
    assert meta['Iterations'] == ITERS
    times = sorted(r['time'] for r in scalars(run_dir) if 'loss' in r)
    assert meta['Training Time (s/iter)'] == pytest.approx(
        (times[(len(times) - 1) // 2] + times[len(times) // 2]) / 2, abs=1e-3)
    # mmengine logs the peak memory of GPU runs only
    memory = [r['memory'] for r in scalars(run_dir) if 'memory' in r]
    assert meta.get('Training Memory (GB)') == (round(max(memory) / 1024, 2) if memory else None)
    inference = meta['inference time (ms/im)'][0]
    assert inference['batch size'] == 2 and inference['hardware'] == 'CPU'
    assert inference['value'] == pytest.approx(1000 * logged['time'] / 2, abs=0.1)

    # only that entry's Results / Weights / measured Metadata lines changed
    after = _snapshot(zoo_root)
    readme = os.path.join(zoo_root, 'configs', 'det', 'toy', 'README.md')
    assert {p for p in before if before[p] != after[p]} == {metafile, readme}
    old, new = before[metafile].decode().split('\n'), after[metafile].decode().split('\n')
    start = old.index(f'  - Name: {TOY}')
    assert new[:start + 4] == old[:start + 4]  # collection, Name, In Collection, Config
    # the entry (the file's last) keeps every key but the results, the weights and the
    # measured metadata (the toy metafile holds the published demo run already)
    measured = {'Iterations', 'Epochs', 'Training Time (s/iter)', 'inference time (ms/im)',
                'Training Memory (GB)', 'Training Resources', 'Training Techniques'}
    old_entry, new_entry = (yaml.safe_load(t)['Models'][0] for t in (before[metafile],
                                                                      after[metafile]))
    assert {k: v for k, v in new_entry['Metadata'].items() if k not in measured} == \
        {k: v for k, v in old_entry['Metadata'].items() if k not in measured}
    assert {k: v for k, v in new_entry.items() if k not in ('Results', 'Weights', 'Metadata')} \
        == {k: v for k, v in old_entry.items() if k not in ('Results', 'Weights', 'Metadata')}
    assert new_entry['Weights'] != old_entry.get('Weights')
    changed = [i for i, (a, b) in enumerate(zip(before[readme].decode().split('\n'),
                                                after[readme].decode().split('\n'))) if a != b]
    assert len(changed) == 1
    row = after[readme].decode().split('\n')[changed[0]]
    box, mask = 100 * logged['coco/bbox_mAP'], 100 * logged['coco/segm_mAP']
    link = os.path.relpath(published, os.path.dirname(readme))
    # the demo's short run is not the config's schedule (the row's schedule column): said so
    assert row.endswith(f"| {box:.1f} / {mask:.1f} ({ITERS} iterations, not the config's 1500) "
                        f'([model]({link})) |'), row


def test_published_checkpoint_reproduces_the_demo_metrics_in_mmdet_test_tool(
        demo, published, tmp_path):
    """mmdet's own tools/test.py on the published file gives the metrics the demo logged
    and wrote into its metrics.json."""
    published = str(published['path'])
    test_tool = os.path.join(_toolkit_dir('mmdet'), 'tools', 'test.py')
    opts = toy_det_options(demo['data'])
    # the config's custom_imports name inline_mm: importable where the package is not installed
    env = dict(tool_env(), PYTHONPATH=os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get('PYTHONPATH')) if p))
    proc = _run([test_tool, TOY_DET_CONFIG, published, '--work-dir', str(tmp_path / 't'), *opts],
                env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged, trained = _final_metrics(demo['work']), demo['result']['trained']
    for kind in ('bbox', 'segm'):
        numbers = _coco_line(proc.stdout + proc.stderr, kind)
        keys = [f'coco/{kind}_mAP{s}' for s in ('', '_50', '_75', '_s', '_m', '_l')]
        assert numbers == [logged[k] for k in keys] == [trained[k] for k in keys]


def test_publish_takes_the_ema_weights(run_dir, zoo_root, tmp_path):
    """A checkpoint saved with mmengine's EMAHook: the averaged weights are published."""
    from inline_mm.engine.launch import read_config
    from mmengine.hooks import EMAHook
    from mmengine.model import ExponentialMovingAverage

    from inline_mm.checkpoint import load_checkpoint_file
    from inline_mm.engine.runner_utils import build_model
    work = tmp_path / 'ema_run'
    shutil.copytree(run_dir, work)
    path = work / f'iter_{ITERS}.pth'
    ckpt = load_checkpoint_file(str(path))
    model = build_model(read_config(str(work / f'{TOY}.py')))
    model.load_state_dict(ckpt['state_dict'])
    ema = ExponentialMovingAverage(model, momentum=0.5)
    ema.update_parameters(model)  # the first update copies the weights
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update_parameters(model)
    ckpt['state_dict'] = model.state_dict()
    hook = EMAHook()
    hook.ema_model = ema
    hook.before_save_checkpoint(None, ckpt)  # what mmengine does when it saves
    torch.save(ckpt, str(path))
    out = tmp_path / 'out'
    proc = _run([PUBLISH, str(work), '--root', zoo_root, '--out-dir', str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    published = torch.load(str(next(out.iterdir())), map_location='cpu', weights_only=True)
    averaged = ema.module.state_dict()
    key = 'backbone.pos_embed1'
    assert key in averaged
    assert all(torch.equal(published['state_dict'][k], averaged[k]) for k in averaged)
    assert not torch.equal(published['state_dict'][key], model.state_dict()[key])
    entry = yaml.safe_load(open(os.path.join(zoo_root, 'configs/det/toy/metafile.yml')))
    assert entry['Models'][0]['Metadata']['Training Techniques'] == ['EMA']


def test_bad_runs_stop_with_one_line_each_and_change_nothing(run_dir, zoo_root, tmp_path):
    from inline_mm.checkpoint import load_checkpoint_file
    bad = {}

    def copy(name):
        bad[name] = tmp_path / name
        shutil.copytree(run_dir, bad[name])
        return bad[name]

    unfinished = copy('unfinished')  # the config asks for more iterations than were run
    ckpt = load_checkpoint_file(str(unfinished / f'iter_{ITERS}.pth'))
    assert f'max_iters={ITERS}' in ckpt['meta']['cfg']  # the config the run trained with
    ckpt['meta']['cfg'] = ckpt['meta']['cfg'].replace(f'max_iters={ITERS}', 'max_iters=10')
    torch.save(ckpt, str(unfinished / f'iter_{ITERS}.pth'))
    no_checkpoint = copy('no_checkpoint')
    for path in no_checkpoint.glob('*.pth'):
        path.unlink()
    (no_checkpoint / 'last_checkpoint').unlink()
    # the config the checkpoint records (its experiment) decides, not a dump of a zoo config
    # that a later run (tools/test.py) left in the work dir
    other = copy('not_ours')
    shutil.copy(other / f'{TOY}.py', other / 'my_detector.py')
    ckpt = load_checkpoint_file(str(other / f'iter_{ITERS}.pth'))
    ckpt['meta']['experiment_name'] = 'my_detector_20261206_000000'
    torch.save(ckpt, str(other / f'iter_{ITERS}.pth'))
    log = next(copy('no_metrics').glob('*/vis_data/scalars.json'))
    log.write_text(''.join(line for line in log.read_text().splitlines(True)
                           if 'coco/' not in line))
    conflict = copy('shape_conflict')
    ckpt = load_checkpoint_file(str(conflict / f'iter_{ITERS}.pth'))
    ckpt['state_dict']['roi_head.bbox_head.fc_cls.weight'] = torch.zeros(7, 256)
    torch.save(ckpt, str(conflict / f'iter_{ITERS}.pth'))

    before = _snapshot(zoo_root)
    out = tmp_path / 'out'
    proc = _run([PUBLISH, run_dir, *map(str, bad.values()), '--root', zoo_root,
                 '--out-dir', str(out)])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert 'Traceback' not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith('error: ')]
    assert len(lines) == len(bad), proc.stderr[-3000:]
    expected = {'unfinished': 'did not finish: its last checkpoint iter_2.pth is at '
                              'iteration 2 of 10',
                'no_checkpoint': 'has no checkpoint',
                'not_ours': "'my_detector', which is not a config of this model zoo",
                'no_metrics': 'has no coco/bbox_mAP for the weights of iteration 2',
                'shape_conflict': 'tensor(s) with other shapes (e.g. '
                                  'roi_head.bbox_head.fc_cls.weight'}
    for (name, path), line in zip(bad.items(), lines):
        assert line.startswith(f'error: {path}: ') and expected[name] in line, line
    assert _snapshot(zoo_root) == before  # the good run is not published either
    assert not out.exists()
    assert not glob.glob(os.path.join(run_dir, 'published'))


def test_publish_reads_the_config_the_run_trained_with(run_dir, zoo_root, tmp_path):
    """A later run in the work dir (tools/test.py's default work dir is the training's)
    rewrites the config dump: the config comes from the newest checkpoint."""
    work = tmp_path / 'tested_after'
    shutil.copytree(run_dir, work)
    dump = work / f'{TOY}.py'
    dump.write_text(dump.read_text().replace(f'max_iters={ITERS}', 'max_iters=4000'))
    # and a test with another zoo config writes its dump beside: the checkpoint names the run
    shutil.copy(os.path.join(REPO_ROOT, 'configs', 'seg', 'toy', 'fpn_inline_pvt_toy.py'),
                work / 'fpn_inline_pvt_toy.py')
    proc = _run([PUBLISH, str(work), '--root', zoo_root, '--out-dir', str(tmp_path / 'out')])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name[:len(TOY) + 1] for p in (tmp_path / 'out').iterdir()] == [TOY + '_']


def test_metafile_edit_that_does_not_read_back_is_refused():
    """A rewrite that lost or changed something is named; it is an error, not an assert."""
    text = open(os.path.join(REPO_ROOT, 'configs', 'det', 'metafile.yml')).read()
    name = 'mask-rcnn_inline-swin-t_fpn_1x_coco'
    results = [dict(Task='Object Detection', Dataset='COCO', Metrics={'box AP': 43.1})]
    weights = 'https://example.org/zoo/x_20261201-0123abcd.pth'
    new = metafile.set_metafile_entry(text, name, results, weights, {'Epochs': 12})
    with pytest.raises(ConfigError, match=r'did not read back \(Weights, Metadata.Epochs '
                                          r'differ.*nothing was written'):
        metafile.check_metafile(text, new, name, results, weights + 'x', {'Epochs': 24})
    other = yaml.safe_load(text)['Models'][0]['Name']
    assert other != name
    broken = new.replace(f'Name: {other}\n', f'Name: {other}-renamed\n', 1)
    with pytest.raises(ConfigError, match=f'the entry {other}'):
        metafile.check_metafile(text, broken, name, results, weights, {'Epochs': 12})


def test_metafile_names_yaml_reads_as_numbers_or_otherwise_are_found_or_named():
    """A name YAML reads as a number is the entry's name; one whose line matches but whose
    YAML reads differently (an escaped quote) is a ConfigError naming it, not a KeyError."""
    text = ('Collections:\n  - Name: C\n    README: configs/det/README.md\n'
            'Models:\n  - Name: 2024\n    In Collection: C\n    Config: a.py\n'
            "  - Name: 'it''s'\n    In Collection: C\n    Config: b.py\n")
    entry = metafile.entry_fields(text, '2024')
    assert entry['Config'] == 'a.py' and entry['_collection']['Name'] == 'C'
    results = [dict(Task='Object Detection', Dataset='COCO', Metrics={'box AP': 1.0})]
    new = metafile.set_metafile_entry(text, '2024', results, 'w.pth', {'Epochs': 1})
    metafile.check_metafile(text, new, '2024', results, 'w.pth', {'Epochs': 1})
    assert metafile.find_entry(text, "it''s") is not None  # the line matches ...
    with pytest.raises(ConfigError, match=r"no Models entry whose Name reads as \"it''s\""):
        metafile.entry_fields(text, "it''s")  # ... its YAML (it's) does not


def test_metafile_edit_keeps_every_other_entry_byte_for_byte():
    """The real det metafile and README: one entry's lines, one row's last cell."""
    path = os.path.join(REPO_ROOT, 'configs', 'det', 'metafile.yml')
    text = open(path).read()
    name = 'mask-rcnn_inline-swin-t_fpn_1x_coco'
    results = [dict(Task='Object Detection', Dataset='COCO', Metrics={'box AP': 43.1})]
    metadata = {'Epochs': 12, 'Training Resources': '8x NVIDIA A100-SXM4-80GB',
                'Training Memory (GB)': 6.21,
                'inference time (ms/im)': [{'value': 61.3, 'hardware': 'NVIDIA A100',
                                            'resolution': '(800, 1333)'}]}
    weights = 'https://example.org/zoo/x_20261201-0123abcd.pth'
    new = metafile.set_metafile_entry(text, name, results, weights, metadata)
    metafile.check_metafile(text, new, name, results, weights, metadata)
    start, end, _ = metafile.find_entry(text, name)
    old_lines, new_lines = text.split('\n'), new.split('\n')
    grown = len(new_lines) - len(old_lines)
    assert new_lines[:start] == old_lines[:start]
    assert new_lines[end + grown:] == old_lines[end:]
    entry = yaml.safe_load(new)['Models'][[m['Name'] for m in yaml.safe_load(text)['Models']]
                                          .index(name)]
    assert entry['Metadata']['FLOPs'] == 275264493056  # kept
    assert entry['Metadata']['Training Resources'] == '8x NVIDIA A100-SXM4-80GB'  # replaced
    with pytest.raises(Exception, match='no Models entry'):
        metafile.set_metafile_entry(text, 'no-such-model', results, weights, metadata)

    readme = open(os.path.join(REPO_ROOT, 'configs', 'det', 'README.md')).read()
    cell = '43.1 / 39.0 ([model](https://example.org/x.pth))'
    edited = metafile.set_readme_row(readme, f'{name}.py', {'ours': cell}, 'README.md')
    diff = [(a, b) for a, b in zip(readme.split('\n'), edited.split('\n')) if a != b]
    assert len(diff) == 1 and len(readme.split('\n')) == len(edited.split('\n'))
    old_row, new_row = diff[0]
    assert old_row.rsplit('|', 2)[0] == new_row.rsplit('|', 2)[0]
    assert new_row.endswith(f'| {cell} |') and f'[{name}.py]({name}.py)' in new_row


def test_readme_cell_says_when_the_run_trained_another_schedule():
    run = zoo.Run(work_dir='w', name='n', config='c', task='mmseg', cfg=None,
                  checkpoint_path='x.pth', checkpoint={}, iteration=80000,
                  schedule=('Iterations', 80000), config_schedule=('Iterations', 80000),
                  metrics={'mIoU': 41.234, 'mAcc': 52.0})
    assert zoo.readme_cell(run, 'x.pth') == '41.23 / 52.00 ([model](x.pth))'
    run.schedule = ('Iterations', 40000)
    assert zoo.readme_cell(run, 'x.pth') == \
        "41.23 / 52.00 (40000 iterations, not the config's 80000) ([model](x.pth))"
    run.schedule, run.config_schedule = ('Epochs', 12), ('Iterations', 80000)
    assert zoo.readme_cell(run, 'x.pth') == \
        "41.23 / 52.00 (12 epochs, not the config's 80000 iterations) ([model](x.pth))"


def test_metrics_of_a_checkpoint_are_those_logged_after_its_iteration():
    rows = [{'coco/bbox_mAP': 0.0}, {'lr': 1, 'step': 10}, {'coco/bbox_mAP': 0.1},
            {'lr': 1, 'step': 20}, {'coco/bbox_mAP': 0.2}]
    assert zoo.metrics_at(rows, 'mmdet', 20)['coco/bbox_mAP'] == 0.2
    assert zoo.metrics_at(rows, 'mmdet', 10)['coco/bbox_mAP'] == 0.1
    assert zoo.metrics_at(rows[:4], 'mmdet', 20) is None  # no validation after the last one
    # a run shorter than the logger interval (the demo's untrained and trained evaluations)
    assert zoo.metrics_at([rows[0], rows[2]], 'mmdet', 4)['coco/bbox_mAP'] == 0.1


# ------------------------------------------------------------------ export
def _layout(tmp_path, toolkit):
    """The toolkit's repository layout: its tools/ copied, its configs/ linked."""
    root = tmp_path / toolkit
    mim = _toolkit_dir(toolkit)
    shutil.copytree(os.path.join(mim, 'tools'), root / 'tools')
    os.symlink(os.path.join(mim, 'configs'), root / 'configs')
    proc = _run([EXPORT, '--toolkit', toolkit, str(root / 'projects')])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _exported_env(root):
    return dict(tool_env(), PYTHONPATH=str(root))


def test_exported_configs_name_the_project_and_the_toolkit_bases_only(tmp_path):
    from inline_mm.engine.launch import read_config
    for toolkit, count in (('mmdet', 12), ('mmseg', 11)):
        root = _layout(tmp_path, toolkit)
        project = root / 'projects' / 'InLine'
        configs = sorted(glob.glob(str(project / 'configs' / '**' / '*.py'), recursive=True))
        assert len(configs) == count
        for path in configs:
            text = open(path).read()
            assert 'inline_mm' not in text and '::' not in text, path
            cfg = read_config(path, import_custom_modules=False)
            assert cfg.custom_imports.imports == ['projects.InLine.inline']
            assert cfg.model.backbone.type.startswith('InLine')
            dumped = cfg.pretty_text
            for name in ('AtomicCheckpointHook', 'SkipBadSamples', 'RNGStateHook',
                         'ResumableEpochBasedTrainLoop', 'NonFiniteLossHook',
                         'CPUAutocastOptimWrapper', 'only_with_bf16_units'):
                assert name not in dumped, (path, name)
            # mmengine's own wrapper (the toy's CPU bf16 autocast is ours: fp32 there)
            assert cfg.optim_wrapper.get('type', 'OptimWrapper') in (
                'OptimWrapper', 'AmpOptimWrapper'), path
            assert 'parts' not in cfg.optim_wrapper, path
            assert cfg.default_hooks.checkpoint.type == 'CheckpointHook'
            dataset = cfg.train_dataloader.dataset
            dataset = dataset.get('dataset', dataset)  # mmseg's RepeatDataset-free recipes
            assert dataset.type in ('CocoDataset', 'ADE20KDataset'), path
        assert not (project / 'inline' / 'engine').exists()
        assert not (project / 'inline' / 'datasets').exists()
        readme = (project / 'README.md').read_text()
        for section in ('## Description', '## Usage', '## Results', '## Citation',
                        '## Checklist'):
            assert section in readme
        meta = yaml.safe_load((project / 'metafile.yml').read_text())
        for model in meta['Models']:
            assert os.path.isfile(root / model['Config']), model['Config']


@pytest.mark.parametrize('wrapper', [
    # our options first, in the middle, last (with and without a trailing comma)
    "dict(type='CPUAutocastOptimWrapper', dtype='bfloat16', parts=['backbone'],\n"
    "     optimizer=dict(type='AdamW', lr=1e-3))",
    "dict(type='CPUAutocastOptimWrapper', optimizer=dict(type='AdamW', lr=1e-3),\n"
    "     dtype='bfloat16', clip_grad=None, parts=['backbone'])",
    "dict(type='CPUAutocastOptimWrapper', optimizer=dict(type='AdamW', lr=1e-3),\n"
    "     dtype='bfloat16', only_with_bf16_units=True,\n     parts=['backbone'],\n)",
])
def test_exported_optim_wrapper_is_mmengines_without_our_options(wrapper):
    """The toy's CPU autocast wrapper becomes mmengine's OptimWrapper, fp32: its own
    options go wherever they stand in the call, the others stay."""
    sys.path.insert(0, os.path.join(REPO_ROOT, 'tools', 'model_zoo'))
    import export_project
    text = export_project.export_config(f'optim_wrapper = {wrapper}\n', depth=3)
    namespace = {}
    exec(text, namespace)  # what mmengine's Config would read
    wrapper = namespace['optim_wrapper']
    assert wrapper['type'] == 'OptimWrapper'
    assert wrapper['optimizer'] == dict(type='AdamW', lr=1e-3)
    assert not {'dtype', 'parts', 'only_with_bf16_units'} & set(wrapper), text


def test_exported_mmdet_project_trains_and_tests_with_mmdets_own_tools(
        demo, published, tmp_path):
    """mmdet's tools/train.py and tools/test.py on the exported toy config, inline_mm
    unimportable; test.py on the published checkpoint of the demo gives its metrics."""
    root = _layout(tmp_path, 'mmdet')
    shutil.copytree(demo['data'], root / 'data' / 'coco_toy')  # the demo's toy set
    config = 'projects/InLine/configs/toy/mask_rcnn_inline_pvt_toy.py'
    proc = _run(['-c', NO_INLINE_MM, 'tools/train.py', config, '--work-dir', 'work',
                 '--cfg-options', f'train_cfg.max_iters={ITERS}',
                 f'default_hooks.checkpoint.interval={ITERS}', 'default_hooks.logger.interval=1'],
                cwd=root, env=_exported_env(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.path.isfile(root / 'work' / f'iter_{ITERS}.pth')
    assert "'projects.InLine.inline'" in open(root / 'work' / f'{TOY}.py').read()

    published = str(published['path'])
    proc = _run(['-c', NO_INLINE_MM, 'tools/test.py', config, published, '--work-dir', 'test'],
                cwd=root, env=_exported_env(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = _final_metrics(demo['work'])
    assert _coco_line(proc.stdout + proc.stderr, 'bbox') == [
        logged[f'coco/bbox_mAP{s}'] for s in ('', '_50', '_75', '_s', '_m', '_l')]


def test_exported_mmseg_project_builds_and_runs_without_inline_mm(tmp_path):
    root = _layout(tmp_path, 'mmseg')
    script = (
        "import sys; sys.modules['inline_mm'] = None\n"
        "import torch\n"
        "from mmengine.config import Config\n"
        "from mmengine.registry import init_default_scope\n"
        "from mmseg.registry import MODELS\n"
        "cfg = Config.fromfile('projects/InLine/configs/"
        "fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py')\n"
        "init_default_scope('mmseg')\n"
        "model = MODELS.build(cfg.model).eval()\n"
        "with torch.no_grad():\n"
        "    out = model(torch.zeros(1, 3, 64, 96), mode='tensor')\n"
        "print(type(model.backbone).__module__, tuple(out.shape))\n")
    proc = _run(['-c', script], cwd=root, env=_exported_env(root))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'projects.InLine.inline.models.backbones.pvt (1, 150, 16, 24)' in proc.stdout
