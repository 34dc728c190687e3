"""Checkpoint safety and loading.

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
  refused with a message naming the class and the file.
* :func:`load_pretrained` loads an authors' / inline-mm / mmdet / mmseg
  checkpoint into a backbone, resizing position tables, and logs one summary;
  a checkpoint of another arch or family (whole blocks or stages on one side
  only) is refused, naming the arch its keys look like, unless ``strict=False``.
* :func:`check_checkpoint_fits` tells, before an evaluation, whether a whole
  detector / segmentor checkpoint fits the model built from a config.
"""
import _compat_pickle
import contextlib
import logging
import os
import pickle
import re
import zipfile
from collections import OrderedDict
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from .errors import CheckpointError, CheckpointMismatchError, MissingFileError

StateDict = Dict[str, Tensor]


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


# ---------------------------------------------------------------- which arch the keys are
def preset_structures() -> Dict[Tuple[str, str], Any]:
    """The :class:`~inline_mm.models.converters.Structure` of every arch preset.

    Keyed by ``(family, arch)``; read from the backbones' ``arch_settings``
    (the authors' variants), without building a model.
    """
    from .models import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin
    from .models.backbones.base import parse_attn_type
    from .models.converters import Structure
    presets = {}
    for family, cls in (('pvt', InLinePVT), ('swin', InLineSwin), ('cswin', InLineCSWin),
                        ('deit', InLineDeiT)):
        for arch, setting in cls.arch_settings.items():
            if 'depth' in setting:  # a plain ViT: one stage
                depths, dims = (setting['depth'],), (setting['embed_dims'],)
            else:
                depths, width = tuple(setting['depths']), setting['embed_dims']
                # Swin / CSwin give the stage-1 width, doubled every stage
                dims = tuple(width) if isinstance(width, (list, tuple)) else \
                    tuple(width * 2 ** i for i in range(len(depths)))
            kinds = parse_attn_type(setting.get('attn_type', 'I' * len(depths)), depths,
                                    'ISM', cls.__name__)
            presets[family, arch] = Structure(family, tuple(''.join(k) for k in kinds), dims)
    return presets


def _family_of(state_dict: StateDict) -> Optional[str]:
    from .models.converters import detect_family
    try:
        return detect_family(state_dict)
    except CheckpointError:
        return None


def looks_like(state_dict: StateDict, family: Optional[str] = None) -> str:
    """What a backbone state dict's keys look like: ``"InLinePVT arch='small'"``, or its
    structure where no preset has it.  Empty when the family cannot be told."""
    from .models.converters import FAMILY_CLASSES, key_structure
    family = family or _family_of(state_dict)
    if family is None:
        return ''
    structure = key_structure(state_dict, family)
    presets = preset_structures()
    name = FAMILY_CLASSES[family]
    for (fam, arch), preset in presets.items():
        if preset == structure:
            return f"{name} arch='{arch}'"
    for (fam, arch), preset in presets.items():
        if fam == family and preset.kinds == structure.kinds:
            return f"{name} with the blocks of arch='{arch}' ({structure.describe()})"
    return f'{name} with {structure.describe()} (no preset)'


def _ranges(indices: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``'2-4, 7'``."""
    out, run = [], [indices[0]]
    for i in indices[1:]:
        if i == run[-1] + 1:
            run.append(i)
            continue
        out.append(str(run[0]) if len(run) == 1 else f'{run[0]}-{run[-1]}')
        run = [i]
    out.append(str(run[0]) if len(run) == 1 else f'{run[0]}-{run[-1]}')
    return ', '.join(out)


def _block_prefix(family: str, stage: int) -> str:
    """The key prefix of a stage's blocks (``block2`` for PVT's second stage)."""
    return {'pvt': f'block{stage + 1}', 'swin': f'layers.{stage}.blocks',
            'cswin': f'stage{stage + 1}', 'deit': 'blocks'}[family]


def structure_problems(checkpoint: StateDict, own: StateDict) -> List[str]:
    """Whole blocks / stages or block kinds on one side only, or another family.

    ``checkpoint`` (converted) and ``own`` (the model's state dict) are
    compared block by block; tensors missing inside a block that both have are
    no problem here (they are reported as missing keys).
    """
    from .models.converters import FAMILY_CLASSES, key_structure
    ckpt_family, own_family = _family_of(checkpoint), _family_of(own)
    if own_family is None:
        return []
    if ckpt_family is not None and ckpt_family != own_family:
        return [f'its keys are those of {FAMILY_CLASSES[ckpt_family]}, not '
                f'{FAMILY_CLASSES[own_family]}']
    ckpt, model = key_structure(checkpoint, own_family), key_structure(own, own_family)
    kind_names = {'I': 'InLine', 'S': 'softmax'}
    problems = []
    for stage in range(max(len(ckpt.kinds), len(model.kinds))):
        theirs = ckpt.kinds[stage] if stage < len(ckpt.kinds) else ''
        mine = model.kinds[stage] if stage < len(model.kinds) else ''
        prefix = _block_prefix(own_family, stage)
        extra = list(range(len(mine), len(theirs)))
        absent = [j for j in range(len(mine)) if j >= len(theirs) or theirs[j] == '?']
        if extra:
            problems.append(f'{prefix}.{{{_ranges(extra)}}} are in the checkpoint, not in the '
                            f'model')
        if absent:
            problems.append(f'{prefix}.{{{_ranges(absent)}}} of the model are not in the '
                            f'checkpoint')
        for kind in 'IS':
            differ = [j for j in range(min(len(mine), len(theirs)))
                      if theirs[j] == kind and mine[j] not in (kind, '?')]
            if differ:
                problems.append(f'{prefix}.{{{_ranges(differ)}}} are {kind_names[kind]} in the '
                                f'checkpoint, {kind_names["IS".replace(kind, "")]} in the model')
    return problems


def load_pretrained(model: nn.Module, path: str, state_dict_key: Optional[str] = None,
                    prefix: Optional[str] = None,
                    logger: Optional[logging.Logger] = None,
                    strict: bool = True) -> Dict[str, List[str]]:
    """Load a checkpoint into an InLine backbone and log what happened.

    Args:
        model: an InLine backbone.
        path: the checkpoint file (authors', inline-mm, mmdet / mmseg).
        state_dict_key: take the weights from this entry (``'state_dict_ema'``).
        prefix: keep the keys under this prefix (default ``backbone.`` where present).
        logger: where the summary goes.
        strict: refuse a checkpoint of another arch or family (whole blocks or
            stages only in the checkpoint or only in the model, InLine vs
            softmax blocks, another family's keys); with False those are logged
            and the tensors that fit are loaded.  Shapes that conflict raise
            either way.

    Returns:
        ``{'loaded': [...], 'missing': [...], 'unexpected': [...], 'resized': [...],
        'mismatched': [...]}`` (``mismatched``: the structural differences).

    Raises:
        CheckpointMismatchError: the checkpoint does not fit the model (see
            ``strict``), or a tensor's shape conflicts and cannot be resized.
    """
    logger = logger or logging.getLogger(__name__)
    state_dict = extract_state_dict(load_checkpoint_file(path), state_dict_key, prefix)
    state_dict = model.convert_checkpoint(state_dict)
    own = model.state_dict()
    look = looks_like(state_dict)
    like = f' (its keys look like {look})' if look else ''
    if not any(k in own for k in state_dict):
        raise CheckpointMismatchError(
            f'none of the {len(state_dict)} tensors in {path} matches a parameter of '
            f'{type(model).__name__}{like}: is it a checkpoint of another model? Use the '
            f'backbone it was trained with, or set init_cfg.prefix to the prefix of the '
            f'backbone keys')
    mismatched = structure_problems(state_dict, own)
    if mismatched:
        mine = looks_like(own)
        summary = (f'checkpoint {path} does not fit {type(model).__name__}: '
                   + '; '.join(mismatched) + f'. The checkpoint looks like {look or "?"}, the '
                   f'model is {mine or type(model).__name__}')
        if strict:
            preset = re.fullmatch(rf"{type(model).__name__} (arch='\w+')", look)
            use = preset.group(1) if preset else 'the arch it was trained with'
            raise CheckpointMismatchError(
                f'{summary}. Build the model with {use}, or load the tensors that fit anyway '
                f"with strict=False (init_cfg=dict(type='Pretrained', checkpoint=..., "
                f'strict=False))')
        logger.warning(f'{summary}; strict=False: loading the tensors that fit')
    try:
        state_dict, resized = adapt_to_model(state_dict, model)
    except CheckpointError as err:
        raise CheckpointMismatchError(f'{err}{like}') from None
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
    return dict(loaded=sorted(loadable), missing=missing, unexpected=unexpected, resized=resized,
                mismatched=mismatched)


# ---------------------------------------------------------------- whole-model checkpoints
#: top-level parts that tell the task of a model's state dict
_TASK_PARTS = (('decode_head', 'a segmentor'), ('roi_head', 'a two-stage detector'),
               ('bbox_head', 'a single-stage detector'))


def describe_model_state(state_dict: StateDict) -> str:
    """What a whole model's state dict looks like, from its keys.

    ``"a two-stage detector (backbone, neck, rpn_head, roi_head) with an
    InLinePVT arch='tiny' backbone"``; a state dict without parts (a bare
    backbone) is described as one.
    """
    parts = sorted({k.split('.', 1)[0] for k in state_dict if '.' in k})
    task = next((name for part, name in _TASK_PARTS if part in parts), None)
    if 'backbone' not in parts:  # no parts at all: a backbone on its own?
        look = looks_like(state_dict)
        return f'a bare backbone ({look}) without neck or heads' if look else \
            f'a state dict of {len(state_dict)} tensors without a backbone'
    backbone = {k[len('backbone.'):]: v for k, v in state_dict.items()
                if k.startswith('backbone.')}
    look = looks_like(backbone) or 'another'
    return f"{task or 'a model'} ({', '.join(parts)}) with {'an' if look[0] in 'AEIOU' else 'a'} " \
           f'{look} backbone'


def check_checkpoint_fits(model: nn.Module, path: str, min_found: float = 0.9) -> None:
    """Refuse, before an evaluation, a checkpoint that is not of the config's model.

    mmengine loads a checkpoint into a model with ``strict=False`` and only
    warns about what does not match, so a segmentor's checkpoint on a
    detector's config evaluates to 0 mAP without an error.  This reads
    ``path`` (safely, see :func:`load_checkpoint_file`) and compares its
    ``state_dict`` with the model's.

    Args:
        model: the detector / segmentor built from the config (a wrapper's
            ``module`` is taken).
        path: the checkpoint (``{'state_dict': ..., 'meta': ...}`` as mmengine
            writes it, or a plain state dict).
        min_found: the share of the model's tensors the checkpoint must hold.

    Raises:
        MissingFileError: ``path`` does not exist.
        CheckpointError: ``path`` is not a readable PyTorch checkpoint.
        CheckpointMismatchError: a tensor's shape conflicts, a whole part of the
            model (backbone, neck, a head) is absent, fewer than ``min_found``
            of the model's tensors are there, a part the model lacks is there,
            or the backbone has other blocks or stages (another arch).
    """
    checkpoint = load_checkpoint_file(path)
    model = getattr(model, 'module', model)
    state = extract_state_dict(checkpoint, prefix='')
    own = model.state_dict()
    conflicts = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    missing = [k for k in own if k not in state]
    own_parts = {k.split('.', 1)[0] for k in own if '.' in k}
    their_parts = {k.split('.', 1)[0] for k in state if '.' in k}
    problems = []
    if missing and len(own) - len(missing) < min_found * len(own):
        problems.append(f"{len(missing)} of the model's {len(own)} tensors are not in it")
    absent = sorted(own_parts - their_parts)
    if absent:
        problems.append(f"it has no {', '.join(absent)}")
    # parts only in the checkpoint (a bare backbone's own modules are not listed)
    extra = sorted(their_parts - own_parts) if own_parts & their_parts else []
    if extra:
        problems.append(f"it has {', '.join(extra)}, which the model has not")
    if conflicts:
        key = conflicts[0]
        problems.append(f'{len(conflicts)} tensor(s) with other shapes (e.g. {key}: '
                        f'{tuple(state[key].shape)} in the checkpoint, {tuple(own[key].shape)} '
                        f'in the model)')
    if not problems and hasattr(model, 'backbone'):
        problems = [f'backbone: {p}' for p in structure_problems(
            {k[9:]: v for k, v in state.items() if k.startswith('backbone.')},
            model.backbone.state_dict())]
    if not problems:
        return
    meta = checkpoint.get('meta') if isinstance(checkpoint.get('meta'), dict) else {}
    origin = f", saved by the run {meta['experiment_name']!r}" \
        if isinstance(meta.get('experiment_name'), str) else ''
    raise CheckpointMismatchError(
        f'checkpoint {path} does not fit the model of the config: ' + '; '.join(problems)
        + f'. The checkpoint looks like {describe_model_state(state)}{origin}; the config '
        f'builds {type(model).__name__}, {describe_model_state(own)}. Pass the checkpoint '
        f'trained with this config, or the config the checkpoint was trained with')


def check_pretrained_files(model_cfg: Any) -> None:
    """Refuse, before a run writes anything, a backbone ``init_cfg`` checkpoint that is absent.

    mmengine reads ``init_cfg=dict(type='Pretrained', checkpoint=PATH)`` only when
    training starts, after the work dir and its log exist; the training tool
    calls this first.  Remote paths (``scheme://``) are left to mmengine.

    Raises:
        MissingFileError: a local ``Pretrained`` checkpoint of the backbone does not exist.
    """
    backbone = (model_cfg or {}).get('backbone') or {}
    init_cfg = backbone.get('init_cfg')
    for cfg in init_cfg if isinstance(init_cfg, (list, tuple)) else [init_cfg]:
        if not isinstance(cfg, dict) or cfg.get('type') != 'Pretrained':
            continue
        path = cfg.get('checkpoint')
        if isinstance(path, str) and '://' not in path and not os.path.isfile(path):
            raise MissingFileError(
                f'checkpoint file not found: {path!r}, named by model.backbone.init_cfg.'
                f"checkpoint: download the authors' ImageNet weights into checkpoints/ (see "
                f'configs/det/README.md) or point init_cfg.checkpoint at your file '
                f'(--cfg-options model.backbone.init_cfg=None trains from scratch)')
