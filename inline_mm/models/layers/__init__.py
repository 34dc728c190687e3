from .inline_attention import InLineAttention, InLineCore, inline_attention
from .softmax_attention import WindowAttention, softmax_attention
from .windows import run_in_windows

__all__ = ['InLineAttention', 'InLineCore', 'inline_attention', 'WindowAttention',
           'softmax_attention', 'run_in_windows']
