"""What the model-zoo tools share: read a finished run.

* :func:`read_run`: from what mmengine's Runner wrote into a work dir (the config its newest
  checkpoint records, else the config dump,
  ``<timestamp>/vis_data/scalars.json`` or the JSON log, the checkpoints, the text log's
  environment block) -> a :class:`Run`: the config, the checkpoint, the final metrics,
  peak training memory, median iteration time, devices and schedule;
* :func:`check_loads_into_model`: the checkpoint loads into the config's model.

What a run gives the zoo (its weights file, metafile entry, README cell): :mod:`_entry`.
"""
import glob
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

#: config folders of the zoo and their toolkit
TASK_DIRS = {'det': 'mmdet', 'seg': 'mmseg'}


@dataclass
class Run:
    """A finished training run of one of the zoo's configs, as its work dir records it."""
    work_dir: str
    name: str  # the config's name (file stem), the metafile entry's Name
    config: str  # our config, relative to the zoo root (configs/det/...)
    task: str  # 'mmdet' or 'mmseg'
    cfg: Any  # mmengine Config of the dump
    checkpoint_path: str
    checkpoint: dict
    iteration: int  # of the published checkpoint
    schedule: Tuple[str, int]  # ('Epochs', 12) or ('Iterations', 80000)
    config_schedule: Optional[Tuple[str, int]]  # the zoo config's own (None: it has none)
    metrics: Dict[str, float]  # the validation row of the checkpoint, as logged
    ema: bool = False
    memory_gb: Optional[float] = None
    iter_time_s: Optional[float] = None
    inference: Dict[str, Any] = field(default_factory=dict)
    resources: Optional[str] = None
    json_logs: List[str] = field(default_factory=list)


# ------------------------------------------------------------------ the zoo's configs
def zoo_configs(root: str) -> Dict[str, str]:
    """Config name -> path relative to ``root`` of every config under configs/det, configs/seg."""
    found = {}
    for sub in TASK_DIRS:
        for path in sorted(glob.glob(osp.join(root, 'configs', sub, '**', '*.py'),
                                     recursive=True)):
            if '__pycache__' not in path:
                found.setdefault(osp.splitext(osp.basename(path))[0], osp.relpath(path, root))
    return found


def alias_target(path: str) -> Optional[str]:
    """The config a short-name config stands for (its whole body is ``_base_ = './X.py'``)."""
    import ast
    with open(path) as f:
        body = ast.parse(f.read()).body
    if len(body) == 1 and isinstance(body[0], ast.Assign) and \
            [getattr(t, 'id', None) for t in body[0].targets] == ['_base_'] and \
            isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        return osp.normpath(osp.join(osp.dirname(path), body[0].value.value))
    return None


# ------------------------------------------------------------------ reading a work dir
def _pointed_checkpoint(work_dir: str) -> Optional[str]:
    """The checkpoint ``last_checkpoint`` names, in ``work_dir`` when it has that file."""
    path = read_pointer(work_dir)
    if not path:
        return None
    # the pointer holds the path the run saw: a copied or moved work dir has its own file
    own = osp.join(work_dir, osp.basename(path))
    return own if osp.isfile(own) else path


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
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a killed process
                    continue
    return rows


def _log_files(work_dir: str) -> Tuple[List[str], List[str]]:
    """(scalars.json or JSON logs, text logs) of every run in ``work_dir``, oldest first."""
    stamps = sorted(d for d in os.listdir(work_dir)
                    if re.fullmatch(r'\d{8}_\d{6}', d) and osp.isdir(osp.join(work_dir, d)))
    scalars, texts = [], []
    for stamp in stamps:
        vis = osp.join(work_dir, stamp, 'vis_data')
        for candidate in (osp.join(vis, 'scalars.json'), osp.join(vis, f'{stamp}.json'),
                          osp.join(work_dir, stamp, f'{stamp}.json')):
            if osp.isfile(candidate):
                scalars.append(candidate)
                break
        text = osp.join(work_dir, stamp, f'{stamp}.log')
        if osp.isfile(text):
            texts.append(text)
    return scalars, texts


def _is_val_row(row: dict, task: str) -> bool:
    if task == 'mmdet':
        return any(k.startswith('coco/') for k in row)
    return 'mIoU' in row


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
    # without training rows every validation row is a candidate, the last one wins
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
        elif _is_val_row(row, task) and trained_to is not None:
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


def _resources(env: Dict[str, str]) -> Optional[str]:
    if 'GPU number' not in env:
        return None
    count = env['GPU number']
    if env.get('CUDA available') == 'True':
        names = [v for k, v in env.items() if re.fullmatch(r'GPU [\d,]+', k)]
        return f"{count}x {names[0] if len(names) == 1 else 'GPUs'}"
    return f'{count}x CPU'


def _test_resolution(cfg: Any) -> Optional[Tuple[int, int]]:
    """(height, width) of the test pipeline's Resize, as mmdet's metafiles write it."""
    loader = cfg.get('test_dataloader') or cfg.get('val_dataloader') or {}
    dataset = loader.get('dataset') or {}
    for step in dataset.get('pipeline') or []:
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
    path = _pointed_checkpoint(work_dir)
    if path is None:
        found = sorted(glob.glob(osp.join(work_dir, 'iter_*.pth')) +
                       glob.glob(osp.join(work_dir, 'epoch_*.pth')), key=_ckpt_iteration)
        path = found[-1] if found else None
    if path is None:
        raise MissingFileError(
            f'work dir {work_dir} has no checkpoint: the run did not finish (train it to the '
            f'end with tools/train.py CONFIG --work-dir {work_dir} --resume)')
    return path


def _schedule(train_cfg: dict) -> Optional[Tuple[str, int]]:
    """``('Epochs', n)`` or ``('Iterations', n)`` of a ``train_cfg``; None without either."""
    if 'max_epochs' in train_cfg:
        return 'Epochs', int(train_cfg['max_epochs'])
    if 'max_iters' in train_cfg:
        return 'Iterations', int(train_cfg['max_iters'])
    return None


def read_run(work_dir: str, root: str = ROOT, which: str = 'last') -> Run:
    """Read a finished run of one of the zoo's configs from its work dir.

    Raises:
        MissingFileError: no work dir, no config dump, no checkpoint, no log.
        ConfigError: the work dir's config is not one of ``root``'s configs.
        DataError: the run did not finish, or its log has no final metrics.
        CheckpointError: the checkpoint cannot be read or is not a runner checkpoint.
    """
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
    experiment = str((last.get('meta') or {}).get('experiment_name', ''))
    names = [experiment[:-16]] if re.fullmatch(r'.+_\d{8}_\d{6}', experiment) else \
        [osp.splitext(d)[0] for d in dumps]  # a checkpoint of mmengine without the name
    name = next((n for n in names if n in ours), None)
    if name is None:
        raise ConfigError(
            f"work dir {work_dir} is a run of {', '.join(repr(n) for n in names)}, which is "
            f"not a config of this model zoo (configs/det, configs/seg under {root}): "
            f"publish runs of those configs, or add the config and its metafile entry first")
    recorded = (last.get('meta') or {}).get('cfg')
    try:
        cfg = Config.fromstring(recorded, file_format='.py') if isinstance(recorded, str) \
            else None
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
    own_schedule = _schedule(Config.fromfile(osp.join(root, config)).get('train_cfg') or {})

    # the run finished when its newest checkpoint is at the end of the schedule
    meta = last.get('meta') or {}
    done = int(meta.get('epoch' if by_epoch else 'iter', -1))
    if done != schedule[1]:
        unit = 'epoch' if by_epoch else 'iteration'
        raise DataError(
            f'the run in {work_dir} did not finish: its last checkpoint '
            f'{osp.basename(last_path)} is at {unit} {done} of {schedule[1]} '
            f"(train_cfg.{'max_epochs' if by_epoch else 'max_iters'}): resume it with "
            f"tools/train.py {config} --work-dir {work_dir} --resume")
    path = _find_checkpoint(work_dir, which)
    checkpoint = last if osp.abspath(path) == osp.abspath(last_path) else _load(path)
    iteration = int((checkpoint.get('meta') or {}).get('iter', -1))

    scalars, texts = _log_files(work_dir)
    if not scalars:
        raise MissingFileError(
            f'work dir {work_dir} has no training log (<timestamp>/vis_data/scalars.json or '
            f'the JSON log): publish from the work dir the run wrote its logs into')
    rows = [row for path_ in scalars for row in _rows(path_)]
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
    val_batch = int((cfg.get('val_dataloader') or {}).get('batch_size', 1))
    inference = {}
    if 'time' in metrics:
        inference = dict(value=round(1000 * float(metrics['time']) / max(val_batch, 1), 1),
                         batch_size=val_batch, resolution=_test_resolution(cfg))
    env = _environment(texts[-1]) if texts else {}
    if inference:
        inference['hardware'] = 'CPU' if env.get('CUDA available') != 'True' else next(
            (v for k, v in env.items() if re.fullmatch(r'GPU [\d,]+', k)), 'GPU')
    return Run(work_dir=work_dir, name=name, config=config, task=task, cfg=cfg,
               checkpoint_path=path, checkpoint=checkpoint, iteration=iteration,
               schedule=schedule, config_schedule=own_schedule,
               metrics={k: float(v) for k, v in metrics.items()
                        if isinstance(v, (int, float))},
               ema='ema_state_dict' in checkpoint,
               memory_gb=round(max(memory) / 1024, 2) if memory else None,
               iter_time_s=round(statistics.median(times), 3) if times else None,
               inference=inference, resources=_resources(env), json_logs=scalars)


def check_loads_into_model(run: Run) -> None:
    """Refuse weights that do not load into the model of the run's config (strict)."""
    from inline_mm.engine.model_fit import check_checkpoint_fits
    from inline_mm.engine.runner_utils import build_model
    model = build_model(run.cfg)
    check_checkpoint_fits(model, run.checkpoint_path)
    result = model.load_state_dict(run.checkpoint['state_dict'], strict=False)
    if result.missing_keys or result.unexpected_keys:
        keys = result.missing_keys or result.unexpected_keys
        raise CheckpointMismatchError(
            f'checkpoint {run.checkpoint_path} does not load into the model of {run.config}: '
            f'{len(result.missing_keys)} missing and {len(result.unexpected_keys)} unexpected '
            f'tensor(s) (e.g. {keys[0]}): publish the checkpoint the run of this config saved')
