"""Backbone weights from any checkpoint layout, refused when of another arch.

mmengine's ``Pretrained`` init loads what matches and warns about the rest,
so an ImageNet checkpoint of another arch or family trains from a half-random
backbone without an error.  :func:`load_pretrained` loads an authors' /
inline-mm / mmdet / mmseg checkpoint into an InLine backbone (converting the
authors' keys, resizing position tables), logs one summary, and refuses a
checkpoint whose whole blocks or stages are on one side only, naming the arch
its keys look like (:func:`looks_like`), unless ``strict=False``.
"""
import logging
import re
from typing import Dict, List, Optional, Sequence, Tuple

from timm.layers import resize_rel_pos_bias_table
from torch import Tensor, nn

from ..checkpoint.safe_load import load_checkpoint_file
from ..errors import CheckpointError, CheckpointMismatchError
from .backbones.arch import FAMILIES, parse_attn_type
from .converters import FAMILY_CLASSES, Structure, detect_family, key_structure
from .layers.pos_embed import resize_pos_embed, square_grid

StateDict = Dict[str, Tensor]


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
def preset_structures() -> Dict[Tuple[str, str], Structure]:
    """The :class:`~inline_mm.models.converters.Structure` of every arch preset.

    Keyed by ``(family, arch)``; read from the backbones' ``arch_settings``
    (the authors' variants, :data:`~inline_mm.models.backbones.arch.FAMILIES`),
    without building a model.
    """
    presets = {}
    for family, cls in FAMILIES.items():
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
    try:
        return detect_family(state_dict)
    except CheckpointError:
        return None


def looks_like(state_dict: StateDict, family: Optional[str] = None) -> str:
    """What a backbone state dict's keys look like: ``"InLinePVT arch='small'"``, or its
    structure where no preset has it.  Empty when the family cannot be told."""
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
    logger = logger or logging.getLogger('inline_mm.checkpoint')
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
