"""Test-only: the smallest model mmengine's Runner trains, for runs about the Runner itself.

A one-layer regression ``BaseModel`` and the collate function of its ``TensorDataset``
batches; the scripts of tests/test_resume.py and tests/test_best_checkpoint.py import it
(``PYTHONPATH=tests/plugins``).
"""
import torch
from mmengine.model import BaseModel


class LinearModel(BaseModel):
    """``Linear(4, 1)`` with a squared-error loss; predictions are a one-element list."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x, y, mode='tensor'):
        out = self.linear(x)
        if mode == 'loss':
            return dict(loss=((out - y) ** 2).mean())
        return [out] if mode == 'predict' else out


def collate(batch):
    """``(x, y)`` pairs of a ``TensorDataset`` -> the model's keyword arguments."""
    x, y = zip(*batch)
    return dict(x=torch.stack(x), y=torch.stack(y))
