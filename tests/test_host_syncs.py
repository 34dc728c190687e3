"""Device-to-host reads added by the plugin: none in the backbones' forward, one per
training iteration from all the recipe hooks together (the non-finite check, with the
preemption flag of every process folded in; the losses of several processes are
averaged on the device), plus, with several processes, one where a checkpoint is
written (all processes agree that rank 0's write succeeded)."""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT, TOY_DET_CONFIG, free_port, tool_env, toy_det_options
from host_syncs import SyncCounter

from inline_mm import InLineCSWin, InLineDeiT, InLinePVT, InLineSwin

DRIVER = os.path.join(REPO_ROOT, 'tests', 'host_syncs.py')

SMALL = {
    InLinePVT: dict(arch='tiny', depths=[1, 1, 1, 1]),
    InLineSwin: dict(arch='tiny', depths=[1, 1, 2, 2], attn_type='IIMS1'),
    InLineCSWin: dict(arch='tiny', depths=[1, 1, 2, 1]),
    InLineDeiT: dict(arch='tiny', depth=2, out_indices=(0, 1)),
}


def test_counter_sees_reads_from_the_package():
    """The counter itself: a read in inline_mm code counts, one in the test does not."""
    from inline_mm.engine.nonfinite import agree_on_flags
    with SyncCounter() as counter:
        torch.ones(2).tolist()
        assert agree_on_flags(torch.tensor([1, 0], dtype=torch.int32)) == [True, False]
    assert [(site[0], site[2]) for site in counter.sites] == \
        [('inline_mm/engine/nonfinite.py', 'tolist')]


@pytest.mark.parametrize('cls', list(SMALL))
def test_backbone_forward_and_backward_read_nothing(cls):
    """Padded, windowed and shifted sizes in training and in eval: no host read."""
    model = cls(**SMALL[cls], with_cp=False)
    with SyncCounter() as counter:
        model.train()
        outs = model(torch.randn(2, 3, 97, 131))
        sum(o.float().mean() for o in outs).backward()
        model.eval()
        with torch.no_grad():
            model(torch.randn(1, 3, 64, 45))
    assert counter.sites == [], counter.sites


def _train(tmp_path, toy_root, nproc: int):
    out = str(tmp_path / 'reads.json')
    opts = toy_det_options(toy_root, **{'train_cfg.max_iters': 4,
                                        'default_hooks.checkpoint.interval': 2})
    args = [out, TOY_DET_CONFIG, '--work-dir', str(tmp_path / 'work'), *opts]
    if nproc == 1:
        cmd = [sys.executable, DRIVER, *args]
    else:
        cmd = [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={nproc}',
               f'--master_port={free_port()}', DRIVER, *args, '--launcher', 'pytorch']
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=tool_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = []
    for rank in range(nproc):
        with open(f'{out}.rank{rank}') as f:
            results.append(json.load(f))
    return results


@pytest.mark.slow
@pytest.mark.parametrize('nproc', [1, 2])
def test_recipe_hooks_read_once_per_iteration(tmp_path, toy_root, nproc):
    """The toy recipe with every hook of the full recipes on (mean losses over processes,
    RNG states, preemption, non-finite skipping, atomic checkpoints every 2 iterations)."""
    for result in _train(tmp_path, toy_root, nproc):
        assert result['exit'] in (0, None)
        assert result['iterations'] == 4
        # one read an iteration: the shared verdict of the optimizer step; with several
        # processes, an iteration that writes a checkpoint (2 and 4) adds the agreement
        # that rank 0's write succeeded (beside the save's own copy of every weight)
        saves = 1 if nproc > 1 else 0
        assert result['reads_per_iteration'] == [1, 1 + saves, 1, 1 + saves], result
        step_site = 'inline_mm/engine/nonfinite.py'
        assert sum(n for site, n in result['sites'].items() if site.startswith(step_site)) == 4
        assert sum(result['sites'].values()) == 4 + 2 * saves, result['sites']
