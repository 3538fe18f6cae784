"""memsnap.predict._autocast -- torch.autocast on the fake device.

Stock torch registers autocast kernels for CUDA, CPU, XPU, MPS... but none
for PrivateUse1 (torch_npu brings its own, in C++), so
``torch.autocast("npu")`` -- and ``torch.autocast("cuda")``, which a
prediction runs on the same fake device -- would fail on every operator.
:func:`install` registers, once per process, Python kernels for the
``AutocastPrivateUse1`` dispatch key with PyTorch's CUDA autocast policy
(``aten/src/ATen/autocast_mode.cpp``: the ``lower_precision_fp``, ``fp32``,
``fp32_set_opt_dtype`` and ``promote`` lists) and a fallthrough for every
other operator.  The casts are real operators on fake tensors, so their
copies are allocations as on the device; a leaf tensor that requires grad
(a parameter) is cast once per autocast region and the copy kept until the
outermost region exits, as ``cached_cast`` does.
"""

from __future__ import annotations

import torch

KEY = "AutocastPrivateUse1"

# aten/src/ATen/autocast_mode.cpp (PyTorch 2.13), CUDA lists.
LOWER_PRECISION_FP = (
    "_convolution", "_convolution.deprecated", "conv1d", "conv2d", "conv3d",
    "conv1d.padding", "conv2d.padding", "conv3d.padding", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input",
    "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
    "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell",
    "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
    "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor",
    "pow.Scalar", "softplus", "layer_norm", "native_layer_norm", "group_norm",
    "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "cosine_similarity",
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d",
    "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname",
    "log_softmax.int", "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum",
    "cumsum.dimname", "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord",
    "sum", "sum.dim_IntList", "sum.dim_DimnameList",
)
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add", "stack", "cat",
)

_libs: list = []
_cache: dict[int, tuple] = {}
_device_type = "npu"


def _exclude():
    return torch._C._ExcludeDispatchKeyGuard(
        torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1))


def _eligible(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.dtype != torch.float64 and t.device.type == _device_type)


def _cast(t, dtype):
    if not _eligible(t) or t.dtype == dtype:
        return t
    if t.is_leaf and t.requires_grad and torch.is_autocast_cache_enabled():
        hit = _cache.get(id(t))
        if hit is not None and hit[0] is t and hit[1].dtype == dtype:
            return hit[1]
        out = t.to(dtype)
        _cache[id(t)] = (t, out)
        return out
    return t.to(dtype)


def _map(args, kwargs, fn):
    # PyTorch's wrappers cast every argument inside one call expression,
    # ``(*F)(cached_cast(..., args, ...)...)`` (autocast_mode.h,
    # WrapFunction_), which GCC -- the compiler of PyTorch's and
    # torch_npu's Linux builds -- evaluates last argument first: the
    # copies are allocated in that order (F.linear: bias, weight, input;
    # the memsnap device, which runs those C++ wrappers, shows it).  A
    # list's items are cast first to last (one loop).
    def one(a):
        if isinstance(a, torch.Tensor):
            return fn(a)
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return type(a)(fn(x) for x in a)
        return a
    kw = {k: one(kwargs[k]) for k in reversed(list(kwargs))}  # kwarg-only: last
    pos = [one(a) for a in reversed(args)]
    return tuple(reversed(pos)), {k: kw[k] for k in kwargs}


# The kernels call the operator's C function (OpOverload._op, what
# OpOverload.__call__ returns) so that no torch/_ops.py frame stands
# between the caller's frames and the allocation in a recorded stack: on
# the device the wrappers are C++ and leave none.


def _lower(op):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype(_device_type)
        with _exclude():
            args, kwargs = _map(args, kwargs, lambda t: _cast(t, dtype))
            return op._op(*args, **kwargs)
    return kernel


def _fp32(op):
    def kernel(*args, **kwargs):
        with _exclude():
            args, kwargs = _map(args, kwargs, lambda t: _cast(t, torch.float32))
            return op._op(*args, **kwargs)
    return kernel


def _set_opt_dtype(op):
    names = [a.name for a in op._schema.arguments]
    at = names.index("dtype") if "dtype" in names else None

    def kernel(*args, **kwargs):
        with _exclude():
            first = args[0] if args else None
            if at is not None and _eligible(first) and first.dtype != torch.float32:
                if len(args) > at:
                    if args[at] is None:
                        args = (*args[:at], torch.float32, *args[at + 1:])
                elif kwargs.get("dtype") is None:
                    kwargs = dict(kwargs, dtype=torch.float32)
            return op._op(*args, **kwargs)
    return kernel


def _promote(op):
    def kernel(*args, **kwargs):
        with _exclude():
            widest = None
            flat = [a for a in args if isinstance(a, torch.Tensor)]
            for a in args:
                if isinstance(a, (list, tuple)):
                    flat += [x for x in a if isinstance(x, torch.Tensor)]
            for t in flat:
                if _eligible(t):
                    widest = t.dtype if widest is None else torch.promote_types(widest, t.dtype)
            if widest is not None:
                args, kwargs = _map(args, kwargs, lambda t: _cast(t, widest))
            return op._op(*args, **kwargs)
    return kernel


def clear_cache() -> None:
    _cache.clear()


def install(device_type: str) -> None:
    """Register the kernels (once per process)."""
    global _device_type
    _device_type = device_type
    if _libs:
        return
    fall = torch.library.Library("_", "IMPL")
    fall.fallback(torch.library.fallthrough_kernel, KEY)
    lib = torch.library.Library("aten", "IMPL")
    for names, make in ((LOWER_PRECISION_FP, _lower), (FP32, _fp32),
                        (FP32_SET_OPT_DTYPE, _set_opt_dtype), (PROMOTE, _promote)):
        for name in names:
            base, _, overload = name.partition(".")
            packet = getattr(torch.ops.aten, base, None)
            op = getattr(packet, overload or "default", None) if packet is not None else None
            if op is None:
                continue  # not in this torch
            lib.impl(name, make(op), KEY)
    _libs.extend([fall, lib])
