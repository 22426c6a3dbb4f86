"""PlanLayouts: golden graphs (the planned program written out as Relay text), numerical equality with the unplanned
program (reference interpreter), compiled models, and the wiring that keeps builds, tuning tasks and the command
line on the same layouts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from test_passes_corpus import CORPUS_FILES, ZOO_FILES, flatten, load
from test_passes_corpus import random_inputs as corpus_inputs

import relay_tune
from relay_tune.cli import main
from relay_tune.interpreter import Interpreter, evaluate
from relay_tune.ir import Call, IRModule, post_order
from relay_tune.ir.expr import structural_equal
from relay_tune.passes import PassConfig, PlanLayouts, layout_block, optimize
from relay_tune.target import Target
from relay_tune.testing import zoo
from relay_tune.text import parse_module, print_module
from relay_tune.tuning.relay_task import tasks_from_module
from relay_tune.type_infer import infer_types

B = 16  # the block of the golden graphs (AVX-512 float32 lanes), whatever this machine's vectors are
HEADER = '#[version = "0.0.5"]\n'
RNG = np.random.default_rng(5)


def typed(text: str, constants: Sequence[np.ndarray] | None = None) -> IRModule:
    return infer_types(parse_module(HEADER + text, constants=list(constants) if constants is not None else None))


def random_inputs(mod: IRModule, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p.name_hint: rng.standard_normal([int(d) for d in p.checked_type.shape]).astype("float32")
            for p in mod["main"].params}


def run(mod: IRModule, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    out = Interpreter(mod).run(inputs)
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


def assert_same_values(a: IRModule, b: IRModule, seed: int = 0) -> None:
    inputs = random_inputs(a, seed)
    for x, y in zip(run(a, inputs), run(b, inputs), strict=True):
        assert x.shape == y.shape
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-4)


def check_golden(source: str, expected: str, constants: Sequence[np.ndarray] | None = None,
                 **options: object) -> IRModule:
    """Plan `source` with block 16; the result must be `expected` (structurally) and compute what `source` does,
    alone and through the whole pipeline (with the FoldConstant that packs constant weights)."""
    mod = typed(source, constants)
    planned = PlanLayouts(block=B, **options).run(mod)  # type: ignore[arg-type]
    want = typed(expected, constants)
    assert structural_equal(planned["main"], want["main"]), "planned program:\n" + print_module(planned)
    assert_same_values(mod, planned)
    pipeline = optimize(mod, layout_block=B) if not options else planned
    assert_same_values(mod, pipeline)
    return planned


def ops(mod: IRModule, name: str) -> list[Call]:
    return [n for f in mod.values() for n in post_order(f) if isinstance(n, Call) and n.op_name == name]


def transforms(mod: IRModule) -> list[tuple[str, str]]:
    return [(str(c.attrs["src_layout"]), str(c.attrs["dst_layout"])) for c in ops(mod, "layout_transform")]


# ---------------------------------------------------------------------------------------------------------------------
# Golden graphs
# ---------------------------------------------------------------------------------------------------------------------

CONV_BIAS_RELU = """def @main(%x: Tensor[(1, 16, 8, 8), float32], %w1: Tensor[(32, 16, 3, 3), float32],
          %b1: Tensor[(32), float32], %w2: Tensor[(32, 32, 1, 1), float32], %b2: Tensor[(32), float32]) {
  %0 = nn.conv2d(%x, %w1, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3]);
  %1 = nn.bias_add(%0, %b1);
  %2 = nn.relu(%1);
  %3 = nn.conv2d(%2, %w2, channels=32, kernel_size=[1, 1]);
  %4 = nn.bias_add(%3, %b2);
  %5 = nn.relu(%4);
  nn.max_pool2d(%5, pool_size=[2, 2], strides=[2, 2])
}"""


def test_conv_bias_relu_chain_stays_blocked_between_its_two_boundaries() -> None:
    # The weights are model inputs here: their transforms stay in the program and run in the model.
    check_golden(CONV_BIAS_RELU, """def @main(%x: Tensor[(1, 16, 8, 8), float32], %w1: Tensor[(32, 16, 3, 3), float32],
          %b1: Tensor[(32), float32], %w2: Tensor[(32, 32, 1, 1), float32], %b2: Tensor[(32), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w1, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = add(%2, reshape(%b1, newshape=[2, 1, 1, 16]));
  %4 = nn.relu(%3);
  %5 = layout_transform(%w2, src_layout="OIHW", dst_layout="OIHW16i16o");
  %6 = nn.contrib_conv2d_NCHWc(%4, %5, channels=32, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %7 = add(%6, reshape(%b2, newshape=[2, 1, 1, 16]));
  %8 = nn.relu(%7);
  %9 = nn.max_pool2d(%8, pool_size=[2, 2], strides=[2, 2], layout="NCHW16c");
  layout_transform(%9, src_layout="NCHW16c", dst_layout="NCHW")
}""")


def test_residual_block_shares_one_transform_of_its_input_and_reshapes_per_channel_constants() -> None:
    consts = [RNG.standard_normal(s).astype("float32") * 0.1 for s in
              [(32, 32, 3, 3), (32, 1, 1), (32, 1, 1), (32, 32, 3, 3), (1, 32, 1, 1)]]
    source = """def @main(%x: Tensor[(1, 32, 8, 8), float32]) {
  %0 = nn.conv2d(%x, meta[relay.Constant][0], padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3]);
  %1 = multiply(%0, meta[relay.Constant][1]);
  %2 = add(%1, meta[relay.Constant][2]);
  %3 = nn.relu(%2);
  %4 = nn.conv2d(%3, meta[relay.Constant][3], padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3]);
  %5 = add(%4, meta[relay.Constant][4]);
  %6 = add(%5, %x);
  nn.relu(%6)
}"""
    expected = """def @main(%x: Tensor[(1, 32, 8, 8), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(meta[relay.Constant][0], src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = multiply(%2, reshape(meta[relay.Constant][1], newshape=[2, 1, 1, 16]));
  %4 = add(%3, reshape(meta[relay.Constant][2], newshape=[2, 1, 1, 16]));
  %5 = nn.relu(%4);
  %6 = layout_transform(meta[relay.Constant][3], src_layout="OIHW", dst_layout="OIHW16i16o");
  %7 = nn.contrib_conv2d_NCHWc(%5, %6, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %8 = add(%7, reshape(meta[relay.Constant][4], newshape=[1, 2, 1, 1, 16]));
  %9 = add(%8, %0);
  %10 = nn.relu(%9);
  layout_transform(%10, src_layout="NCHW16c", dst_layout="NCHW")
}"""
    check_golden(source, expected, consts)
    # Through the pipeline: constant weights and per-channel constants are packed at build time, so only the two
    # activation transforms are left.
    fused = optimize(typed(source, consts), layout_block=B)
    assert sorted(transforms(fused)) == [("NCHW", "NCHW16c"), ("NCHW16c", "NCHW")]
    assert not ops(fused, "reshape")


RGB_STEM = """def @main(%x: Tensor[(1, 3, 16, 16), float32], %w0: Tensor[(16, 3, 3, 3), float32],
          %w1: Tensor[(16, 16, 3, 3), float32], %w2: Tensor[(16, 16, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w0, padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3]);
  %1 = nn.relu(%0);
  %2 = nn.max_pool2d(%1, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1]);
  %3 = nn.conv2d(%2, %w1, padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3]);
  %4 = nn.conv2d(%2, %w2, channels=16, kernel_size=[1, 1]);
  add(%3, %4)
}"""


def test_rgb_stem_reads_its_three_channels_as_one_block_and_writes_the_blocked_layout() -> None:
    check_golden(RGB_STEM, """def @main(%x: Tensor[(1, 3, 16, 16), float32], %w0: Tensor[(16, 3, 3, 3), float32],
          %w1: Tensor[(16, 16, 3, 3), float32], %w2: Tensor[(16, 16, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW3c");
  %1 = layout_transform(%w0, src_layout="OIHW", dst_layout="OIHW3i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3],
                               data_layout="NCHW3c", kernel_layout="OIHW3i16o", out_layout="NCHW16c");
  %3 = nn.relu(%2);
  %4 = nn.max_pool2d(%3, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], layout="NCHW16c");
  %5 = layout_transform(%w1, src_layout="OIHW", dst_layout="OIHW16i16o");
  %6 = nn.contrib_conv2d_NCHWc(%4, %5, padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %7 = layout_transform(%w2, src_layout="OIHW", dst_layout="OIHW16i16o");
  %8 = nn.contrib_conv2d_NCHWc(%4, %7, channels=16, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %9 = add(%6, %8);
  layout_transform(%9, src_layout="NCHW16c", dst_layout="NCHW")
}""")


def test_without_the_stem_rule_the_stem_stays_nchw_and_its_output_is_transformed_once() -> None:
    check_golden(RGB_STEM, """def @main(%x: Tensor[(1, 3, 16, 16), float32], %w0: Tensor[(16, 3, 3, 3), float32],
          %w1: Tensor[(16, 16, 3, 3), float32], %w2: Tensor[(16, 16, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w0, padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3]);
  %1 = nn.relu(%0);
  %2 = nn.max_pool2d(%1, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1]);
  %3 = layout_transform(%2, src_layout="NCHW", dst_layout="NCHW16c");
  %4 = layout_transform(%w1, src_layout="OIHW", dst_layout="OIHW16i16o");
  %5 = nn.contrib_conv2d_NCHWc(%3, %4, padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %6 = layout_transform(%w2, src_layout="OIHW", dst_layout="OIHW16i16o");
  %7 = nn.contrib_conv2d_NCHWc(%3, %6, channels=16, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %8 = add(%5, %7);
  layout_transform(%8, src_layout="NCHW16c", dst_layout="NCHW")
}""", stem=False)


def test_wide_stem_before_an_lrn_is_blocked_and_its_output_transformed_back() -> None:
    # AlexNet's, ZFNet's and Inception v1's stems: a 7x7 kernel, then ReLU and an LRN (which needs NCHW).
    check_golden("""def @main(%x: Tensor[(1, 3, 19, 19), float32], %w: Tensor[(16, 3, 7, 7), float32]) {
  %0 = nn.conv2d(%x, %w, strides=[2, 2], channels=16, kernel_size=[7, 7]);
  %1 = nn.relu(%0);
  nn.lrn(%1, size=5, alpha=0.0001f, beta=0.75f, bias=1f)
}""", """def @main(%x: Tensor[(1, 3, 19, 19), float32], %w: Tensor[(16, 3, 7, 7), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW3c");
  %1 = layout_transform(%w, src_layout="OIHW", dst_layout="OIHW3i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, strides=[2, 2], channels=16, kernel_size=[7, 7],
                               data_layout="NCHW3c", kernel_layout="OIHW3i16o", out_layout="NCHW16c");
  %3 = nn.relu(%2);
  %4 = layout_transform(%3, src_layout="NCHW16c", dst_layout="NCHW");
  nn.lrn(%4, size=5, alpha=0.0001f, beta=0.75f, bias=1f)
}""")


def test_narrow_stem_into_grouped_convolutions_stays_nchw() -> None:
    # ShuffleNet v1: a 3x3 stem feeding only grouped (NCHW) convolutions; a 7x7 stem with 24 output channels (no
    # full block of 16) stays NCHW as well.
    source = """def @main(%x: Tensor[(1, 3, 17, 17), float32], %w: Tensor[(16, 3, 3, 3), float32],
          %g: Tensor[(16, 4, 1, 1), float32], %v: Tensor[(24, 3, 7, 7), float32]) {
  %0 = nn.conv2d(%x, %w, strides=[2, 2], padding=[1, 1, 1, 1], channels=16, kernel_size=[3, 3]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%1, %g, groups=4, channels=16, kernel_size=[1, 1]);
  %3 = nn.conv2d(%x, %v, strides=[2, 2], channels=24, kernel_size=[7, 7]);
  (%2, %3)
}"""
    check_golden(source, source)


def test_grouped_spatial_convolution_with_whole_blocks_per_group_is_blocked() -> None:
    # AlexNet's two-group 3x3 convolution (32 channels in blocks of 16); a two-group 1x1 one stays NCHW.
    check_golden("""def @main(%x: Tensor[(1, 32, 6, 5), float32], %w: Tensor[(32, 16, 3, 3), float32],
          %v: Tensor[(32, 16, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], groups=2, channels=32, kernel_size=[3, 3]);
  %1 = nn.relu(%0);
  nn.conv2d(%1, %v, groups=2, channels=32, kernel_size=[1, 1])
}""", """def @main(%x: Tensor[(1, 32, 6, 5), float32], %w: Tensor[(32, 16, 3, 3), float32],
          %v: Tensor[(32, 16, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, padding=[1, 1, 1, 1], groups=2, channels=32, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = nn.relu(%2);
  %4 = layout_transform(%3, src_layout="NCHW16c", dst_layout="NCHW");
  nn.conv2d(%4, %v, groups=2, channels=32, kernel_size=[1, 1])
}""")


def test_flatten_dense_tail_gets_nchw_after_blocked_global_pooling() -> None:
    check_golden("""def @main(%x: Tensor[(1, 16, 4, 4), float32], %w: Tensor[(32, 16, 1, 1), float32],
          %d: Tensor[(10, 32), float32]) {
  %0 = nn.conv2d(%x, %w, channels=32, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.global_avg_pool2d(%1);
  %3 = nn.batch_flatten(%2);
  %4 = nn.dense(%3, %d, units=10);
  nn.softmax(%4)
}""", """def @main(%x: Tensor[(1, 16, 4, 4), float32], %w: Tensor[(32, 16, 1, 1), float32],
          %d: Tensor[(10, 32), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=32, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = nn.relu(%2);
  %4 = nn.global_avg_pool2d(%3, layout="NCHW16c");
  %5 = layout_transform(%4, src_layout="NCHW16c", dst_layout="NCHW");
  %6 = nn.batch_flatten(%5);
  %7 = nn.dense(%6, %d, units=10);
  nn.softmax(%7)
}""")


def test_concatenation_of_conv_branches_and_the_block_input_concatenates_on_the_outer_block_axis() -> None:
    # DenseNet style: the block's input is one of the concatenated values; Inception style: two conv branches.
    check_golden("""def @main(%x: Tensor[(1, 16, 8, 8), float32], %wa: Tensor[(16, 16, 1, 1), float32],
          %wb: Tensor[(32, 16, 3, 3), float32], %wc: Tensor[(16, 64, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %wa, channels=16, kernel_size=[1, 1]);
  %1 = nn.conv2d(%x, %wb, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3]);
  %2 = (%x, %0, %1);
  %3 = concatenate(%2, axis=1);
  %4 = nn.avg_pool2d(%3, pool_size=[2, 2], strides=[2, 2]);
  nn.conv2d(%4, %wc, channels=16, kernel_size=[1, 1])
}""", """def @main(%x: Tensor[(1, 16, 8, 8), float32], %wa: Tensor[(16, 16, 1, 1), float32],
          %wb: Tensor[(32, 16, 3, 3), float32], %wc: Tensor[(16, 64, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%wa, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=16, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = layout_transform(%wb, src_layout="OIHW", dst_layout="OIHW16i16o");
  %4 = nn.contrib_conv2d_NCHWc(%0, %3, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %5 = (%0, %2, %4);
  %6 = concatenate(%5, axis=1);
  %7 = nn.avg_pool2d(%6, pool_size=[2, 2], strides=[2, 2], layout="NCHW16c");
  %8 = layout_transform(%wc, src_layout="OIHW", dst_layout="OIHW16i16o");
  %9 = nn.contrib_conv2d_NCHWc(%7, %8, channels=16, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  layout_transform(%9, src_layout="NCHW16c", dst_layout="NCHW")
}""")


SHUFFLE_CHANNELS = """def @main(%x: Tensor[(1, 24, 8, 8), float32], %w1: Tensor[(58, 24, 1, 1), float32],
          %w2: Tensor[(58, 1, 3, 3), float32], %w3: Tensor[(116, 58, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=58, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%1, %w2, padding=[1, 1, 1, 1], groups=58, channels=58, kernel_size=[3, 3]);
  nn.conv2d(%2, %w3, channels=116, kernel_size=[1, 1])
}"""


def test_channel_counts_that_are_not_multiples_of_the_block_stay_nchw() -> None:
    mod = typed(SHUFFLE_CHANNELS)
    assert PlanLayouts(block=B).run(mod) is mod  # nothing to plan: the module itself comes back
    check_golden(SHUFFLE_CHANNELS, SHUFFLE_CHANNELS)


def test_a_blocked_chain_hands_nchw_to_a_convolution_it_cannot_block() -> None:
    check_golden("""def @main(%x: Tensor[(1, 32, 8, 8), float32], %w1: Tensor[(48, 32, 1, 1), float32],
          %w2: Tensor[(58, 48, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=48, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%1, %w2, channels=58, kernel_size=[1, 1]);
  nn.relu(%2)
}""", """def @main(%x: Tensor[(1, 32, 8, 8), float32], %w1: Tensor[(48, 32, 1, 1), float32],
          %w2: Tensor[(58, 48, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w1, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=48, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = nn.relu(%2);
  %4 = layout_transform(%3, src_layout="NCHW16c", dst_layout="NCHW");
  %5 = nn.conv2d(%4, %w2, channels=58, kernel_size=[1, 1]);
  nn.relu(%5)
}""")


DEPTHWISE = """def @main(%x: Tensor[(1, 32, 8, 8), float32], %w1: Tensor[(32, 32, 1, 1), float32],
          %w2: Tensor[(32, 1, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=32, kernel_size=[1, 1]);
  %1 = clip(%0, a_min=0f, a_max=6f);
  %2 = nn.conv2d(%1, %w2, padding=[1, 1, 1, 1], groups=32, channels=32, kernel_size=[3, 3]);
  clip(%2, a_min=0f, a_max=6f)
}"""


def test_depthwise_convolution_takes_a_blocked_kernel() -> None:
    check_golden(DEPTHWISE, """def @main(%x: Tensor[(1, 32, 8, 8), float32], %w1: Tensor[(32, 32, 1, 1), float32],
          %w2: Tensor[(32, 1, 3, 3), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w1, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=32, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = clip(%2, a_min=0f, a_max=6f);
  %4 = layout_transform(%w2, src_layout="OIHW", dst_layout="OIHW1i16o");
  %5 = nn.contrib_conv2d_NCHWc(%3, %4, padding=[1, 1, 1, 1], groups=32, channels=32, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW1i16o", out_layout="NCHW16c");
  %6 = clip(%5, a_min=0f, a_max=6f);
  layout_transform(%6, src_layout="NCHW16c", dst_layout="NCHW")
}""")


def test_depthwise_blocking_can_be_turned_off() -> None:
    check_golden(DEPTHWISE, """def @main(%x: Tensor[(1, 32, 8, 8), float32], %w1: Tensor[(32, 32, 1, 1), float32],
          %w2: Tensor[(32, 1, 3, 3), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w1, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=32, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = clip(%2, a_min=0f, a_max=6f);
  %4 = layout_transform(%3, src_layout="NCHW16c", dst_layout="NCHW");
  %5 = nn.conv2d(%4, %w2, padding=[1, 1, 1, 1], groups=32, channels=32, kernel_size=[3, 3]);
  clip(%5, a_min=0f, a_max=6f)
}""", depthwise=False)


def test_depthwise_convolution_with_nchw_input_stays_nchw() -> None:
    # MobileNet v2 between 24-channel projections: the expansion cannot be blocked (24 input channels), and a
    # depthwise kernel would not win back the transform of its input; the next blocked convolution transforms.
    check_golden("""def @main(%x: Tensor[(1, 24, 8, 8), float32], %w1: Tensor[(32, 24, 1, 1), float32],
          %w2: Tensor[(32, 1, 3, 3), float32], %w3: Tensor[(32, 32, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=32, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%1, %w2, padding=[1, 1, 1, 1], groups=32, channels=32, kernel_size=[3, 3]);
  nn.conv2d(%2, %w3, channels=32, kernel_size=[1, 1])
}""", """def @main(%x: Tensor[(1, 24, 8, 8), float32], %w1: Tensor[(32, 24, 1, 1), float32],
          %w2: Tensor[(32, 1, 3, 3), float32], %w3: Tensor[(32, 32, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=32, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%1, %w2, padding=[1, 1, 1, 1], groups=32, channels=32, kernel_size=[3, 3]);
  %3 = layout_transform(%2, src_layout="NCHW", dst_layout="NCHW16c");
  %4 = layout_transform(%w3, src_layout="OIHW", dst_layout="OIHW16i16o");
  %5 = nn.contrib_conv2d_NCHWc(%3, %4, channels=32, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  layout_transform(%5, src_layout="NCHW16c", dst_layout="NCHW")
}""")


# Mixed blocks: channel counts the block of 16 does not divide, but 8 does (24, 40, 56...), are stored in NCHW8c.

BOTTLENECK_24 = """def @main(%x: Tensor[(1, 16, 8, 8), float32], %w1: Tensor[(24, 16, 1, 1), float32],
          %w2: Tensor[(48, 24, 1, 1), float32], %w3: Tensor[(48, 1, 3, 3), float32],
          %w4: Tensor[(24, 48, 1, 1), float32], %w5: Tensor[(32, 24, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=24, kernel_size=[1, 1]);
  %1 = nn.conv2d(%0, %w2, channels=48, kernel_size=[1, 1]);
  %2 = clip(%1, a_min=0f, a_max=6f);
  %3 = nn.conv2d(%2, %w3, padding=[1, 1, 1, 1], groups=48, channels=48, kernel_size=[3, 3]);
  %4 = nn.conv2d(%3, %w4, channels=24, kernel_size=[1, 1]);
  %5 = add(%4, %0);
  nn.conv2d(%5, %w5, channels=32, kernel_size=[1, 1])
}"""


def test_a_24_channel_bottleneck_between_16_multiples_stays_blocked_in_blocks_of_8() -> None:
    # MobileNet v2's 24-channel stage: projections write NCHW8c, the residual add joins two NCHW8c values, and
    # the next expansion reads blocks of 8 and writes blocks of 16 (OIHW8i16o). No transform between them.
    check_golden(BOTTLENECK_24, """def @main(%x: Tensor[(1, 16, 8, 8), float32], %w1: Tensor[(24, 16, 1, 1), float32],
          %w2: Tensor[(48, 24, 1, 1), float32], %w3: Tensor[(48, 1, 3, 3), float32],
          %w4: Tensor[(24, 48, 1, 1), float32], %w5: Tensor[(32, 24, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w1, src_layout="OIHW", dst_layout="OIHW16i8o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=24, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i8o", out_layout="NCHW8c");
  %3 = layout_transform(%w2, src_layout="OIHW", dst_layout="OIHW8i16o");
  %4 = nn.contrib_conv2d_NCHWc(%2, %3, channels=48, kernel_size=[1, 1],
                               data_layout="NCHW8c", kernel_layout="OIHW8i16o", out_layout="NCHW16c");
  %5 = clip(%4, a_min=0f, a_max=6f);
  %6 = layout_transform(%w3, src_layout="OIHW", dst_layout="OIHW1i16o");
  %7 = nn.contrib_conv2d_NCHWc(%5, %6, padding=[1, 1, 1, 1], groups=48, channels=48, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW1i16o", out_layout="NCHW16c");
  %8 = layout_transform(%w4, src_layout="OIHW", dst_layout="OIHW16i8o");
  %9 = nn.contrib_conv2d_NCHWc(%7, %8, channels=24, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i8o", out_layout="NCHW8c");
  %10 = add(%9, %2);
  %11 = layout_transform(%w5, src_layout="OIHW", dst_layout="OIHW8i16o");
  %12 = nn.contrib_conv2d_NCHWc(%10, %11, channels=32, kernel_size=[1, 1],
                                data_layout="NCHW8c", kernel_layout="OIHW8i16o", out_layout="NCHW16c");
  layout_transform(%12, src_layout="NCHW16c", dst_layout="NCHW")
}""")


def test_without_half_blocks_the_24_channel_values_stay_nchw() -> None:
    # The planning before half blocks: nothing here is blocked (each blocked convolution would cost two transforms).
    check_golden(BOTTLENECK_24, BOTTLENECK_24, half_blocks=False)


def test_a_half_block_is_not_worth_a_transform_of_its_own() -> None:
    # A 24-channel model input would need a transform into NCHW8c: the convolution reading it stays NCHW.
    source = """def @main(%x: Tensor[(1, 24, 8, 8), float32], %w1: Tensor[(32, 24, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=32, kernel_size=[1, 1]);
  nn.relu(%0)
}"""
    check_golden(source, source)


def test_concatenation_of_24_and_32_channels_concatenates_blocks_of_8() -> None:
    # 8 divides both channel counts (16 does not divide 24): the 32-channel branch goes from blocks of 16 to blocks
    # of 8 in one transform, and the 56 concatenated channels stay blocked through the pooling into the next
    # convolution (NCHW8c x OIHW8i16o).
    check_golden("""def @main(%x: Tensor[(1, 16, 8, 8), float32], %wa: Tensor[(24, 16, 1, 1), float32],
          %wb: Tensor[(32, 16, 3, 3), float32], %wc: Tensor[(32, 56, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %wa, channels=24, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%x, %wb, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3]);
  %3 = (%1, %2);
  %4 = concatenate(%3, axis=1);
  %5 = nn.max_pool2d(%4, pool_size=[2, 2], strides=[2, 2]);
  nn.conv2d(%5, %wc, channels=32, kernel_size=[1, 1])
}""", """def @main(%x: Tensor[(1, 16, 8, 8), float32], %wa: Tensor[(24, 16, 1, 1), float32],
          %wb: Tensor[(32, 16, 3, 3), float32], %wc: Tensor[(32, 56, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%wa, src_layout="OIHW", dst_layout="OIHW16i8o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=24, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i8o", out_layout="NCHW8c");
  %3 = nn.relu(%2);
  %4 = layout_transform(%wb, src_layout="OIHW", dst_layout="OIHW16i16o");
  %5 = nn.contrib_conv2d_NCHWc(%0, %4, padding=[1, 1, 1, 1], channels=32, kernel_size=[3, 3],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %6 = layout_transform(%5, src_layout="NCHW16c", dst_layout="NCHW8c");
  %7 = (%3, %6);
  %8 = concatenate(%7, axis=1);
  %9 = nn.max_pool2d(%8, pool_size=[2, 2], strides=[2, 2], layout="NCHW8c");
  %10 = layout_transform(%wc, src_layout="OIHW", dst_layout="OIHW8i16o");
  %11 = nn.contrib_conv2d_NCHWc(%9, %10, channels=32, kernel_size=[1, 1],
                                data_layout="NCHW8c", kernel_layout="OIHW8i16o", out_layout="NCHW16c");
  layout_transform(%11, src_layout="NCHW16c", dst_layout="NCHW")
}""")


def test_an_element_wise_join_of_blocks_of_8_and_16_transforms_one_operand_to_16() -> None:
    # 24 + 40 channels concatenate in blocks of 8 (64 channels); added to a 64-channel convolution's NCHW16c
    # output, the concatenation is transformed once, NCHW8c -> NCHW16c (no round trip through NCHW).
    check_golden("""def @main(%x: Tensor[(1, 16, 8, 8), float32], %wa: Tensor[(24, 16, 1, 1), float32],
          %wb: Tensor[(40, 16, 1, 1), float32], %wc: Tensor[(64, 16, 1, 1), float32],
          %wd: Tensor[(32, 64, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %wa, channels=24, kernel_size=[1, 1]);
  %1 = nn.conv2d(%x, %wb, channels=40, kernel_size=[1, 1]);
  %2 = (%0, %1);
  %3 = concatenate(%2, axis=1);
  %4 = nn.conv2d(%x, %wc, channels=64, kernel_size=[1, 1]);
  %5 = add(%4, %3);
  %6 = nn.relu(%5);
  nn.conv2d(%6, %wd, channels=32, kernel_size=[1, 1])
}""", """def @main(%x: Tensor[(1, 16, 8, 8), float32], %wa: Tensor[(24, 16, 1, 1), float32],
          %wb: Tensor[(40, 16, 1, 1), float32], %wc: Tensor[(64, 16, 1, 1), float32],
          %wd: Tensor[(32, 64, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%wa, src_layout="OIHW", dst_layout="OIHW16i8o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=24, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i8o", out_layout="NCHW8c");
  %3 = layout_transform(%wb, src_layout="OIHW", dst_layout="OIHW16i8o");
  %4 = nn.contrib_conv2d_NCHWc(%0, %3, channels=40, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i8o", out_layout="NCHW8c");
  %5 = (%2, %4);
  %6 = concatenate(%5, axis=1);
  %7 = layout_transform(%wc, src_layout="OIHW", dst_layout="OIHW16i16o");
  %8 = nn.contrib_conv2d_NCHWc(%0, %7, channels=64, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %9 = add(%8, layout_transform(%6, src_layout="NCHW8c", dst_layout="NCHW16c"));
  %10 = nn.relu(%9);
  %11 = layout_transform(%wd, src_layout="OIHW", dst_layout="OIHW16i16o");
  %12 = nn.contrib_conv2d_NCHWc(%10, %11, channels=32, kernel_size=[1, 1],
                                data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  layout_transform(%12, src_layout="NCHW16c", dst_layout="NCHW")
}""")


def test_a_half_block_is_not_written_where_the_blocked_chain_ends() -> None:
    # SqueezeNet's classifier (1000 channels, blocks of 8) into global pooling: a convolution writing half blocks
    # runs at half the vector width, and nothing after it reads them blocked, so it stays NCHW.
    check_golden("""def @main(%x: Tensor[(1, 16, 8, 8), float32], %w1: Tensor[(32, 16, 1, 1), float32],
          %w2: Tensor[(24, 32, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=32, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  %2 = nn.conv2d(%1, %w2, channels=24, kernel_size=[1, 1]);
  %3 = nn.relu(%2);
  nn.global_avg_pool2d(%3)
}""", """def @main(%x: Tensor[(1, 16, 8, 8), float32], %w1: Tensor[(32, 16, 1, 1), float32],
          %w2: Tensor[(24, 32, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w1, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=32, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = nn.relu(%2);
  %4 = layout_transform(%3, src_layout="NCHW16c", dst_layout="NCHW");
  %5 = nn.conv2d(%4, %w2, channels=24, kernel_size=[1, 1]);
  %6 = nn.relu(%5);
  nn.global_avg_pool2d(%6)
}""")


def test_shufflenet_channel_counts_that_8_does_not_divide_stay_nchw() -> None:
    # 58 and 116 channels: neither 16 nor 8 divides them, half blocks or not.
    mod = typed(SHUFFLE_CHANNELS)
    assert PlanLayouts(block=B, half_blocks=True).run(mod) is mod


def test_half_blocks_are_at_least_8_lanes() -> None:
    # Block 8 (AVX2) has no half block: 24 channels are blocks of 8, 20 channels stay NCHW.
    source = """def @main(%x: Tensor[(1, 8, 8, 8), float32], %w1: Tensor[(24, 8, 1, 1), float32],
          %w2: Tensor[(20, 24, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w1, channels=24, kernel_size=[1, 1]);
  nn.conv2d(%0, %w2, channels=20, kernel_size=[1, 1])
}"""
    mod = typed(source)
    planned = PlanLayouts(block=8).run(mod)
    assert [(str(c.attrs["data_layout"]), str(c.attrs["out_layout"])) for c in ops(planned, "nn.contrib_conv2d_NCHWc")
            ] == [("NCHW8c", "NCHW8c")]
    assert len(ops(planned, "nn.conv2d")) == 1
    assert_same_values(mod, planned)


def test_squeeze_excitation_scale_broadcasts_in_the_blocked_layout() -> None:
    # The (1, C, 1, 1) scale of the block and the (1, C, H, W) features are both blocked: the multiply needs no
    # transform. A (1, H, W) spatial map does not fit a blocked result: that add is done in NCHW.
    check_golden("""def @main(%x: Tensor[(1, 32, 4, 4), float32], %w: Tensor[(32, 32, 1, 1), float32],
          %ws: Tensor[(32, 32, 1, 1), float32], %m: Tensor[(1, 4, 4), float32]) {
  %0 = nn.conv2d(%x, %w, channels=32, kernel_size=[1, 1]);
  %1 = nn.global_avg_pool2d(%0);
  %2 = nn.conv2d(%1, %ws, channels=32, kernel_size=[1, 1]);
  %3 = sigmoid(%2);
  %4 = multiply(%0, %3);
  add(%4, %m)
}""", """def @main(%x: Tensor[(1, 32, 4, 4), float32], %w: Tensor[(32, 32, 1, 1), float32],
          %ws: Tensor[(32, 32, 1, 1), float32], %m: Tensor[(1, 4, 4), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=32, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = nn.global_avg_pool2d(%2, layout="NCHW16c");
  %4 = layout_transform(%ws, src_layout="OIHW", dst_layout="OIHW16i16o");
  %5 = nn.contrib_conv2d_NCHWc(%3, %4, channels=32, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %6 = sigmoid(%5);
  %7 = multiply(%2, %6);
  %8 = layout_transform(%7, src_layout="NCHW16c", dst_layout="NCHW");
  add(%8, %m)
}""")


def test_tuple_outputs_are_returned_in_their_original_layouts() -> None:
    check_golden("""def @main(%x: Tensor[(1, 16, 4, 4), float32], %w: Tensor[(16, 16, 1, 1), float32]) {
  %0 = nn.conv2d(%x, %w, channels=16, kernel_size=[1, 1]);
  %1 = nn.relu(%0);
  (%0, %1)
}""", """def @main(%x: Tensor[(1, 16, 4, 4), float32], %w: Tensor[(16, 16, 1, 1), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="NCHW16c");
  %1 = layout_transform(%w, src_layout="OIHW", dst_layout="OIHW16i16o");
  %2 = nn.contrib_conv2d_NCHWc(%0, %1, channels=16, kernel_size=[1, 1],
                               data_layout="NCHW16c", kernel_layout="OIHW16i16o", out_layout="NCHW16c");
  %3 = nn.relu(%2);
  %4 = layout_transform(%2, src_layout="NCHW16c", dst_layout="NCHW");
  %5 = layout_transform(%3, src_layout="NCHW16c", dst_layout="NCHW");
  (%4, %5)
}""")


def test_a_program_with_let_bindings_is_left_alone() -> None:
    mod = typed("""def @main(%x: Tensor[(1, 16, 4, 4), float32], %w: Tensor[(16, 16, 1, 1), float32]) {
  let %y = nn.conv2d(%x, %w, channels=16, kernel_size=[1, 1]);
  nn.relu(%y)
}""")
    assert PlanLayouts(block=B).run(mod) is mod


# ---------------------------------------------------------------------------------------------------------------------
# Whole models
# ---------------------------------------------------------------------------------------------------------------------


def _no_transform_pairs(mod: IRModule) -> None:
    for call in ops(mod, "layout_transform"):
        inner = call.args[0]
        if isinstance(inner, Call) and inner.op_name == "layout_transform":
            assert (inner.attrs["src_layout"], inner.attrs["dst_layout"]) != (
                call.attrs["dst_layout"], call.attrs["src_layout"]), "a transform pair A->B->A"


ZOO_16 = {  # widths whose channel counts are multiples of 16
    "resnet18": lambda: zoo.resnet(18, image=32, width=16, num_classes=10),
    "resnet50": lambda: zoo.resnet(50, image=32, width=16, num_classes=10),
    "mobilenet_v2": lambda: zoo.mobilenet(2, image=32, width=16, num_classes=10),
    # MobileNet v2 at its real widths (16, 24, 32, 64, 96, 160, 320 channels): the 24-channel stage in blocks of 8
    "mobilenet_v2_24": lambda: zoo.mobilenet(2, image=32, width=32, num_classes=10),
    "squeezenet1_1": lambda: zoo.squeezenet(image=32, width=16, num_classes=10),
    "inception_block": lambda: zoo.inception_block(image=8, in_channels=32, width=16, pool_features=16),
    "densenet_block": lambda: zoo.densenet_block(image=8, in_channels=16, layers=3, growth=16),
}


@pytest.mark.parametrize("name", sorted(ZOO_16))
def test_planned_zoo_models_compute_what_the_unplanned_ones_do(name: str) -> None:
    mod = infer_types(ZOO_16[name]())
    planned = optimize(mod, layout_block=B)
    assert ops(planned, "nn.contrib_conv2d_NCHWc"), "nothing was blocked"
    _no_transform_pairs(planned)
    assert_same_values(optimize(mod, layout_block=0), planned)


PLAN_CORPUS = CORPUS_FILES + ZOO_FILES


@pytest.mark.parametrize("block", [4, 16])
@pytest.mark.parametrize("name", PLAN_CORPUS)
def test_planning_preserves_the_outputs_of_every_corpus_and_zoo_program(
        program: Callable[[str], Path], name: str, block: int) -> None:
    # Block 4 plans far more of these programs than 16 would (channel counts of 8, 12, 20...).
    mod = load(program(name))
    inputs = corpus_inputs(mod["main"])
    expected = flatten(evaluate(mod, inputs))
    planned = optimize(mod, opt_level=3, layout_block=block)
    _no_transform_pairs(planned)
    actual = flatten(evaluate(planned, inputs))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert isinstance(a, np.ndarray) and isinstance(e, np.ndarray)
        assert a.shape == e.shape and a.dtype == e.dtype
        tolerance = 2e-3 if e.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=tolerance * 10,
                                   atol=tolerance * max(1.0, float(np.abs(e.astype(np.float64)).max(initial=0))))


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2_24"])
def test_resnets_and_mobilenet_v2_transform_activations_only_at_the_boundaries(name: str) -> None:
    # The RGB image enters the blocked chain at the stem (as one block of its 3 channels), and the global pool's
    # result leaves it once for the classifier. Weights are packed at build time: no other transform.
    planned = optimize(infer_types(ZOO_16[name]()), layout_block=B)
    assert sorted(transforms(planned)) == [("NCHW", "NCHW3c"), ("NCHW16c", "NCHW")]
    assert not ops(planned, "nn.conv2d")  # every convolution is blocked


def test_planning_is_off_at_block_zero_and_below_opt_level_3() -> None:
    mod = typed(CONV_BIAS_RELU)
    assert PlanLayouts().run(mod) is mod  # PassConfig.layout_block defaults to 0
    assert PlanLayouts().run(mod, PassConfig(layout_block=B)) is not mod
    assert not ops(optimize(mod, opt_level=2, layout_block=B), "nn.contrib_conv2d_NCHWc")
    with pytest.raises(ValueError, match="layout_block"):
        PassConfig(layout_block=-1)


def test_layout_block_is_the_cpu_targets_float32_lanes_and_off_on_gpus() -> None:
    avx512 = Target.parse("llvm -mcpu=skylake-avx512")
    avx2 = Target.parse("llvm -mcpu=haswell")
    assert layout_block(avx512, True) == 16
    assert layout_block(avx2, True) == 8
    assert layout_block(avx512, False) == 0
    assert layout_block(avx512, None) == (16 if relay_tune.passes.LAYOUT_PLANNING_DEFAULT else 0)
    assert layout_block(Target.parse("cuda -arch=sm_90"), True) == 0


# ---------------------------------------------------------------------------------------------------------------------
# Compiled models and the places that must agree
# ---------------------------------------------------------------------------------------------------------------------


def _lanes() -> int:
    from relay_tune.compile import resolve_target

    return layout_block(resolve_target("llvm"), True)


def test_compiled_model_with_weights_as_inputs_matches_the_reference() -> None:
    mod = typed(CONV_BIAS_RELU)
    model = relay_tune.build(mod, "llvm", layout_planning=True)
    inputs = random_inputs(mod, seed=3)
    np.testing.assert_allclose(model.run(**inputs), run(mod, inputs)[0], rtol=1e-4, atol=1e-4)
    descriptions = " ".join(t.description for t in model.plan.tasks)
    assert ("contrib_conv2d_NCHWc" in descriptions) == (_lanes() > 0)


def test_build_and_tuning_tasks_see_the_same_planned_workloads() -> None:
    mod = infer_types(ZOO_16["resnet18"]())
    model = relay_tune.build(mod, "llvm", layout_planning=True)
    tasks = tasks_from_module(mod, "llvm", layout_planning=True)
    assert {t.key for t in tasks} <= {t.key for t in model.plan.tasks}
    assert {t.key for t in tasks} != {t.key for t in tasks_from_module(mod, "llvm", layout_planning=False)} \
        or _lanes() == 0
    inputs = model.random_inputs(seed=0)
    np.testing.assert_allclose(model.run(**inputs), run(mod, inputs)[0], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["mobilenet_v2", "mobilenet_v2_24", "squeezenet1_1", "inception_block",
                                  "densenet_block", "resnet50"])
def test_compiled_planned_zoo_models_match_the_reference(name: str) -> None:
    mod = infer_types(ZOO_16[name]())
    model = relay_tune.build(mod, "llvm", layout_planning=True)
    inputs = model.random_inputs(seed=1)
    expected = run(mod, inputs)
    got = model.run(**inputs)
    got = list(got) if isinstance(got, tuple | list) else [got]
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)


def test_command_line_tasks_follow_the_layout_planning_switch(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "chain.relay"
    path.write_text(HEADER + CONV_BIAS_RELU)
    assert main(["tasks", str(path), "--layout-planning"]) == 0
    planned = capsys.readouterr().out
    assert main(["tasks", str(path), "--no-layout-planning"]) == 0
    plain = capsys.readouterr().out
    assert "conv2d_nchw" in plain and "NCHWc" not in plain
    assert ("NCHWc" in planned) == (_lanes() > 0)


def test_a_log_tuned_with_planning_serves_builds_with_planning(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Tasks are extracted after planning: the log has records of the blocked kernels, which a build with planning
    # finds for every task, and a build without planning does not.
    monkeypatch.setenv("COLUMNS", "400")
    path = tmp_path / "chain.relay"
    path.write_text(HEADER + CONV_BIAS_RELU)
    log = tmp_path / "chain.jsonl"
    assert main([str(path), "--trials", "16", "--layout-planning", "--no-cache", "--log", str(log),
                 "-o", str(tmp_path / "tuned.rtmod")]) == 0
    assert "contrib_conv2d_NCHWc" in capsys.readouterr().out or _lanes() == 0  # the tuned tasks are blocked
    build = ["build", str(path), "-o", str(tmp_path / "built.rtmod"), "--log", str(log), "--no-cache",
             "--require-tuned", "--no-check-tuned"]
    assert main([*build, "--layout-planning"]) == 0
    assert ("NCHWc" in capsys.readouterr().out) == (_lanes() > 0)
    if _lanes() > 0:
        assert main([*build, "--no-layout-planning"]) == 1
        assert "no tuning record" in capsys.readouterr().err


def test_check_fused_prints_the_planned_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "chain.relay"
    path.write_text(HEADER + CONV_BIAS_RELU)
    assert main(["check", str(path), "--fused", "--layout-planning"]) == 0
    assert ("contrib_conv2d_NCHWc" in capsys.readouterr().out) == (_lanes() > 0)
