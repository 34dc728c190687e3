from .cswin import InLineCSWin
from .deit import InLineDeiT
from .pvt import InLinePVT
from .swin import InLineSwin

__all__ = ['InLinePVT', 'InLineSwin', 'InLineCSWin', 'InLineDeiT']
