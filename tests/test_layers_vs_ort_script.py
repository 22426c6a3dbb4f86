"""experiments/layers_vs_ort.py: our tasks and onnxruntime's profiled nodes meet under one layer name."""

from __future__ import annotations

from tests.experiment_scripts import load_experiment

layers = load_experiment("layers_vs_ort")


def test_a_convolution_gets_the_same_name_on_both_sides() -> None:
    ort_node = {"op_name": "Conv", "input_type_shape": [{"float": [1, 256, 56, 56]}, {"float": [512, 256, 1, 1]},
                                                        {"float": [512]}],
                "output_type_shape": [{"float": [1, 512, 28, 28]}]}
    ours = layers.our_layer("conv2d_nchw+bias 1x256x56x56 * 512x256x1x1 s2 p0")
    assert ours == layers.ort_layer(ort_node) == "conv 256x56x56 -> 512 1x1 out 28"
    # a padded 3x3 and the 7x7 stem: the output width comes from stride and padding
    assert layers.our_layer("conv2d_nchw+bias+relu 1x64x56x56 * 64x64x3x3 s1 p1") == "conv 64x56x56 -> 64 3x3 out 56"
    assert layers.our_layer("conv2d_nchw+bias+relu 1x3x224x224 * 64x3x7x7 s2 p3") == \
        "conv 3x224x224 -> 64 7x7 out 112"
    # residual and plain epilogues are one layer; other operators keep their own names
    assert layers.our_layer("conv2d_nchw+bias+add+relu 1x64x56x56 * 256x64x1x1 s1 p0") == \
        layers.our_layer("conv2d_nchw+bias 1x64x56x56 * 256x64x1x1 s1 p0")
    assert layers.our_layer("max_pool2d 1x64x112x112") == "max_pool2d 1x64x112x112"
    assert layers.ort_layer({"op_name": "MaxPool", "input_type_shape": [{"float": [1, 64, 112, 112]}]}) == \
        "MaxPool (1, 64, 112, 112)"
