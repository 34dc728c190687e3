"""Checkpoint safety and loading.

* torch >= 2.6 loads with ``weights_only=True``; mmengine 0.10.7 writes
  objects of its own into runner checkpoints (the message hub's
  ``HistoryBuffer``, numpy arrays and scalars) and so cannot ``--resume``.
  :func:`allow_mmengine_checkpoints` allow-lists exactly those types; any other
  pickled object is still refused.
* :func:`load_pretrained` loads an authors' / inline-mm / mmdet / mmseg
  checkpoint into a backbone, resizing position tables, and logs one summary.
"""
import logging
import os
import pickle
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor, nn

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
    """Allow-list the types mmengine's own runner checkpoints contain."""
    torch.serialization.add_safe_globals(_mmengine_checkpoint_types())


def load_checkpoint_file(path: str) -> dict:
    """``torch.load(path, weights_only=True)`` with errors that name the file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f'checkpoint file not found: {path!r}. Download the authors\' ImageNet weights '
            f'into checkpoints/ (see README) or fix init_cfg.checkpoint')
    try:
        return torch.load(path, map_location='cpu', weights_only=True)
    except pickle.UnpicklingError as err:
        raise RuntimeError(
            f'refused to load {path!r}: it holds objects that are not plain tensors / '
            f'containers, and checkpoints are loaded with weights_only=True. ({err})') from err
    except Exception as err:  # truncated or non-checkpoint files
        raise RuntimeError(f'cannot read checkpoint {path!r}: the file is corrupt or not a '
                           f'PyTorch checkpoint ({type(err).__name__}: {err})') from err


def extract_state_dict(checkpoint: dict, state_dict_key: Optional[str] = None,
                       prefix: Optional[str] = None) -> StateDict:
    """The backbone's tensors out of any supported checkpoint layout.

    ``{'model': ...}`` (authors), ``{'state_dict': ...}`` (OpenMMLab), a plain
    state dict, or ``state_dict_key`` (e.g. ``'state_dict_ema'`` for CSwin)
    when given.  ``module.`` is stripped; with ``prefix`` (default: ``backbone.``
    when such keys exist) only those keys are kept, without the prefix.
    """
    if not isinstance(checkpoint, dict):
        raise TypeError(f'a checkpoint is a dict, got {type(checkpoint).__name__}')
    if state_dict_key is not None:
        if state_dict_key not in checkpoint:
            raise KeyError(f'state_dict_key {state_dict_key!r} not in the checkpoint; it has '
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
            raise ValueError(f'checkpoint tensor {key!r} has shape {tuple(value.shape)} but the '
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
        except ValueError:
            family = ''
        raise ValueError(f'none of the {len(state_dict)} tensors in {path} matches a parameter '
                         f'of {type(model).__name__}{family}: is it a checkpoint of another '
                         f'model? Use the backbone it was trained with, or set init_cfg.prefix '
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
