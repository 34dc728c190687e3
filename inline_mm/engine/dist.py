"""Multi-process runs without GPUs (CPU + gloo), e.g. tests and CPU clusters.

mmengine 0.10.7 assumes CUDA once a launcher is set: its ``init_dist`` calls
``torch.cuda.set_device`` and its runner wraps the model in DDP with
``device_ids=[LOCAL_RANK]``.  :func:`prepare_distributed` initialises the
process group itself (gloo) when no GPU is present, and points the runner at
:class:`AnyDeviceDistributedDataParallel`, which drops ``device_ids`` for CPU
modules (also as a ``FlexibleRunner``'s DDP strategy wrapper); on GPU machines
both leave mmengine's behaviour untouched, except
after a torchrun restart (:func:`torchrun_store`).

:func:`lost_peer_message` turns the error of a collective whose peer died or
stopped answering into one line that says what to do.
"""
import logging
import os
import sys
import threading
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, List, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.config import Config
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS, STRATEGIES

from ..errors import ConfigError, UserInputError
from .bad_samples import remove_bad_sample_records
from .checkpoint_files import read_pointer
from .hooks.runner_access import names_flexible_runner
from .signals import PREEMPTED_EXIT_CODE


@MODEL_WRAPPERS.register_module()
class AnyDeviceDistributedDataParallel(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that also wraps CPU modules."""

    def __init__(self, module, device_ids=None, **kwargs):
        if next(module.parameters()).device.type == 'cpu':
            device_ids = None  # DDP takes no device ids for CPU modules
        super().__init__(module=module, device_ids=device_ids, **kwargs)


def torchrun_store(timeout: timedelta) -> Optional[dist.Store]:
    """This attempt's own namespace of torchrun's store, or None outside torchrun.

    Under torchrun (static rendezvous, the default with ``--master-port``) the
    workers' ``env://`` rendezvous joins the TCPStore the elastic agent hosts
    at ``MASTER_ADDR:MASTER_PORT``, and the agent keeps that one store for all
    its restarts.  The keys the process group wrote at its first start (gloo:
    every rank's address; NCCL: the unique id) are still there after a
    restart, so the restarted ranks read their dead predecessors' addresses
    and fail to connect ("Connection refused") or wait for the group's whole
    timeout.  Prefixing the keys with ``TORCHELASTIC_RESTART_COUNT`` gives
    every attempt fresh keys.
    """
    if os.environ.get('TORCHELASTIC_USE_AGENT_STORE') != str(True):
        return None
    attempt = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0'))
    store = dist.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']),
                          int(os.environ['WORLD_SIZE']), is_master=False, timeout=timeout)
    return dist.PrefixStore(f'inline_mm/attempt_{attempt}/', store)


def _dist_timeout(cfg: Config) -> timedelta:
    """``env_cfg.dist_cfg.timeout`` (seconds, or a timedelta); 1800 s when not set."""
    timeout = ((cfg.get('env_cfg') or {}).get('dist_cfg') or {}).get('timeout', 1800)
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)


def prepare_distributed(cfg: Config, launcher: str) -> None:
    """Set up a CPU-only multi-process run, and any torchrun restart (no-op without a launcher).

    * CPU, ``--launcher pytorch``: the process group is initialised here (gloo), with
      ``env_cfg.dist_cfg.timeout`` and torchrun's store of this attempt.
    * GPU, a torchrun restart (``TORCHELASTIC_RESTART_COUNT`` > 0): the process group is
      initialised here as mmengine's ``init_dist`` would (``LOCAL_RANK``'s device, the
      config's backend), but on fresh store keys (see :func:`torchrun_store`).
    * Otherwise mmengine's behaviour is left untouched.
    """
    if launcher == 'none':
        return
    if launcher == 'pytorch' and not all(k in os.environ for k in ('RANK', 'WORLD_SIZE')):
        raise ConfigError('--launcher pytorch needs the environment torchrun gives each '
                          'process (RANK, WORLD_SIZE, ...): start the job with '
                          'tools/dist_train.sh CONFIG NPROC or torchrun, or drop --launcher')
    if torch.cuda.is_available():
        _prepare_gpu_restart(cfg, launcher)
        return
    if launcher != 'pytorch':
        raise ConfigError(f'launcher {launcher!r} needs GPUs; on CPUs use --launcher pytorch '
                          f'(tools/dist_train.sh)')
    if not dist.is_initialized():  # gloo whatever the config says: nccl needs GPUs
        # the config's timeout bounds how long a process waits for a dead peer
        timeout = _dist_timeout(cfg)
        dist.init_process_group(backend='gloo', rank=int(os.environ['RANK']),
                                world_size=int(os.environ['WORLD_SIZE']),
                                timeout=timeout, store=torchrun_store(timeout))
    if cfg.get('model_wrapper_cfg') is None:
        cfg.model_wrapper_cfg = dict(type='AnyDeviceDistributedDataParallel')
    _wrap_cpu_modules_of_flexible_runner(cfg)


def _wrap_cpu_modules_of_flexible_runner(cfg: Config) -> None:
    """A FlexibleRunner's DDP strategy wraps the model itself: with our CPU-capable wrapper.

    mmengine's ``DDPStrategy`` (FlexibleRunner's default with a launcher) passes
    ``device_ids``, which DDP refuses for CPU modules.
    """
    if not names_flexible_runner(cfg):
        return
    strategy = cfg.get('strategy') or dict(type='DDPStrategy')
    kind = strategy.get('type') if isinstance(strategy, dict) else None
    if kind in ('DDPStrategy', STRATEGIES.get('DDPStrategy')) and \
            strategy.get('model_wrapper') is None:
        # broadcast_buffers=False: the strategy's own default wrapper setting
        strategy['model_wrapper'] = dict(type='AnyDeviceDistributedDataParallel',
                                         broadcast_buffers=False)
        cfg.strategy = strategy


def _prepare_gpu_restart(cfg: Config, launcher: str) -> None:
    """On a torchrun restart, what mmengine's ``init_dist('pytorch')`` does, on fresh keys."""
    if launcher != 'pytorch' or dist.is_initialized() or \
            int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')) == 0:
        return
    dist_cfg = dict((cfg.get('env_cfg') or {}).get('dist_cfg') or {})
    if dist_cfg.get('init_backend', 'torch') != 'torch':
        return  # deepspeed / colossalai set up their own groups
    timeout = _dist_timeout(cfg)
    store = torchrun_store(timeout)
    if store is None:
        return
    if mp.get_start_method(allow_none=True) is None:
        mp.set_start_method('spawn')  # as mmengine's init_dist
    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))
    kwargs = {k: v for k, v in dist_cfg.items() if k not in ('backend', 'init_backend', 'timeout')}
    dist.init_process_group(backend=dist_cfg.get('backend', 'nccl'),
                            rank=int(os.environ['RANK']),
                            world_size=int(os.environ['WORLD_SIZE']), timeout=timeout,
                            store=store, **kwargs)


#: what the error of a collective whose peer died or stopped answering says (gloo / NCCL)
_LOST_PEER_HINTS = ('Connection reset', 'Connection closed', 'Connection refused',
                    'Broken pipe', 'Timed out waiting', 'NCCL', 'gloo')


def lost_peer_message(err: BaseException, work_dir: Optional[str] = None) -> Optional[str]:
    """One line for an error of a collective with the other processes, else None.

    Called while the process group is still up; None in a single-process run.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    text = str(err)
    if not (isinstance(err, getattr(dist, 'DistError', ())) or
            isinstance(err, RuntimeError) and any(h in text for h in _LOST_PEER_HINTS)):
        return None
    first = ' '.join(text.strip().splitlines()[0].split()) if text.strip() else type(err).__name__
    resume = 'the newest readable checkpoint of the work dir'
    if work_dir:
        resume = read_pointer(work_dir) or resume
    return (f'error: lost contact with another training process (process {dist.get_rank()} '
            f'of {dist.get_world_size()}): {first}. A process or node of this job died or '
            f'stopped answering (a silent peer is given up after env_cfg.dist_cfg.timeout '
            f'seconds); start the job again with --resume to continue from {resume}')


class _CheckFailed:
    """The verdict process 0 sends when its check failed with a bug (not the user's input)."""


def check_on_process_zero(check: Callable[[], None], what: str) -> None:
    """Run ``check`` on process 0 only; every process ends with its verdict.

    In a multi-process job (the process group must exist) process 0 runs the
    check (reads the data, a checkpoint ...) and sends the outcome to the
    others (``mmengine.dist.broadcast_object_list``): nothing, or the
    :class:`~inline_mm.errors.UserInputError` it raised, which every process
    then raises, so all stop with the same one-line error.  In a single
    process ``check`` just runs.

    Args:
        check: raises a ``UserInputError`` for bad input.
        what: names the check in the error of the other processes when it
            failed with a bug (its traceback is in process 0's output).
    """
    from mmengine.dist import broadcast_object_list, get_rank, get_world_size, is_distributed
    if not is_distributed() or get_world_size() == 1:
        check()
        return
    verdict: List[Any] = [None]
    failure: Optional[BaseException] = None
    if get_rank() == 0:
        try:
            check()
        except UserInputError as err:
            verdict = [err]
        except BaseException as err:  # a bug, Ctrl-C: the others must not wait forever
            verdict, failure = [_CheckFailed()], err
    broadcast_object_list(verdict)
    if failure is not None:
        raise failure
    if isinstance(verdict[0], _CheckFailed):
        raise RuntimeError(f'{what} failed on process 0 (its traceback is in its output)')
    if verdict[0] is not None:
        raise verdict[0]


def finish_distributed(barrier: bool = True, timeout: Optional[float] = None,
                       teardown_timeout: float = 60.0, status_if_stuck: int = 0,
                       last_words: str = '') -> None:
    """Wait for every process (``barrier``), then tear the process group down.

    Leaving a gloo group alive until interpreter exit lets its background
    threads be destroyed in arbitrary order, which can abort a process
    (``terminate called without an active exception``) after its work is done.
    After an error on one process, pass ``barrier=False``: the others may
    never reach the barrier.

    The teardown itself can hang once the peers are gone (torch 2.1's gloo, seen
    on a loaded machine after every process had passed the barrier): after
    ``teardown_timeout`` seconds a warning is printed, the logs are flushed and
    the process ends at once with ``status_if_stuck``, after printing
    ``last_words`` (the error a caller would have printed after the teardown).
    The run's work is done by then; only the group's threads are left.

    Args:
        barrier: wait for the other processes first.
        timeout: seconds the barrier may take (None: the process group's
            timeout).  When it runs out a ``RuntimeError`` is raised and the
            group is left as it is (a peer is gone; tearing it down could hang).
        teardown_timeout: seconds the teardown may take.
        status_if_stuck: the exit status when it takes longer (0 for a run
            that finished, 2 after a user error, 1 after another, 75 for a
            preempted run).
        last_words: printed to stderr before the warning when it takes longer.
    """
    if dist.is_available() and dist.is_initialized():
        if barrier:
            if timeout is None:
                dist.barrier()
            else:
                # NCCL honours wait(timeout) only with TORCH_NCCL_BLOCKING_WAIT=1 (before
                # that it blocks in a device sync): a timer bounds the barrier too
                with _exit_unless_done_within(
                        timeout + 5.0, status_if_stuck, last_words,
                        f'not every process reached the barrier within {timeout:g} s (a '
                        f'peer is gone)'):
                    dist.barrier(async_op=True).wait(timeout=timedelta(seconds=timeout))
        # the group's destructor releases the GIL, so a timer thread can end a stuck one
        with _exit_unless_done_within(
                teardown_timeout, status_if_stuck, last_words,
                f'the process group was not torn down within {teardown_timeout:g} s (its '
                f'peers have gone)'):
            dist.destroy_process_group()


@contextmanager
def _exit_unless_done_within(seconds: float, status: int, last_words: str,
                             what: str) -> Iterator[None]:
    """Run the body; if it takes more than ``seconds``, :func:`_exit_now` from a timer."""
    warning = f'warning: {what}; exiting with status {status} all the same'
    timer = threading.Timer(seconds, _exit_now, args=(
        status, f'{last_words.rstrip()}\n{warning}' if last_words else warning))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _exit_now(status: int, warning: str) -> None:
    """Print ``warning``, flush the logs and end the process with ``status`` at once.

    Without the interpreter's exit, which would wait for a stuck process group.
    The flush waits for the logging handlers' locks, which a stuck thread may
    hold (a write to a full pipe or a hung file system): after 5 s the process
    ends without it.
    """
    backstop = threading.Timer(5.0, os._exit, args=(status,))
    backstop.daemon = True
    backstop.start()
    print(warning, file=sys.stderr, flush=True)
    logging.shutdown()  # the log files' handlers
    sys.stdout.flush()
    remove_bad_sample_records()  # what the interpreter's exit would have removed
    os._exit(status)


def finish_preempted(timeout: float = 60.0) -> None:
    """Tear the process group down after the processes agreed to stop (a preemption).

    Every process comes to the barrier, as at the end of a finished run.  A peer
    lost since the agreement must not hold this process past the scheduler's
    grace period, nor turn its status 75 into another: after ``timeout`` seconds
    (for the barrier, and again for the teardown) a warning is printed, the logs
    are flushed and the process ends with
    :data:`~inline_mm.engine.signals.PREEMPTED_EXIT_CODE` at once (its
    interpreter's exit would wait for the peer in the process group's
    destructor, as torch 2.1's gloo does).
    """
    try:
        finish_distributed(timeout=timeout, teardown_timeout=timeout,
                           status_if_stuck=PREEMPTED_EXIT_CODE)
    except Exception as err:
        _exit_now(PREEMPTED_EXIT_CODE,
                  f'warning: not every process reached the end of the preempted run '
                  f'({" ".join(str(err).split())}); exiting with status '
                  f'{PREEMPTED_EXIT_CODE} all the same')
