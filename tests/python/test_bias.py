"""The q/k/v bias of the GLM-4.5 attention (attention_bias) in both
bindings: ``linear(x, W, b)`` and ``qkv_projection(..., q_bias=, k_bias=,
v_bias=)`` add the bias after the product, fl(x W^T + b) (one rounding,
as train_layers.c), and the bias gradient is the token reduction of dy's
column sums (bx_linear_wgrad's bias partials). Checked: the forward bits
against the kernels' GEMM plus an fp32 addition; the gradients against
torch's native autograd in fp64 (tolerance below); torch and Paddle bit
for bit; 1 vs 2 micro-batches bit for bit; bad bias arguments."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bitexact
import bitexact.kernels as bk
import bitexact.torch as bt

T, C, H, N = 8, 4, 12, 6  # tokens, chunk (seq_len), in, out


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


X, W, B, DY = rnd(T, H, seed=1), rnd(N, H, seed=2), rnd(N, seed=3), rnd(T, N, seed=4)


def torch_step(micro_batches, qkv=False):
    """One GradReduction step of sum(y * DY); returns (y, dx, dW, db)."""
    w = torch.nn.Parameter(torch.from_numpy(W.copy()))
    b = torch.nn.Parameter(torch.from_numpy(B.copy()))
    red = bt.GradReduction([("w", w), ("b", b)], C, T)
    per, outs = T // micro_batches, {}

    def run(i):
        x = torch.from_numpy(X[i * per:(i + 1) * per].copy()).requires_grad_()
        if qkv:
            y = bt.qkv_projection(x, w, w2, w3, q_bias=b)[0]
        else:
            y = bt.linear(x, w, b)
        (y * torch.from_numpy(DY[i * per:(i + 1) * per])).sum().backward()
        outs[i] = (y.detach().numpy().copy(), x.grad.numpy().copy())

    w2 = torch.from_numpy(rnd(N, H, seed=5))
    w3 = torch.from_numpy(rnd(N, H, seed=6))
    red.run_two_pass(run, [(i * per, per) for i in range(micro_batches)])
    y = np.concatenate([outs[i][0] for i in range(micro_batches)])
    dx = np.concatenate([outs[i][1] for i in range(micro_batches)])
    return y, dx, w.grad.numpy().copy(), b.grad.numpy().copy()


def same(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qkv", [False, True])
def test_forward_is_gemm_then_one_rounding(qkv):
    y, _, _, _ = torch_step(1, qkv)
    ref = np.empty((T, N), np.float32)
    bk.gemm(X, W, "nt", ref)
    assert same(y, ref + B)  # numpy's fp32 addition: one rounding per element


@pytest.mark.parametrize("qkv", [False, True])
def test_gradients_against_fp64_autograd(qkv):
    """|err| <= 4 * 2^-24 * sum|terms| per element: a sum of at most 8
    products (dx: N terms, dW and db: T terms), each product and addition
    rounded once in fp32 (the db partial is exact on the int64 grid but its
    chunk partials are fp32 sums of C terms). Measured well below."""
    y, dx, dw, db = torch_step(1, qkv)
    x64 = torch.from_numpy(X).double().requires_grad_()
    w64 = torch.from_numpy(W).double().requires_grad_()
    b64 = torch.from_numpy(B).double().requires_grad_()
    (F.linear(x64, w64, b64) * torch.from_numpy(DY).double()).sum().backward()
    u = 4 * 2.0 ** -24
    for got, ref, mag in ((dx, x64.grad, np.abs(DY) @ np.abs(W)),
                          (dw, w64.grad, np.abs(DY).T @ np.abs(X)),
                          (db, b64.grad, np.abs(DY).sum(0))):
        assert np.all(np.abs(got - ref.numpy()) <= u * mag + 1e-30)
    # a wrong bias gradient (e.g. one chunk missing) is far outside the bound
    assert not np.all(np.abs(2 * db - b64.grad.numpy()) <= u * np.abs(DY).sum(0))


def test_micro_batches_do_not_change_a_bit():
    a, b = torch_step(1), torch_step(2)
    assert all(same(p, q) for p, q in zip(a, b))


def test_paddle_equals_torch():
    paddle = pytest.importorskip("paddle")
    import bitexact.paddle as bp
    w = paddle.create_parameter([N, H], "float32")
    w.set_value(W)
    b = paddle.create_parameter([N], "float32")
    b.set_value(B)
    red = bp.GradReduction([("w", w), ("b", b)], C, T)
    outs = {}

    def run(i):
        x = paddle.to_tensor(X.copy(), stop_gradient=False)
        y = bp.linear(x, w, b)
        (y * paddle.to_tensor(DY)).sum().backward()
        outs["y"], outs["dx"] = y.numpy(), x.grad.numpy()

    red.run_two_pass(run, [(0, T)])
    ty, tdx, tdw, tdb = torch_step(1)
    assert same(outs["y"], ty) and same(outs["dx"], tdx)
    assert same(w.grad.numpy(), tdw) and same(b.grad.numpy(), tdb)


@pytest.mark.parametrize("bias,exc", [
    (torch.zeros(N + 1), bitexact.InvalidArgumentError),
    (torch.zeros(N, dtype=torch.float64), bitexact.DTypeError),
    (torch.zeros(1, N), bitexact.InvalidArgumentError),
])
def test_bad_bias_is_refused_naming_it(bias, exc):
    x, w = torch.from_numpy(X), torch.from_numpy(W)
    with pytest.raises(exc, match="'bias'"):
        bt.linear(x, w, bias)
    with pytest.raises(exc, match="'k_bias'"):
        bt.qkv_projection(x, w, w, w, k_bias=bias)


def test_refused_weight_registers_nothing():
    """A multi-weight op whose third weight is refused (not a parameter of
    the reduction) leaves the first two unregistered: the correct call
    that follows in the same micro-batch is accepted (all or nothing in
    _gradred.capture)."""
    w = torch.nn.Parameter(torch.from_numpy(W.copy()))
    b = torch.nn.Parameter(torch.from_numpy(B.copy()))
    foreign = torch.nn.Parameter(torch.from_numpy(W.copy()))
    red = bt.GradReduction([("w", w), ("b", b)], C, T)
    red.begin()
    x = torch.from_numpy(X)
    with red.micro_batch(0, T):
        with pytest.raises(bitexact.InvalidArgumentError, match="not a parameter"):
            bt.qkv_projection(x, w, torch.from_numpy(W), foreign, q_bias=b)
        bt.linear(x, w, b)  # w and b are still free in this micro-batch
