"""One rank of the 2-process DDP run of tests/test_ddp_checkpointing.py.

Started by torchrun (``python -m torch.distributed.run --nproc_per_node 2
tests/ddp_cp_worker.py OUT_DIR``), gloo on the CPU.  For every case of
:data:`CASES` each rank trains a small backbone (plus a 1x1-conv head per
output) for :data:`STEPS` SGD steps three times, from the same initial weights
and with the same inputs (different on each rank) and the same random streams
(stochastic depth, dropout):

* ``cp``: ``with_cp=True`` wrapped by mmengine's ``MMDistributedDataParallel``
  (stepped through its ``train_step``, as the Runner does) or by torch's
  ``DistributedDataParallel`` (a plain loop);
* ``plain``: the same wrapper with ``with_cp=False``;
* ``ref``: no DDP, ``with_cp=False``, both ranks' batches run one after the
  other in this process and their gradients averaged (what the all-reduce of
  DDP must give).

The gradients each optimiser step sees (after DDP's all-reduce) and the
weights after the last step are compared; the figures go to
``OUT_DIR/rank{r}.json`` after every case, the test asserts on them.  A case
that raises (DDP's "Expected to mark a variable ready only once") is written
with its error, and the run goes on with the next case.
"""
import json
import os
import sys
import traceback
from typing import Dict, List, Optional

import torch
import torch.nn as nn

STEPS = 3
WORLD_SIZE = 2
BATCH, SIZE = 2, 64

# Small widths and depths; every kind of block kept: PVT with two blocks in a stage,
# Swin with an 'M' stage and shifted 2x2 softmax windows (a real shift on the 4x4 map of
# stage 3), CSwin with two-branch stripes of 2 and a global last stage, DeiT with its cls
# token. Stochastic depth and dropout on, so the recomputation must replay the random
# streams.
RANDOM = dict(drop_path_rate=0.2, drop_rate=0.1)
FAMILIES: Dict[str, dict] = {
    'pvt': dict(type='InLinePVT', embed_dims=[16, 32, 48, 64], depths=[1, 2, 1, 1],
                num_heads=[1, 2, 2, 4], **RANDOM),
    'swin': dict(type='InLineSwin', embed_dims=16, depths=[1, 1, 2, 2], num_heads=[2, 2, 4, 4],
                 attn_type='IIMS1', window_size=2, inline_window=4, attn_drop_rate=0.1,
                 **RANDOM),
    'cswin': dict(type='InLineCSWin', embed_dims=16, depths=[1, 1, 2, 1],
                  split_size=(1, 2, 2, 2), attn_drop_rate=0.1, **RANDOM),
    'deit': dict(type='InLineDeiT', embed_dims=48, depth=4, num_heads=3,
                 out_indices=(0, 1, 2, 3), **RANDOM),
}
#: out_indices that leave the last stage(s) / blocks without a path to the loss
UNUSED_TAIL = {'pvt': (0, 1, 2), 'swin': (0, 2), 'cswin': (1, 2), 'deit': (0, 2)}


def _cases() -> List[dict]:
    cases = []
    for family in FAMILIES:
        for wrapper in ('mmddp', 'ddp'):
            for unused in (False, True):
                cases.append(dict(family=family, wrapper=wrapper, find_unused=unused,
                                  frozen_stages=-1, out_indices=None))
        for unused in (False, True):
            cases.append(dict(family=family, wrapper='mmddp', find_unused=unused,
                              frozen_stages=1, out_indices=None))
        cases.append(dict(family=family, wrapper='mmddp', find_unused=True, frozen_stages=-1,
                          out_indices=UNUSED_TAIL[family]))
    for case in cases:
        case['name'] = '-'.join([
            case['family'], case['wrapper'], f"unused{int(case['find_unused'])}",
            f"frozen{case['frozen_stages']}",
            'outs' + ''.join(map(str, case['out_indices'] or ('all',)))])
    return cases


CASES = _cases()


def step_seed(step: int, rank: int) -> int:
    """The seed of the random streams of rank ``rank`` at step ``step``."""
    return 1000 + 10 * step + rank


def batch(step: int, rank: int) -> torch.Tensor:
    """The images of rank ``rank`` at step ``step`` (different on every rank and step)."""
    gen = torch.Generator().manual_seed(step_seed(step, rank) + 500)
    return torch.randn(BATCH, 3, SIZE, SIZE, generator=gen)


def build_model(case: dict, with_cp: bool) -> nn.Module:
    """Backbone (through the registry, as a config builds it) and a head per output."""
    from mmengine.model import BaseModel

    from inline_mm.registry import REGISTRIES

    cfg = dict(FAMILIES[case['family']], with_cp=with_cp, frozen_stages=case['frozen_stages'])
    if case['out_indices'] is not None:
        cfg['out_indices'] = case['out_indices']

    class BackboneProbe(BaseModel):
        """A backbone and a 1x1 conv per output; the loss is the mean square of the heads."""

        def __init__(self) -> None:
            super().__init__()
            self.backbone = REGISTRIES[0].build(cfg)
            dims = self.backbone.embed_dims
            self.heads = nn.ModuleList(
                nn.Conv2d(dims if isinstance(dims, int) else dims[i], 4, 1)
                for i in self.backbone.out_indices)

        def forward(self, inputs, data_samples=None, mode='loss'):
            outs = self.backbone(inputs)
            return dict(loss=sum(h(o).square().mean() for h, o in zip(self.heads, outs)))

    torch.manual_seed(0)  # the same initial weights in every run and on every rank
    return BackboneProbe()


def block_counter(model: nn.Module) -> Dict[str, int]:
    """Count the calls of every block (a checkpointed block runs again in backward)."""
    from inline_mm.models.backbones.cswin import CSWinBlock
    from inline_mm.models.layers.blocks import TransformerBlock

    calls: Dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, (TransformerBlock, CSWinBlock)):
            calls[name] = 0
            # a pre-hook: the recomputation may stop before the block's end
            module.register_forward_pre_hook(
                lambda *_, n=name: calls.__setitem__(n, calls[n] + 1))
    return calls


def grad_recorder(model: nn.Module, optimizer: torch.optim.Optimizer) -> List[dict]:
    """The gradients every optimiser step sees, ``{name: tensor or None}`` per step."""
    names = {id(p): n for n, p in model.named_parameters()}
    steps: List[dict] = []

    def record(opt, args, kwargs):
        steps.append({names[id(p)]: None if p.grad is None else p.grad.detach().clone()
                      for group in opt.param_groups for p in group['params']})

    optimizer.register_step_pre_hook(record)
    return steps


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05,
                           momentum=0.9)


def train_ddp(case: dict, with_cp: bool, rank: int) -> dict:
    """``STEPS`` steps of this rank under DDP; what the steps saw and the end weights."""
    from mmengine.model import MMDistributedDataParallel
    from mmengine.optim import OptimWrapper
    from torch.nn.parallel import DistributedDataParallel

    model = build_model(case, with_cp)
    model.train()
    calls = block_counter(model)
    optimizer = make_optimizer(model)
    grads = grad_recorder(model, optimizer)
    if case['wrapper'] == 'mmddp':
        ddp = MMDistributedDataParallel(module=model,
                                        find_unused_parameters=case['find_unused'])
        wrapper = OptimWrapper(optimizer)
        for step in range(STEPS):
            torch.manual_seed(step_seed(step, rank))
            ddp.train_step(dict(inputs=batch(step, rank)), wrapper)
    else:
        ddp = DistributedDataParallel(model, find_unused_parameters=case['find_unused'])
        for step in range(STEPS):
            torch.manual_seed(step_seed(step, rank))
            ddp(inputs=batch(step, rank))['loss'].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return dict(grads=grads, calls=calls, params=dict(model.named_parameters()))


def train_reference(case: dict) -> dict:
    """The same steps without DDP or checkpointing: both ranks' batches in this process."""
    model = build_model(case, with_cp=False)
    model.train()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = make_optimizer(model)
    grads = grad_recorder(model, optimizer)
    rank_gap = 0.
    for step in range(STEPS):
        per_rank = []
        for rank in range(WORLD_SIZE):
            torch.manual_seed(step_seed(step, rank))
            before = {n: None if p.grad is None else p.grad.clone()
                      for n, p in model.named_parameters()}
            # the mean over ranks, as DDP averages the gradients
            (model(inputs=batch(step, rank))['loss'] / WORLD_SIZE).backward()
            per_rank.append({n: p.grad - (0 if before[n] is None else before[n])
                             for n, p in model.named_parameters() if p.grad is not None})
        # the ranks' gradients differ (else the all-reduce would be untested)
        rank_gap = max(rank_gap, norm_of(per_rank[0], per_rank[1]) / norm_of(per_rank[1]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return dict(grads=grads, params=dict(model.named_parameters()), initial=initial,
                rank_gap=rank_gap, model=model)


def norm_of(a: Dict[str, torch.Tensor], b: Optional[Dict[str, torch.Tensor]] = None) -> float:
    """The norm of all tensors of ``a`` (minus those of ``b``) as one vector."""
    return sum(((t - (0 if b is None else b[n])).square().sum().item()
                for n, t in a.items())) ** 0.5


def max_rel(a: Dict[str, Optional[torch.Tensor]], b: Dict[str, Optional[torch.Tensor]]):
    """The largest ``max|a - b| / max|b|`` over the tensors both have, and its name."""
    worst, worst_name = 0., ''
    for name, ref in b.items():
        got = a.get(name)
        if got is None or ref is None:
            continue
        scale = ref.detach().abs().max().item()
        err = (got.detach() - ref.detach()).abs().max().item() / max(scale, 1e-30)
        if err > worst:
            worst, worst_name = err, name
    return worst, worst_name


def compare_runs(run: dict, ref: dict) -> dict:
    """Per-step gradients and end weights of ``run`` against ``ref``."""
    worst, worst_name = 0., ''
    presence = []
    for step, (got, want) in enumerate(zip(run['grads'], ref['grads'])):
        err, name = max_rel(got, want)
        if err > worst:
            worst, worst_name = err, f'step {step}: {name}'
        for n in want:
            if (want[n] is None) != (got.get(n) is None):
                # DDP may give a never-used parameter zeros instead of None
                if want[n] is None and not got[n].abs().max().item() == 0:
                    presence.append(f'step {step}: {n} has a gradient, the reference none')
                elif want[n] is not None:
                    presence.append(f'step {step}: {n} has no gradient, the reference one')
    params, params_name = max_rel(run['params'], ref['params'])
    return dict(grad_rel=worst, grad_worst=worst_name, param_rel=params,
                param_worst=params_name, presence=presence,
                steps=[len(run['grads']), len(ref['grads'])])


_REFERENCES: Dict[tuple, dict] = {}


def run_case(case: dict, rank: int) -> dict:
    # the wrapper and find_unused_parameters do not change the reference
    key = (case['family'], case['frozen_stages'], case['out_indices'])
    if key not in _REFERENCES:
        _REFERENCES[key] = train_reference(case)
    ref = dict(_REFERENCES[key])
    cp = train_ddp(case, True, rank)
    plain = train_ddp(case, False, rank)
    ref_model = ref.pop('model')
    trainable = {n for n, p in ref_model.named_parameters() if p.requires_grad}
    frozen = set(ref['params']) - trainable
    # a parameter the reference never gave a gradient to: no path to the loss
    unused = sorted(n for n in trainable if all(g.get(n) is None for g in ref['grads']))
    # blocks on a path to the loss are recomputed once in every backward pass with_cp
    expected_calls = {}
    for name, block in ref_model.named_modules():
        if name in cp['calls']:
            on_path = any(g.get(f'{name}.{n}') is not None for g in ref['grads']
                          for n, _ in block.named_parameters())
            expected_calls[name] = STEPS * (2 if on_path else 1)
    result = dict(
        name=case['name'], rank=rank,
        cp_vs_plain=compare_runs(cp, plain),
        plain_vs_ref=compare_runs(plain, ref),
        cp_vs_ref=compare_runs(cp, ref),
        rank_gap=ref['rank_gap'],
        frozen=sorted(frozen), unused=unused,
        # not in the optimiser (its zero_grad does not reach them): a .grad would stay
        frozen_with_grad=sorted({n for run in (cp, plain) for n in frozen
                                 if run['params'][n].grad is not None}),
        frozen_changed=sorted(n for run in (cp, plain) for n in frozen
                              if not torch.equal(run['params'][n], ref['initial'][n])),
        calls_cp={n: c for n, c in cp['calls'].items() if c != expected_calls[n]},
        calls_plain={n: c for n, c in plain['calls'].items() if c != STEPS},
        expected_calls=expected_calls, num_blocks=len(expected_calls))
    return result


def main(out_dir: str) -> None:
    import torch.distributed as dist
    from datetime import timedelta

    import inline_mm  # noqa: F401  (registers the backbones)

    dist.init_process_group('gloo', timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    assert dist.get_world_size() == WORLD_SIZE
    only = os.environ.get('DDP_CP_CASES')  # a comma-separated subset, to rerun by hand
    results = []
    path = os.path.join(out_dir, f'rank{rank}.json')
    for case in CASES:
        if only and case['name'] not in only.split(','):
            continue
        try:
            results.append(run_case(case, rank))
        except Exception as err:
            # DDP raises in backward on every rank alike: record it, go on with a new model
            results.append(dict(name=case['name'], rank=rank,
                                error=f'{type(err).__name__}: {err}',
                                traceback=traceback.format_exc()))
        with open(path, 'w') as f:
            json.dump(results, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    main(sys.argv[1])
