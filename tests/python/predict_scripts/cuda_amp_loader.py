"""A CUDA training loop with the usual furniture: a DataLoader with worker
processes and pinned memory, fp16 autocast with a GradScaler, a side
stream, and torch.cuda memory statistics.  On a GPU it runs as it is."""

import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cuda")
data = TensorDataset(torch.randn(256, 256), torch.randint(0, 10, (256,)))
loader = DataLoader(data, batch_size=64, shuffle=True, num_workers=2, pin_memory=True)
side = torch.cuda.Stream()
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.to(device)
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
        assert out.dtype == torch.float16, out.dtype
        loss = nn.functional.cross_entropy(out, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    with torch.cuda.stream(side):
        extra = torch.empty(1 << 20, device="cuda")
    extra.record_stream(torch.cuda.current_stream())
print("max_memory_allocated", torch.cuda.max_memory_allocated(), file=sys.stderr)
print(torch.cuda.memory_summary().splitlines()[1], file=sys.stderr)
