"""Data-loader workers under ResumableEpochBasedTrainLoop: per-epoch workers, seeded apart
per epoch (mmengine seeds every epoch's workers alike), the same in a resumed run."""
import os
import sys
import uuid

import torch
from mmengine.runner import Runner
from torch.utils.data import Dataset

from conftest import REPO_ROOT
from inline_mm.engine.loops import EpochWorkerSeeds

sys.path.insert(0, os.path.join(REPO_ROOT, 'tests', 'plugins'))
from linear_model import LinearModel  # noqa: E402


class RandomInputs(Dataset):
    """Four samples whose input is drawn by torch in the data-loader worker."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return dict(x=torch.rand(4), y=torch.zeros(1))


class RecordingModel(LinearModel):
    """Keeps every training batch's inputs, by epoch."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x, y, mode='tensor'):
        if mode == 'loss':
            self.seen.append(x.clone())
        return super().forward(x, y, mode)


def collate(batch):
    return dict(x=torch.stack([b['x'] for b in batch]), y=torch.stack([b['y'] for b in batch]))


def _train(work_dir, exact_resume=True):
    model = RecordingModel()
    runner = Runner(
        model=model, work_dir=str(work_dir),
        train_dataloader=dict(dataset=RandomInputs(), batch_size=4, num_workers=1,
                              persistent_workers=True, collate_fn=collate,
                              sampler=dict(type='DefaultSampler', shuffle=False)),
        train_cfg=dict(type='ResumableEpochBasedTrainLoop', max_epochs=3,
                       exact_resume=exact_resume),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.0)),
        default_hooks=dict(checkpoint=None), randomness=dict(seed=0),
        experiment_name=f'epoch_workers_{uuid.uuid4().hex}')  # one visualizer per run
    runner.train()
    return runner, [x.tolist() for x in model.seen]


def test_each_epoch_draws_anew_and_two_runs_draw_alike(tmp_path):
    import inline_mm.engine  # noqa: F401  (registers the loop)
    runner, epochs = _train(tmp_path / 'a')
    assert not runner.train_loop.dataloader.persistent_workers
    assert isinstance(runner.train_loop.dataloader.worker_init_fn, EpochWorkerSeeds)
    assert len(epochs) == 3
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2] and epochs[0] != epochs[2]
    assert _train(tmp_path / 'b')[1] == epochs


def test_exact_resume_off_keeps_persistent_workers(tmp_path):
    import inline_mm.engine  # noqa: F401
    runner, _ = _train(tmp_path / 'a', exact_resume=False)
    assert runner.train_loop.dataloader.persistent_workers
    assert not isinstance(runner.train_loop.dataloader.worker_init_fn, EpochWorkerSeeds)


def test_worker_seeds_follow_the_epoch_and_the_inner_seed():
    calls = []
    seeds = EpochWorkerSeeds(lambda worker_id: (calls.append(worker_id),
                                                torch.manual_seed(100 + worker_id)))
    draws = {}
    for epoch, worker in [(0, 0), (1, 0), (0, 1), (0, 0)]:
        seeds.epoch = epoch
        seeds(worker)
        draws.setdefault((epoch, worker), []).append(torch.rand(3).tolist())
    assert calls == [0, 0, 1, 0]
    assert draws[0, 0][0] == draws[0, 0][1]  # the same epoch and worker: the same draws
    assert len({str(d[0]) for d in draws.values()}) == 3
