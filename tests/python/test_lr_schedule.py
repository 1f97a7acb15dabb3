"""bx_lr_at (bitexact.kernels.lr_at, the rate `bitexact train
--lr-scheduler` records) against transformers' schedulers step by step,
and bx_adamw_step against torch.optim.AdamW with non-default betas and
epsilon under a changing learning rate (issue 27, item 3)."""
import math
from fractions import Fraction

import numpy as np
import pytest

import bitexact.kernels as K

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def transformers_rates(name, lr, W, N, steps, min_lr=0.0):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=lr)
    kw = {}
    if min_lr:
        kw["scheduler_specific_kwargs"] = {"min_lr": min_lr}
    sched = transformers.get_scheduler(name, opt, num_warmup_steps=W, num_training_steps=N, **kw)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


CASES = [  # (transformers name, ours, lr, min_lr, warmup, total)
    ("constant", "constant", 3e-4, 0.0, 0, 50),
    ("constant_with_warmup", "constant_with_warmup", 3e-4, 0.0, 7, 50),
    ("linear", "linear", 3e-4, 0.0, 0, 50),
    ("linear", "linear", 1e-3, 0.0, 10, 300),
    ("cosine", "cosine", 3e-4, 0.0, 0, 64),
    ("cosine", "cosine", 6e-4, 0.0, 30, 300),
    ("cosine_with_min_lr", "cosine", 6e-4, 6e-5, 30, 300),
    ("cosine_with_min_lr", "cosine", 1e-3, 1e-4, 5, 17),
]


@pytest.mark.parametrize("name,ours,lr,min_lr,W,N", CASES)
def test_against_transformers(name, ours, lr, min_lr, W, N):
    steps = N + 5  # past the end too
    theirs = transformers_rates(name, lr, W, N, steps, min_lr)
    mine = [K.lr_at(ours, lr, s, total_steps=N, warmup_steps=W, min_lr=min_lr)
            for s in range(steps)]
    # transformers rounds several times in Python floats, bx_lr_at once
    # (checked against MPFR in tests/test_lr.c): within two ulps, except
    # where transformers' 1 + cos(x) cancels near the cosine's end, whose
    # absolute error is about lr * 2^-53
    for s, (a, b) in enumerate(zip(mine, theirs)):
        assert abs(a - b) <= 2 * math.ulp(b) + 2 * 2.0 ** -53 * lr, (s, a.hex(), b.hex())


@pytest.mark.parametrize("kind", ["constant", "linear", "constant_with_warmup"])
def test_rational_rates_exact(kind):
    """The rational schedules are the exact rate rounded once."""
    lr, m, W, N = float.fromhex("0x1.9fd41ab6f6f22p-2"), 0.0, 12, 16
    if kind == "linear":
        m = float.fromhex("0x1.5p-5")
    for s in range(N + 3):
        got = K.lr_at(kind, lr, s, total_steps=N, warmup_steps=W, min_lr=m)
        if kind == "constant" or (kind == "constant_with_warmup" and s >= W):
            want = lr
        elif s < W:
            want = float(Fraction(lr) * s / W)
        else:
            want = float(Fraction(m) + (Fraction(lr) - Fraction(m)) * Fraction(max(0, N - s), N - W))
        assert got == want, (kind, s, got.hex(), want.hex())


def test_errors_named():
    with pytest.raises(ValueError, match="schedule 'warm'"):
        K.lr_at("warm", 1e-3, 0, total_steps=10)
    with pytest.raises(Exception, match="min_lr"):
        K.lr_at("cosine", 1e-3, 0, total_steps=10, min_lr=2e-3)
    with pytest.raises(Exception, match="linear and cosine"):
        K.lr_at("constant", 1e-3, 0, total_steps=10, min_lr=1e-4)
    with pytest.raises(TypeError, match="total_steps"):
        K.lr_at("linear", 1e-3, 0)


def test_adamw_betas_eps_schedule_vs_torch(monkeypatch):
    """bx_adamw_step with betas (0.8, 0.95), eps 1e-6, weight decay 0.1 and
    a cosine schedule's rate per step: bit for bit torch.optim.AdamW
    (foreach=False) given the same rates, once torch's fp32 sqrt (not
    correctly rounded on CPU, docs/train_math.md) is the IEEE one."""
    rng = np.random.default_rng(7)
    n = 4097
    p0 = rng.standard_normal(n).astype(np.float32)
    monkeypatch.setattr(torch.Tensor, "sqrt", lambda t: torch.sqrt(t.double()).to(t.dtype))
    tp = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = torch.optim.AdamW([tp], lr=1e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1,
                            foreach=False)
    p, m, v = p0.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)
    for s in range(12):
        lr = K.lr_at("cosine", 1e-3, s, total_steps=12, warmup_steps=3, min_lr=1e-4)
        g = (rng.standard_normal(n) * math.exp(-s / 4)).astype(np.float32)
        tp.grad = torch.from_numpy(g.copy())
        opt.param_groups[0]["lr"] = lr
        opt.step()
        K.adamw_step(p, g, m, v, s + 1, lr=lr, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1)
        st = opt.state[tp]
        assert np.array_equal(p.view(np.uint32), tp.detach().numpy().view(np.uint32)), s
        assert np.array_equal(m.view(np.uint32), st["exp_avg"].numpy().view(np.uint32)), s
        assert np.array_equal(v.view(np.uint32), st["exp_avg_sq"].numpy().view(np.uint32)), s
