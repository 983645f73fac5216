"""How pooled embeddings and their gradients travel on the wire at each communication precision.

A codec turns rows of fp32 values, (n, width), into rows of wire units, (n, units(width)), and
back. The 16-bit codecs are casts: a unit is one value, and a collective may sum them as they
are (a reduce-scatter reduces in fp16 or bf16). The fp8 codec scales each row so its largest
magnitude lands on the format's largest finite value, as fbgemm's FP8 row-wise quantize ops and
TorchRec's FP8 qcomms do, and sends the row as bytes: `width` fp8 values, then the row's fp32
scale (4 bytes). Bytes cannot be summed on the wire, so an exchange that reduces (row-wise and
table-row-wise partial sums) runs as an all-to-all of encoded rows summed in fp32 on arrival.

fbgemm-gpu-cpu's FloatToFP8RowwiseQuantized raises "fp8 is not supported by CPU", so the fp8
codec is written with torch's float8 dtypes, which both CPU and CUDA support: one code path,
tested here, on every device. As fbgemm does, the forward uses e4m3 (3 significand bits, range
to 448) and the backward e5m2 (2 bits, range to 57344: gradients vary more within a row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model.names import COMM_PRECISIONS

SCALE_BYTES = 4
"""An fp8 row's scale, one fp32 after its values."""


@dataclass(frozen=True)
class CastCodec:
    """A 16- or 32-bit float on the wire: a unit is a value."""

    dtype: torch.dtype
    sums_on_wire = True
    """A reduce-scatter may sum these units as they are."""

    def units(self, width: int) -> int:
        return width

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.to(self.dtype)  # no copy in fp32

    def decode(self, wire: torch.Tensor, width: int) -> torch.Tensor:
        return wire.float()


@dataclass(frozen=True)
class RowwiseFp8Codec:
    """Per-row scaled fp8 values, each row followed by its fp32 scale, sent as bytes."""

    fp8: torch.dtype
    dtype = torch.uint8
    sums_on_wire = False
    """Bytes do not add: partial sums are exchanged whole and summed after decoding."""

    def units(self, width: int) -> int:
        return width + SCALE_BYTES if width else 0  # a row of nothing needs no scale

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        n, width = rows.shape
        if not width:
            return torch.empty(n, 0, dtype=torch.uint8, device=rows.device)
        rows = rows.float()
        amax = rows.abs().amax(dim=1, keepdim=True)
        fmax = torch.finfo(self.fp8).max
        # The divisor is a tensor on the rows' device, not a Python number: CUDA divides by a host
        # scalar as a product with its rounded reciprocal (amax * fl(1/448) is one ulp off amax / 448
        # for some amax), the CPU divides; a device tensor gets a correctly rounded division on both.
        # An all-zero row keeps scale 1 (its values are zeros whatever the scale).
        scale = torch.where(amax > 0, amax / amax.new_full((), fmax), torch.ones_like(amax))
        # |rows / scale| <= max up to fp32 rounding, which the clamp takes back before the cast.
        values = (rows / scale).clamp_(-fmax, fmax).to(self.fp8)
        return torch.cat([values.view(torch.uint8), scale.view(torch.uint8)], dim=1)

    def decode(self, wire: torch.Tensor, width: int) -> torch.Tensor:
        if not width:
            return torch.empty(wire.shape[0], 0, device=wire.device)
        wire = wire.contiguous()
        values = wire[:, :width].contiguous().view(self.fp8).float()
        scale = wire[:, width:].contiguous().view(torch.float32)
        return values * scale


WireCodec = CastCodec | RowwiseFp8Codec

FORWARD_CODECS: dict[str, WireCodec] = {
    "fp32": CastCodec(torch.float32), "fp16": CastCodec(torch.float16), "bf16": CastCodec(torch.bfloat16),
    "fp8": RowwiseFp8Codec(torch.float8_e4m3fn),
}
"""The forward's codec of each communication precision (model/names.py COMM_PRECISIONS)."""

BACKWARD_CODECS: dict[str, WireCodec] = {**FORWARD_CODECS, "fp8": RowwiseFp8Codec(torch.float8_e5m2)}
"""The backward's: fp8 gradients in e5m2, for their range."""

if set(FORWARD_CODECS) != set(COMM_PRECISIONS):  # a name added there needs its codec here
    raise ImportError(f"model/wire_codec.py has codecs for {sorted(FORWARD_CODECS)}, model/names.py names "
                      f"{COMM_PRECISIONS}")
