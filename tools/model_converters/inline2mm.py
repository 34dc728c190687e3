#!/usr/bin/env python
"""Convert an authors' InLine checkpoint to an inline-mm backbone checkpoint.

    python tools/model_converters/inline2mm.py inline_swin_t.pth checkpoints/inline_swin_t_mm.pth

The output holds ``{'state_dict': ..., 'meta': ...}`` with the plugin's keys
(loadable by ``init_cfg=dict(type='Pretrained', checkpoint=DST)`` and by
mmengine's ``load_checkpoint``).  The input is read with ``weights_only=True``;
an existing DST is never overwritten unless ``--overwrite`` is given, and the
output is written to a temporary file first, then moved into place (a DST that
cannot be written is refused before the conversion).  The
family is detected from the keys; a ``--family`` that contradicts them is
refused before anything is written.
"""
import argparse
import io
import os
import sys
from typing import Optional

import torch

from inline_mm.checkpoint import load_checkpoint_file
from inline_mm.models.pretrained import extract_state_dict, looks_like
from inline_mm.engine.atomic_io import atomic_write, check_can_make_folder
from inline_mm.engine.launch import cli_main
from inline_mm.errors import CheckpointError, CheckpointMismatchError, ConfigError
from inline_mm.models.converters import CONVERTERS, FAMILY_CLASSES, convert, detect_family


def check_family(state_dict: dict, family: Optional[str], src: str) -> str:
    """The family of ``state_dict``: detected from its keys; ``family`` must agree.

    Raises:
        CheckpointMismatchError: ``family`` contradicts the keys.
        CheckpointError: no family given and the keys tell none.
    """
    try:
        detected = detect_family(state_dict)
    except CheckpointError:
        if family is None:
            raise
        return family  # keys of no known layout: the user's word is all there is
    if family is not None and family != detected:
        raise CheckpointMismatchError(
            f'--family {family} contradicts the keys of {src}: they are those of '
            f'{looks_like(state_dict, detected) or FAMILY_CLASSES[detected]}; drop --family '
            f'(it is detected) or pass --family {detected}')
    return detected


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help="authors' checkpoint ({'model': ...})")
    parser.add_argument('dst', help='output file')
    parser.add_argument('--family', choices=sorted(CONVERTERS),
                        help='model family (default: detected from the keys)')
    parser.add_argument('--state-dict-key', default=None,
                        help="take the weights from this entry (e.g. 'state_dict_ema')")
    parser.add_argument('--overwrite', action='store_true', help='replace an existing DST')
    args = parser.parse_args(argv)

    if os.path.isdir(args.dst) or args.dst.endswith(('/', os.sep)):
        raise ConfigError(f'{args.dst} is a folder: name the output file (e.g. '
                          f'{os.path.join(args.dst, "backbone.pth")})')
    if os.path.exists(args.dst) and not args.overwrite:
        parser.error(f'{args.dst} exists; pass --overwrite to replace it')
    try:  # before the conversion, and nothing made
        check_can_make_folder(os.path.dirname(os.path.abspath(args.dst)))
    except OSError as err:
        raise ConfigError(f'{args.dst} cannot be written: {err.strerror}; name a file in a '
                          f'writable folder') from None
    state_dict = extract_state_dict(load_checkpoint_file(args.src), args.state_dict_key)
    family = check_family(state_dict, args.family, args.src)
    converted = convert(state_dict, family)
    buffer = io.BytesIO()
    torch.save({'state_dict': converted,
                'meta': dict(source=os.path.basename(args.src), family=family,
                             converter='inline2mm')}, buffer)
    atomic_write(buffer.getvalue(), args.dst)  # an existing DST is whole, old or new
    look = looks_like(converted, family)
    print(f'{family} ({look}): {len(state_dict)} tensors in, {len(converted)} written to '
          f'{args.dst} ({len(state_dict) - len(converted)} dropped: classifier head, '
          f'regenerated buffers)')
    return 0


if __name__ == '__main__':
    sys.exit(cli_main(main))
