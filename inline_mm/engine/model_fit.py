"""Whole detector / segmentor checkpoints checked against the config's model.

mmengine loads a checkpoint into a model with ``strict=False`` and only warns
about what does not match, so a segmentor's checkpoint on a detector's config
evaluates to 0 mAP without an error, and a missing ``init_cfg`` checkpoint
stops a run only after its work dir is written.  :func:`check_checkpoint_fits`
and :func:`check_pretrained_files` refuse both before anything runs.
"""
import os
from typing import Any, Optional, Sequence

from torch import nn

from ..checkpoint import load_checkpoint_file
from ..errors import CheckpointMismatchError, MissingFileError
from ..models.pretrained import StateDict, extract_state_dict, looks_like, structure_problems


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


def check_checkpoint_fits(model: nn.Module, path: str, min_found: float = 0.9,
                          checkpoint: Optional[dict] = None,
                          parts: Optional[Sequence[str]] = None) -> None:
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
        checkpoint: what :func:`load_checkpoint_file` returned for ``path``, when
            the caller has read it already (``path`` then only names it).
        parts: check only these parts of the model (e.g. ``('backbone',)`` for an
            export of the backbone alone); the checkpoint's other parts may be
            of another model.  None: the whole model.

    Raises:
        MissingFileError: ``path`` does not exist.
        CheckpointError: ``path`` is not a readable PyTorch checkpoint.
        CheckpointMismatchError: a tensor's shape conflicts, a whole part of the
            model (backbone, neck, a head) is absent, fewer than ``min_found``
            of the model's tensors are there, a part the model lacks is there,
            or the backbone has other blocks or stages (another arch).
    """
    if checkpoint is None:
        checkpoint = load_checkpoint_file(path)
    model = getattr(model, 'module', model)
    state = extract_state_dict(checkpoint, prefix='')
    own = whole_own = model.state_dict()
    whole_state = state
    if parts is not None:
        state, own = ({k: v for k, v in d.items() if k.split('.', 1)[0] in parts}
                      for d in (state, own))
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
    if not problems and hasattr(model, 'backbone') and (parts is None or 'backbone' in parts):
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
        + f'. The checkpoint looks like {describe_model_state(whole_state)}{origin}; the '
        f'config builds {type(model).__name__}, {describe_model_state(whole_own)}. Pass the '
        f'checkpoint trained with this config, or the config the checkpoint was trained with')


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
