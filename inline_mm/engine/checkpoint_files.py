"""Which checkpoint of a work dir a run can resume from.

mmengine's ``--resume`` without a file loads whatever ``last_checkpoint`` names,
readable or not, and a torn file stops the run with an unpickling error.  This
module adds:

* :func:`checkpoint_problem`: a cheap integrity check (every zip member's CRC; the
  project's safe loader for other files), nothing unpickled from zip checkpoints;
* :func:`newest_readable_checkpoint`: the newest intact one among the pointer's file
  and the files of the checkpoint name template, each newer unreadable one logged;
* :func:`read_pointer` / :func:`point_to`: the ``last_checkpoint`` pointer, read and
  set (written atomically);
* :class:`CheckpointWriteError`: what a failed checkpoint write raises;
* :func:`hold_best_checkpoints` / :func:`settle_held_best` / :func:`recover_held_best`:
  mmengine's ``save_best`` deletes the previous best checkpoint before it writes
  the new one; a hard link (``<name>.held``) keeps the previous one's data until
  the new one is in place, and puts it back when the write failed or the run
  died in between.
"""
import logging
import os
import os.path as osp
import re
import zipfile
from typing import Any, Dict, List, Optional, Tuple

from mmengine.logging import print_log

from ..checkpoint import load_checkpoint_file
from .atomic_io import atomic_write


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


def _template_pattern(filename_tmpl: str) -> str:
    """``filename_tmpl``'s names as a regex; the step (``{}``, ``{:06d}``) is group ``step``."""
    head, tail = (re.split(r'\{[^{}]*\}', filename_tmpl, maxsplit=1) + [''])[:2]
    return re.escape(head) + r'(?P<step>\d+)' + re.escape(tail) + '$'


def _template_regex(filename_tmpl: str) -> 're.Pattern[str]':
    return re.compile(_template_pattern(filename_tmpl))


def read_pointer(folder: str) -> Optional[str]:
    """What the ``last_checkpoint`` file of ``folder`` names ('' when it is empty, None
    when there is no such file)."""
    path = osp.join(folder, 'last_checkpoint')
    if not osp.isfile(path):
        return None
    with open(path) as f:
        return f.read().strip()


def point_to(folder: str, choice: Optional[str], logger: Any = None) -> None:
    """Make ``last_checkpoint`` name ``choice`` (or remove it for None), where it does not.

    mmengine's ``--resume`` without a file (``resume=True``, no ``load_from``)
    resumes from what this pointer names, and from nothing when it is absent.
    """
    if read_pointer(folder) == choice:
        return
    pointer = osp.join(folder, 'last_checkpoint')
    if choice is not None:
        atomic_write(choice, pointer)
    elif osp.isfile(pointer):
        _warn(logger, f'--resume: removed {pointer}, which names no readable checkpoint')
        os.remove(pointer)


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
    named = read_pointer(folder) or None
    if osp.isdir(folder):
        for name in os.listdir(folder):
            match = regex.match(name)
            if match:
                path = osp.join(folder, name)
                candidates[path] = (osp.getmtime(path), int(match.group('step')))
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


#: the name ending of a best checkpoint's hard link while ``save_best`` replaces it
HELD_SUFFIX = '.held'
#: the best checkpoints a folder held when the hold began (one name a line)
HELD_MANIFEST = '.best_checkpoints_held'


def _best_regex(filename_tmpl: str) -> 're.Pattern[str]':
    """mmengine's best checkpoint names: ``best_<metric key>_<filename_tmpl>``."""
    return re.compile(r'best_(?P<key>.+)_' + _template_pattern(filename_tmpl))


def hold_best_checkpoints(folder: str, filename_tmpl: str) -> List[str]:
    """Hard-link every best checkpoint of ``folder`` to ``<name>.held``.

    A link costs no copy; the data stay on disk when mmengine deletes the
    original.  Returns the links made (none where the file system has no hard
    links: then the hold is skipped, as mmengine would do without it).
    """
    regex, held = _best_regex(filename_tmpl), []
    names = sorted(n for n in os.listdir(folder) if regex.match(n)) if osp.isdir(folder) else []
    if names:  # what was there before: a best file not listed is a replacement
        atomic_write(''.join(n + '\n' for n in names), osp.join(folder, HELD_MANIFEST))
    for name in names:
        path = osp.join(folder, name)
        if osp.isfile(path):
            link = path + HELD_SUFFIX
            try:
                if osp.lexists(link):
                    os.remove(link)
                os.link(path, link)
            except OSError as err:
                _warn(None, f'cannot keep {path} while the best checkpoint is replaced '
                            f'({err.strerror}); it is deleted before the new one is written')
                continue
            held.append(link)
    return held


def settle_held_best(folder: str, filename_tmpl: str) -> List[str]:
    """Put back each held best checkpoint whose replacement was not written; drop the links.

    A ``<name>.held`` link (:func:`hold_best_checkpoints`) is dropped where its
    original still exists (that metric did not improve) or where a best
    checkpoint of the same metric exists that the folder did not hold when the
    hold began (its list, :data:`HELD_MANIFEST`): the replacement was written
    (writes are atomic, so one that exists is whole).  Otherwise, also without
    that list, the link is renamed back to its original: a stale duplicate at
    worst, never a lost best.  Returns the restored paths.
    """
    if not osp.isdir(folder):
        return []
    regex = _best_regex(filename_tmpl)
    manifest = osp.join(folder, HELD_MANIFEST)
    before: Optional[set] = None
    if osp.isfile(manifest):
        with open(manifest) as f:
            before = set(f.read().split())
    names = os.listdir(folder)
    new = [m for m in (regex.match(n) for n in names if not n.endswith(HELD_SUFFIX)) if m] \
        if before is not None else []
    restored = []
    for name in sorted(n for n in names if n.endswith(HELD_SUFFIX)):
        link, original = osp.join(folder, name), osp.join(folder, name[:-len(HELD_SUFFIX)])
        held = regex.match(name[:-len(HELD_SUFFIX)])
        replaced = held is not None and before is not None and any(
            m.group('key') == held.group('key') and m.string not in before for m in new)
        if osp.exists(original) or replaced:
            os.remove(link)
        else:
            os.replace(link, original)
            restored.append(original)
    if before is not None:
        os.remove(manifest)
    return restored


def recover_held_best(folder: str, filename_tmpl: str, logger: Any = None) -> List[str]:
    """:func:`settle_held_best` for the links of a run that stopped inside ``save_best``.

    Logs each best checkpoint it puts back; returns their paths.
    """
    restored = settle_held_best(folder, filename_tmpl)
    for path in restored:
        _warn(logger, f'restored the best checkpoint {path}: the run stopped while '
                      f'save_best was replacing it')
    return restored


def _warn(logger: Any, msg: str) -> None:
    if logger is not None:
        logger.warning(msg)
    else:
        print_log(msg, logger='current', level=logging.WARNING)
