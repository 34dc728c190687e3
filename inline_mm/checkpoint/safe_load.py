"""Safe reading of checkpoint files: ``weights_only`` plus what it cannot read.

What torch and mmengine cannot do:

* torch >= 2.6 loads with ``weights_only=True``; mmengine 0.10.7 writes
  objects of its own into runner checkpoints (the message hub's
  ``HistoryBuffer``, numpy arrays and scalars) and so cannot ``--resume``.
  :func:`mmengine_checkpoint_globals` allow-lists exactly those types for the
  loads inside it (the plugin's own loads and, through
  :class:`~inline_mm.engine.AtomicCheckpointHook`, mmengine's resume); any
  other pickled object is still refused, and importing the package changes
  nothing in torch.  :func:`allow_mmengine_checkpoints` is the process-wide
  opt-in for other training scripts.
* :func:`load_checkpoint_file` reads the files the authors' training scripts
  write (weights beside the optimiser / scheduler / scaler state, a yacs
  ``CfgNode`` config or an argparse ``Namespace``, EMA weights), with yacs not
  installed and without arbitrary unpickling: a short allow-list of benign
  classes, by their pickled name, is read as plain dicts; anything else is
  refused with a message naming the class and the file.  An unreadable file
  gets one line saying what it is (empty, a Git LFS pointer, an HTML page,
  truncated) and what to do.
"""
import _compat_pickle
import contextlib
import os
import pickle
import re
import zipfile
from collections import OrderedDict
from typing import Any, ContextManager, Dict, List

import numpy as np
import torch

from ..errors import CheckpointError, MissingFileError


#: the statistics methods mmengine's ``HistoryBuffer`` defines (and registers by default)
_HISTORY_BUFFER_STATISTICS = frozenset({'min', 'max', 'current', 'mean'})


def _history_buffer_getattr(obj: object, name: str) -> object:
    """Stands in for ``getattr`` when unpickling: HistoryBuffer statistics only.

    mmengine pickles each buffer's table of statistics methods, whose entries
    are ``HistoryBuffer``'s own methods, as ``getattr(HistoryBuffer, 'mean')``
    and so on.  Allowing the real ``getattr`` would let a crafted file reach
    arbitrary callables, so this resolves only those methods (statistics
    registered from functions defined elsewhere pickle under their own names
    and are refused as any other global).
    """
    from mmengine.logging import HistoryBuffer
    if obj is HistoryBuffer and name in _HISTORY_BUFFER_STATISTICS:
        return getattr(HistoryBuffer, name)
    raise pickle.UnpicklingError(
        f'refused getattr({obj!r}, {name!r}) while loading with weights_only=True: only '
        f'HistoryBuffer statistics methods are allowed')


def _mmengine_checkpoint_types() -> List[object]:
    from mmengine.logging import HistoryBuffer
    types: List[object] = [HistoryBuffer, (_history_buffer_getattr, 'builtins.getattr'),
                           np.ndarray, np.dtype,
                           np.core.multiarray._reconstruct, np.core.multiarray.scalar]
    # numpy >= 1.25 pickles dtypes as instances of their own classes.
    types += [type(np.dtype(t)) for t in
              (np.float64, np.float32, np.float16, np.int64, np.int32, np.bool_, np.uint8)]
    return types


def _mmengine_checkpoint_globals() -> Dict[str, object]:
    """:func:`_mmengine_checkpoint_types` by pickled name (for :class:`_RestrictedUnpickler`)."""
    named: Dict[str, object] = {}
    for entry in _mmengine_checkpoint_types():
        if isinstance(entry, tuple):
            named[entry[1]] = entry[0]
        else:
            named[f'{entry.__module__}.{entry.__qualname__}'] = entry
    return named


def mmengine_checkpoint_globals() -> ContextManager[Any]:
    """A context in which ``weights_only`` loads accept mmengine's runner checkpoints.

    Inside it, ``torch.load`` (mmengine's resume included) also allows exactly
    the types of :func:`_mmengine_checkpoint_types` (``HistoryBuffer``, numpy
    arrays, dtypes and scalars, ``getattr`` only for HistoryBuffer's statistics
    methods); on leaving, torch's allow-list is what it was.  A no-op on
    torch < 2.6, whose ``torch.load`` defaults to ``weights_only=False`` and
    cannot allow a stand-in under another name.
    """
    if _TORCH_NAMED_SAFE_GLOBALS:  # api-floor: guarded
        return torch.serialization.safe_globals(_mmengine_checkpoint_types())
    return contextlib.nullcontext()


def allow_mmengine_checkpoints() -> None:
    """Allow-list mmengine's runner checkpoint types in the whole process (explicit opt-in).

    ``import inline_mm`` does not call this: the plugin's own loads and the
    runs of configs with :class:`~inline_mm.engine.AtomicCheckpointHook` allow
    the types only while they load (:func:`mmengine_checkpoint_globals`).
    Call it in a training script of your own that resumes mmengine runner
    checkpoints on torch >= 2.6 without that hook; it stays in effect until
    the process ends.  A no-op on torch < 2.6.
    """
    if _TORCH_NAMED_SAFE_GLOBALS:  # api-floor: guarded
        torch.serialization.add_safe_globals(_mmengine_checkpoint_types())


class _ConfigNode:
    """What a pickled yacs ``CfgNode`` is read as: the dict of its entries.

    yacs pickles a ``CfgNode`` (a dict subclass) as its items plus its own
    flags (immutability, deprecated / renamed keys) as instance state.
    ``weights_only`` fills only plain dict types with items, so unpickling
    makes a tagged ``OrderedDict``; its entries are kept, the flags (which mean
    nothing without yacs) are dropped by :func:`_plain`.
    """

    TAG = '_inline_mm_yacs_cfgnode'

    def __new__(cls, *args: Any) -> 'OrderedDict':
        node: OrderedDict = OrderedDict()
        node.__dict__[cls.TAG] = True
        return node


class _Namespace:
    """What a pickled ``argparse.Namespace`` is read as (its attributes, then a dict)."""

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(state if isinstance(state, dict) else {})


#: Classes besides tensors and containers that the authors' training scripts
#: pickle (their ``save_checkpoint`` stores the yacs config; timm-style scripts
#: store the argparse arguments), by pickled name, with what they are read as.
#: Optimiser, LR-scheduler and grad-scaler states are plain dicts of numbers
#: and tensors and need nothing.
AUTHOR_CHECKPOINT_GLOBALS: Dict[str, type] = {
    'yacs.config.CfgNode': _ConfigNode,
    'argparse.Namespace': _Namespace,
}


def _plain(obj: Any) -> Any:
    """Replace the stand-ins of :data:`AUTHOR_CHECKPOINT_GLOBALS` by plain dicts.

    Containers without a stand-in are returned as they are (state dicts keep
    their class and ``_metadata``).
    """
    if isinstance(obj, _Namespace):
        return {k: _plain(v) for k, v in vars(obj).items()}
    if isinstance(obj, dict):
        items = {k: _plain(v) for k, v in obj.items()}
        if getattr(obj, '__dict__', {}).get(_ConfigNode.TAG):
            return items
        if any(items[k] is not v for k, v in obj.items()):
            return type(obj)(items)
        return obj
    if type(obj) in (list, tuple):
        items = [_plain(v) for v in obj]
        return type(obj)(items) if any(a is not b for a, b in zip(items, obj)) else obj
    return obj


def _unsafe_globals(path: str, err: Exception) -> List[str]:
    """The pickled classes / functions that made a ``weights_only`` load refuse ``path``."""
    names: List[str] = []
    finder = getattr(torch.serialization, 'get_unsafe_globals_in_checkpoint', None)
    if finder is not None:
        try:
            names = [n for n in finder(path) if n not in AUTHOR_CHECKPOINT_GLOBALS]
        except Exception:  # not a zip checkpoint: fall back on the error message
            names = []
    if not names:
        names = re.findall(r'GLOBAL ([\w.]+)', str(err)) or \
            re.findall(r'unrecognized function ([\w.<> ]+)', str(err))
    return sorted(set(names))


def _torch_at_least(major: int, minor: int) -> bool:
    version = tuple(int(v) for v in re.findall(r'\d+', torch.__version__)[:2])
    return version >= (major, minor)


#: torch accepts ``(class, 'pickled.name')`` pairs in ``safe_globals`` from 2.6 on
_TORCH_NAMED_SAFE_GLOBALS = _torch_at_least(2, 6)


def _latin1_encode(text: str, encoding: str = 'latin1') -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for bytes (numpy arrays'
    data in mmengine's message hub): the latin-1 codec only."""
    if encoding not in ('latin1', 'latin-1'):
        raise pickle.UnpicklingError(f'refused _codecs.encode(..., {encoding!r}) while loading '
                                     f'with weights_only=True: only latin1 is allowed')
    return text.encode('latin1')


#: builtins that newer torch allows under weights_only and older torch's list lacks
#: (yacs keeps a set of deprecated keys in every CfgNode; protocol-2 pickles write bytes
#: as ``_codecs.encode(text, 'latin1')``)
_BENIGN_BUILTINS: Dict[str, Any] = {'builtins.set': set, 'builtins.frozenset': frozenset,
                                    '_codecs.encode': _latin1_encode}


class _RestrictedUnpickler(pickle.Unpickler):
    """For torch < 2.6: an unpickler that resolves only allow-listed globals.

    The allow-list is torch's own ``weights_only`` list plus
    :data:`AUTHOR_CHECKPOINT_GLOBALS` and the types of mmengine's runner
    checkpoints (what :func:`mmengine_checkpoint_globals` adds on newer torch);
    any other class or function is refused before it is imported, as
    ``weights_only=True`` does.
    """

    def find_class(self, module: str, name: str) -> Any:
        from torch import _weights_only_unpickler
        # protocol-2 pickles name Python 2 modules (``__builtin__.set``)
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full = f'{module}.{name}'
        # torch's built-in weights_only list: torch 2.1-2.5 (the only ones that take this
        # path) have no public getter of it (torch.serialization.get_safe_globals, 2.5+,
        # lists the user-added globals only); torch >= 2.6 loads through safe_globals
        allowed = AUTHOR_CHECKPOINT_GLOBALS.get(full) or _BENIGN_BUILTINS.get(full) or \
            _weights_only_unpickler._get_allowed_globals().get(full) or \
            _mmengine_checkpoint_globals().get(full)
        if allowed is None:
            raise pickle.UnpicklingError(f'Unsupported global: GLOBAL {full}')
        return allowed


class _RestrictedPickleModule:
    """The ``pickle_module`` torch.load uses with :class:`_RestrictedUnpickler`."""

    Unpickler = _RestrictedUnpickler
    __name__ = 'inline_mm_restricted_pickle'

    @staticmethod
    def load(file: Any, **kwargs: Any) -> Any:
        return _RestrictedUnpickler(file, **kwargs).load()


def _load_restricted(path: str) -> Any:
    """``torch.load(weights_only=True)`` that also reads :data:`AUTHOR_CHECKPOINT_GLOBALS`.

    On torch >= 2.6 the stand-ins and mmengine's runner checkpoint types are
    allowed under their pickled names for this load only
    (``torch.serialization.safe_globals``); nothing else is added to what
    ``weights_only`` accepts, and torch's allow-list is unchanged afterwards.
    Older torch cannot allow a class under another name, so the same
    allow-list is enforced by
    :class:`_RestrictedUnpickler` (torch's own list plus the stand-ins).
    """
    if _TORCH_NAMED_SAFE_GLOBALS:  # api-floor: guarded
        allowed = [(cls, name) for name, cls in AUTHOR_CHECKPOINT_GLOBALS.items()]
        with torch.serialization.safe_globals(allowed + _mmengine_checkpoint_types()):
            return torch.load(path, map_location='cpu', weights_only=True)
    return torch.load(path, map_location='cpu', weights_only=False,
                      pickle_module=_RestrictedPickleModule)


def load_checkpoint_file(path: str) -> dict:
    """Read a checkpoint safely: ``weights_only`` plus the authors' config objects.

    Accepts what ``torch.load(path, weights_only=True)`` accepts, and the
    files the authors' training scripts write (see
    :data:`AUTHOR_CHECKPOINT_GLOBALS`; a yacs ``CfgNode`` or argparse
    ``Namespace`` comes back as a plain dict).  yacs need not be installed.

    Raises:
        MissingFileError: ``path`` does not exist.
        CheckpointError: the file holds another pickled class or function
            (named in the message, nothing of it is run), or it is not a
            readable PyTorch checkpoint.
    """
    if not os.path.isfile(path):
        raise MissingFileError(f'checkpoint file not found: {path!r}')
    try:
        checkpoint = _load_restricted(path)
    except pickle.UnpicklingError as err:
        unsafe = _unsafe_globals(path, err)
        if unsafe:
            raise CheckpointError(
                f'refused to load {path!r}: it pickles {", ".join(unsafe)}, which is not a '
                f'tensor, a container or a known-benign class, and unpickling it could run '
                f'code. If you trust the file, re-save its weights alone where it was written: '
                f"torch.save({{'model': ckpt['model']}}, 'weights.pth')") from None
        raise CheckpointError(_unreadable_message(path, err)) from None
    except Exception as err:  # truncated zip, text file, wrong format ...
        raise CheckpointError(_unreadable_message(path, err)) from None
    return _plain(checkpoint)


#: the fix for a file that is not the checkpoint it should be
_FETCH_AGAIN = 'download or copy the file again (compare its size with the original)'


def _unreadable_message(path: str, err: Exception) -> str:
    """One line: what the unreadable file at ``path`` is, and what to do.

    Told from the first bytes: empty, a Git LFS pointer, an HTML page, other
    text, a zip archive (torch's format) without its end, a legacy pickle cut
    short.  torch's own reason comes last (without its ``weights_only`` advice).
    """
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
        head = f.read(512)
    start = head.lstrip().lower()
    if size == 0:
        what = f'is empty (0 bytes), not a PyTorch checkpoint: {_FETCH_AGAIN}'
    elif head.startswith(b'version https://git-lfs'):
        what = ('is a Git LFS pointer, not a PyTorch checkpoint: fetch the weights '
                '(`git lfs pull`) or download the file itself')
    elif start.startswith((b'<!doctype html', b'<html')):
        what = ('is an HTML page, not a PyTorch checkpoint (a download link that returned a '
                'web page?): download the file itself')
    elif head.startswith(b'PK\x03\x04'):
        if not zipfile.is_zipfile(path):
            what = (f'is truncated or corrupt: a zip archive (the PyTorch format) of {size} '
                    f'bytes without its end, e.g. an interrupted download or copy: '
                    f'{_FETCH_AGAIN}')
        else:
            what = ('is a zip archive but not a PyTorch checkpoint, or it is corrupt: pass the '
                    '.pth file torch.save wrote')
    elif head.startswith(b'\x80'):
        what = (f'is truncated or corrupt (a legacy-format PyTorch file of {size} bytes '
                f'that cannot be read to its end): {_FETCH_AGAIN}')
    elif all(32 <= b < 127 or b in b'\t\n\r' for b in head):
        what = ('is a text file, not a PyTorch checkpoint: pass the .pth file the training '
                'wrote')
    else:
        what = ('is not a PyTorch checkpoint (neither a zip archive nor a pickle) or it is '
                f'corrupt: {_FETCH_AGAIN}')
    # torch's reason, first sentence only (its advice is about saving, not this file)
    reason = _first_line(err).split('. ')[0].rstrip('.')
    return f'cannot read checkpoint {path!r}: it {what} ({type(err).__name__}: {reason})'


def _first_line(err: Exception) -> str:
    """The reason of a failed load, without torch's advice to turn ``weights_only`` off."""
    text = str(err)
    # torch wraps the unpickler's reason in a paragraph about weights_only
    reason = re.search(r'WeightsUnpickler error:\s*(.+)', text)
    if reason:
        text = reason.group(1)
    elif 'weights_only' in text:
        return 'not loadable with weights_only=True'
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
