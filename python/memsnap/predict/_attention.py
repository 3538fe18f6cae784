"""memsnap.predict._attention -- scaled_dot_product_attention as the device runs it.

On a CPU-only torch, ``F.scaled_dot_product_attention`` of fake tensors
takes the math path: it materialises the B x H x Tq x Tk attention matrix
and keeps it for the backward.  On the devices the prediction is about it
is a fused kernel that never does, so the memory differs by orders of
magnitude at long sequences.  With ``attention="fused"`` (the default)
SDPA on the fake device allocates what the device's kernel allocates:

- ``cuda`` profile: PyTorch's own fused operators, as the CUDA dispatch of
  SDPA calls them -- ``aten._scaled_dot_product_flash_attention`` for
  fp16/bf16 without a mask and head size <= 256 (output + logsumexp
  B x H x Tq fp32 kept for the backward; dropout by Philox, no mask), else
  ``aten._scaled_dot_product_efficient_attention`` (with the mask as an
  additive bias; a bool mask is first converted, as SDPA does).  Their
  backward operators allocate dq, dk, dv.
- ``npu`` profile: torch_npu's ``npu_fusion_attention`` (what torch_npu's
  SDPA calls): the output, ``softmax_max`` and ``softmax_sum`` (B x N x Sq x
  8 fp32 each, kept for the backward), an empty ``softmax_out``, seed and
  offset; with dropout a bit mask of B x N x Sq x Skv / 8 bytes kept for
  the backward.  The backward allocates dq, dk, dv and an empty dpse.
  Shapes as torch_npu's fake registrations
  (op_plugin/python/meta/_fake_registrations.py).

Workspace inside the kernels (not allocator memory, or allocated and freed
within one kernel) is not modelled.  Inputs that are not 4-D take the math
path.  ``attention="math"`` keeps torch's CPU decision (the math path).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten
SDPA = torch._C._nn.scaled_dot_product_attention
_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
           "enable_gqa")
_DEFAULTS = (None, None, None, None, 0.0, False, None, False)


def _bind(args, kwargs) -> dict:
    d = dict(zip(_PARAMS, _DEFAULTS))
    d.update(zip(_PARAMS, args))
    d.update(kwargs)
    return d


class _NpuFusionAttention(torch.autograd.Function):
    """The allocations of torch_npu's npu_fusion_attention (BNSD layout)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, dropout_p):
        b, n, s, _ = q.shape
        skv, dv = k.shape[-2], v.shape[-1]
        out = q.new_empty((b, n, s, dv))
        softmax_max = q.new_empty((b, n, s, 8), dtype=torch.float32)
        softmax_sum = q.new_empty((b, n, s, 8), dtype=torch.float32)
        q.new_empty((0,))  # softmax_out
        seed = q.new_empty((1,), dtype=torch.long)
        offset = q.new_empty((1,), dtype=torch.long)
        saved = [q, k, v, out, softmax_max, softmax_sum, seed, offset]
        if dropout_p > 0:
            saved.append(q.new_empty(((b * n * s * skv + 7) // 8,), dtype=torch.uint8))
        if mask is not None:
            saved.append(mask)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors[:3]
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        q.new_empty((0,))  # dpse
        return dq, dk, dv, None, None


def fused(profile: str, args, kwargs):
    """SDPA's result through the device kernel's allocations, or None when
    the call is left to torch (not 4-D)."""
    a = _bind(args, kwargs)
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return None
    dropout_p, is_causal, scale = a["dropout_p"], a["is_causal"], a["scale"]
    if profile == "npu":
        # npu_fusion_attention takes fewer key/value heads as they are.
        return _NpuFusionAttention.apply(q, k, v, mask, dropout_p)
    if a["enable_gqa"] and k.size(-3) != q.size(-3):
        rep = q.size(-3) // k.size(-3)
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    if mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.size(-1) <= 256:
        # (the overload's C function: no torch/_ops.py frame in the
        # recorded stacks, as the device's C++ leaves none)
        return aten._scaled_dot_product_flash_attention.default._op(
            q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    if mask is not None and mask.dtype == torch.bool:
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
        mask = bias.masked_fill_(mask.logical_not(), float("-inf"))
    if mask is not None:
        mask = mask.expand(q.size(0), q.size(1), q.size(2), k.size(2))
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return aten._scaled_dot_product_efficient_attention.default._op(
        q, k, v, mask, grad, dropout_p, is_causal, scale=scale)[0]
