"""Small real models train on the memsnap device (memsnap.torch.register_device)
exactly as on the CPU: a transformer (nn.Embedding, nn.TransformerEncoderLayer
with scaled_dot_product_attention, nn.LayerNorm, nn.Dropout, GELU,
cross_entropy, AdamW) and a CNN (nn.Conv2d, nn.BatchNorm2d, ReLU, MaxPool2d,
AdaptiveAvgPool2d, Linear, SGD with momentum).  Each scenario runs in a fresh
process (PrivateUse1's name and memsnap's allocator are per process) that
imports this file, so the models, the training loop and the comparison with
the CPU are the code below, and the recorded Python stacks end in this file."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from conftest import base_env, run_script

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
HERE = os.path.dirname(os.path.abspath(__file__))
DEVICE = "npu"


class TinyTransformer(nn.Module):
    """A causal language model: embedding, one encoder layer, a head."""

    def __init__(self, vocab=37, d_model=32, heads=4, seq=10):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.drop = nn.Dropout(0.1)
        self.encoder = nn.TransformerEncoderLayer(
            d_model, heads, dim_feedforward=64, dropout=0.1, activation="gelu",
            batch_first=True)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids):
        h = self.drop(self.embed(ids) + self.pos[: ids.shape[1]])
        mask = nn.Transformer.generate_square_subsequent_mask(
            ids.shape[1], device=ids.device)
        h = self.encoder(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))

    def loss(self, batch):
        ids, targets = batch
        return F.cross_entropy(self(ids).reshape(-1, self.vocab), targets.reshape(-1))


class TinyCNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.classifier = nn.Linear(16, classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))

    def loss(self, batch):
        x, labels = batch
        return F.cross_entropy(self(x), labels)


def _batches(kind):
    g = torch.Generator().manual_seed(1)
    if kind == "transformer":
        return [(torch.randint(0, 37, (4, 10), generator=g),
                 torch.randint(0, 37, (4, 10), generator=g)) for _ in range(2)]
    return [(torch.randn(4, 3, 16, 16, generator=g),
             torch.randint(0, 10, (4,), generator=g)) for _ in range(2)]


def _optimizer(kind, params):
    if kind == "transformer":
        return torch.optim.AdamW(params, lr=1e-2)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def _train(model, opt, batches, device, snap_at=None):
    """Two steps (forward, backward, optimizer step); the same dropout masks
    on every device (random operators use the CPU generator, reseeded per
    step).  Returns the losses and, when snap_at is a step, the snapshot
    taken after that step's backward."""
    import memsnap.memory as mm

    losses, snap = [], None
    for step, batch in enumerate(batches):
        batch = tuple(t.to(device) for t in batch)
        torch.manual_seed(100 + step)
        opt.zero_grad()
        loss = model.loss(batch)
        loss.backward()
        if step == snap_at:
            snap = mm._snapshot()
        opt.step()
        losses.append(loss.detach())
    return losses, snap


def _comparable(model):
    """The state dict on the CPU, without the attention's key bias: softmax
    ignores a constant added to a row of scores, so that bias's gradient is
    0 in exact arithmetic and rounding noise (~1e-9) in float32, on every
    backend; AdamW divides it by its own magnitude, so the update is the
    sign of the noise (a CPU run with another attention kernel differs from
    the default CPU run the same way).  Its gradient is compared above."""
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    for k in [k for k in state if k.endswith("self_attn.in_proj_bias")]:
        q, _, v = state[k].chunk(3)
        state[k] = torch.cat([q, v])
    return state


def train_and_compare(kind):
    """Run in the child process after register_device: train the model on
    the CPU and a copy of it on the memsnap device; assert they agree.
    Returns what the parent checks about the snapshot."""
    import memsnap.memory as mm

    torch.manual_seed(0)
    cpu_model = TinyTransformer() if kind == "transformer" else TinyCNN()
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    mm._record_memory_history("all", stacks="python")
    dev_losses, snap = _train(dev_model, _optimizer(kind, dev_model.parameters()),
                              _batches(kind), DEVICE, snap_at=0)
    mm._record_memory_history(None)
    cpu_losses, _ = _train(cpu_model, _optimizer(kind, cpu_model.parameters()),
                           _batches(kind), "cpu")

    on_device = all(t.device.type == DEVICE for t in dev_model.state_dict().values())
    torch.testing.assert_close([l.cpu() for l in dev_losses], cpu_losses)
    # Gradients, parameters and buffers (BatchNorm's running statistics).
    torch.testing.assert_close([p.grad.cpu() for p in dev_model.parameters()],
                               [p.grad for p in cpu_model.parameters()])
    torch.testing.assert_close(_comparable(dev_model), _comparable(cpu_model))
    # Evaluation mode (BatchNorm's running statistics; no dropout).
    dev_model.eval()
    cpu_model.eval()
    x = _batches(kind)[0][0]
    with torch.no_grad():
        torch.testing.assert_close(dev_model(x.to(DEVICE)).cpu(), cpu_model(x))

    me = os.path.abspath(__file__)
    segs = [s for s in snap["segments"] if s["device"] == 0]
    active = [b for s in segs for b in s["blocks"] if b["state"] == "active_allocated"]
    mine = [e for e in snap["device_traces"][0] if e["action"] == "alloc"
            and any(f["filename"] == me for f in e.get("frames", []))]
    return {
        "on_device": on_device,
        "losses": [float(l) for l in cpu_losses],
        "segments": len(segs),
        "active_blocks": len(active),
        "active_bytes": sum(b["size"] for b in active),
        "allocated_at_snapshot": sum(s["allocated_size"] for s in segs),
        "alloc_entries_from_this_file": len(mine),
        "lines_from_this_file": sorted({f["line"] for e in mine for f in e["frames"]
                                        if f["filename"] == me}),
        "functions_from_this_file": sorted({f["name"] for e in mine for f in e["frames"]
                                            if f["filename"] == me}),
        # torch.nn's files under those frames: the layers that allocated.
        "torch_nn_files": sorted({os.path.basename(f["filename"]) for e in mine
                                  for f in e["frames"]
                                  if f"torch{os.sep}nn{os.sep}" in f["filename"]}),
    }


def _run(call):
    code = f"""
import json, sys
sys.path.insert(0, {HERE!r})
import memsnap.torch as mt
mt.register_device({DEVICE!r})
import test_device_models as t
print("RESULT " + json.dumps({call}))
"""
    return run_script(code, timeout=300).result


def _shim_built() -> bool:
    import memsnap._shim as s

    return os.path.exists(s.path(s.TORCH_LIB))


needs_shim = pytest.mark.skipif(not _shim_built(),
                                reason="memsnap was built without its C++ torch shim")


def _line(text):
    src = open(os.path.abspath(__file__)).read().splitlines()
    return next(i for i, l in enumerate(src, 1) if text in l)


@needs_shim
@pytest.mark.parametrize("kind", ["transformer", "cnn"])
def test_model_trains_on_the_device_as_on_the_cpu(kind):
    r = _run(f"t.train_and_compare({kind!r})")
    assert r["on_device"]
    assert all(l > 0 for l in r["losses"])
    # The snapshot taken during training holds the model's device memory:
    # segments with active blocks, allocations whose stacks end here.
    assert r["segments"] > 0 and r["active_blocks"] > 10
    assert r["active_bytes"] == r["allocated_at_snapshot"] > 0
    assert r["alloc_entries_from_this_file"] > 10
    # (function names as torch records them: co_name, not "{cls}.forward")
    assert {"_train", "forward", "loss"} <= set(r["functions_from_this_file"])
    forward_line = _line("h = self.encoder(h" if kind == "transformer"
                         else "return self.classifier(self.features(x)")
    assert forward_line in r["lines_from_this_file"]
    # e.g. the convolutions' outputs (convolution_overrideable allocates
    # them through memsnap) and the attention's.
    layers = {"transformer.py", "functional.py"} if kind == "transformer" else {
        "conv.py", "batchnorm.py", "pooling.py"}
    assert layers <= set(r["torch_nn_files"]), r["torch_nn_files"]


class Pools(nn.Module):
    def forward(self, x):
        return (F.adaptive_avg_pool2d(x, 3).sum() + F.avg_pool2d(x, 2).sum()
                + F.adaptive_max_pool2d(x, 2).sum() + F.max_pool2d(x, 3, 2).sum())


class Attention(nn.Module):
    def forward(self, x):
        q = x.unflatten(-1, (2, -1)).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q.tanh(), q, is_causal=True)


def layer_variants():
    """Layers beyond the two models (convolutions 1d/3d, transposed,
    grouped, strided, dilated, channels_last; BatchNorm1d; pools; the
    attention's math path; the inference fast paths of
    TransformerEncoderLayer and MultiheadAttention), forward and backward,
    on the device and on the CPU."""
    torch.manual_seed(0)
    cases = [
        (nn.Conv1d(3, 4, 3, stride=2, dilation=2), (2, 3, 17)),
        (nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1), (2, 3, 5, 5)),
        (nn.Conv2d(6, 6, 3, groups=3, bias=False), (2, 6, 7, 7)),
        (nn.Conv3d(2, 3, 2), (1, 2, 4, 4, 4)),
        (nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8)), (6, 4)),
        (Pools(), (2, 3, 9, 9)),
        (Attention(), (2, 5, 16)),
        (nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval(), (2, 5, 16)),
        (nn.MultiheadAttention(16, 2, batch_first=True).eval(), (2, 5, 16)),
    ]
    out = []
    for layer, shape in cases:
        x = torch.randn(shape)
        if layer.__class__ is nn.Conv2d:
            x = x.to(memory_format=torch.channels_last)
        dev = copy.deepcopy(layer).to(DEVICE)
        if layer.training:
            xd = x.to(DEVICE).requires_grad_()
            xc = x.clone().requires_grad_()
            yd, yc = dev(xd), layer(xc)
            (yd * yd).sum().backward()
            (yc * yc).sum().backward()
            torch.testing.assert_close(xd.grad.cpu(), xc.grad)
            torch.testing.assert_close([p.grad.cpu() for p in dev.parameters()],
                                       [p.grad for p in layer.parameters()])
            torch.testing.assert_close({k: v.cpu() for k, v in dev.state_dict().items()},
                                       layer.state_dict())
        else:  # torch's fused inference path (no autograd)
            with torch.no_grad():
                args = (x,) * (3 if isinstance(layer, nn.MultiheadAttention) else 1)
                yd = dev(*(a.to(DEVICE) for a in args))
                yc = layer(*args)
                if isinstance(layer, nn.MultiheadAttention):
                    yd, yc = yd[0], yc[0]
        torch.testing.assert_close(yd.cpu(), yc)
        out.append([type(layer).__name__, yd.device.type,
                    list(yd.stride()) == list(yc.stride())])
    return out


@needs_shim
def test_layer_variants_match_the_cpu():
    r = _run("t.layer_variants()")
    assert [d for _, d, _ in r] == ["npu"] * 9, r
    # convolution_overrideable keeps the CPU kernel's layout (channels_last
    # too); attention's layout depends on the kernel torch picks per device.
    assert all(same for name, _, same in r if name.startswith("Conv")), r


def padded_encoder_inference():
    """nn.TransformerEncoder's inference with src_key_padding_mask: on the
    CPU a left-aligned mask turns the batch into a nested tensor; the
    device has none, so it answers that the mask is not left-aligned and
    runs the padded path (NotImplementedError for
    _nested_tensor_from_mask_left_aligned before).  The outputs at the
    unpadded positions are the CPU's."""
    torch.manual_seed(0)
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 2).eval()
    dev = copy.deepcopy(enc).to(DEVICE)
    x = torch.randn(3, 7, 16)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    mask[0, 5:] = True
    mask[2, 3:] = True
    with torch.inference_mode():
        yd = dev(x.to(DEVICE), src_key_padding_mask=mask.to(DEVICE))
        yc = enc(x, src_key_padding_mask=mask)
        left = bool(torch._nested_tensor_from_mask_left_aligned(
            x.to(DEVICE), mask.logical_not().to(DEVICE)))
    keep = ~mask
    torch.testing.assert_close(yd.cpu()[keep], yc[keep])
    return {"device": yd.device.type, "shape": list(yd.shape),
            "cpu_nested_zeros": bool((yc[mask] == 0).all()),
            "left_aligned_on_device": left}


@needs_shim
def test_padded_encoder_inference_matches_the_cpu():
    r = _run("t.padded_encoder_inference()")
    assert r == {"device": "npu", "shape": [3, 7, 16], "cpu_nested_zeros": True,
                 "left_aligned_on_device": False}, r


def recurrent_layer_errors():
    out = {}
    for layer in (nn.LSTM(4, 8, batch_first=True), nn.GRUCell(4, 8)):
        layer = layer.to(DEVICE)
        try:
            layer(torch.randn(2, 3, 4).to(DEVICE) if isinstance(layer, nn.LSTM)
                  else torch.randn(2, 4).to(DEVICE))
        except NotImplementedError as e:
            out[type(layer).__name__] = str(e)
    return out


@needs_shim
def test_recurrent_layers_say_they_are_unsupported():
    """nn.LSTM / nn.GRUCell call aten::_thnn_fused_lstm_cell /
    _thnn_fused_gru_cell on a PrivateUse1 device, which PyTorch implements
    for CUDA only: a clear NotImplementedError naming the operator."""
    r = _run("t.recurrent_layer_errors()")
    assert set(r) == {"LSTM", "GRUCell"}, r
    for layer, op in (("LSTM", "lstm"), ("GRUCell", "gru")):
        assert r[layer].startswith(
            f"operator aten::_thnn_fused_{op}_cell is not implemented for the "
            "memsnap device 'npu' (the fused recurrent cell"), r[layer]
        assert "run the recurrent layer on the CPU" in r[layer]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def _setitem_mask(z):
    z = z.clone()
    z[z > 0.5] = 0
    return z


def _index_put(z):
    z = z.clone()
    # CPU indices (advanced indexing moves them), values on z's device
    # (CUDA's accumulate path requires it: TensorAdvancedIndexing.cpp)
    z.index_put_((torch.tensor([0, 2]), torch.tensor([1, 3])),
                 torch.tensor([7.0, 8.0], device=z.device), accumulate=True)
    z[[1, 1]] = -1.0
    return z


def indexing_and_selection():
    """Advanced indexing, scans, sorting and selection (what transformer
    code uses: masks, top-k sampling, cumulative sums, gathers) on the
    device and on the CPU, with the same inputs; each result is compared
    with the CPU's and must be a device tensor."""
    torch.manual_seed(0)
    x = torch.rand(4, 6)
    idx = torch.tensor([0, 2])
    cases = {
        "index_tensor": lambda z: z[idx.to(z.device)],
        "index_list": lambda z: z[[0, 2]],
        "index_mask": lambda z: z[z > 0.3],
        "index_2d": lambda z: z[idx.to(z.device), 1:4],
        "setitem_mask": _setitem_mask,
        "index_put": _index_put,
        "index_add": lambda z: z.index_add(0, idx.to(z.device), torch.ones(2, 6, device=z.device)),
        "cumsum": lambda z: z.cumsum(1),
        "cumsum_": lambda z: z.clone().cumsum_(0),
        "cumprod": lambda z: z.cumprod(1),
        "topk_values": lambda z: z.topk(3, dim=1).values,
        "topk_indices": lambda z: z.topk(3, dim=1).indices,
        "sort_values": lambda z: z.sort(dim=1, descending=True).values,
        "sort_indices": lambda z: z.sort(dim=1, stable=True).indices,
        "argsort": lambda z: z.argsort(dim=0),
        "nonzero": lambda z: (z > 0.5).nonzero(),
        "masked_select": lambda z: z.masked_select(z > 0.5),
        "argmax": lambda z: z.argmax(dim=1),
        "gather": lambda z: z.gather(1, z.argsort(1)[:, :2]),
        "scatter": lambda z: torch.zeros_like(z).scatter(1, z.argsort(1)[:, :2], 1.0),
        "where": lambda z: torch.where(z > 0.5, z, -z),
        "clamp": lambda z: z.clamp(0.2, 0.8),
        "flip": lambda z: z.flip(1),
    }
    out = {}
    for name, fn in cases.items():
        yd, yc = fn(x.to(DEVICE)), fn(x.clone())
        torch.testing.assert_close(yd.cpu(), yc, msg=name)
        out[name] = [yd.device.type, list(yd.shape)]
    return out


@needs_shim
def test_indexing_scans_and_sorting_match_the_cpu():
    r = _run("t.indexing_and_selection()")
    assert {d for d, _ in r.values()} == {DEVICE}, r
    assert len(r) == 23 and r["index_mask"][1][0] > 0


def scan_gradients():
    """Backward through cumsum and cumprod (their backward formulas flip
    the gradient: aten::flip) on the device, against the CPU's."""
    torch.manual_seed(0)
    out = {}
    for op in ("cumsum", "cumprod"):
        x = torch.rand(4, 6) + 0.5
        xd = x.to(DEVICE).requires_grad_()
        x.requires_grad_()
        getattr(x, op)(1).pow(2).sum().backward()
        getattr(xd, op)(1).pow(2).sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), x.grad, msg=op)
        out[op] = xd.grad.device.type
    return out


@needs_shim
def test_scans_backward_match_the_cpu():
    assert _run("t.scan_gradients()") == {"cumsum": DEVICE, "cumprod": DEVICE}


def forward_backward_like_the_cpu(x, cases):
    """Each case's output and the gradient of its squares' sum with
    respect to x, on the device against the CPU's: {name: [the output's
    device type, the gradient's]}."""
    out = {}
    for name, f in cases.items():
        xc = x.clone().requires_grad_()
        xd = x.to(DEVICE).requires_grad_()
        yc, yd = f(xc), f(xd)
        torch.testing.assert_close(yd.cpu(), yc, msg=name)
        yc.pow(2).sum().backward()
        yd.pow(2).sum().backward()
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, msg=name)
        out[name] = [yd.device.type, xd.grad.device.type]
    return out


def rotary_losses_and_resampling():
    """The operators of a LLaMA-style block and of common heads beyond the
    first list: rotary position embeddings (sin, cos, the rotate-half
    cat), Tensor.repeat (through the device's unfold view), roll, prod,
    softplus, log1p, erf, nan_to_num, integer division, unique,
    F.interpolate (nearest, linear, bilinear), and the losses
    binary_cross_entropy(_with_logits), smooth_l1_loss and kl_div, forward
    and backward, on the device against the CPU's."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 6)

    def rotary(t):
        pos = torch.arange(8, device=t.device, dtype=t.dtype)[:, None]
        inv = 1.0 / (10000 ** (torch.arange(0, 6, 2, device=t.device,
                                            dtype=t.dtype) / 6))
        ang = torch.cat([pos * inv, pos * inv], -1)
        half = torch.cat([-t[..., 3:], t[..., :3]], -1)
        return t * ang.cos() + half * ang.sin()

    cases = {
        "rotary": rotary,
        "repeat": lambda t: t.repeat(2, 1, 1, 1) * 2,
        "unfold": lambda t: t.unfold(2, 4, 2).sum(-1),
        "roll": lambda t: torch.roll(t, 1, 2) * t,
        "prod": lambda t: (t.abs() + 0.5).prod(-1),
        "softplus": F.softplus,
        "log1p": lambda t: torch.log1p(t.abs()),
        "erf": torch.erf,
        "nan_to_num": lambda t: torch.nan_to_num(torch.log(t)),
        "interp_nearest": lambda t: F.interpolate(t, scale_factor=2),
        "interp_bilinear": lambda t: F.interpolate(t, scale_factor=2,
                                                   mode="bilinear"),
        "interp_linear": lambda t: F.interpolate(t[0], scale_factor=2,
                                                 mode="linear"),
        "bce_logits": lambda t: F.binary_cross_entropy_with_logits(
            t, (t.detach() > 0).to(t.dtype)),
        "bce": lambda t: F.binary_cross_entropy(
            torch.sigmoid(t), (t.detach() > 0).to(t.dtype)),
        "smooth_l1": lambda t: F.smooth_l1_loss(t, t.detach() * 0.5),
        "kl_div": lambda t: F.kl_div(F.log_softmax(t, -1),
                                     F.softmax(t.detach(), -1),
                                     reduction="batchmean"),
    }
    out = forward_backward_like_the_cpu(x, cases)
    ints = (x * 10).long()
    for name, f in (("floor_divide", lambda t: t // 3),
                    ("remainder", lambda t: t % 3),
                    ("unique", lambda t: torch.unique(t % 4))):
        r = f(ints.to(DEVICE))
        torch.testing.assert_close(r.cpu(), f(ints), msg=name)
        out[name] = [r.device.type, r.device.type]
    return out


@needs_shim
def test_rotary_losses_and_resampling_match_the_cpu():
    r = _run("t.rotary_losses_and_resampling()")
    assert len(r) == 19 and all(v == [DEVICE, DEVICE] for v in r.values()), r


def activations_padding_and_selection():
    """Forward and backward of the activations, paddings, patch and
    distance operators, complex views and selections a wider range of
    models uses (LeakyReLU/ELU/SELU/Hardtanh/ReLU6/Hardswish/Mish/GLU,
    reflect/replicate padding, F.unfold/F.fold, cdist, EmbeddingBag,
    rotary embeddings through view_as_complex and polar, median,
    kthvalue, logcumsumexp, cummax, index_copy, masked_scatter, huber),
    plus searchsorted, bucketize, bincount, tril_indices and randperm, on
    the device against the CPU's."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 6, 8)

    def rotary_complex(t):
        z = torch.view_as_complex(t.reshape(2, 4, 6, 4, 2))
        rot = torch.polar(torch.ones(6, 4, device=t.device),
                          torch.arange(24., device=t.device).reshape(6, 4))
        return torch.view_as_real(z * rot).flatten(-2)

    eb = nn.EmbeddingBag(10, 8, mode="mean")
    ebd = copy.deepcopy(eb).to(DEVICE)
    idx = torch.tensor([[0, 2, 4], [5, 7, 9]])
    cases = {
        "leaky_relu": F.leaky_relu, "elu": F.elu, "selu": F.selu,
        "hardtanh": F.hardtanh, "relu6": F.relu6, "hardswish": F.hardswish,
        "hardsigmoid": F.hardsigmoid, "mish": F.mish,
        "glu": lambda t: F.glu(t, -1),
        "atan2_log2": lambda t: torch.atan2(t, t.flip(0)) + torch.log2(t.abs() + 1),
        "pad_reflect": lambda t: F.pad(t, (1, 2, 2, 1), mode="reflect"),
        "pad_replicate": lambda t: F.pad(t, (1, 2, 2, 1), mode="replicate"),
        "unfold_fold": lambda t: F.fold(F.unfold(t, 3, padding=1), (6, 8), 3,
                                        padding=1),
        "cdist": lambda t: torch.cdist(t[0], t[1]),
        "rotary_complex": rotary_complex,
        "median": lambda t: t.median(-1).values,
        "kthvalue": lambda t: t.kthvalue(3, -1).values,
        "logcumsumexp": lambda t: t.logcumsumexp(-1),
        "cummax": lambda t: t.cummax(-1).values,
        "index_copy": lambda t: t.index_copy(
            1, torch.tensor([0, 2], device=t.device), t[:, 1:3] * 2),
        "masked_scatter": lambda t: t.masked_scatter(t.detach() > 0, t * 3),
        "huber": lambda t: F.huber_loss(t, t.detach() * 0.5),
    }
    out = forward_backward_like_the_cpu(x, cases)
    prelu = nn.PReLU(3)
    prelu_d = copy.deepcopy(prelu).to(DEVICE)
    x5 = torch.randn(2, 3, 4, 5, 6)
    out.update(forward_backward_like_the_cpu(x5, {
        "prelu": lambda t: (prelu_d if t.device.type == DEVICE else prelu)(t),
        "pad3d_reflect": lambda t: F.pad(t, (1, 1, 1, 1, 1, 1), mode="reflect"),
        "pad3d_replicate": lambda t: F.pad(t, (1, 1, 1, 1, 1, 1),
                                           mode="replicate"),
        "bicubic": lambda t: F.interpolate(t[:, :, 0], scale_factor=2,
                                           mode="bicubic"),
        "trilinear": lambda t: F.interpolate(t, scale_factor=2,
                                             mode="trilinear"),
        "nearest_exact": lambda t: F.interpolate(t[:, :, 0], scale_factor=2,
                                                 mode="nearest-exact"),
        "bilinear_aa": lambda t: F.interpolate(t[:, :, 0], scale_factor=0.5,
                                               mode="bilinear", antialias=True),
        "erfinv": lambda t: torch.erfinv(t.tanh() * 0.9),
        "pdist": lambda t: F.pdist(t.flatten(1)),
        "nanmedian": lambda t: t.nanmedian(-1).values,
        "repeat_interleave": lambda t: t.repeat_interleave(
            torch.tensor([1, 2], device=t.device), dim=0),
        # BCE's gradient with respect to a soft target (logit)
        "bce_soft_target": lambda t: F.binary_cross_entropy(
            torch.sigmoid(t.detach()), torch.sigmoid(t)),
    }))
    ec, ed = eb(idx), ebd(idx.to(DEVICE))
    torch.testing.assert_close(ed.cpu(), ec)
    ec.sum().backward()
    ed.sum().backward()
    torch.testing.assert_close(ebd.weight.grad.cpu(), eb.weight.grad)
    out["embedding_bag"] = [ed.device.type, ebd.weight.grad.device.type]
    edges = torch.tensor([-1.0, 0.0, 1.0])
    for name, f in (
            ("searchsorted", lambda t, e: torch.searchsorted(e, t)),
            ("bucketize", lambda t, e: torch.bucketize(t, e)),
            ("bincount", lambda t, e: torch.bincount((t.abs() * 3).long().flatten()))):
        r = f(x.to(DEVICE), edges.to(DEVICE))
        torch.testing.assert_close(r.cpu(), f(x, edges), msg=name)
        out[name] = [r.device.type, r.device.type]
    ti = torch.tril_indices(5, 5, device=DEVICE)
    torch.testing.assert_close(ti.cpu(), torch.tril_indices(5, 5))
    torch.manual_seed(3)
    rp = torch.randperm(7, device=DEVICE)
    torch.manual_seed(3)
    torch.testing.assert_close(rp.cpu(), torch.randperm(7))
    out["tril_indices"] = [ti.device.type, ti.device.type]
    out["randperm"] = [rp.device.type, rp.device.type]
    return out


@needs_shim
def test_activations_padding_and_selection_match_the_cpu():
    r = _run("t.activations_padding_and_selection()")
    assert len(r) == 40 and all(v == [DEVICE, DEVICE] for v in r.values()), r


def statistics_norms_and_fused_optimizers():
    """nn.GroupNorm (math_group_norm over var_mean, and its backward),
    var/std, cross_entropy with label_smoothing (bitwise_not of the
    ignore mask) forward and backward, bitwise/logical ops, and one step of
    each fused=True optimizer, on the device against the CPU's."""
    torch.manual_seed(0)
    out = {}
    x = torch.randn(6, 8, 5)
    gn = nn.GroupNorm(2, 8)
    gnd = copy.deepcopy(gn).to(DEVICE)
    xd = x.to(DEVICE).requires_grad_()
    x.requires_grad_()
    gn(x).pow(2).sum().backward()
    gnd(xd).pow(2).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)
    torch.testing.assert_close(gnd.weight.grad.cpu(), gn.weight.grad)
    out["group_norm"] = xd.grad.device.type
    y = torch.randn(7, 9)
    for name, f in (("var", lambda t: t.var(1)), ("std", lambda t: t.std(0, correction=0)),
                    ("var_mean", lambda t: torch.var_mean(t, 1)[0]),
                    ("std_mean", lambda t: torch.std_mean(t)[1])):
        r = f(y.to(DEVICE))
        torch.testing.assert_close(r.cpu(), f(y), msg=name)
        out[name] = r.device.type
    logits, target = torch.randn(8, 5), torch.tensor([0, 1, 2, 3, 4, 0, 1, -100])
    ld = logits.to(DEVICE).requires_grad_()
    logits.requires_grad_()
    F.cross_entropy(logits, target, label_smoothing=0.1).backward()
    F.cross_entropy(ld, target.to(DEVICE), label_smoothing=0.1).backward()
    torch.testing.assert_close(ld.grad.cpu(), logits.grad)
    out["label_smoothing"] = ld.grad.device.type
    a, b = torch.randint(0, 255, (10,), dtype=torch.uint8), torch.randint(0, 255, (10,), dtype=torch.uint8)
    for name, f in (("bitwise_not", lambda p, q: ~p), ("bitwise_xor", lambda p, q: p ^ q),
                    ("logical_or", lambda p, q: torch.logical_or(p > 100, q > 100))):
        r = f(a.to(DEVICE), b.to(DEVICE))
        assert torch.equal(r.cpu(), f(a, b)), name
        out[name] = r.device.type
    for name, cls, kw in (("adamw", torch.optim.AdamW, {"lr": 0.1}),
                          ("adam", torch.optim.Adam, {"lr": 0.1}),
                          ("sgd", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                          ("adagrad", torch.optim.Adagrad, {"lr": 0.1})):
        torch.manual_seed(1)
        m = nn.Linear(4, 3)
        md = copy.deepcopy(m).to(DEVICE)
        for model in (m, md):
            opt = cls(model.parameters(), fused=True, **kw)
            for _ in range(2):
                model(torch.ones(2, 4, device=model.weight.device)).pow(2).sum().backward()
                opt.step()
                opt.zero_grad()
        torch.testing.assert_close(md.weight.cpu(), m.weight, msg=name)
        out["fused_" + name] = md.weight.device.type
    return out


@needs_shim
def test_statistics_norms_and_fused_optimizers_match_the_cpu():
    r = _run("t.statistics_norms_and_fused_optimizers()")
    assert set(r.values()) == {DEVICE} and len(r) == 13, r


def save_load_round_trip(path):
    """torch.save of device tensors and a module's state_dict, torch.load
    back onto the device (torch's _utils._to enters torch.<name>.device),
    and onto the CPU with map_location."""
    torch.manual_seed(0)
    t = torch.randn(3, 5).to(DEVICE)
    layer = nn.Linear(5, 2).to(DEVICE)
    torch.save({"t": t, "state": layer.state_dict()}, path)
    back = torch.load(path)
    cpu = torch.load(path, map_location="cpu")
    torch.testing.assert_close(back["t"].cpu(), t.cpu())
    torch.testing.assert_close(cpu["t"], t.cpu())
    fresh = nn.Linear(5, 2).to(DEVICE)
    fresh.load_state_dict(back["state"])
    torch.testing.assert_close(fresh(t).cpu(), layer(t).cpu())
    dev_mod = getattr(torch, DEVICE)
    with dev_mod.device(0) as ctx:
        inside = dev_mod.current_device()
    return {"device": str(back["t"].device), "cpu": str(cpu["t"].device),
            "state": sorted({str(v.device) for v in back["state"].values()}),
            "ctx": [ctx.idx, inside, dev_mod.current_device()]}


@needs_shim
def test_save_and_load_a_device_tensor(tmp_path):
    r = _run(f"t.save_load_round_trip({str(tmp_path / 'x.pt')!r})")
    assert r == {"device": "npu:0", "cpu": "cpu", "state": ["npu:0"], "ctx": [0, 0, 0]}


def _device_context_switches():
    """torch.<name>.device sets and restores the current device (two
    devices: MEMSNAP_SIM_DEVICES=2)."""
    dev_mod = getattr(torch, DEVICE)
    seen = [dev_mod.current_device()]
    with dev_mod.device(1):
        seen.append(dev_mod.current_device())
        seen.append(str(torch.empty(1, device=DEVICE).device))
        with dev_mod.device(None):
            seen.append(dev_mod.current_device())
    seen.append(dev_mod.current_device())
    t = torch.ones(2, device=f"{DEVICE}:1")
    with dev_mod.device_of(t):
        seen.append(dev_mod.current_device())
    with dev_mod.device_of(torch.ones(2)):
        seen.append(dev_mod.current_device())
    try:
        dev_mod.device("cpu")
    except ValueError as e:
        seen.append(str(e))
    return seen


@needs_shim
def test_device_context_manager_sets_and_restores():
    code = f"""
import json, sys
sys.path.insert(0, {HERE!r})
import memsnap.torch as mt
mt.register_device({DEVICE!r})
import test_device_models as t
print("RESULT " + json.dumps(t._device_context_switches()))
"""
    from conftest import base_env

    env = base_env()
    env["MEMSNAP_SIM_DEVICES"] = "2"
    r = run_script(code, env=env).result
    assert r[:6] == [0, 1, "npu:1", 1, 0, 1], r
    assert r[6] == 0 and "Expected a npu device" in r[7], r


class AmpBlock(nn.Module):
    """Linear, softmax, layer_norm, GELU and a loss: the autocast policy's
    lower-precision (linear) and fp32 (softmax, layer_norm, mse_loss) ops."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x)
        p = h.softmax(-1)
        n = self.norm(F.gelu(h))
        y = self.fc2(n)
        return {"linear": h, "softmax": p, "layer_norm": n, "out": y,
                "matmul": x @ x.t(), "sum": y.sum()}


def autocast_on_the_device():
    """The same block under torch.autocast(<device>, bfloat16) and
    torch.autocast("cpu", bfloat16): the dtype of each output, values
    equal to bf16 rounding, and a training step (backward through the
    casts, SGD update) that matches the CPU's."""
    torch.manual_seed(0)
    cpu_model = AmpBlock()
    dev_model = copy.deepcopy(cpu_model).to(DEVICE)
    x = torch.randn(6, 8)
    target = torch.randn(6, 4)
    dtypes = {}
    for device, model, xi, ti in (("cpu", cpu_model, x, target),
                                  (DEVICE, dev_model, x.to(DEVICE), target.to(DEVICE))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.autocast(device, dtype=torch.bfloat16):
            outs = model(xi)
            loss = F.mse_loss(outs["out"], ti)
        loss.backward()
        opt.step()
        dtypes[device] = {k: str(v.dtype) for k, v in outs.items()}
        dtypes[device]["loss"] = str(loss.dtype)
        dtypes[device]["grad"] = str(model.fc1.weight.grad.dtype)
        dtypes[device]["out_device"] = outs["out"].device.type
        if device == "cpu":
            cpu_outs, cpu_loss = outs, loss
        else:
            for k, v in outs.items():
                # bf16 matmuls: the CPU autocast kernel (oneDNN) and the
                # device's addmm (on the CPU, via cpu_fallback) round differently
                torch.testing.assert_close(v.cpu().float(), cpu_outs[k].float(),
                                           atol=2e-2, rtol=2e-2, msg=k)
            torch.testing.assert_close(loss.cpu(), cpu_loss, atol=2e-2, rtol=2e-2)
    # The update of a bf16 gradient: equal to bf16 rounding.
    torch.testing.assert_close({k: v.cpu() for k, v in dev_model.state_dict().items()},
                               cpu_model.state_dict(), atol=1e-3, rtol=1e-2)
    dev_mod = getattr(torch, DEVICE)
    return {"dtypes": dtypes, "default": str(torch.get_autocast_dtype(DEVICE)),
            "supported": [str(d) for d in dev_mod.get_amp_supported_dtype()],
            "outside": str(dev_model.fc1(x.to(DEVICE)).dtype)}


@needs_shim
def test_autocast_on_the_device_follows_torchs_policy():
    """The device registers PyTorch's own autocast policy lists
    (ATen/autocast_mode.h, those of AutocastCUDA, which torch_npu follows):
    linear and matmul in the autocast dtype as under CPU autocast; softmax,
    layer_norm and sum in fp32 (CUDA's fp32 / fp32_set_opt_dtype lists,
    where torch 2.13's CPU autocast keeps bf16); the loss and the
    parameters' gradients in fp32 on both."""
    r = _run("t.autocast_on_the_device()")
    dev, cpu = r["dtypes"]["npu"], r["dtypes"]["cpu"]
    assert dev["out_device"] == "npu" and cpu["out_device"] == "cpu"
    for op in ("linear", "matmul", "out"):
        assert dev[op] == cpu[op] == "torch.bfloat16", (op, r)
    for op in ("loss", "grad"):
        assert dev[op] == cpu[op] == "torch.float32", (op, r)
    for op in ("softmax", "layer_norm", "sum"):
        assert dev[op] == "torch.float32", (op, r)
    assert r["outside"] == "torch.float32"  # no autocast outside the region
    assert r["default"] == "torch.float16"  # torch's default for PrivateUse1
    assert r["supported"] == ["torch.bfloat16", "torch.float16"]


def _grad_scaler_run(device):
    """An MLP trained with torch.amp.GradScaler on `device`: two finite
    steps (the scale grows: growth_interval=2), then a batch whose loss is
    inf (the step is skipped, the scale backs off), then one more step."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device if device == "cpu" else DEVICE,
                                  init_scale=2.0 ** 10, growth_interval=2)
    g = torch.Generator().manual_seed(4)
    scales, skipped = [], []
    for step in range(4):
        x = torch.randn(16, 12, generator=g)
        y = torch.randn(16, 3, generator=g)
        if step == 2:
            x[0, 0] = float("inf")
        x, y = x.to(device), y.to(device)
        before = [p.detach().cpu().clone() for p in model.parameters()]
        opt.zero_grad()
        scaler.scale(F.mse_loss(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        skipped.append(all(torch.equal(b, p.detach().cpu())
                           for b, p in zip(before, model.parameters())))
    return model, scales, skipped


def grad_scaler_and_multinomial():
    """torch.amp.GradScaler on the device against the CPU's (the same
    scales, skipped steps and parameters), and torch.multinomial drawing
    what the CPU draws from the same seed."""
    md, sd, kd = _grad_scaler_run(DEVICE)
    mc, sc, kc = _grad_scaler_run("cpu")
    for a, b in zip(md.parameters(), mc.parameters()):
        assert a.device.type == DEVICE
        torch.testing.assert_close(a.detach().cpu(), b.detach())
    p = torch.softmax(torch.randn(5, 9), -1)
    torch.manual_seed(11)
    dd = torch.multinomial(p.to(DEVICE), 4)
    torch.manual_seed(11)
    dc = torch.multinomial(p, 4)
    assert torch.equal(dd.cpu(), dc)
    return {"scales": [sd, sc], "skipped": [kd, kc],
            "multinomial_device": dd.device.type}


@needs_shim
def test_grad_scaler_and_multinomial_match_the_cpu():
    r = _run("t.grad_scaler_and_multinomial()")
    dev, cpu = r["scales"]
    assert dev == cpu == [1024.0, 2048.0, 1024.0, 1024.0], r
    # the inf step (the third) is skipped, the others update
    assert r["skipped"] == [[False, False, True, False]] * 2, r
    assert r["multinomial_device"] == DEVICE


AUTOCAST_LAYER_NORM = """
import json, sys, torch, torch.nn as nn, torch.nn.functional as F
if sys.argv[1] == "device":
    import memsnap.torch as mt
    dev = mt.register_device("npu")
else:  # under python -m memsnap.predict
    dev = "npu"
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(128, 128), nn.LayerNorm(128), nn.Linear(128, 100)).to(dev)
x = torch.randn(8, 64, 128, device=dev)
y = torch.randint(0, 100, (8 * 64,), device=dev)
with torch.autocast(dev, dtype=torch.bfloat16):
    loss = F.cross_entropy(m(x).flatten(0, 1), y)
loss.backward()
print("RESULT " + json.dumps([torch.npu.max_memory_allocated(),
                              torch.npu.memory_stats()["requested_bytes.all.peak"]]))
"""


@needs_shim
def test_layer_norm_under_autocast_allocates_as_predicted(tmp_path):
    """LayerNorm on the device runs the CPU's native_layer_norm kernel
    (PyTorch's math_native_layer_norm, which a backend without its own
    kernel gets, allocated a full-size fp32 temporary under autocast that
    CUDA's kernel does not: 1478656 B at the peak against 1460736 B).  The
    device's peaks equal memsnap.predict's for the same script, byte for
    byte, in the npu profile."""
    script = tmp_path / "ln.py"
    script.write_text(AUTOCAST_LAYER_NORM)
    env = base_env(MEMSNAP_PROFILE="npu")
    dev = subprocess.run([sys.executable, str(script), "device"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert dev.returncode == 0, dev.stdout + dev.stderr
    got = json.loads(dev.stdout.split("RESULT ", 1)[1])
    pred = subprocess.run([sys.executable, "-m", "memsnap.predict", "--profile", "npu",
                           "--attention", "math", "--json", str(script), "predict"],
                          env=base_env(), capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert pred.returncode == 0, pred.stdout + pred.stderr
    p = json.loads(pred.stdout.strip().splitlines()[-1])
    assert got == [p["peak_allocated_bytes"], p["peak_requested_bytes"]], (got, p)
