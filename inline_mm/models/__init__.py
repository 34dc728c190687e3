from .backbones import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin

__all__ = ['InLinePVT', 'InLineSwin', 'InLineCSWin', 'InLineDeiT']
