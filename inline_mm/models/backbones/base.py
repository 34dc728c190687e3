"""What the four InLine backbones share: the OpenMMLab backbone contract
(out_indices, frozen_stages, with_cp, init_cfg), ``torch.compile`` of the backbone
alone and checkpoint loading (the structural arguments: :mod:`.arch`)."""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from timm.layers import trunc_normal_
from torch import Tensor

from ...errors import ConfigError, MissingFileError
from ..layers import symbolic
from ..layers.token_grid import tokens_to_nchw
from ..layers.token_mlp import TokenMlp, graph_chunk_count
from ..pretrained import load_pretrained
from .arch import FAMILIES

#: What ``compile=True`` means: one graph (a graph break is an error) with symbolic
#: input sizes, so a new image size reuses the compiled code.
COMPILE_DEFAULTS = dict(fullgraph=True, dynamic=True)


def compile_options(compile: Union[bool, dict, None], cls_name: str) -> Optional[dict]:
    """``torch.compile`` keyword arguments of a backbone's ``compile`` argument.

    False / None: eager; True: :data:`COMPILE_DEFAULTS`; a dict: those defaults
    updated by it (e.g. ``dict(backend='aot_eager')``, ``dict(mode='max-autotune')``).
    On inductor, unless ``dynamic=False``, inductor's ``layout_optimization`` is
    turned off (unless ``options`` sets it) and a ``mode`` is passed as the
    inductor options it stands for (``torch.compile`` takes one or the other).
    An unknown mode, or a mode with ``options``, raises :class:`ConfigError`.
    """
    if compile is None or compile is False:
        return None
    if compile is True:
        compile = {}
    if not isinstance(compile, dict):
        raise ConfigError(f'compile of {cls_name} is True, False or a dict of torch.compile '
                          f"arguments (e.g. dict(mode='max-autotune')), got {compile!r}")
    options = {**COMPILE_DEFAULTS, **compile}
    mode = options.get('mode')
    if mode and options.get('options'):
        raise ConfigError(f'compile of {cls_name} sets both mode and options, which '
                          'torch.compile refuses: give one of them')
    if options.get('backend', 'inductor') != 'inductor':
        return options
    mode_options = {}
    if mode:
        from torch._inductor import list_mode_options
        try:
            mode_options = list_mode_options(mode, options.get('dynamic'))
        except (KeyError, RuntimeError, TypeError) as err:
            raise ConfigError(f'compile of {cls_name}: unknown mode {mode!r}; '
                              f"torch.compile's modes: {', '.join(list_mode_options())}"
                              ) from err
    if options.get('dynamic') is not False:  # True, or None: symbolic after a second size
        # inductor's layout optimisation gives the activations a training graph saves
        # for backward channels-last strides and then orders them by size; with symbolic
        # sizes such as ceil(H / 4) (every patch embedding) torch 2.14's inductor cannot
        # and stops with "cannot determine truth value of Relational".  Off, the saved
        # tensors keep the layouts the backbone gives them (its convolutions take
        # channels-last views already).  torch.compile takes mode or options, not both:
        # a mode goes as the options list_mode_options gives it (what torch.compile
        # itself applies for it).
        options.pop('mode', None)
        options['options'] = {**mode_options, 'layout_optimization': False,
                              **(options.get('options') or {})}
    return options


def init_transformer_weights(module: nn.Module) -> None:
    """The authors' initialisation: trunc-normal Linear weights, unit LayerNorm."""
    if isinstance(module, nn.Linear):
        trunc_normal_(module.weight, std=.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class InLineBackbone(BaseModule):
    """Base of the InLine backbones.

    Subclasses build their layers, then call :meth:`_finish_init`; they
    implement ``_stage_parts(i)`` (the modules / parameters of stage ``i``; ``i = 0``
    is the stem) for ``frozen_stages`` and the MLPs' chunk counts in compiled graphs
    (by ``_stage_stride(i)``: 4, 8, 16, 32 unless overridden), and a
    ``convert_checkpoint`` static method (a pure function, see
    :mod:`inline_mm.models.converters`).

    Args:
        out_indices: stages whose outputs are returned.
        frozen_stages: stages (counting the stem as 0) kept frozen and in eval
            mode; -1 freezes nothing.
        with_cp: gradient checkpointing of every block.
        compile: run the backbone through ``torch.compile`` (True, or a dict of
            its arguments over :data:`COMPILE_DEFAULTS`); compiled once, on the
            first forward pass, for every input size (see :func:`compile_options`).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH)`` loads an authors'
            or an OpenMMLab checkpoint (see :func:`inline_mm.models.pretrained.load_pretrained`;
            ``strict=False`` loads what fits from a checkpoint of another arch).
    """

    num_stages: int = 4
    #: the family's name (``'pvt'``, ...): its class is kept in :data:`.arch.FAMILIES`
    family: str = ''
    #: the family's arch presets (the authors' variants)
    arch_settings: Dict[str, dict] = {}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.family and cls.family not in FAMILIES:  # the family's own class, not a subclass
            FAMILIES[cls.family] = cls

    def __init__(self, out_indices: Sequence[int], frozen_stages: int, with_cp: bool,
                 init_cfg: Optional[dict], num_stages: int = 4,
                 compile: Union[bool, dict] = False) -> None:
        super().__init__(init_cfg=init_cfg)
        self.num_stages = num_stages
        name = type(self).__name__
        out_indices = tuple(out_indices)
        if not out_indices or any(not 0 <= i < self.num_stages for i in out_indices):
            raise ConfigError(f'out_indices {out_indices} of {name} must be a non-empty subset '
                              f'of 0..{self.num_stages - 1}')
        if not -1 <= frozen_stages <= self.num_stages:
            raise ConfigError(f'frozen_stages of {name} is -1 (none) to {self.num_stages}, '
                              f'got {frozen_stages}')
        self.out_indices = out_indices
        self.frozen_stages = frozen_stages
        self.with_cp = with_cp
        self.compile_options = compile_options(compile, name)
        self._compiled = None

    def _finish_init(self) -> None:
        self.apply(init_transformer_weights)
        self._freeze_stages()
        # the MLPs' chunks in compiled graphs with symbolic sizes, by the stage's stride
        for i in range(1, self.num_stages + 1):
            chunks = graph_chunk_count(self._stage_stride(i))
            for part in self._stage_parts(i):
                if isinstance(part, nn.Module):
                    for module in part.modules():
                        if isinstance(module, TokenMlp):
                            module.graph_chunks = chunks

    # ------------------------------------------------------------ contract
    def _stage_parts(self, i: int) -> List[Union[nn.Module, nn.Parameter]]:
        raise NotImplementedError

    def _stage_stride(self, i: int) -> int:
        """The stride of stage ``i`` (from 1) against the image: 4, 8, 16, 32."""
        return 4 * 2 ** (i - 1)

    def _freeze_stages(self) -> None:
        for i in range(self.frozen_stages + 1):
            for part in self._stage_parts(i):
                if isinstance(part, nn.Parameter):
                    part.requires_grad_(False)
                else:
                    part.eval()
                    for p in part.parameters():
                        p.requires_grad_(False)

    def train(self, mode: bool = True) -> 'InLineBackbone':
        super().train(mode)
        self._freeze_stages()
        return self

    def run_block(self, block: nn.Module, x: Tensor, hw: Tuple[int, int]) -> Tensor:
        """Run one block, with gradient checkpointing when ``with_cp`` applies.

        Every block that backward will reach is checkpointed: one whose input
        requires grad, and also the first trainable block after frozen stages
        (its input does not).  Checkpointing is non-reentrant: the reentrant
        variant hides the block's parameters from the graph that DDP walks with
        ``find_unused_parameters=True``, and DDP then fails in backward with
        "Expected to mark a variable ready only once".
        """
        if self.with_cp and torch.is_grad_enabled() and (
                x.requires_grad or any(p.requires_grad for p in block.parameters())):
            return cp.checkpoint(block, x, hw, use_reentrant=False)
        return block(x, hw)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """The outputs of the stages in ``out_indices``: NCHW maps, strides of the family."""
        if self.compile_options is None or symbolic.in_graph():
            return self.forward_stages(x)
        if self._compiled is None:
            self._compiled = torch.compile(self.forward_stages, **self.compile_options)
        return self._compiled(x)

    def forward_stages(self, x: Tensor) -> Tuple[Tensor, ...]:
        """The eager forward pass of the family (what ``compile`` compiles)."""
        raise NotImplementedError

    def __getstate__(self) -> dict:
        # the compiled function holds this module: copies (deepcopy for EMA, pickling)
        # compile their own on their first forward pass
        return dict(self.__dict__, _compiled=None)

    @staticmethod
    def to_nchw(x: Tensor, hw: Tuple[int, int]) -> Tensor:
        """Tokens -> a contiguous NCHW map (what necks and mmcv's RoIAlign expect)."""
        return tokens_to_nchw(x, hw)

    # ------------------------------------------------------------ weights
    @staticmethod
    def convert_checkpoint(state_dict: Dict[str, Tensor]) -> Dict[str, Tensor]:
        raise NotImplementedError

    #: a LayerNorm ``norm{i}`` per output; the authors' final ``norm`` is the last one
    has_output_norms: bool = False

    def documented_missing(self) -> Dict[str, str]:
        """Keys of this model that no authors' checkpoint provides, with the reason."""
        if not self.has_output_norms:
            return {}
        return {f'norm{i}.{p}': 'output norm added for dense prediction'
                for i in self.out_indices if i != self.num_stages - 1
                for p in ('weight', 'bias')}

    def init_weights(self) -> None:
        """Load ``init_cfg`` Pretrained weights, or keep the authors' random init.

        ``init_cfg`` may be one dict or a list (as mmdet configs often write
        it); other initialisers of the list run first through mmengine, the
        ``Pretrained`` entry last through :func:`~inline_mm.models.pretrained.load_pretrained`
        (key conversion, table resizing, one summary in the log).
        """
        cfgs = self.init_cfg if isinstance(self.init_cfg, (list, tuple)) else [self.init_cfg]
        pretrained = [c for c in cfgs if isinstance(c, dict) and c.get('type') == 'Pretrained']
        if not pretrained:
            super().init_weights()
            return
        if len(pretrained) > 1:
            raise ConfigError(f'init_cfg of {type(self).__name__} has '
                              f'{len(pretrained)} Pretrained entries; keep one')
        others = [c for c in cfgs if c is not None and c not in pretrained]
        if others:
            original, self.init_cfg = self.init_cfg, others
            try:
                super().init_weights()
            finally:
                self.init_cfg = original
        cfg = pretrained[0]
        try:
            load_pretrained(self, cfg['checkpoint'], state_dict_key=cfg.get('state_dict_key'),
                            prefix=cfg.get('prefix'), logger=MMLogger.get_current_instance(),
                            strict=cfg.get('strict', True))
        except MissingFileError as err:
            raise MissingFileError(
                f"{err}, named by init_cfg.checkpoint of {type(self).__name__}: download the "
                f"authors' ImageNet weights into checkpoints/ (see configs/det/README.md) or "
                f'point init_cfg.checkpoint at your file (init_cfg=None trains from '
                f'scratch)') from None
        self._is_init = True
