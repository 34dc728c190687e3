"""The one path the command-line tools take to a Runner, and their error handling.

Every tool that runs a model through mmengine's ``Runner`` (``tools/train.py``,
``tools/test.py``, the demo) goes through the same steps, written once here:

1. :func:`load_config`: read the config, apply ``--cfg-options`` (refusing a
   key whose parent does not exist or that looks like a typo of an existing
   one), set the launcher;
2. :func:`run_with_runner`: set up the process group (gloo on CPU machines),
   check the data folders and the dataset classes against the config on
   process 0 (before anything is built or written; every process stops with
   its verdict), build the Runner, run the action, and tear the process group
   down whatever happens.

:func:`cli_main` wraps a tool's ``main``: an error in the user's input (a
:class:`~inline_mm.errors.UserInputError`: missing data folder, annotation or
checkpoint file, unknown config option, bad arch, classes that do not match)
prints one ``error: ...`` line and exits with status 2; any other exception is
a bug and keeps its traceback.
"""
import argparse
import contextlib
import difflib
import importlib
import inspect
import os
import os.path as osp
import sys
import traceback
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Set, TypeVar

from mmengine.config import Config, DictAction
from mmengine.config import utils as config_utils
from mmengine.registry import Registry
from mmengine.utils import is_installed

from ..errors import ConfigError, MissingFileError, UserInputError
from .model_fit import check_pretrained_files

T = TypeVar('T')

#: exit status of a tool stopped by an error in the user's input
USER_ERROR_EXIT = 2


class CfgOptionsAction(DictAction):
    """mmengine's ``DictAction`` that refuses an option without ``=`` in argparse's way
    (usage and one ``error:`` line, exit status 2) instead of a ValueError traceback."""

    def __call__(self, parser, namespace, values, option_string=None):
        bad = [v for v in values if '=' not in v]
        if bad:
            parser.error(f"{option_string} takes KEY=VALUE pairs, got {bad[0]!r} (e.g. "
                         f"{bad[0]}=VALUE; quote values with spaces)")
        super().__call__(parser, namespace, values, option_string)


def add_cfg_options(parser: argparse.ArgumentParser) -> None:
    """``--cfg-options KEY=VALUE ...``, as the toolkits' tools have it."""
    parser.add_argument('--cfg-options', nargs='+', action=CfgOptionsAction, metavar='KEY=VALUE',
                        help='override config entries, e.g. train_cfg.max_iters=100')


def add_runner_args(parser: argparse.ArgumentParser) -> None:
    """``--cfg-options``, ``--launcher`` and ``--local-rank``, as the toolkits' tools have them."""
    add_cfg_options(parser)
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher (tools/dist_train.sh: pytorch)')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0,
                        help=argparse.SUPPRESS)


def _lookup(node: Any, part: str) -> Any:
    """``node[part]`` for a dict or a list (``part`` an index), KeyError otherwise."""
    if isinstance(node, (list, tuple)):
        if not part.lstrip('-').isdigit() or not -len(node) <= int(part) < len(node):
            raise KeyError(part)
        return node[int(part)]
    if isinstance(node, dict) and part in node:
        return node[part]
    raise KeyError(part)


#: the registries a config's ``type`` is looked up in (the toolkits' children of mmengine's)
_REGISTRY_MODULES = ('mmengine.registry', 'mmdet.registry', 'mmseg.registry')


def _constructor_args(kind: Any, scope: Optional[str] = None) -> Set[str]:
    """The named arguments a config node's ``type`` takes (its class and bases), or an
    empty set where the type cannot be found: ``dtype`` of ``AmpOptimWrapper`` is then an
    argument, not a typo of ``type``.  The registries of the config's ``default_scope``
    are searched first (``FPN`` is a name in both toolkits)."""
    if isinstance(kind, str):
        found = None
        first = (f'{scope}.registry',) if scope else ()
        for name in dict.fromkeys(first + _REGISTRY_MODULES):
            try:
                module = importlib.import_module(name)
            except Exception:  # absent, or a toolkit refusing this stack's versions
                continue
            for registry in vars(module).values():
                if isinstance(registry, Registry):
                    try:
                        found = registry.get(kind)
                    except Exception:  # a scope that does not import: not this registry
                        found = None
                    if found is not None:
                        break
            if found is not None:
                break
        kind = found
    if not callable(kind):
        return set()
    names: Set[str] = set()
    for owner in getattr(kind, '__mro__', (kind,)):
        try:
            names.update(inspect.signature(owner).parameters)
        except (TypeError, ValueError):  # builtins without a signature
            continue
    return names


def check_cfg_options(cfg: Config, options: dict) -> None:
    """Refuse ``--cfg-options`` keys that cannot be what the user meant.

    A key part that is missing but close to an existing sibling (a typo such
    as ``train_cfg.max_iter`` for ``max_iters``), or an index past the end of
    a list (``pipeline.9``), raises :class:`ConfigError`.  Other new keys are
    allowed: constructor arguments a config does not spell out
    (``model.backbone.with_cp=True``) and new nested entries
    (``train_dataloader.dataset.metainfo.classes=...``).
    """
    _check_schedule_options(cfg, options)
    tree = cfg.to_dict()  # plain dicts and lists (the public view of the config)
    for key in options:
        parts = key.split('.')
        node: Any = tree
        for depth, part in enumerate(parts):
            try:
                node = _lookup(node, part)
                continue
            except KeyError:
                pass
            where = '.'.join(parts[:depth]) or 'the config'
            if isinstance(node, (list, tuple)):
                raise ConfigError(f"unknown config option '{key}': {where} is a list of "
                                  f'{len(node)} entries, it has no entry {part!r}')
            if not isinstance(node, dict):  # mmengine merges options into dicts only
                override = 'dict(_delete_=True, ...)'  # mmengine: replaces a non-dict
                for name in reversed(parts[1:depth]):
                    override = f'dict({name}={override})'
                raise ConfigError(
                    f"config option '{key}': {where} is {node!r} in the config, not a dict, "
                    f'so --cfg-options cannot set entries under it; in a config whose _base_ '
                    f'is this one write {parts[0]} = {override}')
            close = difflib.get_close_matches(part, [str(k) for k in node], n=1, cutoff=0.8)
            if close:
                # the node's type as it will be: --cfg-options may change it in the same call
                kind = options.get('.'.join(parts[:depth] + ['type']), node.get('type'))
                takes = _constructor_args(kind, cfg.get('default_scope'))
                if part in takes:
                    break  # an argument the config does not spell out (dtype next to type)
                # where the type is known, say that it takes no such argument either
                why = f"; {kind} takes no argument '{part}'" if takes else ''
                raise ConfigError(f"unknown config option '{key}': {where} has no entry "
                                  f"'{part}'{why} (did you mean "
                                  f"'{'.'.join(parts[:depth] + close + parts[depth + 1:])}'?)")
            break


def _check_schedule_options(cfg: Config, options: dict) -> None:
    """Refuse ``train_cfg.max_iters`` on an epoch-based loop and ``max_epochs`` on an
    iteration-based one (the loop would fail with an unexpected-argument traceback)."""
    if 'train_cfg.type' in options:
        return
    train_cfg = cfg.get('train_cfg') or {}
    for name, other, unit in (('max_iters', 'max_epochs', 'epochs'),
                              ('max_epochs', 'max_iters', 'iterations')):
        if f'train_cfg.{name}' in options and other in train_cfg and name not in train_cfg:
            raise ConfigError(
                f"--cfg-options train_cfg.{name}: this config trains by {unit} "
                f"({train_cfg.get('type', 'its loop')} with train_cfg.{other}="
                f'{train_cfg[other]}): set train_cfg.{other}=N instead')


@contextlib.contextmanager
def toolkit_scopes_resolvable(scopes: Sequence[str] = ('mmdet', 'mmseg')) -> Iterator[None]:
    """Let ``mmdet::`` / ``mmseg::`` bases resolve where the toolkit's distribution has
    another name than mmengine expects.

    mmengine reads a ``scope::path`` base from the distribution named in
    ``mmengine.config.utils.MODULE2PACKAGE`` (``mmseg`` -> ``mmsegmentation``).  OneDL's
    continuation ships ``onedl-mmsegmentation``: under its mmengine every ``mmseg::``
    base stops with "mmsegmentation is not installed" although ``mmseg`` imports.  For
    the duration of the block a scope whose distribution is missing but whose module
    imports maps to the module (mmengine then finds it through ``find_spec``); the table
    is restored afterwards, and nothing changes where the distribution is found.
    """
    table = config_utils.MODULE2PACKAGE
    saved = dict(table)
    try:
        for scope in scopes:
            package = table.get(scope)
            if package and package != scope and not is_installed(package) \
                    and is_installed(scope):
                table[scope] = scope
        yield
    finally:
        table.clear()
        table.update(saved)


def read_config(path: str, **kwargs) -> Config:
    """``Config.fromfile`` with the toolkits' ``scope::`` bases resolvable on both lines
    (see :func:`toolkit_scopes_resolvable`)."""
    with toolkit_scopes_resolvable():
        return Config.fromfile(path, **kwargs)


def load_config(path: str, cfg_options: Optional[dict] = None, launcher: str = 'none'
                ) -> Config:
    """Read a config file, apply ``--cfg-options`` and the launcher.

    Raises:
        MissingFileError: the config file does not exist.
        ConfigError: an option key does not fit the config (see :func:`check_cfg_options`).
    """
    if not osp.isfile(path):
        raise MissingFileError(f'config file not found: {path!r}')
    cfg = read_config(path)
    cfg.launcher = launcher
    if cfg_options:
        check_cfg_options(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
    return cfg


def default_work_dir(cfg: Config, config_path: str, work_dir: Optional[str] = None) -> str:
    """``work_dir`` if given, else the config's, else ``work_dirs/<config name>``."""
    return work_dir or cfg.get('work_dir') or osp.join(
        './work_dirs', osp.splitext(osp.basename(config_path))[0])


def set_local_rank(local_rank: int) -> None:
    """Export ``LOCAL_RANK`` for launchers that pass ``--local-rank`` instead."""
    os.environ.setdefault('LOCAL_RANK', str(local_rank))


def init_process_group(cfg: Config, launcher: str) -> None:
    """Start the process group now, as mmengine's Runner would later (no-op without a launcher).

    The dataset checks run before the Runner exists and send their verdict
    to the other processes; the Runner then finds the group initialised and
    keeps it.  CPU-only runs and torchrun restarts are set up by
    :func:`~inline_mm.engine.dist.prepare_distributed`; otherwise this does what
    ``Runner.setup_env`` does: the multi-processing settings, then ``init_dist``
    with ``env_cfg.dist_cfg``.
    """
    import torch.distributed as dist
    from mmengine.dist import init_dist
    from mmengine.utils.dl_utils import set_multi_processing

    from .dist import prepare_distributed
    prepare_distributed(cfg, launcher)
    if launcher == 'none' or dist.is_initialized():
        return
    env_cfg = cfg.get('env_cfg') or {}
    set_multi_processing(**(env_cfg.get('mp_cfg') or {}), distributed=True)
    init_dist(launcher, **(env_cfg.get('dist_cfg') or {}))


def run_with_runner(cfg: Config, launcher: str, loaders: Sequence[str],
                    action: Callable[[Any], T], check_data: bool = True,
                    check_pretrained: bool = False,
                    check: Optional[Callable[[], None]] = None, training: bool = True) -> T:
    """Set up distributed processes, check the data, build the Runner, run ``action``.

    Args:
        cfg: the full config (``work_dir`` set).
        launcher: ``'none'``, ``'pytorch'``, ``'slurm'`` or ``'mpi'``.
        loaders: the dataloaders whose datasets are checked before anything is
            built (e.g. ``('train_dataloader', 'val_dataloader')``).
        action: called with the Runner, e.g. ``lambda r: r.train()``.
        check_data: run :func:`~inline_mm.engine.data_checks.check_datasets`
            (on process 0 of a multi-process job, its verdict shared).
        check_pretrained: then refuse an absent backbone ``init_cfg`` checkpoint
            (:func:`~inline_mm.engine.model_fit.check_pretrained_files`; training reads it).
        check: a tool's own check of the input (e.g. the model and the checkpoint to
            resume from), run first, on process 0 of a multi-process job, its verdict
            shared (:func:`~inline_mm.engine.dist.check_on_process_zero`).
        training: ``action`` trains (the Runner's checkpoint hooks will save);
            False for a test run.

    Returns:
        What ``action`` returns.
    """
    from .atomic_io import check_can_make_folder
    from .data_checks import check_datasets_once
    from .runners import build_runner
    work_dir = str(cfg.get('work_dir') or '')
    if work_dir and '://' not in work_dir:  # mmengine would fail deep inside the Runner
        try:
            check_can_make_folder(work_dir)
        except OSError as err:
            raise ConfigError(f'work dir {work_dir!r} cannot be made: {err.strerror}; pass '
                              f'another --work-dir') from None
    from .dist import (check_on_process_zero, finish_distributed, finish_preempted,
                       lost_peer_message)
    from .signals import PREEMPTED_EXIT_CODE
    init_process_group(cfg, launcher)
    finished = preempted = False
    # if the teardown hangs, the process ends with this status, printing these words first
    # (cli_main, which would print a user error, is not reached then)
    status, last_words = 1, ''
    try:
        if check is not None:
            check_on_process_zero(check, 'the check of the input')
        if check_data:
            check_datasets_once(cfg, loaders)
        if check_pretrained:  # before the Runner writes the work dir and its log
            check_pretrained_files(cfg.get('model'))
        runner = build_runner(cfg, training)
        result = action(runner)
        finished, status = True, 0
        return result
    except SystemExit as stop:
        # PreemptionHook's exit: every process agreed on it at the same step, so all
        # reach the barrier.  Torn down without it, a process could abort at interpreter
        # exit (``terminate called without an active exception``), a status the job
        # scheduler does not requeue
        preempted = stop.code == PREEMPTED_EXIT_CODE
        status = stop.code if isinstance(stop.code, int) else 1
        raise
    except UserInputError as err:
        status, last_words = USER_ERROR_EXIT, f'error: {format_user_error(err)}'
        raise
    except Exception as err:
        # a peer process or node died or stopped answering: say so in one line
        message = lost_peer_message(err, cfg.get('work_dir'))
        if message:
            print(message, file=sys.stderr, flush=True)
        last_words = ''.join(traceback.format_exception(type(err), err, err.__traceback__))
        raise
    finally:
        if preempted:
            finish_preempted()
        else:  # after an error on this process the others may never reach a barrier
            finish_distributed(barrier=finished, status_if_stuck=status,
                               last_words=last_words)


def format_user_error(err: BaseException) -> str:
    """One line for an error in the user's input."""
    return ' '.join(str(err).split())


def cli_main(main: Callable[..., Any], argv: Optional[Iterable[str]] = None) -> int:
    """Run a tool's ``main``; user errors become one line on stderr and exit status 2.

    Returns the exit status (``main``'s result when it is an int, else 0).
    """
    try:
        result = main(argv)
    except UserInputError as err:
        print(f'error: {format_user_error(err)}', file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    return result if isinstance(result, int) else 0
