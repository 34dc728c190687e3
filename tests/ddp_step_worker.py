"""One DDP training step of an InLine backbone, checked against the ranks' own gradients.

Launched by tests/test_cuda.py through torchrun (one process per rank)::

    python -m torch.distributed.run --nproc_per_node 2 tests/ddp_step_worker.py \\
        --backend nccl --out result.json

Every rank builds the same model (same seed), wraps it in
``DistributedDataParallel`` and runs one forward / backward / SGD step on its
own batch.  The reference is computed without DDP: each rank's gradient of a
plain copy of the model on its own batch, all-gathered and averaged.  DDP's
gradients must equal that average on every rank, and after the step every
rank must hold the same weights.  Rank 0 writes what it found as JSON
(``--out``).  ``--backend gloo --device cpu`` runs the same check on the CPU.
"""
import argparse
import copy
import json
import os
import os.path as osp
import sys
from datetime import timedelta

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from timm.layers import DropPath  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from inline_mm import InLinePVT  # noqa: E402


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def loss_of(outputs) -> torch.Tensor:
    return sum(o.float().square().mean() for o in outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--backend', default='nccl', choices=['nccl', 'gloo'])
    parser.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument('--out', required=True)
    args = parser.parse_args()
    rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    local = int(os.environ['LOCAL_RANK'])
    if args.device == 'cuda':
        # one GPU per rank where there are enough; otherwise the ranks share (NCCL may refuse)
        torch.cuda.set_device(local % torch.cuda.device_count())
        device = torch.device('cuda', torch.cuda.current_device())
    else:
        device = torch.device('cpu')
        torch.set_num_threads(1)
    # a short timeout: a rank that cannot start must not leave the other waiting for 30 min
    dist.init_process_group(args.backend, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        torch.manual_seed(0)  # the same weights on every rank
        # no drop path: DDP's forward and the reference's would drop different blocks (and
        # pass or fail by the seed)
        model = InLinePVT(arch='tiny', depths=[1, 1, 1, 1], drop_path_rate=0.).to(device)
        random_layers = [type(m).__name__ for m in model.modules()
                         if isinstance(m, (DropPath, torch.nn.Dropout)) and m.training and
                         (getattr(m, 'drop_prob', 0) or getattr(m, 'p', 0))]
        assert not random_layers, f'the step check needs a deterministic forward: {random_layers}'
        reference = copy.deepcopy(model)
        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.index is not
                                      None else None)
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
        x = torch.randn(2, 3, 96, 128, generator=gen).to(device)

        loss_of(ddp(x)).backward()
        got = flat_grads(model)
        loss_of(reference(x)).backward()
        local_grad = flat_grads(reference)
        gathered = [torch.empty_like(local_grad) for _ in range(world)]
        dist.all_gather(gathered, local_grad)
        expected = torch.stack(gathered).mean(0)
        grad_err = ((got - expected).abs().max() / expected.abs().max()).item()

        torch.optim.SGD(model.parameters(), lr=0.1).step()
        weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        all_weights = [torch.empty_like(weights) for _ in range(world)]
        dist.all_gather(all_weights, weights)
        weight_diff = max((w - all_weights[0]).abs().max().item() for w in all_weights)
        ranks_differ = (torch.stack(gathered)[0] - torch.stack(gathered)[-1]).abs().max().item()
        result = dict(world_size=world, backend=args.backend, device=str(device),
                      devices=torch.cuda.device_count() if args.device == 'cuda' else 0,
                      grad_rel_err=grad_err, weight_diff=weight_diff,
                      local_grads_differ=ranks_differ, grad_max=expected.abs().max().item())
        dist.barrier()
        if rank == 0:
            with open(args.out, 'w') as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
