"""A finished run as the model zoo reads it, and what it gives the zoo.

:func:`read_run` reads only what mmengine's Runner wrote into the work dir (the config
the newest checkpoint records, the logs, the checkpoints, the text log's environment
block); :func:`published_checkpoint`, :func:`results_of`, :func:`metadata_of` and
:func:`readme_cell` are the weights file, metafile entry and README cell of the run.
"""
import ast
import datetime
import glob
import hashlib
import io
import json
import os
import os.path as osp
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from inline_mm.engine.checkpoint_files import read_pointer
from inline_mm.errors import (CheckpointError, CheckpointMismatchError, ConfigError, DataError,
                              MissingFileError)

#: the repository root: its configs/ hold the configs, metafiles and READMEs of the zoo
ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TASK_DIRS = {'det': 'mmdet', 'seg': 'mmseg'}

#: metric keys of the logs -> metafile metric names (mmdet's / mmseg's metafiles), x100
DET_METRICS = {'bbox': ('Object Detection', 'box'), 'segm': ('Instance Segmentation', 'mask')}
DET_SUFFIXES = (('', 'AP'), ('_50', 'AP50'), ('_75', 'AP75'), ('_s', 'APs'), ('_m', 'APm'),
                ('_l', 'APl'))
SEG_METRICS = ('mIoU', 'mAcc', 'aAcc')
#: meta entries kept in the published file (mmengine writes them; all plain values)
META_KEYS = ('epoch', 'iter', 'cfg', 'seed', 'experiment_name', 'time', 'mmengine_version',
             'dataset_meta')


@dataclass
class Run:
    work_dir: str
    name: str  # the config's name (file stem), the metafile entry's Name
    config: str  # our config, relative to the zoo root (configs/det/...)
    task: str  # 'mmdet' or 'mmseg'
    cfg: Any  # mmengine Config the run trained with
    checkpoint_path: str
    checkpoint: dict
    iteration: int  # of the published checkpoint
    schedule: Tuple[str, int]  # ('Epochs', 12) or ('Iterations', 80000)
    config_schedule: Optional[Tuple[str, int]]  # the zoo config's own (None: it has none)
    metrics: Dict[str, float]  # the validation row of the checkpoint, as logged
    ema: bool = False
    memory_gb: Optional[float] = None
    iter_time_s: Optional[float] = None
    inference: Dict[str, Any] = field(default_factory=dict)  # the metafile's entry
    resources: Optional[str] = None


def zoo_configs(root: str) -> Dict[str, str]:
    """Config name -> path relative to ``root`` of every config under configs/det, configs/seg."""
    found = {}
    for sub in TASK_DIRS:
        for path in sorted(glob.glob(osp.join(root, 'configs', sub, '**', '*.py'),
                                     recursive=True)):
            found.setdefault(osp.splitext(osp.basename(path))[0], osp.relpath(path, root))
    return found


def alias_target(path: str) -> Optional[str]:
    """The config a short-name config stands for (its whole body is ``_base_ = './X.py'``)."""
    with open(path) as f:
        body = ast.parse(f.read()).body
    if len(body) == 1 and isinstance(body[0], ast.Assign) and \
            [getattr(t, 'id', None) for t in body[0].targets] == ['_base_'] and \
            isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        return osp.normpath(osp.join(osp.dirname(path), body[0].value.value))
    return None


# ------------------------------------------------------------------ reading a work dir
def _ckpt_iteration(path: str) -> int:
    match = re.search(r'(\d+)\.pth$', osp.basename(path))
    return int(match.group(1)) if match else -1


def _load(path: str) -> dict:
    """A runner checkpoint, read with weights_only semantics (mmengine's types allowed)."""
    from inline_mm.checkpoint import load_checkpoint_file
    from inline_mm.engine.checkpoint_files import checkpoint_problem
    problem = checkpoint_problem(path)
    if problem:
        raise CheckpointError(f'checkpoint {path} cannot be read ({problem}): publish another '
                              f'checkpoint of the run (--checkpoint) or resume the run')
    checkpoint = load_checkpoint_file(path)
    if not isinstance(checkpoint.get('state_dict'), dict):
        raise CheckpointError(f'{path} is not a runner checkpoint (no state_dict): pass the '
                              f'work dir of a run of tools/train.py')
    return checkpoint


def _rows(path: str) -> List[dict]:
    rows = []
    with open(path) as f:
        for line in filter(str.strip, f):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a killed process
                pass
    return rows


def _log_files(work_dir: str) -> Tuple[List[str], List[str]]:
    """(scalars.json or JSON logs, text logs) of every run in ``work_dir``, oldest first."""
    scalars, texts = [], []
    for stamp in sorted(os.listdir(work_dir)):
        run = osp.join(work_dir, stamp)
        if not (re.fullmatch(r'\d{8}_\d{6}', stamp) and osp.isdir(run)):
            continue
        scalars += [p for p in (osp.join(run, 'vis_data', 'scalars.json'),
                                osp.join(run, 'vis_data', f'{stamp}.json'),
                                osp.join(run, f'{stamp}.json')) if osp.isfile(p)][:1]
        if osp.isfile(osp.join(run, f'{stamp}.log')):
            texts.append(osp.join(run, f'{stamp}.log'))
    return scalars, texts


def _is_train_row(row: dict) -> bool:
    return 'lr' in row or 'loss' in row


def metrics_at(rows: Sequence[dict], task: str, iteration: int) -> Optional[dict]:
    """The validation row logged for the weights of ``iteration`` (global iterations).

    Training rows carry the iterations done (``step``, as checkpoints' ``meta['iter']``);
    validation rows carry none of their own (mmengine logs them at the epoch, 0 for
    iteration-based loops): the row taken is the last one logged after the last
    training row up to ``iteration`` and before the first training row past it.  A log
    without training rows (a run shorter than the logger's interval) gives its last
    validation row: the evaluation after training, when the run validated at its end.
    """
    last = None
    trained_to = None if any(_is_train_row(row) for row in rows) else 0
    for row in rows:
        if _is_train_row(row):
            step = int(row.get('step', 0))
            if step > iteration:
                if trained_to is not None:
                    break
                continue
            trained_to = step
            last = None  # a validation before this training row is of older weights
        elif trained_to is not None and (any(k.startswith('coco/') for k in row)
                                         if task == 'mmdet' else 'mIoU' in row):
            last = row
    return last


def _environment(text_log: str) -> Dict[str, str]:
    """The 'System environment' / 'Runtime environment' entries mmengine logs at start."""
    env = {}
    with open(text_log, errors='replace') as f:
        for i, line in enumerate(f):
            if i > 400 or line.startswith('Config:') or ' - Config:' in line:
                break
            match = re.match(r'\s{4}([A-Za-z][\w ,.-]*?): (.*)$', line.rstrip('\n'))
            if match:
                env.setdefault(match.group(1), match.group(2).strip())
    return env


def _test_resolution(cfg: Any) -> Optional[Tuple[int, int]]:
    """(height, width) of the test pipeline's Resize."""
    loader = cfg.get('test_dataloader') or cfg.get('val_dataloader') or {}
    for step in (loader.get('dataset') or {}).get('pipeline') or []:
        scale = step.get('scale') if isinstance(step, dict) else None
        if step.get('type') == 'Resize' and isinstance(scale, (list, tuple)) and \
                len(scale) == 2:
            return int(scale[1]), int(scale[0])
    return None


def _find_checkpoint(work_dir: str, which: str) -> str:
    if which not in ('last', 'best'):
        if not osp.isfile(which):
            raise MissingFileError(f'checkpoint {which!r} not found')
        return which
    if which == 'best':
        best = sorted(glob.glob(osp.join(work_dir, 'best_*.pth')), key=_ckpt_iteration)
        if not best:
            raise MissingFileError(
                f'work dir {work_dir} has no best_*.pth checkpoint (the run had no '
                f'default_hooks.checkpoint.save_best): publish the last one (--checkpoint last)')
        return best[-1]
    path = read_pointer(work_dir)
    if path:
        # the pointer holds the path the run saw: a copied or moved work dir has its own file
        own = osp.join(work_dir, osp.basename(path))
        return own if osp.isfile(own) else path
    found = sorted(glob.glob(osp.join(work_dir, 'iter_*.pth')) +
                   glob.glob(osp.join(work_dir, 'epoch_*.pth')), key=_ckpt_iteration)
    if not found:
        raise MissingFileError(
            f'work dir {work_dir} has no checkpoint: the run did not finish (train it to the '
            f'end with tools/train.py CONFIG --work-dir {work_dir} --resume)')
    return found[-1]


def _schedule(train_cfg: dict) -> Optional[Tuple[str, int]]:
    for key, unit in (('max_epochs', 'Epochs'), ('max_iters', 'Iterations')):
        if key in train_cfg:
            return unit, int(train_cfg[key])
    return None


def read_run(work_dir: str, root: str = ROOT, which: str = 'last') -> Run:
    """A finished run of one of the zoo's configs; a UserInputError (one line, the fix)
    for anything else."""
    from mmengine.config import Config
    if not osp.isdir(work_dir):
        raise MissingFileError(f'work dir {work_dir!r} not found')
    dumps = sorted(f for f in os.listdir(work_dir) if f.endswith('.py'))
    if not dumps:
        raise MissingFileError(
            f'work dir {work_dir} has no config dump (*.py): pass the --work-dir of a run '
            f'of tools/train.py (mmengine writes the config there when the run starts)')
    ours = zoo_configs(root)
    # the config the run trained with, as its newest checkpoint records it (its name in the
    # experiment name '<config>_<yyyymmdd_hhmmss>'): a later run in the work dir writes a
    # dump of its own config there (tools/test.py's default work dir is the training's)
    last_path = _find_checkpoint(work_dir, 'last')
    last = _load(last_path)
    meta = last.get('meta') or {}
    experiment = str(meta.get('experiment_name', ''))
    names = [experiment[:-16]] if re.fullmatch(r'.+_\d{8}_\d{6}', experiment) else \
        [osp.splitext(d)[0] for d in dumps]  # a checkpoint of mmengine without the name
    name = next((n for n in names if n in ours), None)
    if name is None:
        raise ConfigError(
            f"work dir {work_dir} is a run of {', '.join(repr(n) for n in names)}, which is "
            f"not a config of this model zoo (configs/det, configs/seg under {root}): "
            f"publish runs of those configs, or add the config and its metafile entry first")
    try:
        cfg = Config.fromstring(meta['cfg'], file_format='.py') \
            if isinstance(meta.get('cfg'), str) else None
    except Exception:  # a dump mmengine could not write back as Python: the file's
        cfg = None
    if cfg is None:
        cfg = Config.fromfile(osp.join(work_dir, f'{name}.py'))
    config = ours[name]
    task = TASK_DIRS[config.split(os.sep)[1]]

    schedule = _schedule(cfg.get('train_cfg') or {})
    if schedule is None:
        raise ConfigError(f'the config of {work_dir} has neither train_cfg.max_epochs nor '
                          f'train_cfg.max_iters: not a training run')
    by_epoch = schedule[0] == 'Epochs'
    done = int(meta.get('epoch' if by_epoch else 'iter', -1))
    if done != schedule[1]:  # the newest checkpoint is not at the end of the schedule
        raise DataError(
            f'the run in {work_dir} did not finish: its last checkpoint '
            f"{osp.basename(last_path)} is at {'epoch' if by_epoch else 'iteration'} {done} "
            f"of {schedule[1]} (train_cfg.{'max_epochs' if by_epoch else 'max_iters'}): "
            f'resume it with tools/train.py {config} --work-dir {work_dir} --resume')
    path = _find_checkpoint(work_dir, which)
    checkpoint = last if osp.abspath(path) == osp.abspath(last_path) else _load(path)
    iteration = int((checkpoint.get('meta') or {}).get('iter', -1))

    scalars, texts = _log_files(work_dir)
    if not scalars:
        raise MissingFileError(
            f'work dir {work_dir} has no training log (<timestamp>/vis_data/scalars.json or '
            f'the JSON log): publish from the work dir the run wrote its logs into')
    rows = [row for log in scalars for row in _rows(log)]
    metrics = metrics_at(rows, task, iteration)
    wanted = 'coco/bbox_mAP' if task == 'mmdet' else 'mIoU'
    if metrics is None or wanted not in metrics:
        raise DataError(
            f'the log of {work_dir} has no {wanted} for the weights of iteration {iteration} '
            f'({osp.basename(path)}): the run did not evaluate them (val_interval / val_begin); '
            f'evaluate them with tools/test.py and train with a final validation')

    train_rows = [r for r in rows if _is_train_row(r)]
    memory = [float(r['memory']) for r in train_rows if 'memory' in r]
    times = [float(r['time']) for r in train_rows if 'time' in r]
    env = _environment(texts[-1]) if texts else {}
    cuda = env.get('CUDA available') == 'True'
    gpus = [v for k, v in env.items() if re.fullmatch(r'GPU [\d,]+', k)]
    resources = None
    if 'GPU number' in env:
        resources = f"{env['GPU number']}x " + \
            ((gpus[0] if len(gpus) == 1 else 'GPUs') if cuda else 'CPU')
    inference = {}
    if 'time' in metrics:
        batch = int((cfg.get('val_dataloader') or {}).get('batch_size', 1))
        inference = dict(value=round(1000 * float(metrics['time']) / max(batch, 1), 1),
                         hardware=(gpus + ['GPU'])[0] if cuda else 'CPU', backend='PyTorch',
                         **{'batch size': batch}, mode='FP32')
        if (resolution := _test_resolution(cfg)):
            inference['resolution'] = str(resolution)
    return Run(work_dir=work_dir, name=name, config=config, task=task, cfg=cfg,
               checkpoint_path=path, checkpoint=checkpoint, iteration=iteration,
               schedule=schedule,
               config_schedule=_schedule(Config.fromfile(osp.join(root, config)).get(
                   'train_cfg') or {}),
               metrics={k: float(v) for k, v in metrics.items()
                        if isinstance(v, (int, float))},
               ema='ema_state_dict' in checkpoint,
               memory_gb=round(max(memory) / 1024, 2) if memory else None,
               iter_time_s=round(statistics.median(times), 3) if times else None,
               inference=inference, resources=resources)


def check_loads_into_model(run: Run) -> None:
    """Refuse weights that do not load into the model of the run's config (strict)."""
    from inline_mm.engine.model_fit import check_checkpoint_fits
    from inline_mm.engine.runner_utils import build_model
    model = build_model(run.cfg)
    check_checkpoint_fits(model, run.checkpoint_path, checkpoint=run.checkpoint)
    result = model.load_state_dict(run.checkpoint['state_dict'], strict=False)
    keys = result.missing_keys or result.unexpected_keys
    if keys:
        raise CheckpointMismatchError(
            f'checkpoint {run.checkpoint_path} does not load into the model of {run.config}: '
            f'{len(result.missing_keys)} missing and {len(result.unexpected_keys)} unexpected '
            f'tensor(s) (e.g. {keys[0]}): publish the checkpoint the run of this config saved')


# ------------------------------------------------------------------ what the run publishes
def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return isinstance(value, (str, int, float, bool, type(None)))


def published_checkpoint(run: Run, date: Optional[str] = None) -> Tuple[str, bytes]:
    """(file name, bytes) of the weights-only checkpoint of ``run``.

    With mmengine's ``EMAHook`` ``state_dict`` holds the averaged weights (the hook swaps
    them in when it saves; the raw ones, ``ema_state_dict``, go with the optimiser);
    ``meta`` keeps plain values only, so the file loads with
    ``torch.load(weights_only=True)`` and no allow-list.
    """
    import torch
    meta = {k: v for k, v in (run.checkpoint.get('meta') or {}).items()
            if k in META_KEYS and _plain(v)}
    buffer = io.BytesIO()
    torch.save({'meta': meta, 'state_dict': run.checkpoint['state_dict']}, buffer)
    data = buffer.getvalue()
    date = date or datetime.datetime.now().strftime('%Y%m%d')
    return f'{run.name}_{date}-{hashlib.sha256(data).hexdigest()[:8]}.pth', data


def results_of(run: Run, dataset: str) -> List[dict]:
    """The metafile ``Results``: box / mask AP x100, one decimal (undefined ones, logged as
    -1, left out), or mIoU / mAcc / aAcc, two decimals."""
    if run.task != 'mmdet':
        metrics = {k: round(run.metrics[k], 2) for k in SEG_METRICS if k in run.metrics}
        return [dict(Task='Semantic Segmentation', Dataset=dataset, Metrics=metrics)]
    results = []
    for kind, (task, prefix) in DET_METRICS.items():
        values = {f'{prefix} {label}': run.metrics.get(f'coco/{kind}_mAP{suffix}')
                  for suffix, label in DET_SUFFIXES}
        metrics = {k: round(100 * v, 1) for k, v in values.items() if v is not None and v >= 0}
        if metrics:
            results.append(dict(Task=task, Dataset=dataset, Metrics=metrics))
    return results


def metadata_of(run: Run) -> Dict[str, Any]:
    """The ``Metadata`` keys a run measures (the others of the entry stay as they are)."""
    meta: Dict[str, Any] = {run.schedule[0]: run.schedule[1]}
    for key, value in (('Training Resources', run.resources),
                       ('Training Memory (GB)', run.memory_gb),
                       ('Training Time (s/iter)', run.iter_time_s)):
        if value is not None:
            meta[key] = value
    if run.inference:
        meta['inference time (ms/im)'] = [run.inference]
    if run.ema:
        meta['Training Techniques'] = ['EMA']
    return meta


def readme_cell(run: Run, link: str) -> str:
    """The "ours" cell: box AP / mask AP, or mIoU / mAcc, with the model link; a run of
    another schedule than the config's (the row's schedule column) says so."""
    if run.task == 'mmdet':
        values = [run.metrics.get(f'coco/{k}_mAP') for k in DET_METRICS]
        text = ' / '.join(f'{100 * v:.1f}' for v in values if v is not None and v >= 0)
    else:
        text = ' / '.join(f'{run.metrics[k]:.2f}' for k in ('mIoU', 'mAcc') if k in run.metrics)
    if run.config_schedule is not None and run.schedule != run.config_schedule:
        (unit, count), (own_unit, own_count) = run.schedule, run.config_schedule
        own = f' {own_unit.lower()}' if own_unit != unit else ''
        text += f" ({count} {unit.lower()}, not the config's {own_count}{own})"
    return f'{text} ([model]({link}))'
