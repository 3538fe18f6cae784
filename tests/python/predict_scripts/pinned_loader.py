"""Host-to-device copies from pinned memory, as a CUDA input pipeline does:
batches built on the host, pinned (`Tensor.pin_memory()`, a staging buffer
made with `torch.empty(..., pin_memory=True)`), copied with
`non_blocking=True`, and a small MLP trained on them.  Prints what
`is_pinned()` answers and the batch's device."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    w = args.width
    model = nn.Sequential(nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    staging = torch.empty(args.batch, w, pin_memory=True)  # a reused pinned buffer
    labels = torch.zeros(args.batch, dtype=torch.long).pin_memory()
    print(f"staging pinned: {staging.is_pinned()}, labels pinned: {labels.is_pinned()}, "
          f"unpinned: {torch.zeros(4).is_pinned()}")
    for step in range(args.steps):
        staging.copy_(torch.randn(args.batch, w))
        x = staging.to(args.device, non_blocking=True)
        y = labels.to(args.device, non_blocking=True)
        small = torch.randn(1000).pin_memory()  # a small real host tensor
        s = small.to(args.device, non_blocking=True)
        loss = F.cross_entropy(model(x), y) + s.sum() * 0
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step}: batch on {x.device}, small pinned {small.is_pinned()}")


if __name__ == "__main__":
    main()
