"""Write a toy dataset folder atomically, or reuse a complete one.

Both toy generators (:mod:`.toy_data`) write into a hidden sibling folder and
rename it into place once whole; a marker file holding the generation
arguments makes a second call with the same arguments return at once, and a
folder this generator did not write is never deleted.  Only the standard
library (and mmengine's progress bar, when asked for) is used, so the
generator still loads without the plugin.
"""
import itertools
import json
import os
import os.path as osp
import shutil
import uuid
from typing import Callable, Dict, Optional, Tuple, Union

__all__ = ['MARKER_FILE', 'ProgressArg', 'write_once']

#: Name of the file that marks a finished dataset folder.
MARKER_FILE = '.toy_complete'

ProgressArg = Union[bool, Callable[[int, int], None]]


def _count_files(folder: str, suffix: str) -> int:
    if not osp.isdir(folder):
        return -1
    return sum(1 for f in os.listdir(folder) if f.endswith(suffix))


def _read_marker(root: str) -> Optional[dict]:
    try:
        with open(osp.join(root, MARKER_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_once(root: str, args: dict, expected: Dict[str, Tuple[int, str]],
              write: Callable[[str, Callable[[], None]], dict], total: int,
              progress: ProgressArg, force: bool) -> dict:
    """Write a dataset atomically, or reuse a complete one.

    Args:
        root (str): Final dataset folder.
        args (dict): Generation arguments stored in the marker, the
            generator's ``version`` among them.
        expected (dict): ``{relative folder: (file count, suffix)}`` that a
            complete dataset has.
        write (callable): ``write(tmp_root, step)`` writes everything into
            ``tmp_root``, calls ``step()`` after each image and returns the
            summary.
        total (int): Number of images, for the progress report.
        progress (bool | callable): See :func:`.toy_data.make_coco_toy`.
        force (bool): Regenerate even when a complete dataset exists.
    """

    def complete(folder: str) -> Optional[dict]:
        marker = _read_marker(folder)
        if marker is None or marker.get('args') != args:
            return None
        if any(_count_files(osp.join(folder, sub), suffix) != n
               for sub, (n, suffix) in expected.items()):
            return None
        return marker.get('summary')

    if not force:
        summary = complete(root)
        if summary is not None:
            return dict(summary, root=root, generated=False)
    if osp.exists(root):
        # Never delete data this generator did not write.
        if not osp.isdir(root) or (os.listdir(root) and _read_marker(root) is None):
            raise FileExistsError(
                f'{root} exists and is not a toy dataset written by this generator '
                f'(no {MARKER_FILE}); remove it or choose another folder')

    parent = osp.dirname(root)
    os.makedirs(parent, exist_ok=True)
    # A unique hidden sibling (same file system, so the final rename is
    # atomic); os.makedirs honours the umask, unlike tempfile.mkdtemp.
    tmp = osp.join(parent, f'.{osp.basename(root)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}')
    os.makedirs(tmp)
    old = None
    try:
        if progress and not callable(progress):
            from mmengine.utils import ProgressBar
            bar = ProgressBar(total)
            progress = lambda done, total: bar.update()  # noqa: E731
        done = itertools.count(1)

        def step() -> None:
            if progress:
                progress(next(done), total)

        summary = write(tmp, step)
        summary = dict(summary, args=args)
        # The marker is written last: its presence means the folder is whole.
        with open(osp.join(tmp, MARKER_FILE), 'w') as f:
            json.dump(dict(version=args['version'], args=args, summary=summary), f,
                      indent=1, sort_keys=True)
        if osp.exists(root):
            # Our own stale / different dataset: move it aside, then swap.
            old = osp.join(parent, f'.{osp.basename(root)}.old-{uuid.uuid4().hex[:8]}')
            os.replace(root, old)
        try:
            os.replace(tmp, root)
        except OSError:
            # Another process finished the same dataset first: use it.
            if complete(root) is None:
                raise
        return dict(summary, root=root, generated=True)
    finally:
        for path in (tmp, old):
            if path is not None and osp.exists(path):
                shutil.rmtree(path, ignore_errors=True)
