"""model/adagrad.py against torch.optim.Adagrad (the class it leaves out) and a float64 hand formula."""

import subprocess
import sys

import pytest
import torch

from model.adagrad import Adagrad


def _steps(impl, n_steps=5, n=257):
    torch.manual_seed(0)
    w0 = torch.randn(n)
    grads = [torch.randn(n) for _ in range(n_steps)]
    grads[2][:100] = 0.0  # rows with a zero gradient must not move
    ours = w0.clone()
    ref = torch.nn.Parameter(w0.clone())
    opt = Adagrad(ours, lr=0.05, eps=1e-8, impl=impl)
    ref_opt = torch.optim.Adagrad([ref], lr=0.05, eps=1e-8,
                                  **({} if impl is None else {"fused": impl == "fused", "foreach": impl == "foreach"}))
    for g in grads:
        ours.grad = g.clone()
        ref.grad = g.clone()
        opt.step()
        ref_opt.step()
    return w0, grads, ours, ref.detach(), opt, ref_opt.state[ref]


@pytest.mark.parametrize("impl", ["fused", "foreach", None])
def test_the_same_bits_as_torch_optim_adagrad(impl):
    _, _, ours, ref, opt, state = _steps(impl)
    assert torch.equal(ours, ref)
    assert torch.equal(opt.sum, state["sum"])
    assert opt.steps.item() == state["step"].item() == 5


def test_adagrad_is_the_textbook_update_in_float64():
    w0, grads, ours, _, _, _ = _steps("foreach")
    w, acc = w0.double(), torch.zeros_like(w0, dtype=torch.float64)
    for g in grads:
        g = g.double()
        acc += g * g
        w = w - 0.05 * g / (acc.sqrt() + 1e-8)
    torch.testing.assert_close(ours.double(), w, rtol=1e-6, atol=1e-6)


def test_a_step_without_a_gradient_moves_nothing():
    w = torch.ones(4)
    opt = Adagrad(w, lr=0.1, eps=1e-8, impl="foreach")
    opt.step()
    assert torch.equal(w, torch.ones(4)) and opt.steps.item() == 0


def test_an_unknown_implementation_is_refused_in_one_line():
    with pytest.raises(ValueError, match="not one of"):
        Adagrad(torch.ones(2), lr=0.1, eps=1e-8, impl="fast")


def test_building_and_stepping_imports_no_dynamo():
    """The reason the class is left out: torch.optim's Optimizer imports torch._dynamo, which
    costs every rank process most of a second (model/adagrad.py)."""
    code = ("import sys, torch; from model.adagrad import Adagrad; w = torch.ones(3); w.grad = torch.ones(3); "
            "o = Adagrad(w, lr=0.1, eps=1e-8, impl='foreach'); o.step(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
