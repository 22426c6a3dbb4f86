"""FuseOps keeps 8-bit tensors 8-bit between kernels: a dequantize (`cast(x8, float32) * s + b`) that would widen its
producer's result goes into its consumers' kernels (`relay_tune.passes.fuse_ops.partition_keeping_8bit`).

Hand-written int8 programs (integer convolutions with a requantizing epilogue, as QuantizedProducts makes them):
- a projection-style producer whose dequantized result is the residual of another convolution's epilogue returns
  uint8, and the consumer dequantizes; with two consumers each takes a copy of the dequantize;
- a convolution's residual and a plain element-wise kernel (a ReLU) as the two consumers;
- a 1x1 float convolution takes the dequantize as its prologue;
- a consumer that cannot take it (a padded 3x3 float convolution's data) leaves the plain grouping;
- float programs are grouped as before;
and every compiled program equals the numpy reference interpreter (exactly where the result is 8-bit).
"""

from __future__ import annotations

import numpy as np
import pytest

from relay_tune import build
from relay_tune.compile import resolve_target
from relay_tune.interpreter import evaluate
from relay_tune.ir import Call, Function, IRModule
from relay_tune.passes import PassConfig, fused_groups
from relay_tune.passes.base import dataflow_post_order
from relay_tune.passes.pipeline import layout_block, optimize
from relay_tune.text import parse_module

RNG = np.random.default_rng(20261207)
C, H, W = 16, 9, 11  # odd map
# Every scale is a power of two, so each product in the epilogues is exact and the compiled kernels (which fold the
# requantization's multiply and divide into one multiplier) must equal the interpreter bit for bit.


class _Program:
    """Relay text of `main(%x: uint8 1x16x9x11)` built line by line; each line's value is `%n`."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def let(self, expr: str) -> str:
        self.lines.append(f"  %{len(self.lines)} = {expr};")
        return f"%{len(self.lines) - 1}"

    def requantize(self, value: str, scale: float, zero: int) -> str:
        """Float `value` requantized to uint8 (round half to even, clip)."""
        value = self.let(f"round(divide({value}, {scale}f))")
        value = self.let(f"clip(add({value}, {zero}f), a_min=0f, a_max=255f)")
        return self.let(f'cast({value}, dtype="uint8")')

    def conv(self, data: str, weight: int, scale: float, zero: int) -> str:
        """An integer 1x1 convolution of uint8 `data` by constant `weight` with a requantizing epilogue."""
        acc = self.let(f'nn.conv2d({data}, meta[relay.Constant][{weight}], channels={C}, kernel_size=[1, 1], '
                       f'out_dtype="int32")')
        return self.requantize(self.let(f'multiply(cast({acc}, dtype="float32"), 0.0078125f)'), scale, zero)

    def dequantize(self, value: str, scale: float, zero: int) -> str:
        return self.let(f'add(multiply(cast({value}, dtype="float32"), {scale}f), {-zero * scale}f)')

    def module(self, result: str, constants: list[np.ndarray]) -> IRModule:
        text = '#[version = "0.0.5"]\ndef @main(%x: Tensor[(1, 16, 9, 11), uint8]) {\n'
        return parse_module(text + "\n".join(self.lines) + f"\n  {result}\n}}\n", constants=constants)


def _weights(count: int) -> list[np.ndarray]:
    return [RNG.integers(-64, 64, (C, C, 1, 1)).astype(np.int8) for _ in range(count)]


def _residual_program(consumers: int) -> IRModule:
    """x -> producer conv (requantized, dequantized) read as the residual of `consumers` other convolutions'
    epilogues (add, relu, requantize)."""
    prog = _Program()
    residual = prog.dequantize(prog.conv("%x", 0, 0.03125, 7), 0.03125, 7)
    outs = []
    for k in range(consumers):
        own = prog.dequantize(prog.conv("%x", k + 1, 0.0625, 3), 0.0625, 3)
        outs.append(prog.requantize(prog.let(f"nn.relu(add({own}, {residual}))"), 0.125, 0))
    return prog.module(outs[0] if consumers == 1 else "(" + ", ".join(outs) + ")", _weights(consumers + 1))


def _fused(mod: IRModule, on: bool = True) -> IRModule:
    target = resolve_target("llvm")
    return optimize(mod, config=PassConfig(dequantize_in_consumers=on), layout_block=layout_block(target, None),
                    full_range_int8="int16")


def _primitive_results(mod: IRModule) -> list[tuple[tuple[str, ...], str]]:
    """(operators, result dtype) of every primitive function `main` calls, in evaluation order."""
    found = []
    for node in dataflow_post_order(mod["main"]):
        if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
            names = tuple(c.op_name for c in dataflow_post_order(node.op.body)
                          if isinstance(c, Call) and c.op_name is not None)
            found.append((names, str(node.op.body.checked_type.dtype)))  # type: ignore[attr-defined]
    return found


def _int8_convs(mod: IRModule) -> list[tuple[tuple[str, ...], str]]:
    return [(ops, dtype) for ops, dtype in _primitive_results(mod) if "nn.contrib_conv2d_NCHWc_int8" in ops]


def _check_compiled(mod: IRModule) -> None:
    x = RNG.integers(0, 256, (1, C, H, W)).astype(np.uint8)
    want = evaluate(mod, {"x": x})
    got = build(mod, "llvm", opt_level=3, jobs=1, kernel_cache=False, build_cache=False).run(x=x)
    for w, g in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("consumers", [1, 2])
def test_producer_returns_uint8_and_consumers_dequantize(consumers: int) -> None:
    mod = _residual_program(consumers)
    convs = _int8_convs(_fused(mod))
    assert len(convs) == consumers + 1
    assert all(dtype == "uint8" for _, dtype in convs), convs
    # the producer ends at its 8-bit cast; every consumer's kernel dequantizes it (a cast of a uint8 parameter)
    producer = [ops for ops in (o for o, _ in convs) if ops.count("cast") == 2]
    assert len(producer) == 1 and producer[0][-1] == "cast"
    for ops, _ in convs:
        if ops is not producer[0]:
            # int32 -> f32, the residual u8 -> f32, the sum requantized -> u8 (SimplifyRequantize drops the uint8
            # round trip between the kernel's own requantize and dequantize)
            assert ops.count("cast") == 3
    # the old grouping: the producer returns the float dequantized tensor
    old = _int8_convs(_fused(mod, on=False))
    assert sorted(dtype for _, dtype in old) == ["float32"] + ["uint8"] * consumers
    _check_compiled(mod)


def _float_conv_consumer(kernel: int) -> IRModule:
    """The producer's dequantized result is the data of a float `kernel` x `kernel` convolution (padded to size)."""
    prog = _Program()
    residual = prog.dequantize(prog.conv("%x", 0, 0.03125, 7), 0.03125, 7)
    w_float = RNG.standard_normal((C, C, kernel, kernel)).astype(np.float32)
    pad = kernel // 2
    return prog.module(f"nn.conv2d({residual}, meta[relay.Constant][1], channels={C}, kernel_size=[{kernel}, "
                       f"{kernel}], padding=[{pad}, {pad}, {pad}, {pad}])", [_weights(1)[0], w_float])


def _check_float_result(mod: IRModule) -> None:
    x = RNG.integers(0, 256, (1, C, H, W)).astype(np.uint8)
    got = build(mod, "llvm", opt_level=3, jobs=1, kernel_cache=False, build_cache=False).run(x=x)
    np.testing.assert_allclose(got, evaluate(mod, {"x": x}), rtol=1e-5, atol=1e-4)


def test_consumer_that_cannot_take_the_dequantize_keeps_the_old_grouping() -> None:
    # a padded 3x3 float convolution takes no element-wise input chain: the producer keeps the dequantize
    mod = _float_conv_consumer(3)
    new, old = _fused(mod), _fused(mod, on=False)
    assert fused_groups(new) == fused_groups(old)
    assert [dtype for _, dtype in _int8_convs(new)] == ["float32"]
    _check_float_result(mod)


def test_pointwise_float_conv_takes_the_dequantize_as_its_prologue() -> None:
    # a 1x1 blocked float convolution computes an element-wise prologue on its input rows
    mod = _float_conv_consumer(1)
    assert [dtype for _, dtype in _int8_convs(_fused(mod))] == ["uint8"]
    assert [dtype for _, dtype in _int8_convs(_fused(mod, on=False))] == ["float32"]
    _check_float_result(mod)


def test_dequantize_read_by_an_elementwise_kernel_and_an_epilogue() -> None:
    # one consumer is another convolution's residual add, the other a plain element-wise kernel (a ReLU the function
    # returns): each takes its copy of the dequantize, and the producer returns uint8
    prog = _Program()
    residual = prog.dequantize(prog.conv("%x", 0, 0.03125, 7), 0.03125, 7)
    own = prog.dequantize(prog.conv("%x", 1, 0.0625, 3), 0.0625, 3)
    total = prog.requantize(prog.let(f"add({own}, {residual})"), 0.125, 9)
    mod = prog.module(f"(nn.relu({residual}), {total})", _weights(2))
    fused = _fused(mod)
    assert sorted(dtype for _, dtype in _int8_convs(fused)) == ["uint8", "uint8"]
    # the ReLU's kernel (with the layout transform back to NCHW) dequantizes the uint8 map it reads
    relu = ("cast", "multiply", "add", "nn.relu")
    assert any(ops[:4] == relu for ops, _ in _primitive_results(fused))
    assert sorted(dtype for _, dtype in _int8_convs(_fused(mod, on=False))) == ["float32", "uint8"]
    assert not any(ops[:4] == relu for ops, _ in _primitive_results(_fused(mod, on=False)))
    _check_compiled(mod)


def test_float_programs_group_as_before() -> None:
    text = '''#[version = "0.0.5"]
def @main(%x: Tensor[(1, 16, 9, 11), float32]) {
  %0 = nn.conv2d(%x, meta[relay.Constant][0], channels=16, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%1, meta[relay.Constant][1], channels=16, kernel_size=[3, 3], padding=[1, 1, 1, 1]);
  %3 = add(%2, %0);
  %4 = nn.relu(%3);
  %5 = nn.max_pool2d(%4, pool_size=[2, 2], strides=[2, 2]);
  multiply(%5, 0.5f)
}
'''
    mod = parse_module(text, constants=[RNG.standard_normal((C, C, 1, 1)).astype(np.float32),
                                        RNG.standard_normal((C, C, 3, 3)).astype(np.float32)])
    assert fused_groups(_fused(mod)) == fused_groups(_fused(mod, on=False))
