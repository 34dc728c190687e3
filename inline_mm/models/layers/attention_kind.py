"""What an attention kind of a :class:`~.blocks.TransformerBlock` provides.

A kind (``'I'`` InLine, ``'S'`` window softmax; the table is
:data:`~.blocks.ATTENTION_KINDS`) is an ``nn.Module`` class with

* ``for_block(args)``: the module for a block, from the block's arguments
  (:class:`BlockArgs`; a kind takes what it uses);
* ``forward(x, window, valid=None, bias=None)``: ``x`` the ``(B * nW, N, C)`` tokens
  of the windows of size ``window``, ``valid`` the ``(B * nW, N)`` real (not padded)
  tokens or None, ``bias`` the region bias of shifted / padded windows (a tensor or a
  function of a dtype) or None;
* ``shifted_windows``: whether the block's windows take its shift;
* ``region_bias``: whether the windowing builds the region bias for it;
* ``wide_windows``: whether a family gives it its InLine window (large: the cost is
  linear in the window's tokens) instead of the softmax window (InLine-Swin's choice;
  its shift is half the softmax window, so a wide kind takes none).

The block then runs every kind the same way (:func:`~.windows.run_in_windows`).
"""
from dataclasses import dataclass
from typing import Optional, Tuple

from .windows import Window


@dataclass(frozen=True)
class BlockArgs:
    """The arguments of a block that its attention may use."""

    dim: int
    num_heads: int
    window: Window = (None, None)
    #: the window a relative position table is sized for (None: ``window``)
    table_window: Optional[Tuple[int, int]] = None
    qkv_bias: bool = True
    kernel_func: str = 'identity'
    separate_q: bool = False
    num_prefix_tokens: int = 0
    attn_drop: float = 0.
    proj_drop: float = 0.


class AttentionKind:
    """Mixin of the attention kinds: the class attributes and the builder."""

    #: the block's windows take its shift
    shifted_windows: bool = False
    #: padding and shifted regions are separated by a region bias (built for the kind)
    region_bias: bool = False
    #: the family's InLine window, not its softmax window (cost linear in the window's tokens)
    wide_windows: bool = False

    @classmethod
    def for_block(cls, args: BlockArgs) -> 'AttentionKind':
        raise NotImplementedError
