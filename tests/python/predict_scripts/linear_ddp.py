"""A plain DistributedDataParallel training script, as launched by
`torchrun --nproc-per-node N linear_ddp.py --device npu` on a real node:
an MLP of nn.Linear layers wrapped in DDP, a few SGD steps."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class WithUnusedHead(nn.Module):
    """The body, and a head the forward never uses (its parameters get no
    gradient: DDP needs find_unused_parameters=True)."""

    def __init__(self, body, head):
        super().__init__()
        self.body, self.head = body, head

    def forward(self, x):
        return self.body(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="npu")
    ap.add_argument("--backend", default="hccl")
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--bucket-view", action="store_true",
                    help="gradient_as_bucket_view=True (gradients are views of the buckets)")
    ap.add_argument("--find-unused", action="store_true",
                    help="an unused head and find_unused_parameters=True (DDP walks the "
                         "graph after each forward and reduces a pinned bitmap of the "
                         "unused parameters)")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    getattr(torch, args.device).set_device(local_rank)
    dist.init_process_group(args.backend)
    device = torch.device(args.device, local_rank)

    w = args.width
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, 10))
    if args.find_unused:
        model = WithUnusedHead(model, nn.Linear(w, 10))
    model = model.to(device)
    ddp = DDP(model, device_ids=[local_rank], bucket_cap_mb=args.bucket_mb,
              gradient_as_bucket_view=args.bucket_view,
              find_unused_parameters=args.find_unused)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    for step in range(args.steps):
        x = torch.randn(args.batch, w, device=device)
        y = torch.randint(0, 10, (args.batch,), device=device)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
