"""A Llama-style training step, written as for a real device.

The model of Llama-2/3 70B by default (80 layers, d_model 8192, 64 heads,
8 key/value heads, SwiGLU 28672, vocabulary 128256; about 70 B
parameters), bf16 weights, AdamW, one step on a batch of --batch x --seq
tokens.  Nothing here knows about memsnap: bench/predict_bench.py runs it
unchanged under `python -m memsnap.predict` (and under torch's MemTracker).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) \
            * self.weight


class Attention(nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.wq = nn.Linear(d, heads * self.hd, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.attention_norm = RMSNorm(d)
        self.attention = Attention(d, heads, kv_heads)
        self.ffn_norm = RMSNorm(d)
        self.feed_forward = FeedForward(d, hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab, d, layers, heads, kv_heads, hidden):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="npu")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--d-model", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=28672)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=1)
    args = ap.parse_args()

    device = torch.device(args.device)
    # Built in bf16 directly on the device, as large models are.
    torch.set_default_dtype(torch.bfloat16)
    with device:
        model = Llama(args.vocab, args.d_model, args.layers, args.heads, args.kv_heads,
                      args.ffn)
    torch.set_default_dtype(torch.float32)
    n = sum(p.numel() for p in model.parameters())
    print(f"{n / 1e9:.1f} B parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step} done")


if __name__ == "__main__":
    main()
