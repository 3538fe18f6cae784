"""The GPT of gpt_train.py sharded with FSDP2 (fully_shard), as launched by
`torchrun --nproc-per-node N gpt_fsdp.py --device npu` on a real node."""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

from gpt_train import GPT, parser


def main():
    ap = parser()
    ap.add_argument("--backend", default="hccl")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    dev_mod = getattr(torch, args.device)
    dev_mod.set_device(local_rank)
    dist.init_process_group(args.backend)
    device = torch.device(args.device, local_rank)

    model = GPT(args.vocab, args.seq, args.d_model, args.layers, args.heads).to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(args.steps):
        x = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
        y = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
