"""InLine (injective linear) attention, shared by every backbone family.

Per head, with scale ``s = d ** -0.5`` and ``N`` real tokens, the authors'
reference computes::

    kv = (K^T * sqrt(s / N)) @ (V * sqrt(s / N))
    O  = Q @ kv + (1 - s * Q @ mean(K)^T) * mean(V)

which is algebraically the centred form used here::

    O = s * Q @ Cov(K, V) + mean(V),   Cov(K, V) = K^T V / N - mean(K)^T mean(V)

one ``d x d`` matrix per head: cost ``O(N d^2)``, no ``N x N`` matrix.  The
token reductions (means and ``K^T V``) run in fp32 even under autocast, so
fp16 / bf16 training on tens of thousands of tokens stays finite.  Padded
tokens (windows over a padded map) are excluded: ``N`` counts real tokens.

The local-modeling branch adds a per-sample 3x3 depthwise convolution of ``V``
on the token grid, whose kernel is predicted from the token mean of the
attention input.
"""
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from . import symbolic
from .attention_kind import AttentionKind, BlockArgs
from .token_grid import depthwise_conv3x3_per_sample

from ...errors import ConfigError


def _exp_kernel(x: Tensor) -> Tensor:
    return torch.exp(0.2 * x)


#: Kernel functions phi of the reference (``exp`` is exp(0.2 x)).
KERNEL_FUNCS: Dict[str, Optional[Callable[[Tensor], Tensor]]] = {
    'identity': None,
    'relu': F.relu,
    'leakyrelu': F.leaky_relu,
    'exp': _exp_kernel,
}


def inline_attention(q: Tensor, k: Tensor, v: Tensor, scale: float,
                     valid: Optional[Tensor] = None) -> Tensor:
    """InLine attention in the centred form.

    Args:
        q, k, v: ``(B, heads, N, d)``, kernel function already applied.
        scale: ``s``, normally ``d ** -0.5``.
        valid: optional ``(B, N)`` bool mask of real tokens; padded tokens are
            left out of every sum and of ``N``.

    Returns:
        ``(B, heads, N, d)`` in the dtype of ``q``.
    """
    tokens, v_mean = inline_attention_split(q, k, v, scale, valid)
    return tokens.add_(v_mean.to(q.dtype))


def inline_attention_split(q: Tensor, k: Tensor, v: Tensor, scale: float,
                           valid: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """InLine attention as its two terms: ``s * Q @ Cov(K, V)`` and ``mean(V)``.

    Same arguments as :func:`inline_attention`, whose output is their sum; q / k / v
    may also be one head's ``(B, N, d)``.  Returns the query term ``(B, heads, N, d)``
    (or ``(B, N, d)``) in the dtype of ``q`` and the value mean ``(B, heads, 1, d)``
    (or ``(B, 1, d)``) in fp32.  The mean, the same for every token,
    can be much larger than the query term (by 30-40x in some blocks of a
    trained InLine-PVT-T), so a sum rounded to bf16 keeps little of the only
    term that differs between tokens; callers under autocast keep the two apart
    through the output projection (:func:`project_with_mean`).
    """
    with torch.autocast(device_type=q.device.type, enabled=False):
        k32, v32 = k.float(), v.float()
        if valid is None:
            n = k.shape[-2]
            k_mean = k32.mean(dim=-2, keepdim=True)
            v_mean = v32.mean(dim=-2, keepdim=True)
        else:
            # (B, N) -> (B, 1, N, 1) for heads, (B, N, 1) for one head's tokens
            weight = valid[(slice(None),) + (None,) * (k.dim() - 3) + (slice(None), None)]
            weight = weight.to(torch.float32)
            n = weight.sum(dim=-2, keepdim=True).clamp_min(1.0)
            k32 = k32 * weight
            k_mean = k32.sum(dim=-2, keepdim=True) / n
            v_mean = (v32 * weight).sum(dim=-2, keepdim=True) / n
        cov = torch.matmul(k32.transpose(-2, -1), v32).div_(n)
        cov = cov.sub_(k_mean.transpose(-2, -1) * v_mean).mul_(scale)
    return torch.matmul(q, cov.to(q.dtype)), v_mean


def project_with_mean(proj: nn.Linear, tokens: Tensor, mean: Tensor) -> Tensor:
    """``proj(tokens + mean)`` as ``proj(tokens) + mean @ W^T``, the second term in fp32.

    ``tokens``: ``(B, N, C)``; ``mean``: ``(B, 1, C)`` (fp32), broadcast over the
    tokens.  The same numbers as projecting the sum in fp32; under autocast only the
    per-token term goes through the low-precision matmul, so the result (fp32 then)
    keeps the token-dependent part of InLine's output at its own precision.
    """
    out = proj(tokens)
    with torch.autocast(device_type=tokens.device.type, enabled=False):
        weight = proj.weight
        return out + F.linear(mean.to(weight.dtype), weight)


def masked_token_mean(x: Tensor, valid: Optional[Tensor]) -> Tensor:
    """Mean over tokens of ``(B, N, C)`` in fp32, over real tokens only."""
    x = x.float()
    if valid is None:
        return x.mean(dim=1)
    weight = valid.unsqueeze(-1).to(torch.float32)
    return (x * weight).sum(dim=1) / weight.sum(dim=1).clamp_min(1.0)


def zero_padded_tokens(x: Tensor, valid: Optional[Tensor]) -> Tensor:
    """Zero the padded tokens of ``(B, N, C)`` so 3x3 convolutions see zero padding."""
    return x if valid is None else x * valid.unsqueeze(-1).to(x.dtype)


def grouped_pointwise(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """A grouped ``Conv1d`` of kernel size 1 (with bias) applied to ``(B, C_in)``: ``(B, C_out)``.

    The numbers of ``conv(x.unsqueeze(-1)).squeeze(-1)`` (autocast included: ``baddbmm``
    runs in the reduced precision as the convolution does), as one batched matmul over
    the groups; used in eager mode and under ``torch.compile``, where the convolution
    would pick its CPU backend by the batch size (B = the number of windows) and dynamo
    would guard on it: one more compilation whenever an input size crosses that
    threshold.  (Under ``torch.jit`` tracing, FLOP counting and ONNX, the convolutions
    run: mmengine's counter counts them, not ``baddbmm``.)
    """
    g, b = conv.groups, x.shape[0]
    c_in, c_out = conv.in_channels // g, conv.out_channels // g
    weight = conv.weight.view(g, c_out, c_in).transpose(1, 2)
    x = x.reshape(b, g, c_in).transpose(0, 1)
    y = torch.baddbmm(conv.bias.view(g, 1, c_out), x, weight)
    return y.transpose(0, 1).reshape(b, g * c_out)


#: Tokens x channels of q from which eager CPU passes with several samples or windows run
#: InLine attention head by head (:meth:`InLineCore.attention`).  The toy detector's
#: training iteration (batch 2 at 192x192: at most 0.3 M values of q in a block) ran 9 %
#: slower head by head on a 2-core Intel Xeon with AMX; InLine-PVT-T's inference at batch
#: 2 and 1333x800 (8.5 M values in stage 1) 13-22 % faster.
PER_HEAD_MIN_VALUES = 1 << 20


class InLineCore(nn.Module):
    """InLine attention on already projected q / k / v, plus the local branch.

    Holds the parameters of the local-modeling branch (``residual``: the
    kernel predictor of the reference, same key names) and applies the
    attention; the family modules add their own projections around it.

    Args:
        dim: channels of q / k / v.
        num_heads: attention heads.
        kernel_func: phi, one of ``identity | relu | leakyrelu | exp``.
        num_prefix_tokens: leading tokens (DeiT's cls token) that take part in
            the attention but are not on the grid of the local branch.
    """

    def __init__(self, dim: int, num_heads: int, kernel_func: str = 'identity',
                 num_prefix_tokens: int = 0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ConfigError(f'dim {dim} is not divisible by num_heads {num_heads}')
        if kernel_func not in KERNEL_FUNCS:
            raise ConfigError(f'unknown kernel_func {kernel_func!r}: use one of '
                              f'{sorted(KERNEL_FUNCS)}')
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.kernel_func = kernel_func
        self.phi = KERNEL_FUNCS[kernel_func]
        self.num_prefix_tokens = num_prefix_tokens
        self.residual = nn.Sequential(
            nn.Conv1d(dim, dim, kernel_size=1, groups=num_heads),
            nn.GELU(),
            nn.Conv1d(dim, dim * 9, kernel_size=1, groups=num_heads))

    def _heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

    def attention(self, q: Tensor, k: Tensor, v: Tensor,
                  valid: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """InLine attention of ``(B, N, C)`` tokens over the heads: the query term
        ``(B, N, C)`` and the value mean ``(B, 1, C)`` (fp32), see
        :func:`inline_attention_split`.

        The heads are views of the channels.  Folded with the batch into one batched
        matmul, ``(B, heads)`` is one batch axis only when B == 1; for several samples
        or windows that fold copies q, k and v (strided copies, slow once they leave
        the cache), so eager CPU passes with B > 1 over at least
        :data:`PER_HEAD_MIN_VALUES` values run one head at a time on its channel slice,
        which the batched matmuls read in place (on smaller tensors the copies are cheap
        and the per-head operations, forward and backward, cost more than they save).
        Recorded graphs keep the folded form (no graph specialised on B).
        """
        b, n, c = q.shape
        # the graph test first: in a recorded graph a test of B or of the size would guard
        if (symbolic.eager_on_cpu(q) and b > 1 and self.num_heads > 1
                and q.numel() >= PER_HEAD_MIN_VALUES):
            # split, not one slice per head: its backward is one concatenation, where each
            # slice's would fill a zero tensor of the whole width
            d = self.head_dim
            parts = [inline_attention_split(*heads, self.scale, valid)
                     for heads in zip(q.split(d, dim=-1), k.split(d, dim=-1), v.split(d, dim=-1))]
            return (torch.cat([out for out, _ in parts], dim=-1),
                    torch.cat([v_mean for _, v_mean in parts], dim=-1))
        out, v_mean = inline_attention_split(self._heads(q), self._heads(k), self._heads(v),
                                             self.scale, valid)
        return out.transpose(1, 2).reshape(b, n, c), v_mean.transpose(1, 2).reshape(b, 1, c)

    def local_branch(self, v: Tensor, kernel_src: Tensor, hw: Tuple[int, int],
                     valid: Optional[Tensor] = None) -> Tensor:
        """Per-sample 3x3 depthwise convolution of ``v`` on its ``hw`` grid.

        The kernel of each sample and channel is predicted from the mean of
        ``kernel_src`` ``(B, N, C)`` over its real tokens, or from ``kernel_src`` itself
        when it is that mean already, ``(B, C)`` in fp32 (InLine-CSwin sums its windows'
        means from the map: :func:`~.windows.window_token_means`).  Returns ``(B, h*w, C)``.
        """
        b, _, c = v.shape
        mean = kernel_src if kernel_src.dim() == 2 else masked_token_mean(kernel_src, valid)
        mean = mean.to(v.dtype)
        if symbolic.is_jit_tracing():  # the convolutions (what FLOP counters and ONNX know)
            weight = self.residual(mean.unsqueeze(-1))
        else:  # eager and compiled alike (see grouped_pointwise: no guard on the batch)
            conv1, act, conv2 = self.residual
            weight = grouped_pointwise(conv2, act(grouped_pointwise(conv1, mean)))
        weight = weight.reshape(b * c, 1, 3, 3)
        return depthwise_conv3x3_per_sample(zero_padded_tokens(v, valid), hw, weight)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, kernel_src: Tensor,
               hw: Tuple[int, int], valid: Optional[Tensor] = None
               ) -> Tuple[Tensor, Tensor]:
        """InLine attention + local branch, the value mean apart.

        Args:
            q, k, v: ``(B, N, C)`` projected tokens (``N = prefix + h * w``).
            kernel_src: ``(B, N, C)`` tokens whose mean predicts the local kernel, or
                that mean, ``(B, C)`` (see :meth:`local_branch`).
            hw: the token grid ``(h, w)`` (without prefix tokens).
            valid: ``(B, N)`` bool mask of real tokens, or None.

        Returns:
            ``(B, N, C)`` (the query term and the local branch) and the value mean
            ``(B, 1, C)`` in fp32, before the output projection: the attention's
            output is their sum (see :func:`inline_attention_split` for why apart).
        """
        if self.phi is not None:
            q, k = self.phi(q), self.phi(k)
        out, v_mean = self.attention(q, k, v, valid)
        p = self.num_prefix_tokens
        if p == 0:
            return out + self.local_branch(v, kernel_src, hw, valid), v_mean
        grid_valid = None if valid is None else valid[:, p:]
        local = self.local_branch(v[:, p:], kernel_src, hw, grid_valid)
        return torch.cat([out[:, :p], out[:, p:] + local], dim=1), v_mean


class InLineAttention(InLineCore, AttentionKind):
    """InLine attention with input / output projections (PVT, Swin, DeiT).

    Args:
        dim: channels.
        num_heads: heads.
        qkv_bias: bias on the q / k / v projections.
        kernel_func: see :class:`InLineCore`.
        num_prefix_tokens: see :class:`InLineCore`.
        separate_q: project q and kv with two layers (``q``, ``kv``: the PVT
            layout) instead of one fused ``qkv`` layer.
        attn_drop: accepted for the common backbone signature
            (``attn_drop_rate``); InLine forms no attention matrix, so there is
            no attention weight to drop (the authors' InLine ignores it too).
        proj_drop: dropout after the output projection.

    As an attention kind of :class:`~inline_mm.models.layers.blocks.TransformerBlock`
    (``'I'``): windows are never shifted (a shifted InLine window would mix
    wrapped-around borders) and padded tokens are masked out through ``valid``, not
    through a region bias (InLine forms no score matrix).
    """

    shifted_windows = False  # a shifted InLine window would mix wrapped-around borders
    region_bias = False  # padding is masked through ``valid``
    wide_windows = True  # linear in the window's tokens: the family's large InLine window

    @classmethod
    def for_block(cls, args: BlockArgs) -> 'InLineAttention':
        return cls(args.dim, args.num_heads, qkv_bias=args.qkv_bias,
                   kernel_func=args.kernel_func, num_prefix_tokens=args.num_prefix_tokens,
                   separate_q=args.separate_q, attn_drop=args.attn_drop,
                   proj_drop=args.proj_drop)

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 kernel_func: str = 'identity', num_prefix_tokens: int = 0,
                 separate_q: bool = False, attn_drop: float = 0.,
                 proj_drop: float = 0.) -> None:
        super().__init__(dim, num_heads, kernel_func, num_prefix_tokens)
        self.separate_q = separate_q
        if separate_q:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        else:
            self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, window: Tuple[int, int], valid: Optional[Tensor] = None,
                bias: Optional[object] = None) -> Tensor:
        """``x``: ``(B, N, C)`` normed tokens of windows of size ``window`` (after prefix
        tokens); ``valid``: ``(B, N)`` real (not padded) tokens or None; ``bias`` is the
        block interface's region bias, which InLine does not use."""
        if self.separate_q:
            q = self.q(x)
            k, v = self.kv(x).chunk(2, dim=-1)
        else:
            q, k, v = self.qkv(x).chunk(3, dim=-1)
        out, v_mean = self.attend(q, k, v, x, window, valid)
        return self.proj_drop(project_with_mean(self.proj, out, v_mean))
