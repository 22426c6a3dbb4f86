"""`python -m experiments layers`: relay-tune's kernels and OpenVINO's nodes matched to the ONNX nodes they
compute. Behaviour only, never timings."""

from __future__ import annotations

import pytest

from experiments.__main__ import main
from experiments.layers import OnnxNode, match_layers, relay_kind


def test_relay_kinds_of_task_descriptions() -> None:
    assert relay_kind("conv2d_nchw+bias+relu 1x3x224x224 * 96x3x11x11 s4 p0") == "conv"
    assert relay_kind("contrib_conv2d_NCHWc_nchw8c+bias+relu 1x32x12x12x8 * 48x32x3x3x8x8 s1") == "conv"
    assert relay_kind("dense+bias+relu 1x9216 * 4096x9216") == "dense"
    assert relay_kind("max_pool2d 1x96x54x54") == "max_pool"
    assert relay_kind("lrn 1x96x54x54") == "lrn"
    assert relay_kind("layout_transform 1x256x12x12") == "layout"
    assert relay_kind("winograd_output_transform+bias+relu 36x196x192") == "conv"
    assert relay_kind("reshape+transpose+reshape+conv2d_nchw+bias 1x272x14x14 * 272x1x3x3 s1 p1 g272") == "conv"
    assert relay_kind("concatenate+relu ") == "concat"


def test_kernels_and_openvino_nodes_meet_at_their_onnx_nodes() -> None:
    nodes = [OnnxNode("n0", "Conv", ("r0",), 96 * 54 * 54), OnnxNode("n1", "Relu", ("r1",), 96 * 54 * 54),
             OnnxNode("n2", "LRN", ("r2",), 96 * 54 * 54), OnnxNode("n3", "Conv", ("r3",), 64 * 27 * 27),
             OnnxNode("n4", "Conv", ("r4",), 64 * 27 * 27), OnnxNode("n5", "Conv", ("r5",), 64 * 27 * 27)]
    relay = [("conv2d_nchw+bias+relu 1x3x224x224 * 96x3x11x11 s4 p0", 96 * 54 * 54, 4e-3),
             ("lrn 1x96x54x54", 96 * 54 * 54, 3e-3),
             ("layout_transform 1x96x54x54", 96 * 54 * 54, 1e-3),
             ("conv2d_nchw 1x96x54x54 * 64x96x3x3 s2 p1", 64 * 27 * 27, 2e-3),
             # a Winograd convolution: its three kernels add up on node n4
             ("winograd_input_transform 1x8x27x27x8", 36 * 49 * 64, 1e-3),
             ("batch_matmul 36x49x64 * 36x64x64", 36 * 49 * 64, 2e-3),
             ("winograd_output_transform 36x49x64", 64 * 27 * 27, 1e-3)]
    openvino = [("n0/WithoutBiases", "Convolution", 5e-3), ("n0_abcd_acdb_n2", "Reorder", 0.5e-3),
                ("r2", "LRN", 0.5e-3), ("n3/WithoutBiases", "Convolution", 2e-3), ("n4", "Convolution", 3e-3),
                ("n1", "Relu", 0.0), ("Multiply_9", "GroupConvolution", 1.5e-3)]  # renamed by a fusion
    rows = {row.name.split(" ")[0]: row for row in match_layers(nodes, relay, openvino)}
    assert rows["n0"].relay == pytest.approx(4e-3) and rows["n0"].openvino == pytest.approx(5e-3)
    assert rows["n2"].relay == pytest.approx(3e-3) and rows["n2"].openvino == pytest.approx(0.5e-3)  # by output
    assert rows["n3"].relay == pytest.approx(2e-3) and rows["n3"].openvino == pytest.approx(2e-3)
    assert rows["n4"].relay == pytest.approx(4e-3) and rows["n4"].relay_calls == 3
    assert rows["n5"].openvino == pytest.approx(1.5e-3) and rows["n5"].relay == 0
    assert rows["layout_transform"].openvino == 0 and rows["n0_abcd_acdb_n2"].relay == 0
    assert "n1" not in rows  # neither engine spent time on it
    ordered = list(match_layers(nodes, relay, openvino))
    assert [row.gap for row in ordered] == sorted((row.gap for row in ordered), reverse=True)


def test_unknown_network_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["layers", "--model", "nosuchnet"])
    assert exit_info.value.code == 2
    assert "unknown network 'nosuchnet'" in capsys.readouterr().err


def test_a_small_network_layer_by_layer(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openvino")
    # every node: which ones come first depends on the timings
    assert main(["layers", "--model", "small_cnn", "--repeat", "2", "--top", "50"]) == 0
    out = capsys.readouterr().out
    assert "summed kernel time relay-tune" in out and "(Conv)" in out and "kind of layer" in out


def test_convolutions_are_summed_by_kernel_and_elementwise_kernels_by_kind() -> None:
    from experiments.layers import relay_conv_kind

    assert relay_conv_kind("contrib_conv2d_NCHWc_nchw8c+bias+relu 1x32x56x56x8 * 16x32x1x1x8x8 s1") == "conv 1x1"
    assert relay_conv_kind("multiply+bias+relu+contrib_conv2d_NCHWc_nchw8c 1x5x7x9x8 * 3x5x1x1x8x8 s1") == "conv 1x1"
    assert relay_conv_kind("depthwise_conv2d_NCHWc+bias 1x12x50x38x8 * 12x1x5x5x1x8 s1 p2") == "conv 5x5 dw"
    assert relay_conv_kind("conv2d_nchw+bias 1x272x14x14 * 272x1x3x3 s1 p1 g272") == "conv 3x3 dw"
    assert relay_conv_kind("winograd_output_transform+bias+relu 36x196x192") == "conv 3x3"
    assert relay_conv_kind("max_pool2d 1x96x54x54") == ""
    assert relay_kind("multiply+bias+relu 1x28x56x56x8 28x1x1x8") == "elementwise"
    # a 1x1 kernel passes over a depthwise node with as many outputs and takes the 1x1 node after it
    nodes = [OnnxNode("dw", "Conv", ("a",), 64 * 100, "conv 3x3 dw"),
             OnnxNode("pw", "Conv", ("b",), 64 * 100, "conv 1x1")]
    relay = [("contrib_conv2d_NCHWc_nchw8c+bias 1x8x10x10x8 * 8x8x1x1x8x8 s1", 64 * 100, 2e-3),
             ("depthwise_conv2d_NCHWc+bias 1x8x10x10x8 * 8x1x3x3x1x8 s1 p1", 64 * 100, 1e-3)]
    rows = {row.name.split(" ")[0]: row for row in match_layers(nodes, relay, [])}
    assert rows["pw"].relay == pytest.approx(2e-3) and rows["dw"].relay == pytest.approx(1e-3)
    assert rows["pw"].kind == "conv 1x1" and rows["dw"].kind == "conv 3x3 dw"
