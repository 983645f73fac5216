"""The wire codecs (model/wire_codec.py): fp8 rows against bytes and bounds worked out by hand and
in float64, the 16-bit casts against torch's own rounding."""

from __future__ import annotations

import struct

import pytest
import torch

from model.wire_codec import BACKWARD_CODECS, FORWARD_CODECS, SCALE_BYTES


def test_an_fp8_row_is_its_values_then_its_scale_byte_for_byte():
    # Row max 448 is e4m3's largest finite value, so the scale is 1 and every value is exact.
    # e4m3 (bias 7): 448 = 1.75 * 2^8 -> 0 1111 110 = 0x7E; -224 = -1.75 * 2^7 -> 1 1110 110 = 0xF6;
    # 1 = 2^0 -> 0 0111 000 = 0x38; 0 -> 0x00. Then 1.0f little-endian.
    codec = FORWARD_CODECS["fp8"]
    wire = codec.encode(torch.tensor([[448.0, -224.0, 1.0, 0.0]]))
    assert wire.dtype == torch.uint8 and wire.shape == (1, 4 + SCALE_BYTES) == (1, codec.units(4))
    assert bytes(wire[0].tolist()) == bytes([0x7E, 0xF6, 0x38, 0x00]) + struct.pack("<f", 1.0)
    # Doubling the row doubles the scale, not the bytes of the values.
    doubled = codec.encode(torch.tensor([[896.0, -448.0, 2.0, 0.0]]))
    assert bytes(doubled[0].tolist()) == bytes([0x7E, 0xF6, 0x38, 0x00]) + struct.pack("<f", 2.0)
    assert codec.decode(doubled, 4).tolist() == [[896.0, -448.0, 2.0, 0.0]]


# (precision, significand bits kept after the leading one, smallest normal exponent): e4m3 keeps 3
# bits and its normals start at 2^-6, e5m2 keeps 2 and starts at 2^-14.
FORMATS = [(FORWARD_CODECS["fp8"], 3, -6), (BACKWARD_CODECS["fp8"], 2, -14)]


@pytest.mark.parametrize("codec, bits, min_exp", FORMATS, ids=["e4m3 forward", "e5m2 backward"])
def test_fp8_rows_round_within_half_a_step_of_their_scaled_value(codec, bits, min_exp):
    """Rounding to nearest moves a scaled normal value x by at most half its step, |x| 2^-(bits+1);
    a subnormal by half the smallest step, 2^(min_exp - bits - 1). Checked in float64 on rows of
    very different sizes (each row has its own scale), a row of zeros and a row with one value."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(64, 40, generator=gen, dtype=torch.float64) * torch.logspace(-6, 6, 64, dtype=torch.float64)[:, None]
    rows[3] = 0.0
    rows[5] = 0.0
    rows[5, 7] = -3.5
    wire = codec.encode(rows.float())
    back = codec.decode(wire, 40).double()
    assert wire.shape == (64, 40 + SCALE_BYTES)
    x = rows.float().double()
    scale = x.abs().amax(dim=1, keepdim=True) / torch.finfo(codec.fp8).max
    scale[scale == 0] = 1.0
    # In the scaled domain x / scale; back in the row's own: times scale.
    bound = torch.maximum(x.abs() * 2.0 ** -(bits + 1), 2.0 ** (min_exp - bits - 1) * scale.expand_as(x))
    assert ((back - x).abs() <= bound * (1 + 1e-6)).all()
    assert (back[3] == 0).all() and back[5].tolist() == [-3.5 if j == 7 else 0.0 for j in range(40)]
    # Each row's largest magnitude lands on the format's largest value: it comes back to fp32 rounding.
    top = x.abs().argmax(dim=1)
    assert torch.allclose(back.gather(1, top[:, None]), x.gather(1, top[:, None]), rtol=1e-6, atol=0)


def test_an_empty_row_needs_no_scale():
    codec = FORWARD_CODECS["fp8"]
    assert codec.units(0) == 0
    wire = codec.encode(torch.empty(3, 0))
    assert wire.shape == (3, 0) and codec.decode(wire, 0).shape == (3, 0)


# 1/3 rounded to nearest by hand: fp16 keeps 10 fraction bits (0x3555 = 1365/4096 = 0.333251953125),
# bf16 keeps 7 (0x3EAB = 171/512 = 0.333984375); fp32 is 0x3EAAAAAB, 11184811/33554432.
ONE_THIRD = {"fp32": (torch.float32, 11184811 / 33554432), "fp16": (torch.float16, 1365 / 4096),
             "bf16": (torch.bfloat16, 171 / 512)}


@pytest.mark.parametrize("name", list(ONE_THIRD))
def test_16_and_32_bit_precisions_round_to_nearest_and_sum_on_the_wire(name):
    dtype, third = ONE_THIRD[name]
    rows = torch.full((2, 3), 1 / 3)
    for codec in (FORWARD_CODECS[name], BACKWARD_CODECS[name]):
        wire = codec.encode(rows)
        assert codec.units(3) == 3 and codec.sums_on_wire and wire.dtype == dtype
        assert codec.decode(wire, 3).tolist() == [[third] * 3] * 2
    assert not FORWARD_CODECS["fp8"].sums_on_wire


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_fp8_rows_encode_to_the_same_bytes_on_cuda(direction):
    """The fp8 codec on a CUDA tensor writes the bytes it writes on the CPU (one code path, one
    format on every device), and decodes them to the same values."""
    codec = (FORWARD_CODECS if direction == "forward" else BACKWARD_CODECS)["fp8"]
    rows = torch.randn(256, 136, generator=torch.Generator().manual_seed(2)) * 10
    cpu = codec.encode(rows)
    gpu = codec.encode(rows.cuda())
    assert gpu.is_cuda and torch.equal(gpu.cpu(), cpu)
    assert torch.equal(codec.decode(gpu, 136).cpu(), codec.decode(cpu, 136))


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_an_fp8_scale_is_the_correctly_rounded_quotient(direction):
    """The contract that makes CUDA write the CPU's bytes: a row's scale is amax / max rounded once to
    fp32, as an fp64 division rounded to fp32 gives it (the reference), not amax times a rounded
    reciprocal, which CUDA computes for a divisor given as a Python number and which is one ulp
    off for about half of all rows (the H100 run's fp8 bytes differed from the CPU's)."""
    codec = (FORWARD_CODECS if direction == "forward" else BACKWARD_CODECS)["fp8"]
    fmax = torch.finfo(codec.fp8).max
    rows = torch.randn(512, 8, generator=torch.Generator().manual_seed(3)) * 10
    amax = rows.abs().amax(dim=1)
    reference = (amax.double() / fmax).float()
    by_reciprocal = amax * torch.tensor(1 / fmax, dtype=torch.float32)
    assert (by_reciprocal != reference).float().mean() > 0.2  # the rows where the two ways part
    scale = codec.encode(rows)[:, 8:].contiguous().view(torch.float32).view(-1)
    assert torch.equal(scale, reference)
