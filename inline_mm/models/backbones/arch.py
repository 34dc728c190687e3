"""The backbones' structural arguments, parsed the same way in every family.

Arch presets with overrides (:func:`resolve_arch`), per-stage lists checked
against ``depths`` (:func:`check_stage_lists`), the reference's ``attn_type``
letters (:func:`parse_attn_type`), per-stage windows (:func:`per_stage_windows`),
and :data:`FAMILIES`, the backbone class of each family (filled as the classes
are defined), from which the checkpoint code reads the presets without
importing the classes.
"""
import re
from typing import Dict, List, Sequence, Union

from ...errors import ConfigError
from ..layers.windows import Window, to_window

WindowSpec = Union[str, int, Sequence, None]

#: family name (``'pvt'``, ``'swin'``, ``'cswin'``, ``'deit'``) -> its backbone class
FAMILIES: Dict[str, type] = {}


def resolve_arch(cls_name: str, arch: Union[str, dict], settings: Dict[str, dict],
                 overrides: dict) -> dict:
    """Start from an arch preset (or a full dict) and apply explicit overrides."""
    if isinstance(arch, str):
        if arch not in settings:
            raise ConfigError(f"unknown arch {arch!r} for {cls_name}: choose one of "
                              f"{', '.join(settings)} or pass a dict of structural arguments")
        cfg = dict(settings[arch])
    elif isinstance(arch, dict):
        cfg = dict(arch)
    else:
        raise ConfigError(f'arch of {cls_name} is a preset name or a dict, '
                          f'got {type(arch).__name__}')
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    return cfg


def check_stage_lists(cls_name: str, cfg: dict, per_stage: Sequence[str]) -> int:
    """The number of stages (``len(depths)``), checking every per-stage list against it."""
    num_stages = len(cfg['depths'])
    if num_stages < 1:
        raise ConfigError(f'depths of {cls_name} is empty: give one block count per stage')
    for name in per_stage:
        value = cfg.get(name)
        if isinstance(value, (list, tuple)) and len(value) != num_stages:
            raise ConfigError(f'{name} of {cls_name} has {len(value)} entries but depths '
                              f'{list(cfg["depths"])} has {num_stages} stages: give one per stage')
    return num_stages


def parse_attn_type(attn_type: Union[str, Sequence[str]], depths: Sequence[int],
                    allowed: str, cls_name: str) -> List[List[str]]:
    """Expand the reference's attn_type into one ``'I'`` / ``'S'`` per block.

    One letter a stage: ``'I'`` InLine, ``'S'`` softmax, ``'M'`` mixed (InLine in
    the first k blocks of the stage, softmax after), with k written after the
    stage letters as in the reference (``'IIMS2'``).  A list form
    ``['I', 'I', 'M2', 'S']`` is accepted too.
    """
    num_stages = len(depths)
    example = 'I' * num_stages
    if isinstance(attn_type, str):
        letters, suffix = attn_type[:num_stages], attn_type[num_stages:]
        if len(letters) < num_stages or (suffix and not suffix.isdigit()):
            raise ConfigError(
                f'attn_type {attn_type!r} does not fit {cls_name}: give one letter per stage '
                f'({num_stages} stages, e.g. {example!r}), followed by the InLine block count '
                f"of an 'M' stage if there is one (e.g. 'IIMS2')")
        stages = [c + (suffix if c == 'M' else '') for c in letters]
        if suffix and 'M' not in letters:
            raise ConfigError(f"attn_type {attn_type!r}: the trailing number is only allowed "
                              f"with an 'M' stage")
    else:
        stages = list(attn_type)
        if len(stages) != num_stages:
            raise ConfigError(f'attn_type {attn_type!r} has {len(stages)} entries but {cls_name} '
                              f'has {num_stages} stages')
    per_block = []
    for stage, (code, depth) in enumerate(zip(stages, depths)):
        # one kind letter (a key of blocks.ATTENTION_KINDS), or 'M' with its count
        match = re.fullmatch(r'([A-LN-Z])|M(\d+)', code)
        if match is None or code[0] not in allowed:
            raise ConfigError(f'attn_type {attn_type!r}: stage {stage} has {code!r}; {cls_name} '
                              f"supports {', '.join(repr(a) for a in allowed)}"
                              + (" ('M' needs its block count, e.g. 'IIMS2')" if code == 'M'
                              else ''))
        if match.group(1):
            per_block.append([code] * depth)
        else:
            k = int(match.group(2))
            if not 0 < k <= depth:  # more InLine blocks than the stage has: a typo
                raise ConfigError(
                    f"attn_type {attn_type!r}: the 'M' stage {stage} has {depth} blocks, so its "
                    f'InLine block count is 1 to {depth}, got {k} (InLine in the first k '
                    f"blocks, softmax after); write 'S' for a whole softmax stage")
            per_block.append(['I' if i < k else 'S' for i in range(depth)])
    return per_block


def per_stage_windows(spec: WindowSpec, auto: Sequence[Window], name: str) -> List[Window]:
    """Per-stage InLine windows.

    ``'auto'``: ``auto`` (the family default); ``'global'`` / None: global in
    every stage; an int or an ``(h, w)`` pair: that window in every stage; a
    list with one entry per stage (int, pair, ``'global'`` or None).
    """
    n = len(auto)
    if spec is None or spec == 'global':
        return [(None, None)] * n
    if spec == 'auto':
        return list(auto)
    if isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
        return [(spec, spec)] * n
    if isinstance(spec, (list, tuple)):
        if len(spec) == 2 and all(s is None or isinstance(s, int) for s in spec):
            return [(spec[0], spec[1])] * n
        if len(spec) == n:
            return [(None, None) if s in (None, 'global') else to_window(s) for s in spec]
    raise ConfigError(f"{name} is 'auto', 'global', a positive int, an (h, w) pair or a list "
                      f'of {n} of those (one per stage), got {spec!r}')
