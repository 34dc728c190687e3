"""Atomic checkpoint files: a reader sees the old file or the whole new one, never a torn one.

mmengine's local file backend writes a checkpoint in place, and its ``CheckpointHook``
writes ``last_checkpoint`` the same way: a kill, a full disk or a power loss in the
middle leaves a truncated file under the final name.  This module adds:

* :func:`atomic_write`: the data go to a temp file in the same folder, flushed,
  fsynced and renamed over the target, then the folder is fsynced; the file gets the
  mode ``open()`` would give it (0666 less the umask), as mmengine's own files;
* :class:`AtomicLocalBackend`: mmengine's local file backend with ``put`` going
  through :func:`atomic_write`, registered as the file backend ``'inline_mm_atomic_local'``
  (what :class:`~inline_mm.engine.hooks.AtomicCheckpointHook` saves through);
* :func:`remove_stale_temp_files`: the temp files of writes that were killed;
* :func:`check_can_write`: an output file checked before a run that writes it at the end;
* :func:`check_can_make_folder`: a work dir / output folder checked, nothing made.
"""
import os
import os.path as osp
import tempfile
from pathlib import Path
from typing import List, Union

from mmengine.fileio import LocalBackend, register_backend


#: name of the atomic local file backend in mmengine's file backend registry
ATOMIC_BACKEND = 'inline_mm_atomic_local'


def fsync_dir(folder: str) -> None:
    """fsync a folder so a rename in it survives a power loss (no-op where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on folders
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask: from /proc (Linux), else by setting and restoring it."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('Umask:'):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no getter elsewhere; a brief window for other threads
    os.umask(mask)
    return mask


def check_can_write(path: str, atomic: bool = True) -> None:
    """Make sure ``path`` can be written later, without touching a file already there.

    Creates the folder (as :func:`atomic_write` would) and writes and removes a temp
    file in it, so a run that writes its results only at the end fails before it
    starts instead (with several processes, a failure on rank 0 at the end would
    leave the others waiting for it until the collective timeout).  With
    ``atomic=False`` (a writer that opens ``path`` in place, as mmengine's
    ``dump``) an existing file only has to be writable itself.

    Raises:
        OSError: the folder cannot be made or written, or ``path`` is a folder; the
            error carries ``path`` as its file name.
    """
    if osp.isdir(path):
        raise IsADirectoryError(21, 'a folder, not a file', path)
    if not atomic and osp.isfile(path):
        if not os.access(path, os.W_OK):
            raise PermissionError(13, 'the file is not writable', path)
        return
    folder = osp.dirname(osp.abspath(path))
    try:
        if osp.exists(folder) and not osp.isdir(folder):  # makedirs would say 'File exists'
            raise NotADirectoryError(20, f'{osp.basename(folder)} is a file, not a folder', path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(path)}.', suffix='.tmp', dir=folder)
        os.close(fd)
        os.remove(tmp)
    except OSError as err:
        raise type(err)(err.errno, err.strerror, path) from err


def check_can_make_folder(path: str) -> None:
    """Make sure the folder ``path`` exists or can be made, without making it.

    A work dir or output folder below a file, or in a folder that is not
    writable, fails before a run starts (mmengine would raise deep inside the
    Runner).  Nothing is created: an input error found later leaves no folder.

    Raises:
        OSError: the nearest existing ancestor is a file or not writable; the error
            carries ``path`` as its file name.
    """
    current = osp.abspath(path)
    while not osp.exists(current) and osp.dirname(current) != current:
        current = osp.dirname(current)
    if not osp.isdir(current):
        raise NotADirectoryError(20, f'{current} is a file, not a folder', path)
    if not os.access(current, os.W_OK | os.X_OK):
        raise PermissionError(13, f'{current} is not writable', path)


def atomic_write(data: Union[bytes, str], path: str) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either the old file or the whole new one.

    The data go to a temp file in the same folder, which is flushed, fsynced
    and renamed over ``path``; the folder is fsynced after the rename.  On
    failure the temp file is removed and ``path`` is untouched.

    Raises:
        OSError: the folder cannot be written (read-only, full disk ...); the
            error carries ``path`` as its file name.
    """
    if isinstance(data, str):
        data = data.encode('utf-8')
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(path)}.', suffix='.tmp', dir=folder)
    try:
        # mkstemp makes the file 0600; give it the mode open() would (0666 less the umask),
        # so teammates on shared storage read checkpoints as they read mmengine's own
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        try:
            os.remove(tmp)
        except OSError:
            pass
        if isinstance(err, OSError) and err.filename is None:
            raise OSError(err.errno, err.strerror, path) from err
        raise
    fsync_dir(folder)


def replace_with(tmp: str, path: str) -> None:
    """Put the complete file ``tmp`` in place of ``path`` (fsync, rename, fsync the folder).

    For a writer that cannot go through :func:`atomic_write` (mmengine's
    FlexibleRunner strategies write with the plain local backend): it writes
    ``tmp`` (named ``.NAME.XXXX.tmp`` beside ``path``), this publishes it.
    """
    with open(tmp, 'rb') as f:
        os.fsync(f.fileno())
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
    fsync_dir(osp.dirname(osp.abspath(path)))


class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose writes are atomic (see :func:`atomic_write`)."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write(obj, str(filepath))

    def put_text(self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8') -> None:
        atomic_write(obj.encode(encoding), str(filepath))


register_backend(ATOMIC_BACKEND, AtomicLocalBackend, force=True)


def remove_stale_temp_files(folder: str) -> List[str]:
    """Remove the temp files of writes that were killed (``.NAME.XXXX.tmp``)."""
    removed = []
    if not osp.isdir(folder):
        return removed
    for name in os.listdir(folder):
        if name.startswith('.') and name.endswith('.tmp'):
            try:
                os.remove(osp.join(folder, name))
                removed.append(name)
            except OSError:
                pass
    return removed
