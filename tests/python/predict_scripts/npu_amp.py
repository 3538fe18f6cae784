"""An Ascend-style script: torch_npu, .npu(), torch.npu.amp, torch.npu
memory statistics.  On an NPU host it runs as it is."""

import sys

import torch
import torch_npu  # noqa: F401  (registers the npu device)
import torch.nn.functional as F

from gpt_train import GPT

torch.npu.set_device(0)
model = GPT(4096, 128, 256, 2, 4).npu()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
scaler = torch.npu.amp.GradScaler()
x = torch.randint(0, 4096, (4, 128)).npu()
with torch.npu.amp.autocast(dtype=torch.bfloat16):
    logits = model(x)
    assert logits.dtype == torch.bfloat16, logits.dtype
    loss = F.cross_entropy(logits.flatten(0, 1).float(), x.flatten())
scaler.scale(loss).backward()
scaler.step(opt)
scaler.update()
torch.npu.synchronize()
print("max_memory_allocated", torch.npu.max_memory_allocated(), file=sys.stderr)
