"""Checkpoint safety and loading.

* torch >= 2.6 loads with ``weights_only=True``; mmengine 0.10.7 writes
  objects of its own into runner checkpoints (the message hub's
  ``HistoryBuffer``, numpy arrays and scalars) and so cannot ``--resume``.
  :func:`allow_mmengine_checkpoints` allow-lists exactly those types; any other
  pickled object is still refused.
* :func:`load_checkpoint_file` reads the files the authors' training scripts
  write (weights beside the optimiser / scheduler / scaler state, a yacs
  ``CfgNode`` config or an argparse ``Namespace``, EMA weights), with yacs not
  installed and without arbitrary unpickling: a short allow-list of benign
  classes, by their pickled name, is read as plain dicts; anything else is
  refused with a message naming the class and the file.
* :func:`load_pretrained` loads an authors' / inline-mm / mmdet / mmseg
  checkpoint into a backbone, resizing position tables, and logs one summary.
"""
import _compat_pickle
import logging
import os
import pickle
import re
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from .errors import CheckpointError, MissingFileError

StateDict = Dict[str, Tensor]


def _history_buffer_getattr(obj: object, name: str) -> object:
    """Stands in for ``getattr`` when unpickling: HistoryBuffer statistics only.

    mmengine pickles ``HistoryBuffer._statistics_methods`` as
    ``getattr(HistoryBuffer, 'mean')`` and so on.  Allowing the real
    ``getattr`` would let a crafted file reach arbitrary callables, so this
    resolves only the statistics methods of ``HistoryBuffer``.
    """
    from mmengine.logging import HistoryBuffer
    # the defaults are registered lazily (on the first instance), so name them too
    allowed = {'min', 'max', 'current', 'mean', *HistoryBuffer._statistics_methods}
    if obj is HistoryBuffer and name in allowed:
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


def allow_mmengine_checkpoints() -> None:
    """Allow-list the types mmengine's own runner checkpoints contain.

    Needed from torch 2.6 on, where ``torch.load`` defaults to
    ``weights_only=True``; older torch loads them as it is (mmengine passes no
    ``weights_only``).
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


#: builtins that newer torch allows under weights_only and older torch's list lacks
#: (yacs keeps a set of deprecated keys in every CfgNode)
_BENIGN_BUILTINS: Dict[str, type] = {'builtins.set': set, 'builtins.frozenset': frozenset}


class _RestrictedUnpickler(pickle.Unpickler):
    """For torch < 2.6: an unpickler that resolves only allow-listed globals.

    The allow-list is torch's own ``weights_only`` list plus
    :data:`AUTHOR_CHECKPOINT_GLOBALS`; any other class or function is refused
    before it is imported, as ``weights_only=True`` does.
    """

    def find_class(self, module: str, name: str) -> Any:
        from torch import _weights_only_unpickler
        # protocol-2 pickles name Python 2 modules (``__builtin__.set``)
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full = f'{module}.{name}'
        allowed = AUTHOR_CHECKPOINT_GLOBALS.get(full) or _BENIGN_BUILTINS.get(full) or \
            _weights_only_unpickler._get_allowed_globals().get(full)
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

    On torch >= 2.6 the stand-ins are allowed under their pickled names for
    this load only (``torch.serialization.safe_globals``); nothing else is
    added to what ``weights_only`` accepts.  Older torch cannot allow a class
    under another name, so the same allow-list is enforced by
    :class:`_RestrictedUnpickler` (torch's own list plus the stand-ins).
    """
    if _TORCH_NAMED_SAFE_GLOBALS:  # api-floor: guarded
        allowed = [(cls, name) for name, cls in AUTHOR_CHECKPOINT_GLOBALS.items()]
        with torch.serialization.safe_globals(allowed):
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
        raise CheckpointError(f'cannot read checkpoint {path!r}: it is not a PyTorch '
                              f'checkpoint or it is corrupt ({_first_line(err)})') from None
    except Exception as err:  # truncated zip, text file, wrong format ...
        raise CheckpointError(f'cannot read checkpoint {path!r}: the file is corrupt or not a '
                              f'PyTorch checkpoint ({type(err).__name__}: '
                              f'{_first_line(err)})') from None
    return _plain(checkpoint)


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


def extract_state_dict(checkpoint: dict, state_dict_key: Optional[str] = None,
                       prefix: Optional[str] = None) -> StateDict:
    """The backbone's tensors out of any supported checkpoint layout.

    ``{'model': ...}`` (authors), ``{'state_dict': ...}`` (OpenMMLab), a plain
    state dict, or ``state_dict_key`` (e.g. ``'state_dict_ema'`` for CSwin)
    when given.  ``module.`` is stripped; with ``prefix`` (default: ``backbone.``
    when such keys exist) only those keys are kept, without the prefix.
    """
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f'a checkpoint is a dict, got {type(checkpoint).__name__}')
    if state_dict_key is not None:
        if state_dict_key not in checkpoint:
            raise CheckpointError(f'state_dict_key {state_dict_key!r} not in the checkpoint; it '
                                  f'has '
                                  f'{sorted(k for k in checkpoint if isinstance(k, str))}')
        state_dict = checkpoint[state_dict_key]
    else:
        for key in ('state_dict', 'model', 'module'):
            if isinstance(checkpoint.get(key), dict):
                state_dict = checkpoint[key]
                break
        else:
            state_dict = checkpoint
    state_dict = {(k[7:] if k.startswith('module.') else k): v for k, v in state_dict.items()
                  if isinstance(v, Tensor)}
    if prefix is None and any(k.startswith('backbone.') for k in state_dict):
        prefix = 'backbone.'
    if prefix:
        state_dict = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    return state_dict


def adapt_to_model(state_dict: StateDict, model: nn.Module) -> Tuple[StateDict, List[str]]:
    """Resize what can be resized to the model's shapes; fail on anything else.

    Absolute position tables are resampled (bilinear, the authors' convention),
    relative position bias tables resized (timm's helper).  Returns the adapted
    dict and a line per resized key.
    """
    from timm.layers import resize_rel_pos_bias_table

    from .models.layers.pos_embed import resize_pos_embed, square_grid
    own = model.state_dict()
    out, notes = {}, []
    for key, value in state_dict.items():
        target = own.get(key)
        if target is None or target.shape == value.shape:
            out[key] = value
            continue
        name = key.rsplit('.', 1)[-1]
        if name.startswith('pos_embed') and value.ndim == 3 and value.shape[-1] == target.shape[-1]:
            prefix = getattr(model, 'num_prefix_tokens', 0)
            old = square_grid(value.shape[1] - prefix)
            new = square_grid(target.shape[1] - prefix)
            out[key] = resize_pos_embed(value.float(), new, old, prefix).to(value.dtype)
        elif name == 'relative_position_bias_table' and value.shape[1] == target.shape[1]:
            module = model.get_submodule(key.rsplit('.', 1)[0])
            window = module.table_window
            out[key] = resize_rel_pos_bias_table(value, new_window_size=window,
                                                 new_bias_shape=tuple(target.shape))
        else:
            raise CheckpointError(f'checkpoint tensor {key!r} has shape {tuple(value.shape)} '
                                  f'but the '
                                  f'model expects {tuple(target.shape)}, and it cannot be resized: '
                                  f'check that the checkpoint matches the arch / embed_dims / '
                                  f'num_heads of the model')
        notes.append(f'{key}: {tuple(value.shape)} -> {tuple(target.shape)}')
    return out, notes


def load_pretrained(model: nn.Module, path: str, state_dict_key: Optional[str] = None,
                    prefix: Optional[str] = None,
                    logger: Optional[logging.Logger] = None) -> Dict[str, List[str]]:
    """Load a checkpoint into an InLine backbone and log what happened.

    Returns:
        ``{'loaded': [...], 'missing': [...], 'unexpected': [...], 'resized': [...]}``.
    """
    logger = logger or logging.getLogger(__name__)
    state_dict = extract_state_dict(load_checkpoint_file(path), state_dict_key, prefix)
    state_dict = model.convert_checkpoint(state_dict)
    own = model.state_dict()
    if not any(k in own for k in state_dict):
        from .models.converters import detect_family
        try:
            family = f' (its keys look like InLine-{detect_family(state_dict)})'
        except CheckpointError:
            family = ''
        raise CheckpointError(f'none of the {len(state_dict)} tensors in {path} matches a '
                              f'parameter of {type(model).__name__}{family}: is it a checkpoint '
                              f'of another model? Use the backbone it was trained with, or set '
                              f'init_cfg.prefix '
                              f'to the prefix of the backbone keys')
    state_dict, resized = adapt_to_model(state_dict, model)
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    loadable = {k: v for k, v in state_dict.items() if k in own}
    model.load_state_dict(loadable, strict=False)
    reasons = model.documented_missing()
    lines = [f'loaded {len(loadable)}/{len(own)} tensors from {path}']
    if resized:
        lines.append('resized: ' + '; '.join(resized))
    if missing:
        lines.append('missing (left at their initial values): ' + ', '.join(
            f"{k} ({reasons.get(k, 'not in the checkpoint')})" for k in missing))
    if unexpected:
        lines.append('unexpected (ignored): ' + ', '.join(unexpected))
    logger.info('\n'.join(lines))
    return dict(loaded=sorted(loadable), missing=missing, unexpected=unexpected, resized=resized)
