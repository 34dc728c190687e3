"""Authors' checkpoints -> inline-mm keys: pure functions, one per family.

The plugin keeps the authors' module names, so conversion only drops what a
dense-prediction backbone does not have (the classifier ``head.*``, buffers the
plugin regenerates per input size: ``relative_position_index``, ``attn_mask``)
and renames the final norm of Swin / CSwin to the norm of the last output
(``norm`` -> ``norm3``).  Every function is idempotent: an inline-mm state
dict passes through unchanged.
"""
import re
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

from torch import Tensor

from ..errors import CheckpointError

StateDict = Dict[str, Tensor]

#: buffers of the reference that the plugin rebuilds for every input size
REGENERATED_BUFFERS = ('relative_position_index', 'attn_mask')


def _drop_classifier_and_buffers(state_dict: StateDict) -> StateDict:
    out = {}
    for key, value in state_dict.items():
        if key.startswith(('head.', 'head_dist.')):
            continue
        if key.rsplit('.', 1)[-1] in REGENERATED_BUFFERS:
            continue
        out[key] = value
    return out


def _final_norm_to_last_output(state_dict: StateDict, stage_key: str,
                               first_stage: int) -> StateDict:
    """Rename the final ``norm`` to the norm of the last stage's output.

    The last stage comes from the keys (``stage_key`` is a regex whose group 1
    is a stage number counted from ``first_stage``), so models with other
    than 4 stages convert too.
    """
    stages = {int(m.group(1)) for k in state_dict if (m := re.match(stage_key, k))}
    if not stages:
        return state_dict
    last = max(stages) - first_stage
    return {re.sub(r'^norm\.', f'norm{last}.', k): v for k, v in state_dict.items()}


def convert_pvt(state_dict: StateDict) -> StateDict:
    """InLine-PVT: same keys; no final norm in the reference."""
    return _drop_classifier_and_buffers(state_dict)


def convert_swin(state_dict: StateDict) -> StateDict:
    """InLine-Swin: final ``norm`` becomes the norm of the last stage's output."""
    return _final_norm_to_last_output(_drop_classifier_and_buffers(state_dict),
                                      r'^layers\.(\d+)\.', first_stage=0)


def convert_cswin(state_dict: StateDict) -> StateDict:
    """InLine-CSwin: final ``norm`` becomes the norm of the last stage's output."""
    return _final_norm_to_last_output(_drop_classifier_and_buffers(state_dict),
                                      r'^stage(\d+)\.', first_stage=1)


def convert_deit(state_dict: StateDict) -> StateDict:
    """InLine-DeiT: same keys (``norm`` stays the final norm)."""
    return _drop_classifier_and_buffers(state_dict)


CONVERTERS: Dict[str, Callable[[StateDict], StateDict]] = {
    'pvt': convert_pvt,
    'swin': convert_swin,
    'cswin': convert_cswin,
    'deit': convert_deit,
}


def detect_family(state_dict: StateDict) -> str:
    """Tell the family of an authors' or inline-mm state dict from its keys."""
    keys = state_dict.keys()
    if any(k.startswith('stage1_conv_embed.') for k in keys):
        return 'cswin'
    if any(k.startswith('block1.') or k.startswith('pos_embed1') for k in keys):
        return 'pvt'
    if any(k.startswith('layers.') for k in keys):
        return 'swin'
    if 'cls_token' in keys or any(k.startswith('blocks.') for k in keys):
        return 'deit'
    raise CheckpointError("cannot tell the InLine family of this state dict: none of the keys "
                          "'stage1_conv_embed.*' (CSwin), 'block1.*' (PVT), 'layers.*' (Swin), "
                          "'blocks.*' / 'cls_token' (DeiT) is present; pass the family "
                          'explicitly')


def convert(state_dict: StateDict, family: str | None = None) -> StateDict:
    """Convert with the converter of ``family`` (detected from the keys when None)."""
    family = family or detect_family(state_dict)
    if family not in CONVERTERS:
        raise CheckpointError(f'unknown family {family!r}: choose one of {", ".join(CONVERTERS)}')
    return CONVERTERS[family](state_dict)


#: per family: the regex of a block's keys (groups: stage, block; DeiT has one stage)
#: and the number of its first stage
BLOCK_KEYS: Dict[str, Tuple[str, int]] = {
    'pvt': (r'^block(\d+)\.(\d+)\.', 1),
    'swin': (r'^layers\.(\d+)\.blocks\.(\d+)\.', 0),
    'cswin': (r'^stage(\d+)\.(\d+)\.', 1),
    'deit': (r'^()blocks\.(\d+)\.', 0),
}

#: the class each family's keys belong to
FAMILY_CLASSES: Dict[str, str] = {'pvt': 'InLinePVT', 'swin': 'InLineSwin',
                                  'cswin': 'InLineCSWin', 'deit': 'InLineDeiT'}


@dataclass(frozen=True)
class Structure:
    """The block structure of a state dict: what tells one arch from another.

    ``kinds`` holds, per stage, one letter per block: ``'I'`` InLine (its
    local branch ``residual`` is there), ``'S'`` softmax, ``'?'`` a block index
    missing between others.  ``dims`` holds each stage's width (from the
    blocks' ``norm1``), None where no block tells.
    """

    family: str
    kinds: Tuple[str, ...]
    dims: Tuple[Optional[int], ...]

    @property
    def depths(self) -> Tuple[int, ...]:
        return tuple(len(k) for k in self.kinds)

    def describe(self) -> str:
        """``'depths 2-2-18-2, widths 128-256-512-1024, attention I I M2 S'``.

        A stage is one letter when its blocks agree, ``M<k>`` when k InLine
        blocks come before softmax ones (the reference's notation).
        """
        dims = '-'.join('?' if d is None else str(d) for d in self.dims)
        kinds = []
        for stage in self.kinds:
            mixed = re.fullmatch(r'(I+)S+', stage)
            kinds.append(stage[:1] if len(set(stage)) == 1 else
                         f'M{len(mixed.group(1))}' if mixed else stage)
        return (f"depths {'-'.join(map(str, self.depths))}, widths {dims}, "
                f"attention {' '.join(kinds)}")


def key_structure(state_dict: StateDict, family: str) -> Structure:
    """The :class:`Structure` of ``state_dict`` read with ``family``'s key layout."""
    pattern, first = BLOCK_KEYS[family]
    blocks: Dict[Tuple[int, int], list] = {}
    for key in state_dict:
        match = re.match(pattern, key)
        if match:
            stage = int(match.group(1) or first) - first
            blocks.setdefault((stage, int(match.group(2))), []).append(key)
    num_stages = max((s for s, _ in blocks), default=-1) + 1
    kinds, dims = [], []
    for stage in range(num_stages):
        depth = max((b for s, b in blocks if s == stage), default=-1) + 1
        letters, dim = '', None
        for b in range(depth):
            keys = blocks.get((stage, b))
            if keys is None:
                letters += '?'
                continue
            # InLine blocks have the local branch (``residual``), softmax blocks do not
            letters += 'I' if any('.residual.' in k for k in keys) else 'S'
            norms = [k for k in keys if k.endswith('.norm1.weight')]
            if dim is None and norms:
                dim = int(state_dict[norms[0]].shape[0])
        kinds.append(letters)
        dims.append(dim)
    return Structure(family, tuple(kinds), tuple(dims))
