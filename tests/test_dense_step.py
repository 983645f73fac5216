"""The dense step: eager against a float64 reference (plain autograd), bf16 autocast really in
bf16, bad inputs refused, graphed against eager (CUDA).

The 2-rank bucketed all-reduce is in tests/test_dense_gradients.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.run.dense_gradients import FlatGradients
from harness.run.dense_step import DenseStep, graph_input_shapes
from harness.presets import tiny
from harness.run.rank import build_dense
from tests.dense_fixtures import B, ND, PW, adagrad, assert_close_to_float64, make_inputs, make_model, reference_step


def build(model, *, graphed: bool = False, device: str = "cpu", precision: str = "fp32",
          local_batch: int = B, num_dense: int = ND, pooled_width: int = PW,
          compute_dtype: torch.dtype | None = None, gather: bool = False) -> tuple[DenseStep, FlatGradients]:
    grads = FlatGradients(model, world_size=1, group=None, compute_dtype=compute_dtype, gather=gather)
    step = DenseStep(dense=model, grads=grads, world_size=1, local_batch=local_batch, num_dense=num_dense,
                     pooled_width=pooled_width, device=torch.device(device), graphed=graphed, precision=precision)
    return step, grads


def test_graph_input_shapes():
    assert graph_input_shapes(32, 13, 26 * 128) == {"dense_x": (32, 13), "pooled": (32, 3328), "labels": (32,)}
    with pytest.raises(ValueError, match="local_batch"):
        graph_input_shapes(0, 13, 16)


def test_graphed_needs_cuda_and_precision_must_be_known():
    with pytest.raises(ValueError, match="CUDA"):
        build(make_model(), graphed=True, device="cpu")
    with pytest.raises(ValueError, match="precision 'fp16'"):
        build(make_model(), precision="fp16")
    with pytest.raises(ValueError, match="static views"):  # a graph needs the views, whatever the device
        build(make_model(), graphed=True, device="cpu", gather=True)


def test_eager_step_matches_float64_reference_with_updates_between():
    """Several iterations, each followed by the optimizer step and zeroing, as in the train loop;
    each step's loss and gradients against float64 autograd on that step's weights."""
    model = make_model()
    step, grads = build(model)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1, fused=True)
    for it in range(4):
        dense_x, pooled, labels = make_inputs(it)
        ref = reference_step(model, [(dense_x, pooled, labels)])
        loss, pooled_grad = step.run(dense_x, pooled.clone().requires_grad_(True), labels)
        step.finish_gradients()  # eager leaves the last buckets in flight until here

        assert loss.dim() == 0 and not loss.requires_grad
        assert_close_to_float64(loss, ref["losses"][0])
        assert_close_to_float64(pooled_grad, ref["pooled_grads"][0])
        assert_close_to_float64(grads.buffer, ref["grads"])
        # The params' .grad are still views of the flat buffer (what the optimizer reads).
        assert next(model.parameters()).grad.data_ptr() == grads.buffer.data_ptr()
        opt.step()
        grads.zero()
    assert not torch.equal(next(model.parameters()), next(make_model().parameters())), "no update happened"


class _MatmulDtypes(TorchDispatchMode):
    """Records the dtypes of the tensors every matrix multiply receives, forward and backward."""

    OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, set[torch.dtype]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            self.seen.append((str(func), {a.dtype for a in args if isinstance(a, torch.Tensor)}))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_dense_matmuls_run_in_the_requested_precision(precision):
    """The real dense arch (tiny): with bf16 every forward and backward matmul gets bf16 tensors,
    while weights, their gradients, the pooled gradient and the loss stay fp32."""
    cfg = tiny()
    dense = build_dense(cfg, torch.device("cpu"))
    width = cfg.model.num_sparse * cfg.model.embedding_dim
    step, grads = build(dense, precision=precision, local_batch=8, num_dense=cfg.model.num_dense, pooled_width=width)
    g = torch.Generator().manual_seed(0)
    dense_x, pooled = torch.randn(8, cfg.model.num_dense, generator=g), torch.randn(8, width, generator=g)
    labels = (torch.rand(8, generator=g) < 0.5).float()
    with _MatmulDtypes() as mode:
        loss, pooled_grad = step.run(dense_x, pooled.requires_grad_(True), labels)
    want = torch.bfloat16 if precision == "bf16" else torch.float32
    # forward: one per linear layer; backward: at least one per linear (weight grads)
    linears = sum(isinstance(m, torch.nn.Linear) for m in dense.modules())
    assert len(mode.seen) >= 2 * linears
    assert all(dtypes == {want} for _, dtypes in mode.seen), mode.seen
    assert loss.dtype == pooled_grad.dtype == grads.buffer.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in dense.parameters())
    assert grads.buffer.abs().sum() > 0


class _Casts(TorchDispatchMode):
    """Counts the ops that change a tensor's dtype (autocast's casts, the weight copy's copies)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        src = args[1] if func is torch.ops.aten.copy_.default else args[0]
        if isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and src.dtype != out.dtype:
            self.count += 1
        return out


def _tiny_dense(fused_cross: bool = True, batch: int = 8):
    cfg = tiny()
    dense = build_dense(cfg, torch.device("cpu"), fused_cross=fused_cross)
    width = cfg.model.num_sparse * cfg.model.embedding_dim
    sizes = {"local_batch": batch, "num_dense": cfg.model.num_dense, "pooled_width": width}

    def inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        dense_x, pooled = torch.randn(batch, cfg.model.num_dense, generator=g), torch.randn(batch, width, generator=g)
        return dense_x, pooled, (torch.rand(batch, generator=g) < 0.5).float()

    return dense, sizes, inputs


@pytest.mark.parametrize("gather", [False, True], ids=["views", "gathered"])
@pytest.mark.parametrize("fused_cross", [True, False], ids=["fused-cross", "autograd-cross"])
def test_the_bf16_weight_copy_trains_bit_for_bit_as_autocast_casting_fp32_weights(fused_cross, gather):
    """The reference is torch's own mixed precision: a copy of the model with fp32 parameters,
    torch.autocast(bf16) casting them, the per-parameter Adagrad. The harness's step on a bf16
    copy of the weights (one flat Adagrad on the fp32 masters, the copy refreshed after each
    update; its gradients added into views or gathered) must give the same losses, pooled
    gradients and weights, to the bit, step after step."""
    dense, sizes, inputs = _tiny_dense(fused_cross)
    ref = copy.deepcopy(dense)
    step, grads = build(dense, precision="bf16", compute_dtype=torch.bfloat16, gather=gather, **sizes)
    assert grads.copies_weights and all(p.dtype == torch.bfloat16 for p in dense.parameters())
    opt = adagrad([grads.flat_parameter()], lr=0.1)
    ref_opt = adagrad(ref.parameters(), lr=0.1)
    for it in range(4):
        dense_x, pooled, labels = inputs(it)
        loss, pooled_grad = step.run(dense_x, pooled.clone().requires_grad_(True), labels)
        step.finish_gradients()
        opt.step()
        grads.updated()
        ref_pooled = pooled.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = ref(dense_x, ref_pooled)
        ref_loss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert torch.equal(loss, ref_loss.detach()), it
        assert torch.equal(pooled_grad, ref_pooled.grad), it
    with grads.master_weights():
        assert all(p.dtype == torch.float32 for p in dense.parameters())
        for (name, a), b in zip(dense.named_parameters(), ref.parameters()):
            assert torch.equal(a, b), name
    for a, b in zip(dense.parameters(), ref.parameters()):  # the copy is the masters rounded, refreshed
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16))
    assert not all(torch.equal(a, b) for a, b in zip(ref.parameters(), _tiny_dense(fused_cross)[0].parameters()))


def test_the_bf16_weight_copy_casts_once_a_step_each_way_where_autocast_casts_each_parameter():
    """A whole step (forward, backward, gradients, update): autocast casts each of the P parameters
    to bf16 and its gradient back, 2P casts; the copy casts the gradient buffer once and refreshes
    itself once. Every other cast (inputs, activations) is the same in both."""
    counts = {}
    for copy_weights in (False, True):
        dense, sizes, inputs = _tiny_dense()
        step, grads = build(dense, precision="bf16", compute_dtype=torch.bfloat16 if copy_weights else None, **sizes)
        opt = adagrad([grads.flat_parameter()], lr=0.1)
        dense_x, pooled, labels = inputs(0)
        with _Casts() as mode:
            step.run(dense_x, pooled.requires_grad_(True), labels)
            step.finish_gradients()
            opt.step()
            grads.updated()
        counts[copy_weights] = mode.count
    params = len(list(dense.parameters()))
    assert params == 2 * 2 + 2 * 3 + 3 * 2  # tiny: bottom 2 Linears, cross 2 x (V, W, b), top 3 Linears
    assert counts[False] - counts[True] == 2 * params - 2, counts


class _FloatOutputs(TorchDispatchMode):
    """Records (op, dtype, shape) of every floating-point tensor an op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.dtype, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                self.seen.append((str(func), t.dtype, tuple(t.shape)))
        return out


def test_bf16_pure_keeps_every_activation_and_gradient_of_the_step_in_bf16():
    """bf16-pure on the real dense arch (tiny): every 2-D tensor the step computes is bf16 (under
    autocast the cross layers' elementwise work is fp32), but for the pooled gradient handed back
    in fp32; the loss and the weights' gradients end fp32. It needs the bf16 weight copy."""
    dense, sizes, inputs = _tiny_dense()
    with pytest.raises(ValueError, match="compute_dtype=torch.bfloat16"):
        build(copy.deepcopy(dense), precision="bf16-pure", **sizes)
    counts = {}
    for precision in ("bf16", "bf16-pure"):
        step, grads = build(copy.deepcopy(dense), precision=precision, compute_dtype=torch.bfloat16, **sizes)
        dense_x, pooled, labels = inputs(0)
        with _FloatOutputs() as mode:
            loss, pooled_grad = step.run(dense_x, pooled.requires_grad_(True), labels)
            step.finish_gradients()
        fp32_2d = [(op, shape) for op, dtype, shape in mode.seen  # computed, not views (detach)
                   if dtype == torch.float32 and len(shape) == 2 and shape[1] > 1 and "detach" not in op]
        counts[precision] = len(fp32_2d)
        if precision == "bf16-pure":
            assert fp32_2d == [("aten._to_copy.default", (sizes["local_batch"], sizes["pooled_width"]))], fp32_2d
        assert loss.dtype == pooled_grad.dtype == grads.buffer.dtype == torch.float32
        assert grads.buffer.abs().sum() > 0
    assert counts["bf16"] > 4 * 2  # autocast: the cross layers' products and sums, both ways, in fp32


def test_wrong_shapes_and_non_leaf_pooled_are_refused():
    step, _ = build(make_model())
    dense_x, pooled, labels = make_inputs(0)
    with pytest.raises(ValueError, match="dense_x has shape"):
        step.run(dense_x[:-1], pooled.requires_grad_(True), labels)
    with pytest.raises(ValueError, match="require grad"):
        step.run(dense_x, pooled.detach(), labels)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision, weight_copy", [("fp32", False), ("bf16", False), ("bf16", True),
                                                    ("bf16-pure", True)],
                         ids=["fp32", "bf16-autocast-casts", "bf16-weight-copy", "bf16-pure"])
def test_graphed_matches_eager_over_several_steps(precision, weight_copy):
    # Replays and eager kernels may differ in the last bits (e.g. cuBLAS picking other algorithms
    # on another stream), hence allclose rather than equal; bf16 rounds more. With the weight copy
    # the replays must read the copy each update refreshes in place. The eager side gathers its
    # gradients, as the harness's eager step does; the graph adds into views.
    tol = {"rtol": 1e-2, "atol": 1e-3} if precision != "fp32" else {}
    compute = torch.bfloat16 if weight_copy else None
    eager_model = make_model("cuda")
    graphed_model = copy.deepcopy(eager_model)
    eager, eager_grads = build(eager_model, device="cuda", precision=precision, compute_dtype=compute, gather=True)
    graphed, graphed_grads = build(graphed_model, graphed=True, device="cuda", precision=precision,
                                   compute_dtype=compute)
    assert torch.count_nonzero(graphed_grads.buffer) == 0, "warm-up gradients leaked into the buffer"
    eager_opt = adagrad([eager_grads.flat_parameter()], lr=0.1, device="cuda")
    graphed_opt = adagrad([graphed_grads.flat_parameter()], lr=0.1, device="cuda")

    for it in range(4):
        dense_x, pooled, labels = make_inputs(it, device="cuda")
        e_loss, e_pg = eager.run(dense_x, pooled.clone().requires_grad_(True), labels)
        eager.finish_gradients()
        if it % 2:  # as the train loop does: the embedding forward writes the static input itself
            static = graphed.pooled_input()
            with torch.no_grad():
                static.copy_(pooled)
            g_loss, g_pg = graphed.run(dense_x, static, labels)
        else:
            g_loss, g_pg = graphed.run(dense_x, pooled.clone().requires_grad_(True), labels)
        torch.testing.assert_close(g_loss, e_loss, **tol)
        torch.testing.assert_close(g_pg, e_pg, **tol)
        torch.testing.assert_close(graphed_grads.buffer, eager_grads.buffer, **tol)
        eager_opt.step()
        eager_grads.updated()
        graphed_opt.step()
        graphed_grads.updated()

    torch.testing.assert_close(graphed_grads.master, eager_grads.master, **tol)
    assert not torch.equal(graphed_grads.master, FlatGradients(make_model("cuda"), world_size=1, group=None).master)


def test_an_eager_step_has_no_static_pooled_input():
    step, _ = build(make_model())
    assert step.pooled_input() is None  # the embedding forward then makes its own leaf, as before


def test_pooled_gradient_is_handed_over_inside_backward_before_the_bottom_layers():
    """on_pooled_grad gets the pooled gradient as soon as it exists: before the bottom MLP's
    weights have theirs (so a collective launched from it precedes their bucket), and equal to
    what run returns."""
    model = make_model()
    grads = FlatGradients(model, world_size=1, group=None)
    step = DenseStep(dense=model, grads=grads, world_size=1, local_batch=B, num_dense=ND, pooled_width=PW,
                     device=torch.device("cpu"), graphed=False, precision="fp32")
    events: list[tuple[str, torch.Tensor | None]] = []
    model.bottom.weight.register_post_accumulate_grad_hook(lambda p: events.append(("bottom", None)))
    dense_x, pooled, labels = make_inputs(0)
    _, pooled_grad = step.run(dense_x, pooled.requires_grad_(True), labels,
                              on_pooled_grad=lambda g: events.append(("pooled", g.clone())))
    assert [name for name, _ in events] == ["pooled", "bottom"]
    assert torch.equal(events[0][1], pooled_grad)


class _Kernels(TorchDispatchMode):
    """Counts the ops that run a kernel (every op but those that only make a view)."""

    VIEWS = {"t", "detach", "view", "_unsafe_view", "reshape", "as_strided", "expand", "alias", "slice", "select",
             "transpose", "unsqueeze", "squeeze", "split", "split_with_sizes", "chunk", "unbind", "permute"}

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in self.VIEWS:
            self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gathered_gradients_launch_one_cat_where_views_add_each_parameter_and_fill(precision):
    """A whole eager step at world size 1: with views autograd adds each of the P gradients into
    its view and the step ends with a zero fill; gathered, autograd keeps them and one cat
    collects them. Same bits (the buffers compared), P fewer kernels."""
    kernels, buffers = {}, {}
    for gather in (False, True):
        dense, sizes, inputs = _tiny_dense()
        step, grads = build(dense, precision=precision, gather=gather,
                            compute_dtype=torch.bfloat16 if precision == "bf16" else None, **sizes)
        opt = adagrad([grads.flat_parameter()], lr=0.1)
        for it in range(2):  # the second step: what every step after the first launches
            dense_x, pooled, labels = inputs(it)
            with _Kernels() as mode:
                step.run(dense_x, pooled.requires_grad_(True), labels)
                step.finish_gradients()
                buffers[gather, it] = grads.buffer.clone()
                opt.step()
                grads.updated()
        kernels[gather] = mode.ops
    params = len(list(dense.parameters()))
    assert all(torch.equal(buffers[False, it], buffers[True, it]) for it in range(2))
    views, gathered = kernels[False], kernels[True]
    assert views.get("add_", 0) - gathered.get("add_", 0) == params, (views, gathered)
    assert gathered.get("cat", 0) - views.get("cat", 0) == 1 and views["zero_"] - gathered.get("zero_", 0) == 1
    assert sum(views.values()) - sum(gathered.values()) == params


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gathered_gradients_are_the_views_bits_on_cuda(precision):
    """On the GPU too: gathered, the buffer holds the bits the views accumulate, step after step."""
    buffers = {}
    for gather in (False, True):
        model = make_model("cuda")
        step, grads = build(model, device="cuda", precision=precision, gather=gather,
                            compute_dtype=torch.bfloat16 if precision == "bf16" else None)
        opt = adagrad([grads.flat_parameter()], lr=0.1, device="cuda")
        for it in range(3):
            dense_x, pooled, labels = make_inputs(it, device="cuda")
            step.run(dense_x, pooled.requires_grad_(True), labels)
            step.finish_gradients()
            buffers[gather, it] = grads.buffer.clone()
            opt.step()
            grads.updated()
    assert all(torch.equal(buffers[False, it], buffers[True, it]) for it in range(3))
