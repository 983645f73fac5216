"""Flat dense gradients: bucket layout, and the bucketed all-reduce on 2 gloo ranks against a
float64 reference, launched during backward, bitwise equal to one all-reduce of the buffer."""

from __future__ import annotations

import pytest
import torch

from harness.run.dense_gradients import FlatGradients, bucket_ranges
from harness.run.dense_step import DenseStep
from tests.dense_fixtures import B, ND, PW, assert_close_to_float64, make_inputs, make_model, reference_step
from tests.distributed import spawn_ranks

STEPS = 3
# SmallDense's parameters hold 20, 4, 128, 8, 8, 1 floats; a 25-float cap gives three buckets,
# from the last parameter back: [1, 8, 8], [128] alone (bigger than the cap), [20, 4].
SMALL_BUCKETS_MIB = 25 * 4 / 2**20


def test_bucket_ranges_hand_computed():
    # Parameters of 3, 2, 5, 1 elements sit at [0,3) [3,5) [5,10) [10,11).
    assert bucket_ranges([3, 2, 5, 1], 5) == [(10, 11), (5, 10), (0, 5)]
    assert bucket_ranges([3, 2, 5, 1], 6) == [(5, 11), (0, 5)]
    assert bucket_ranges([3, 2, 5, 1], 100) == [(0, 11)]
    assert bucket_ranges([3, 2, 5, 1], 1) == [(10, 11), (5, 10), (3, 5), (0, 3)]
    assert bucket_ranges([10], 3) == [(0, 10)]  # a parameter bigger than the cap is a bucket of its own
    with pytest.raises(ValueError, match="bucket cap"):
        bucket_ranges([3], 0)


def test_grads_are_views_of_the_buffer_and_buckets_cover_it():
    model = make_model()
    grads = FlatGradients(model, world_size=2, group=None, bucket_mib=SMALL_BUCKETS_MIB)
    assert grads.buckets == [(152, 169), (24, 152), (0, 24)]
    params = list(model.parameters())
    assert grads.buffer.numel() == sum(p.numel() for p in params) == 169
    grads.buffer.copy_(torch.arange(169.0))
    offset = 0
    for p in params:
        assert torch.equal(p.grad.flatten(), torch.arange(offset, offset + p.numel(), dtype=torch.float32))
        offset += p.numel()
    grads.zero()
    assert all(torch.count_nonzero(p.grad) == 0 for p in params)
    with pytest.raises(ValueError, match="bucket_mib"):
        FlatGradients(make_model(), world_size=2, group=None, bucket_mib=0)


def test_flat_parameter_updates_the_module_as_the_per_parameter_optimizer_does():
    """One fused Adagrad over the flat parameter: the module's parameters (views of it) end with
    the bits the per-parameter fused Adagrad gives them, step after step."""
    torch.manual_seed(0)
    flat_model, ref_model = make_model(), make_model()
    grads = FlatGradients(flat_model, world_size=1, group=None)
    flat_opt = torch.optim.Adagrad([grads.flat_parameter()], lr=0.1, eps=1e-8, fused=True)
    ref_params = list(ref_model.parameters())
    ref_opt = torch.optim.Adagrad(ref_params, lr=0.1, eps=1e-8, fused=True)
    assert all(torch.equal(a, b) for a, b in zip(flat_model.parameters(), ref_params))  # same init kept
    for _ in range(5):
        g = torch.randn(grads.buffer.numel())
        grads.buffer.copy_(g)
        for p, chunk in zip(ref_params, g.split([p.numel() for p in ref_params])):
            p.grad = chunk.view_as(p).clone()
        flat_opt.step()
        ref_opt.step()
    assert all(torch.equal(a, b) for a, b in zip(flat_model.parameters(), ref_params))
    assert not any(torch.equal(a, b) for a, b in zip(ref_params, make_model().parameters()))  # they did move


def _two_bucketings(rank: int, world: int, device: torch.device) -> dict:
    """Trains three copies of the model on this rank's share: small buckets and one bucket of
    views, and small buckets gathered."""
    runs = {}
    for name, mib, gather in (("small", SMALL_BUCKETS_MIB, False), ("one", 1.0, False),
                              ("gather", SMALL_BUCKETS_MIB, True)):
        model = make_model()
        grads = FlatGradients(model, world_size=world, group=None, bucket_mib=mib, gather=gather)
        step = DenseStep(dense=model, grads=grads, world_size=world, local_batch=B, num_dense=ND, pooled_width=PW,
                         device=device, graphed=False, precision="fp32")
        opt = torch.optim.Adagrad([grads.flat_parameter()], lr=0.1)
        # Registered after FlatGradients' hooks: runs when the first parameter, the last one
        # backward reaches, has its gradient; counts the buckets already launched by then.
        in_flight: list[int] = []
        next(model.parameters()).register_post_accumulate_grad_hook(lambda _: in_flight.append(grads.in_flight))
        steps = []
        for it in range(STEPS):
            dense_x, pooled, labels = (t.chunk(world)[rank] for t in make_inputs(it, B * world))
            before = {k: v.clone() for k, v in model.state_dict().items()}
            loss, pooled_grad = step.run(dense_x, pooled.clone().requires_grad_(True), labels)
            step.finish_gradients()  # eager leaves the last buckets in flight until here
            steps.append({"weights": before, "loss": loss, "pooled_grad": pooled_grad.clone(),
                          "buffer": grads.buffer.clone()})
            opt.step()
            grads.zero()
        runs[name] = {"steps": steps, "buckets": grads.buckets, "in_flight": in_flight}
    return runs


def test_bucketed_all_reduce_on_two_ranks(tmp_path):
    world = 2
    ranks = spawn_ranks(_two_bucketings, world, tmp_path)
    small = [r["small"] for r in ranks]
    assert len(small[0]["buckets"]) == 3
    for r in small + [r["gather"] for r in ranks]:
        # Overlap: when backward reaches the first parameter, the buckets of every later one are
        # already out (the first's own bucket too if its bias was done before it).
        assert len(r["in_flight"]) == STEPS and all(n >= 2 for n in r["in_flight"]), r["in_flight"]
    for it in range(STEPS):
        model = make_model()
        model.load_state_dict(small[0]["steps"][it]["weights"])
        shards = [tuple(t.chunk(world)[r] for t in make_inputs(it, B * world)) for r in range(world)]
        ref = reference_step(model, shards)
        for rank in range(world):
            got = small[rank]["steps"][it]
            for k, v in got["weights"].items():  # replicas stay identical
                assert torch.equal(v, small[0]["steps"][it]["weights"][k]), k
            assert_close_to_float64(got["loss"], ref["losses"][rank])
            assert_close_to_float64(got["pooled_grad"], ref["pooled_grads"][rank])
            assert_close_to_float64(got["buffer"], ref["grads"])
            # 2 ranks: a + b in any bucketing, so bitwise the single all-reduce's result; and a
            # gradient gathered is the one added into a zeroed view.
            assert torch.equal(got["buffer"], ranks[rank]["one"]["steps"][it]["buffer"])
            gathered = ranks[rank]["gather"]["steps"][it]
            assert torch.equal(got["buffer"], gathered["buffer"]) and torch.equal(got["loss"], gathered["loss"])
            assert all(torch.equal(v, gathered["weights"][k]) for k, v in got["weights"].items())


def _copy_or_casts(rank: int, world: int, device: torch.device) -> dict:
    """Trains the small model in bf16 on this rank's share, small buckets: once on a bf16 copy of
    the weights, once with autocast casting the fp32 ones."""
    runs = {}
    for name, dtype, gather in (("copy", torch.bfloat16, False), ("casts", None, False),
                                ("copy gathered", torch.bfloat16, True)):
        model = make_model()
        grads = FlatGradients(model, world_size=world, group=None, bucket_mib=SMALL_BUCKETS_MIB, compute_dtype=dtype,
                              gather=gather)
        step = DenseStep(dense=model, grads=grads, world_size=world, local_batch=B, num_dense=ND, pooled_width=PW,
                         device=device, graphed=False, precision="bf16")
        opt = torch.optim.Adagrad([grads.flat_parameter()], lr=0.1)
        buffers = []
        for it in range(STEPS):
            dense_x, pooled, labels = (t.chunk(world)[rank] for t in make_inputs(it, B * world))
            step.run(dense_x, pooled.clone().requires_grad_(True), labels)
            step.finish_gradients()
            buffers.append(grads.buffer.clone())
            opt.step()
            grads.updated()
        runs[name] = {"buffers": buffers, "master": grads.master.clone(),
                      "dtypes": {p.dtype for p in model.parameters()}}
    return runs


def test_the_bf16_weight_copy_sums_its_gradients_over_two_ranks_as_autocast_does(tmp_path):
    """Each bucket's bf16 gradients are cast into the fp32 buffer before its all-reduce: the
    summed gradients and the weights are those of fp32 weights cast by autocast, to the bit."""
    ranks = spawn_ranks(_copy_or_casts, 2, tmp_path)
    for r in ranks:
        assert r["copy"]["dtypes"] == {torch.bfloat16} and r["casts"]["dtypes"] == {torch.float32}
        for copy in ("copy", "copy gathered"):
            for got, want in zip(r[copy]["buffers"], r["casts"]["buffers"]):
                assert torch.count_nonzero(want) > 0 and torch.equal(got, want)
            assert torch.equal(r[copy]["master"], r["casts"]["master"])
    assert torch.equal(ranks[0]["copy"]["master"], ranks[1]["copy"]["master"])
