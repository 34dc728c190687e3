"""Count device-to-host reads made by inline-mm's own code (used by test_host_syncs.py).

A read of a tensor's value on the host (``item``, ``tolist``, ``bool(t)``,
``float(t)``, ``.cpu()``, ``.numpy()``, ...) makes the host wait for the device
on a GPU.  :class:`SyncCounter` wraps those ``torch.Tensor`` methods and
records each call whose calling frame is a file of the ``inline_mm`` package;
calls from torch, mmengine or mmdet are not ours and are not counted.

Run as a script it trains a config through ``tools/train.py``'s ``main`` with
the counter on and writes, per process, how many reads fell inside each
training iteration (mmengine's ``run_iter``: the hooks before and after the
iteration, the forward, backward and optimizer step) and where they were::

    python tests/host_syncs.py OUT.json CONFIG [train.py args...]
    python -m torch.distributed.run --nproc_per_node 2 tests/host_syncs.py OUT.json CONFIG \
        --launcher pytorch [...]
"""
import collections
import json
import os
import os.path as osp
import sys
from typing import Dict, List, Optional, Tuple

import torch

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PACKAGE_DIR = osp.join(REPO_ROOT, 'inline_mm') + os.sep

#: the Tensor methods that read a value to the host
READS = ('item', 'tolist', 'cpu', 'numpy', '__bool__', '__float__', '__int__', '__index__')


class SyncCounter:
    """Context manager recording host reads made from ``inline_mm`` code.

    ``sites`` collects ``(file, line, method)`` of every counted read made while
    :attr:`active` is True (always, unless a caller toggles it).
    """

    def __init__(self) -> None:
        self.sites: List[Tuple[str, int, str]] = []
        self.active = True
        self._saved: Dict[str, object] = {}

    def __enter__(self) -> 'SyncCounter':
        for name in READS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original
            setattr(torch.Tensor, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._saved.clear()

    def _wrap(self, name: str, original):
        counter = self

        def read(tensor, *args, **kwargs):
            if counter.active:
                caller = sys._getframe(1)
                path = caller.f_code.co_filename
                if path.startswith(PACKAGE_DIR):
                    counter.sites.append((osp.relpath(path, REPO_ROOT), caller.f_lineno, name))
            return original(tensor, *args, **kwargs)

        read.__name__ = name
        return read


def count_training_reads(out: str, argv: List[str]) -> None:
    """Train with ``tools/train.py`` and write the reads of each iteration to ``out``."""
    from mmengine.runner import loops

    sys.path.insert(0, osp.join(REPO_ROOT, 'tools'))
    import train  # tools/train.py

    per_iter: List[List[Tuple[str, int, str]]] = []
    counter = SyncCounter()
    counter.active = False
    originals = {}
    for loop in (loops.IterBasedTrainLoop, loops.EpochBasedTrainLoop):
        originals[loop] = loop.run_iter

        def run_iter(self, *args, _original=loop.run_iter, **kwargs):
            start = len(counter.sites)
            counter.active = True
            try:
                return _original(self, *args, **kwargs)
            finally:
                counter.active = False
                per_iter.append(counter.sites[start:])

        loop.run_iter = run_iter
    code: Optional[int] = 0
    try:
        with counter:
            try:
                train.main(argv)
            except SystemExit as stop:
                code = stop.code
    finally:
        for loop, original in originals.items():
            loop.run_iter = original
    rank = int(os.environ.get('RANK', 0))
    with open(f'{out}.rank{rank}', 'w') as f:
        json.dump(dict(exit=code, iterations=len(per_iter),
                       reads_per_iteration=[len(s) for s in per_iter],
                       sites=collections.Counter(f'{p}:{n} {m}' for s in per_iter
                                                 for p, n, m in s)), f)


if __name__ == '__main__':
    count_training_reads(sys.argv[1], sys.argv[2:])
