"""Gradient checkpointing (``with_cp=True``) under DDP, for the four backbone families.

One 2-process torchrun (gloo on the CPU) runs every case of ``tests/ddp_cp_worker.py``:
mmengine's ``MMDistributedDataParallel`` (what the Runner wraps a model in) and torch's
``DistributedDataParallel``, ``find_unused_parameters`` False and True, ``frozen_stages``
-1 and 1, and ``out_indices`` that leave the last stage without a path to the loss.  Each
case trains a few SGD steps with checkpointing, without it, and without DDP at all (both
ranks' batches in one process, gradients averaged); the gradients after the all-reduce
must be those of the plain runs to 1e-5 relative.  Reentrant checkpointing fails here
("Expected to mark a variable ready only once") with ``find_unused_parameters=True``.
"""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, free_port, tool_env
from ddp_cp_worker import CASES, STEPS

WORKER = os.path.join(REPO_ROOT, 'tests', 'ddp_cp_worker.py')
RTOL = 1e-5


@pytest.fixture(scope='module')
def ddp_run(tmp_path_factory):
    """Run every case once in one 2-process group; the records of both ranks by case."""
    out = tmp_path_factory.mktemp('ddp_cp')
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2',
           '--master_addr', '127.0.0.1', '--master_port', str(free_port()), WORKER, str(out)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, env=tool_env(), capture_output=True, text=True,
                          timeout=600)
    records = {}
    for rank in range(2):
        path = out / f'rank{rank}.json'
        for rec in json.loads(path.read_text()) if path.exists() else []:
            records.setdefault(rec['name'], {})[rank] = rec
    return proc, records


def test_cases_cover_the_brief():
    """Every family with both wrappers and both find_unused settings, frozen and subset."""
    families = {c['family'] for c in CASES}
    assert families == {'pvt', 'swin', 'cswin', 'deit'}
    for family in families:
        mine = [c for c in CASES if c['family'] == family]
        assert {(c['wrapper'], c['find_unused']) for c in mine if c['frozen_stages'] == -1} \
            == {(w, u) for w in ('mmddp', 'ddp') for u in (False, True)}
        assert any(c['frozen_stages'] == 1 for c in mine)
        assert any(c['out_indices'] and c['find_unused'] for c in mine)


@pytest.mark.slow
@pytest.mark.parametrize('case', CASES, ids=[c['name'] for c in CASES])
def test_with_cp_under_ddp_gives_the_plain_gradients(ddp_run, case):
    proc, records = ddp_run
    recs = records.get(case['name'], {})
    errors = [r for r in recs.values() if 'error' in r]
    assert not errors, f"{errors[0]['error'][:500]}\n{errors[0]['traceback']}"
    assert set(recs) == {0, 1}, \
        f'no result for this case (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n' \
        f'{proc.stderr[-5000:]}'
    for rank, rec in recs.items():
        where = f"{case['name']} rank {rank}"
        # every step went through the optimiser, in all three runs
        for pair in ('cp_vs_plain', 'plain_vs_ref', 'cp_vs_ref'):
            assert rec[pair]['steps'] == [STEPS, STEPS], (where, pair)
            assert not rec[pair]['presence'], (where, pair, rec[pair]['presence'][:5])
            # after the all-reduce, the gradients of each step and the end weights agree
            assert rec[pair]['grad_rel'] <= RTOL, (where, pair, rec[pair])
            assert rec[pair]['param_rel'] <= RTOL, (where, pair, rec[pair])
        # the ranks had different batches: the all-reduce changed the gradients
        assert rec['rank_gap'] > 1e-2, where
        # checkpointing was on: each block on a path to the loss ran again in backward
        assert rec['num_blocks'] >= 4, where
        assert not rec['calls_cp'], (where, 'with_cp calls', rec['calls_cp'],
                                     rec['expected_calls'])
        assert not rec['calls_plain'], (where, 'plain calls', rec['calls_plain'])
        assert any(c == 2 * STEPS for c in rec['expected_calls'].values()), where
        # frozen parameters get no gradient and keep their values
        assert bool(rec['frozen']) == (case['frozen_stages'] >= 0), where
        assert not rec['frozen_with_grad'], (where, rec['frozen_with_grad'][:5])
        assert not rec['frozen_changed'], (where, rec['frozen_changed'][:5])
        # the unused tail exists exactly when out_indices leaves it without a path
        assert bool(rec['unused']) == (case['out_indices'] is not None), (where, rec['unused'])
