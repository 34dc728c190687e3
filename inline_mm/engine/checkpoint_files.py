"""Which checkpoint of a work dir a run can resume from.

mmengine's ``--resume`` without a file loads whatever ``last_checkpoint`` names,
readable or not, and a torn file stops the run with an unpickling error.  This
module adds:

* :func:`checkpoint_problem`: a cheap integrity check (every zip member's CRC; the
  project's safe loader for other files), nothing unpickled from zip checkpoints;
* :func:`newest_readable_checkpoint`: the newest intact one among the pointer's file
  and the files of the checkpoint name template, each newer unreadable one logged;
* :class:`CheckpointWriteError`: what a failed checkpoint write raises.
"""
import logging
import os
import os.path as osp
import re
import zipfile
from typing import Any, Dict, Optional, Tuple

from mmengine.logging import print_log

from ..checkpoint import load_checkpoint_file


class CheckpointWriteError(RuntimeError):
    """A checkpoint or the ``last_checkpoint`` pointer could not be written."""


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be resumed from, or None when it is intact.

    torch's zip checkpoints are checked member by member against their CRCs
    (reads the file once, unpickles nothing); other files are loaded with the
    project's safe loader.
    """
    if not osp.isfile(path):
        return 'file not found'
    if osp.getsize(path) == 0:
        return 'empty file'
    try:
        with open(path, 'rb') as f:
            magic = f.read(2)
        if magic == b'PK' and not zipfile.is_zipfile(path):
            return 'truncated (the zip archive has no central directory)'
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()
            return None if bad is None else f'corrupt member {bad}'
        load_checkpoint_file(path)
        return None
    except Exception as err:  # any read failure means "do not resume from it"
        return f'{type(err).__name__}: {err}'


def _template_regex(filename_tmpl: str) -> 're.Pattern[str]':
    head, _, tail = filename_tmpl.partition('{}')
    return re.compile(re.escape(head) + r'(\d+)' + re.escape(tail) + '$')


def newest_readable_checkpoint(folder: str, filename_tmpl: str = 'iter_{}.pth',
                               logger: Any = None) -> Optional[str]:
    """The newest intact checkpoint of ``folder`` (None when there is none).

    Candidates are the file ``last_checkpoint`` names and every file that
    matches ``filename_tmpl``; the newest (modification time, then step) that
    passes :func:`checkpoint_problem` wins.  Each unreadable candidate newer
    than the choice is reported on ``logger`` (a warning).
    """
    candidates: Dict[str, Tuple[float, int]] = {}
    regex = _template_regex(filename_tmpl)
    pointer = osp.join(folder, 'last_checkpoint')
    named = None
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip() or None
    if osp.isdir(folder):
        for name in os.listdir(folder):
            match = regex.match(name)
            if match:
                path = osp.join(folder, name)
                candidates[path] = (osp.getmtime(path), int(match.group(1)))
    if named and osp.isfile(named):
        candidates.setdefault(named, (osp.getmtime(named), -1))
    elif named:
        _warn(logger, f'last_checkpoint names {named}, which does not exist')
    for path in sorted(candidates, key=lambda p: candidates[p], reverse=True):
        problem = checkpoint_problem(path)
        if problem is None:
            return path
        _warn(logger, f'checkpoint {path} is unreadable ({problem}); trying an older one')
    return None


def _warn(logger: Any, msg: str) -> None:
    if logger is not None:
        logger.warning(msg)
    else:
        print_log(msg, logger='current', level=logging.WARNING)
