"""One least-recently-used cache, bounded in bytes, for the per-size masks and indices.

Windowed attention needs, per feature-map size, window size and shift, masks
of the padded tokens and region biases (up to ``nW x N x N`` values), and per
clipped window a relative position index.  They depend on sizes only, so they
are built once and reused; at detection sizes (many input shapes, large maps)
an unbounded cache grows without limit.  This cache holds at most
:func:`budget_bytes` bytes over all its entries, evicting the least recently
used first; an entry larger than the whole budget is built and not kept.

The budget is ``INLINE_MM_CACHE_MB`` megabytes (environment variable, read
at import; default 256), or set at run time with :func:`set_budget_mb`; 0
turns caching off.  Keys name the device and dtype of the entry, so a mask
is built once in the dtype of the scores it is added to.

While a graph is recorded (``torch.compile`` or ONNX export) the cache is
never read: the entries are built in the graph (:mod:`.symbolic`), so dynamo
puts no guard on the cache's contents and a new entry recompiles nothing.
"""
import os
from collections import OrderedDict
from typing import Any, Callable, Hashable, Optional

import torch

from . import symbolic
from ...errors import ConfigError

#: Environment variable with the byte budget of the cache, in MB.
ENV_VAR = 'INLINE_MM_CACHE_MB'
DEFAULT_MB = 256.


def _mb_from_env() -> float:
    text = os.environ.get(ENV_VAR, '')
    if not text:
        return DEFAULT_MB
    try:
        value = float(text)
    except ValueError:
        value = -1.
    if value < 0:
        raise ConfigError(f'{ENV_VAR}={text!r} is not a size in MB: set it to a number >= 0 '
                          f'(0 turns the mask cache off) or unset it for {DEFAULT_MB:g}')
    return value


def nbytes(value: Any) -> int:
    """Bytes held by a tensor, or by the tensors of a tuple / list (None counts 0)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    return 0


class TensorCache:
    """An LRU mapping of keys to tensors whose total size stays within a byte budget.

    Args:
        budget_mb: the budget in MB; None follows the module setting
            (:func:`set_budget_mb`, ``INLINE_MM_CACHE_MB``).
    """

    def __init__(self, budget_mb: Optional[float] = None) -> None:
        self._entries: 'OrderedDict[Hashable, tuple]' = OrderedDict()
        self._budget_mb = budget_mb
        self.nbytes = 0

    @property
    def budget(self) -> int:
        """The byte budget this cache keeps to."""
        mb = _BUDGET_MB if self._budget_mb is None else self._budget_mb
        return int(mb * 2 ** 20)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The entry of ``key``, built by ``build()`` on a miss.

        In a recorded graph ``build()`` runs every time (in the graph) and the
        cache is not touched.  Entries are built outside inference mode: a mask
        cached during inference is reused in training, where inference tensors
        cannot enter autograd.
        """
        if symbolic.in_graph() or symbolic.is_jit_tracing():
            # a jit trace (mmengine's FLOP counter) gives sizes as traced tensors: an entry
            # built then would hold a traced size (and make the byte count a tensor)
            return build()
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit[0]
        with torch.inference_mode(False):
            value = build()
        size = nbytes(value)
        budget = self.budget
        if size <= budget:
            self._entries[key] = (value, size)
            self.nbytes += size
            self._evict(budget)
        return value

    def _evict(self, budget: int) -> None:
        while self.nbytes > budget and self._entries:
            _, (_, size) = self._entries.popitem(last=False)
            self.nbytes -= size


_BUDGET_MB = _mb_from_env()

#: The cache of the window masks and relative position indices.
CACHE = TensorCache()


def budget_bytes() -> int:
    """The byte budget of :data:`CACHE`."""
    return CACHE.budget


def set_budget_mb(mb: float) -> None:
    """Set the budget of :data:`CACHE` (MB, 0 = no caching); evicts down to it now."""
    global _BUDGET_MB
    if mb < 0:
        raise ConfigError(f'the mask cache budget is a size in MB >= 0, got {mb!r}')
    _BUDGET_MB = float(mb)
    CACHE._evict(CACHE.budget)
