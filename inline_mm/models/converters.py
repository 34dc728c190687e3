"""Authors' checkpoints -> inline-mm keys: pure functions, one per family.

The plugin keeps the authors' module names, so conversion only drops what a
dense-prediction backbone does not have (the classifier ``head.*``, buffers the
plugin regenerates per input size: ``relative_position_index``, ``attn_mask``)
and renames the final norm of Swin / CSwin to the norm of the last output
(``norm`` -> ``norm3``).  Every function is idempotent: an inline-mm state
dict passes through unchanged.
"""
import re
from typing import Callable, Dict

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
