#!/usr/bin/env python
"""Evaluate a checkpoint on a config's test set (COCO bbox / segm mAP, or mIoU).

    python tools/test.py CONFIG CHECKPOINT [--show-dir DIR] [--out results.pkl]
    bash tools/dist_test.sh CONFIG CHECKPOINT 8

``--show-dir vis`` draws the predictions of every test image into
``<work_dir>/<timestamp>/vis/`` (detectors and segmentors alike).  ``--out``
pickles the predictions: for detectors mmdet's ``DumpDetResults`` (boxes,
scores, labels, masks as RLE), for segmentors the predicted label maps with
the image metadata (no logits).  ``--confusion-matrix cm.json`` (segmentors)
logs the pixel confusion matrix of the test set and writes it to ``cm.json``;
mmseg's ``confusion_matrix.py`` is off by one class on ADE20K-layout sets
(``inline_mm.engine.metrics``).  For detectors mmdet's own
``tools/analysis_tools/confusion_matrix.py`` reads the ``--out`` pickle.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import inline_mm.engine  # noqa: E402,F401  (SegTestVisualizationHook, DumpSegResults)
from inline_mm.engine.model_fit import check_checkpoint_fits  # noqa: E402
from inline_mm.engine.amp import enable_inference_autocast  # noqa: E402
from inline_mm.engine.atomic_io import check_can_write  # noqa: E402
from inline_mm.engine.launch import (add_runner_args, cli_main, default_work_dir,  # noqa: E402
                                     load_config, run_with_runner, set_local_rank)
from inline_mm.engine.runner_utils import build_model, task_of  # noqa: E402
from inline_mm.errors import ConfigError, MissingFileError  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test a detector / segmentor')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--work-dir', help='where the evaluation log goes')
    parser.add_argument('--out', help='dump the predictions to this pickle file (detectors: '
                        'boxes / scores / labels / RLE masks; segmentors: label maps)')
    parser.add_argument('--confusion-matrix', metavar='JSON',
                        help='segmentors: log the pixel confusion matrix of the test set and '
                        'write it to this JSON file')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision: fp16 on a GPU, bf16 on the CPU (detectors: '
                        'backbone and neck, the heads and mmcv ops stay fp32)')
    parser.add_argument('--show-dir', help='draw the predictions of every test image into '
                        '<work_dir>/<timestamp>/<show-dir>/')
    add_runner_args(parser)
    args = parser.parse_args(argv)
    set_local_rank(args.local_rank)
    return args


def _metric_configs(evaluator) -> list:
    """The metric configs of ``test_evaluator``: one, a list, or an Evaluator's ``metrics``."""
    if isinstance(evaluator, dict):
        evaluator = evaluator.get('metrics', evaluator)
    return [evaluator] if isinstance(evaluator, dict) else list(evaluator)


def _type_name(type_) -> str:
    """``'IoUMetric'`` of ``'IoUMetric'``, ``'mmseg.IoUMetric'`` and the class itself."""
    return type_.__name__ if isinstance(type_, type) else str(type_).rsplit('.', 1)[-1]


def _check_output_file(path: str, option: str, atomic: bool) -> None:
    """Stop before the test run when a local file it writes at the end cannot be written."""
    if '://' in path:
        if atomic:  # written through atomic_write, which writes local files
            raise ConfigError(f'{option} writes a local file, got {path!r}')
        return  # a path of one of mmengine's file backends (s3:// ...): its own business
    try:
        check_can_write(path, atomic)
    except OSError as err:
        raise ConfigError(f'{option} {path!r} cannot be written ({err.strerror}): name a '
                          'file in a writable folder') from err


def main(argv=None) -> None:
    args = parse_args(argv)
    if not osp.isfile(args.checkpoint):
        raise MissingFileError(f'checkpoint {args.checkpoint!r} not found')
    cfg = load_config(args.config, args.cfg_options, args.launcher)
    task = task_of(cfg)
    if args.confusion_matrix and task != 'mmseg':
        raise ConfigError('--confusion-matrix is for segmentors; for a detector, write the '
                          'predictions with --out results.pkl and run mmdet\'s '
                          'tools/analysis_tools/confusion_matrix.py on them')
    # a file that is not a checkpoint, or one of another model (mmengine loads it with a
    # warning and evaluates to 0 mAP), stops here in one line, before anything is written
    check_checkpoint_fits(build_model(cfg), args.checkpoint)
    cfg.work_dir = default_work_dir(cfg, args.config, args.work_dir)
    cfg.load_from = args.checkpoint
    if args.show_dir:
        hook = cfg.default_hooks.visualization
        hook.draw = True
        if task == 'mmseg':  # mmdet's hook has test_out_dir; this one gives mmseg the same
            hook.type = 'SegTestVisualizationHook'
        hook.test_out_dir = args.show_dir
    evaluators = _metric_configs(cfg.test_evaluator)
    added, first = [], []
    if args.out:
        if not args.out.endswith(('.pkl', '.pickle')):
            raise ConfigError(f'--out must end with .pkl, got {args.out!r}')
        _check_output_file(args.out, '--out', atomic=False)  # mmengine's dump
        added.append(dict(type='DumpDetResults' if task == 'mmdet' else 'DumpSegResults',
                          out_file_path=args.out))
    if args.confusion_matrix:
        _check_output_file(args.confusion_matrix, '--confusion-matrix', atomic=True)
        # first: on a test set without label maps its message, not IoUMetric's KeyError;
        # the pixels it counts are those the config's IoUMetric scores
        ignore_index = next((e.get('ignore_index', 255) for e in evaluators
                             if _type_name(e.get('type')) == 'IoUMetric'), 255)
        first.append(dict(type='SegConfusionMatrix', out_file=args.confusion_matrix,
                          ignore_index=ignore_index))
    if added or first:
        if isinstance(cfg.test_evaluator, dict) and 'metrics' in cfg.test_evaluator:
            cfg.test_evaluator.metrics = [*first, *evaluators, *added]  # an Evaluator's
        else:
            cfg.test_evaluator = [*first, *evaluators, *added]

    def test(runner):
        if args.amp:
            enable_inference_autocast(runner.model, task)
        return runner.test()

    run_with_runner(cfg, args.launcher, ('test_dataloader',), test, training=False)


if __name__ == '__main__':
    sys.exit(cli_main(main))
