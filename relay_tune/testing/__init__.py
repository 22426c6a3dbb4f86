"""Models and helpers for tests and benchmarks that need nothing beside the project.

`relay_tune.testing.zoo` builds well-known networks (ResNet, MobileNet, SqueezeNet, Inception and DenseNet blocks,
an LSTM, a DCGAN generator, a BERT encoder layer) as Relay modules with seeded random parameters, at a small size
for tests and at their real size for benchmarks. `relay_tune.testing.onnx_zoo` builds the ONNX networks the
benchmarks compare against onnxruntime (and two small ones); `relay_tune.testing.blocked_conv` a convolution layer
on channel-blocked layouts; `relay_tune.testing.fuzz` runs the fuzz campaign. Small tunable tasks for the tuning
machinery itself live in `relay_tune.tuning.testing`.
"""

from relay_tune.testing import zoo

__all__ = ["zoo"]
