"""A model zoo: well-known networks as type-checked Relay modules with seeded random parameters.

Every builder takes its sizes as keyword arguments, so one function gives both the real network for benchmarks
(`resnet(50)`: 224x224, 64 base channels, 1000 classes) and a small one for tests (`resnet(18, image=32, width=8,
num_classes=10)`). `MODELS` names each network with the arguments of both sizes; `small(name)` and `full(name)`
build them, `write(mod, path)` saves one as Relay text with a parameter file beside it.

Parameters are random but at the scale of a trained network, so that activations stay O(1) through any depth and a
comparison against the reference interpreter means something (a network whose activations vanish compares zeros
with zeros; one whose activations explode compares rounding noise): weights are He-initialised (variance 2/fan_in
in front of a ReLU, 1/fan_in elsewhere); the running mean and variance of every batch norm are those of the values
that reach it (estimated while the model is built, by propagating the mean and variance of N(0, 1) inputs layer by
layer), so each batch norm really normalises, as in a trained network; and the last batch norm of a residual branch
has a small scale (as trained residual networks have), so that a deep stack of residual blocks grows slowly.

The modules are built with the IR constructors directly (`Call`, `Var`, `Constant`, ...), type-checked with
`infer_types`, and print to Relay text that parses back to the same module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from relay_tune.frontend.params import params_path, save_params
from relay_tune.ir import Call, Constant, Expr, Function, IRModule, TensorType, Tuple, TupleGetItem, Var, op
from relay_tune.op.registry import get_op
from relay_tune.text import print_module
from relay_tune.type_infer import infer_types

DTYPE = "float32"


class _Builder:
    """Makes calls and seeded parameters; one per model, so a model's parameters depend only on its seed."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        # Estimated mean and variance of the values of the expressions built so far (by id; the expression is
        # kept alive beside them), for model inputs drawn from N(0, 1), propagated layer by layer as if every
        # tensor were Gaussian. Batch norms take their statistics from it, as a trained network's running
        # statistics come from the data that really reaches them.
        self._moments: dict[int, tuple[Expr, float, float]] = {}

    def moments(self, x: Expr) -> tuple[float, float]:
        _, mean, var = self._moments.get(id(x), (x, 0.0, 1.0))
        return mean, var

    def mean_square(self, x: Expr) -> float:
        mean, var = self.moments(x)
        return mean * mean + var

    def track(self, x: Expr, mean: float, var: float) -> Expr:
        self._moments[id(x)] = (x, mean, max(var, 1e-6))
        return x

    # --- plumbing -------------------------------------------------------------------------------
    @staticmethod
    def call(name: str, *args: Expr, **attrs: Any) -> Call:
        return Call(op(name), tuple(args), get_op(name).make_attrs(attrs))

    @staticmethod
    def scalar(value: float) -> Constant:
        return Constant(np.asarray(value, dtype=DTYPE))

    def normal(self, shape: Sequence[int], std: float, mean: float = 0.0) -> Constant:
        return Constant((self.rng.standard_normal(tuple(shape)) * std + mean).astype(DTYPE))

    def uniform(self, shape: Sequence[int], low: float, high: float) -> Constant:
        return Constant(self.rng.uniform(low, high, tuple(shape)).astype(DTYPE))

    def he(self, shape: Sequence[int], fan_in: int, gain: float = 2.0) -> Constant:
        """He (Kaiming) normal initialisation: variance gain/fan_in keeps the output variance that of the input
        (gain 2 in front of a ReLU, which zeroes half of its input; 1 for a linear layer)."""
        return self.normal(shape, math.sqrt(gain / fan_in))

    # --- layers ---------------------------------------------------------------------------------
    def conv(
        self, x: Expr, in_channels: int, channels: int, kernel: int, stride: int = 1, padding: int | None = None,
        groups: int = 1, gain: float = 2.0, bias: bool = False,
    ) -> Expr:
        pad = kernel // 2 if padding is None else padding
        fan_in = in_channels // groups * kernel * kernel
        weight = self.he((channels, in_channels // groups, kernel, kernel), fan_in, gain)
        y = self.call(
            "nn.conv2d", x, weight, strides=(stride, stride), padding=(pad, pad, pad, pad), groups=groups,
            channels=channels, kernel_size=(kernel, kernel),
        )
        # each output sums fan_in products w*x: variance fan_in * (gain/fan_in) * E[x^2]
        variance = gain * self.mean_square(x)
        if bias:
            y = self.call("nn.bias_add", y, self.normal((channels,), 0.05), axis=1)
            variance += 0.05**2
        return self.track(y, 0.0, variance)

    def batch_norm(self, x: Expr, channels: int, scale: float = 1.0, axis: int = 1) -> Expr:
        """Inference batch norm whose running statistics are near the estimated moments of `x`, and whose output
        has variance about `scale`^2."""
        mu, sigma2 = self.moments(x)
        gamma = self.uniform((channels,), 0.8 * scale, 1.2 * scale)
        beta = self.normal((channels,), 0.1)
        mean = self.normal((channels,), 0.1 * math.sqrt(sigma2), mu)
        var = self.uniform((channels,), 0.8 * sigma2, 1.2 * sigma2)
        y = TupleGetItem(self.call("nn.batch_norm", x, gamma, beta, mean, var, axis=axis, epsilon=1e-5), 0)
        return self.track(y, 0.0, scale * scale)

    def _rectified(self, x: Expr, y: Expr) -> Expr:
        """Track `y = max(x, 0)`: the moments of a rectified Gaussian N(mu, s^2)."""
        mu, var = self.moments(x)
        s = math.sqrt(var)
        a = mu / s
        cdf, pdf = 0.5 * (1 + math.erf(a / math.sqrt(2))), math.exp(-a * a / 2) / math.sqrt(2 * math.pi)
        mean = mu * cdf + s * pdf
        square = (mu * mu + var) * cdf + mu * s * pdf
        return self.track(y, mean, square - mean * mean)

    def relu(self, x: Expr) -> Expr:
        return self._rectified(x, self.call("nn.relu", x))

    def relu6(self, x: Expr) -> Expr:  # the clip at 6 is rare for O(1) values: moments as a ReLU's
        return self._rectified(x, self.call("clip", x, a_min=0.0, a_max=6.0))

    def add(self, x: Expr, y: Expr) -> Expr:
        (mx, vx), (my, vy) = self.moments(x), self.moments(y)
        return self.track(self.call("add", x, y), mx + my, vx + vy)

    def concatenate(self, parts: Sequence[Expr], channels: Sequence[int]) -> Expr:
        """Concatenation along axis 1 of parts with the given channel counts."""
        total = sum(channels)
        mean = sum(self.moments(p)[0] * c for p, c in zip(parts, channels)) / total
        square = sum(self.mean_square(p) * c for p, c in zip(parts, channels)) / total
        return self.track(self.call("concatenate", Tuple(tuple(parts)), axis=1), mean, square - mean * mean)

    def pool(self, x: Expr, name: str, **attrs: Any) -> Expr:  # moments kept (a max pool raises them a little)
        return self.track(self.call(name, x, **attrs), *self.moments(x))

    def conv_bn(self, x: Expr, in_channels: int, channels: int, kernel: int, stride: int = 1, groups: int = 1,
                act: str | None = "relu", bn_scale: float = 1.0) -> Expr:
        y = self.batch_norm(self.conv(x, in_channels, channels, kernel, stride, groups=groups), channels, bn_scale)
        if act == "relu":
            return self.relu(y)
        if act == "relu6":
            return self.relu6(y)
        return y

    def dense(self, x: Expr, in_features: int, units: int, bias: bool = True, gain: float = 1.0) -> Expr:
        y: Expr = self.call("nn.dense", x, self.he((units, in_features), in_features, gain), units=units)
        if bias:
            y = self.call("nn.bias_add", y, self.normal((units,), 0.05), axis=-1)
        return y

    def classifier(self, x: Expr, channels: int, num_classes: int) -> Expr:
        pooled = self.call("nn.global_avg_pool2d", x)
        return self.dense(self.call("nn.batch_flatten", pooled), channels, num_classes)

    @staticmethod
    def module(params: Sequence[Var], body: Expr) -> IRModule:
        return infer_types(IRModule({"main": Function(tuple(params), body)}))


def _input(name: str, *shape: int) -> Var:
    return Var(name, TensorType(tuple(shape), DTYPE))


def _scaled(channels: int, scale: float) -> int:
    return max(1, round(channels * scale))


# ---------------------------------------------------------------------------------------------------------------
# ResNet
# ---------------------------------------------------------------------------------------------------------------

_RESNET_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}


def resnet(
    depth: int = 50, *, image: int = 224, width: int = 64, num_classes: int = 1000, batch: int = 1, seed: int = 0
) -> IRModule:
    """ResNet v1 (He et al. 2015): basic blocks for depth 18/34, bottlenecks (expansion 4) for 50/101/152.

    `width` is the channel count of the stem and first stage (64 in the paper); stages double it.
    """
    if depth not in _RESNET_BLOCKS:
        raise ValueError(f"ResNet depth must be one of {sorted(_RESNET_BLOCKS)}, got {depth}")
    b = _Builder(seed)
    data = _input("data", batch, 3, image, image)
    x = b.conv_bn(data, 3, width, 7, stride=2)
    x = b.pool(x, "nn.max_pool2d", pool_size=(3, 3), strides=(2, 2), padding=(1, 1, 1, 1))
    bottleneck = depth >= 50
    expansion = 4 if bottleneck else 1
    channels = width
    for stage, blocks in enumerate(_RESNET_BLOCKS[depth]):
        planes = width * 2**stage
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            out_channels = planes * expansion
            if bottleneck:
                y = b.conv_bn(x, channels, planes, 1)
                y = b.conv_bn(y, planes, planes, 3, stride)
                y = b.conv_bn(y, planes, out_channels, 1, act=None, bn_scale=0.5)
            else:
                y = b.conv_bn(x, channels, planes, 3, stride)
                y = b.conv_bn(y, planes, planes, 3, act=None, bn_scale=0.5)
            shortcut = x
            if stride != 1 or channels != out_channels:
                shortcut = b.conv_bn(x, channels, out_channels, 1, stride, act=None)
            x = b.relu(b.add(y, shortcut))
            channels = out_channels
    return b.module([data], b.classifier(x, channels, num_classes))


# ---------------------------------------------------------------------------------------------------------------
# MobileNet
# ---------------------------------------------------------------------------------------------------------------

# v1: (output channels as a multiple of the stem's 32, stride) of each depthwise-separable block
_MOBILENET_V1 = [(2, 1), (4, 2), (4, 1), (8, 2), (8, 1), (16, 2)] + [(16, 1)] * 5 + [(32, 2), (32, 1)]
# v2: (expansion t, output channels c at width 32, repeats n, first stride s) of each inverted-residual stage
_MOBILENET_V2 = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                 (6, 320, 1, 1)]


def mobilenet(
    version: int = 1, *, image: int = 224, width: int = 32, num_classes: int = 1000, batch: int = 1, seed: int = 0
) -> IRModule:
    """MobileNet v1 (depthwise-separable convolutions) or v2 (inverted residuals with linear bottlenecks, ReLU6).

    `width` is the channel count of the stem convolution (32 in both papers); every layer scales with it.
    """
    if version not in (1, 2):
        raise ValueError(f"MobileNet version must be 1 or 2, got {version}")
    b = _Builder(seed)
    data = _input("data", batch, 3, image, image)
    scale = width / 32
    act = "relu" if version == 1 else "relu6"
    x = b.conv_bn(data, 3, width, 3, stride=2, act=act)
    channels = width
    if version == 1:
        for multiple, stride in _MOBILENET_V1:
            out_channels = width * multiple
            x = b.conv_bn(x, channels, channels, 3, stride, groups=channels)  # depthwise
            x = b.conv_bn(x, channels, out_channels, 1)  # pointwise
            channels = out_channels
    else:
        for t, c, n, s in _MOBILENET_V2:
            out_channels = _scaled(c, scale)
            for i in range(n):
                stride = s if i == 0 else 1
                hidden = channels * t
                y = x if t == 1 else b.conv_bn(x, channels, hidden, 1, act=act)
                y = b.conv_bn(y, hidden, hidden, 3, stride, groups=hidden, act=act)
                y = b.conv_bn(y, hidden, out_channels, 1, act=None, bn_scale=0.5 if stride == 1 else 1.0)
                x = b.add(x, y) if stride == 1 and channels == out_channels else y
                channels = out_channels
        last = _scaled(1280, max(scale, 1.0))  # the paper widens the last layer but never narrows it
        x = b.conv_bn(x, channels, last, 1, act=act)
        channels = last
    return b.module([data], b.classifier(x, channels, num_classes))


# ---------------------------------------------------------------------------------------------------------------
# SqueezeNet 1.1
# ---------------------------------------------------------------------------------------------------------------


def squeezenet(*, image: int = 224, width: int = 64, num_classes: int = 1000, batch: int = 1,
               seed: int = 0) -> IRModule:
    """SqueezeNet 1.1 (Iandola et al. 2016): fire modules (1x1 squeeze, concatenated 1x1 and 3x3 expands),
    convolutions with biases and no batch norm, a 1x1 convolution as classifier. `width` is the stem's channel
    count (64)."""
    b = _Builder(seed)
    data = _input("data", batch, 3, image, image)
    scale = width / 64

    def pool(x: Expr) -> Expr:
        return b.pool(x, "nn.max_pool2d", pool_size=(3, 3), strides=(2, 2), ceil_mode=True)

    def fire(x: Expr, in_channels: int, squeeze: int, expand: int) -> tuple[Expr, int]:
        s, e = _scaled(squeeze, scale), _scaled(expand, scale)
        y = b.relu(b.conv(x, in_channels, s, 1, bias=True))
        left = b.relu(b.conv(y, s, e, 1, bias=True))
        right = b.relu(b.conv(y, s, e, 3, bias=True))
        return b.concatenate((left, right), (e, e)), 2 * e

    x = pool(b.relu(b.conv(data, 3, width, 3, stride=2, padding=0, bias=True)))
    channels = width
    for i, (squeeze, expand) in enumerate([(16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192),
                                           (64, 256), (64, 256)]):
        x, channels = fire(x, channels, squeeze, expand)
        if i in (1, 3):
            x = pool(x)
    x = b.relu(b.conv(x, channels, num_classes, 1, bias=True))
    return b.module([data], b.call("nn.batch_flatten", b.call("nn.global_avg_pool2d", x)))


# ---------------------------------------------------------------------------------------------------------------
# Inception and DenseNet blocks
# ---------------------------------------------------------------------------------------------------------------


def inception_block(*, image: int = 35, in_channels: int = 192, width: int = 64, pool_features: int = 32,
                    batch: int = 1, seed: int = 0) -> IRModule:
    """Inception v3's first mixed block (Szegedy et al. 2015, "Mixed_5b"): 1x1, 1x1->5x5, 1x1->3x3->3x3 and
    average pool->1x1 branches, concatenated. `width` is the 1x1 branch's channel count (64); the others scale."""
    b = _Builder(seed)
    data = _input("data", batch, in_channels, image, image)
    scale = width / 64
    c48, c64, c96 = _scaled(48, scale), width, _scaled(96, scale)
    branch1 = b.conv_bn(data, in_channels, c64, 1)
    branch5 = b.conv_bn(b.conv_bn(data, in_channels, c48, 1), c48, c64, 5)
    branch3 = b.conv_bn(b.conv_bn(b.conv_bn(data, in_channels, c64, 1), c64, c96, 3), c96, c96, 3)
    pooled = b.pool(data, "nn.avg_pool2d", pool_size=(3, 3), padding=(1, 1, 1, 1), count_include_pad=False)
    branch_pool = b.conv_bn(pooled, in_channels, pool_features, 1)
    out = b.concatenate((branch1, branch5, branch3, branch_pool), (c64, c64, c96, pool_features))
    return b.module([data], out)


def densenet_block(*, image: int = 56, in_channels: int = 64, layers: int = 6, growth: int = 32,
                   bn_size: int = 4, batch: int = 1, seed: int = 0) -> IRModule:
    """DenseNet-121's first dense block and transition (Huang et al. 2016): each layer is BN-ReLU-1x1 conv
    (bn_size * growth channels)-BN-ReLU-3x3 conv (growth channels) over the concatenation of all earlier
    outputs; the transition halves channels (BN-ReLU-1x1 conv) and resolution (2x2 average pool)."""
    b = _Builder(seed)
    data = _input("data", batch, in_channels, image, image)
    features: list[Expr] = [data]
    widths = [in_channels]
    channels = in_channels
    for _ in range(layers):
        x = features[0] if len(features) == 1 else b.concatenate(features, widths)
        y = b.conv(b.relu(b.batch_norm(x, channels)), channels, bn_size * growth, 1)
        y = b.conv(b.relu(b.batch_norm(y, bn_size * growth)), bn_size * growth, growth, 3)
        features.append(y)
        widths.append(growth)
        channels += growth
    x = b.concatenate(features, widths)
    x = b.conv(b.relu(b.batch_norm(x, channels)), channels, channels // 2, 1)
    return b.module([data], b.call("nn.avg_pool2d", x, pool_size=(2, 2), strides=(2, 2)))


# ---------------------------------------------------------------------------------------------------------------
# LSTM
# ---------------------------------------------------------------------------------------------------------------


def lstm(*, steps: int = 10, input_size: int = 512, hidden: int = 512, batch: int = 1, seed: int = 0) -> IRModule:
    """One LSTM layer unrolled over `steps` time steps (PyTorch's gate order i, f, g, o and its uniform
    initialisation), zero initial state. Input (steps, batch, input_size); output every step's hidden state,
    (steps, batch, hidden)."""
    b = _Builder(seed)
    data = _input("data", steps, batch, input_size)
    bound = 1 / math.sqrt(hidden)
    w_ih = b.uniform((4 * hidden, input_size), -bound, bound)
    w_hh = b.uniform((4 * hidden, hidden), -bound, bound)
    bias = b.uniform((4 * hidden,), -bound, bound)
    inputs = b.call("split", data, indices_or_sections=steps, axis=0) if steps > 1 else None
    h: Expr | None = None
    c: Expr | None = None
    outputs: list[Expr] = []
    for t in range(steps):
        x_t = b.call("squeeze", TupleGetItem(inputs, t) if inputs is not None else data, axis=[0])
        gates: Expr = b.call("nn.dense", x_t, w_ih, units=4 * hidden)
        if h is not None:  # the zero initial state contributes nothing at the first step
            gates = b.call("add", gates, b.call("nn.dense", h, w_hh, units=4 * hidden))
        gates = b.call("nn.bias_add", gates, bias, axis=-1)
        parts = b.call("split", gates, indices_or_sections=4, axis=1)
        i, f, g, o = (TupleGetItem(parts, k) for k in range(4))
        i, f, o = (b.call("sigmoid", v) for v in (i, f, o))
        ig = b.call("multiply", i, b.call("tanh", g))
        c = ig if c is None else b.call("add", b.call("multiply", f, c), ig)
        h = b.call("multiply", o, b.call("tanh", c))
        outputs.append(h)
    return b.module([data], b.call("stack", Tuple(tuple(outputs)), axis=0))


# ---------------------------------------------------------------------------------------------------------------
# DCGAN generator
# ---------------------------------------------------------------------------------------------------------------


def dcgan(*, image: int = 64, nz: int = 100, ngf: int = 64, batch: int = 1, seed: int = 0) -> IRModule:
    """The DCGAN generator (Radford et al. 2015): a latent vector (batch, nz, 1, 1) through 4x4 transposed
    convolutions (stride 1 to 4x4, then stride 2 doubling the resolution), batch norm and ReLU, to a tanh image
    (batch, 3, image, image). `image` must be a power of two >= 8; `ngf` is the channel count before the last
    layer (64)."""
    ups = int(math.log2(image)) - 2
    if image < 8 or 2 ** (ups + 2) != image:
        raise ValueError(f"the DCGAN image size must be a power of two >= 8, got {image}")
    b = _Builder(seed)
    z = _input("z", batch, nz, 1, 1)

    def deconv(x: Expr, in_channels: int, channels: int, stride: int, padding: int, fan_in: int,
               gain: float) -> Expr:
        weight = b.he((in_channels, channels, 4, 4), fan_in, gain)  # IOHW
        y = b.call("nn.conv2d_transpose", x, weight, channels=channels, kernel_size=(4, 4),
                   strides=(stride, stride), padding=(padding, padding, padding, padding))
        return b.track(y, 0.0, gain * b.mean_square(x))

    channels = ngf * 2 ** (ups - 1)
    # a 1x1 input: each output pixel sees every input channel once
    x = b.relu(b.batch_norm(deconv(z, nz, channels, 1, 0, nz, 2.0), channels))
    for step in range(ups):
        last = step == ups - 1
        out_channels = 3 if last else channels // 2
        # stride 2, kernel 4: each output pixel sees (4/2)^2 taps of every input channel
        x = deconv(x, channels, out_channels, 2, 1, channels * 4, 1.0 if last else 2.0)
        x = b.call("tanh", x) if last else b.relu(b.batch_norm(x, out_channels))
        channels = out_channels
    return b.module([z], x)


# ---------------------------------------------------------------------------------------------------------------
# BERT encoder layer
# ---------------------------------------------------------------------------------------------------------------


def bert_layer(*, seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, batch: int = 1,
               seed: int = 0) -> IRModule:
    """One BERT-base encoder layer (Devlin et al. 2018): multi-head self-attention (batch_matmul, softmax),
    residual and layer norm, a GELU feed-forward network, residual and layer norm. Input and output
    (batch, seq, hidden)."""
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    b = _Builder(seed)
    dh = hidden // heads
    data = _input("data", batch, seq, hidden)
    rows = b.call("reshape", data, newshape=[batch * seq, hidden])

    def heads_first(x: Expr) -> Expr:  # (batch*seq, hidden) -> (batch*heads, seq, dh)
        x = b.call("reshape", x, newshape=[batch, seq, heads, dh])
        return b.call("reshape", b.call("transpose", x, axes=[0, 2, 1, 3]), newshape=[batch * heads, seq, dh])

    def layer_norm(x: Expr) -> Expr:
        gamma = b.uniform((hidden,), 0.9, 1.1)
        beta = b.normal((hidden,), 0.05)
        return b.call("nn.layer_norm", x, gamma, beta, axis=-1, epsilon=1e-12)

    q, k, v = (heads_first(b.dense(rows, hidden, hidden)) for _ in range(3))
    scores = b.call("nn.batch_matmul", q, k, transpose_b=True)  # q k^T
    scores = b.call("multiply", scores, b.scalar(1 / math.sqrt(dh)))
    probs = b.call("nn.softmax", scores, axis=-1)
    context = b.call("nn.batch_matmul", probs, v, transpose_b=False)  # (batch*heads, seq, dh)
    context = b.call("transpose", b.call("reshape", context, newshape=[batch, heads, seq, dh]), axes=[0, 2, 1, 3])
    context = b.call("reshape", context, newshape=[batch * seq, hidden])
    attended = layer_norm(b.call("add", b.dense(context, hidden, hidden), rows))
    up = b.dense(attended, hidden, ffn)
    # GELU, exactly: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
    erf = b.call("erf", b.call("multiply", up, b.scalar(1 / math.sqrt(2))))
    gelu = b.call("multiply", b.call("multiply", up, b.scalar(0.5)), b.call("add", erf, b.scalar(1.0)))
    out = layer_norm(b.call("add", b.dense(gelu, ffn, hidden), attended))
    return b.module([data], b.call("reshape", out, newshape=[batch, seq, hidden]))


# ---------------------------------------------------------------------------------------------------------------
# the registry
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ZooModel:
    """A network of the zoo: how to build it, and with which arguments at the test and the real size."""

    name: str
    make: Callable[..., IRModule]
    small_args: Mapping[str, Any] = field(default_factory=dict)
    full_args: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def build(self, size: str = "small", seed: int = 0) -> IRModule:
        if size not in ("small", "full"):
            raise ValueError(f"size must be 'small' or 'full', got {size!r}")
        return self.make(**(self.small_args if size == "small" else self.full_args), seed=seed)


def _partial(fn: Callable[..., IRModule], *args: Any) -> Callable[..., IRModule]:
    def make(**kwargs: Any) -> IRModule:
        return fn(*args, **kwargs)

    make.__name__ = fn.__name__
    return make


_ENTRIES = [
    ZooModel("resnet18", _partial(resnet, 18), {"image": 32, "width": 8, "num_classes": 10}, {},
             "ResNet-18, basic blocks"),
    ZooModel("resnet50", _partial(resnet, 50), {"image": 32, "width": 8, "num_classes": 10}, {},
             "ResNet-50 v1, bottleneck blocks"),
    ZooModel("mobilenet_v1", _partial(mobilenet, 1), {"image": 32, "width": 8, "num_classes": 10}, {},
             "MobileNet v1, depthwise-separable convolutions"),
    ZooModel("mobilenet_v2", _partial(mobilenet, 2), {"image": 32, "width": 8, "num_classes": 10}, {},
             "MobileNet v2, inverted residuals, ReLU6"),
    ZooModel("squeezenet1_1", squeezenet, {"image": 32, "width": 8, "num_classes": 10}, {},
             "SqueezeNet 1.1, fire modules"),
    ZooModel("inception_block", inception_block, {"image": 8, "in_channels": 16, "width": 8, "pool_features": 4},
             {}, "Inception v3 Mixed_5b block"),
    ZooModel("densenet_block", densenet_block, {"image": 8, "in_channels": 8, "layers": 3, "growth": 4}, {},
             "DenseNet-121 dense block 1 and transition"),
    ZooModel("lstm", lstm, {"steps": 3, "input_size": 8, "hidden": 16, "batch": 2}, {},
             "one LSTM layer unrolled over the time steps"),
    ZooModel("dcgan", dcgan, {"image": 16, "nz": 16, "ngf": 8}, {}, "DCGAN generator, transposed convolutions"),
    ZooModel("bert_layer", bert_layer, {"seq": 8, "hidden": 32, "heads": 2, "ffn": 64, "batch": 2}, {},
             "BERT-base encoder layer: attention, layer norm, GELU"),
]
MODELS: Mapping[str, ZooModel] = MappingProxyType({m.name: m for m in _ENTRIES})


def _entry(name: str) -> ZooModel:
    if name not in MODELS:
        raise KeyError(f"no zoo model {name!r}; the zoo has {', '.join(MODELS)}")
    return MODELS[name]


def small(name: str, seed: int = 0) -> IRModule:
    """The zoo model `name` at its test size (builds and runs in seconds)."""
    return _entry(name).build("small", seed)


def full(name: str, seed: int = 0) -> IRModule:
    """The zoo model `name` at its real size (ImageNet resolution, published widths)."""
    return _entry(name).build("full", seed)


def write(mod: IRModule, path: str | Path) -> Path:
    """Save `mod` as Relay text at `path` (`.relay`) with its weights in `<stem>.params.npz` beside it, which
    `relay_tune.text.load_module` and the command line read back exactly."""
    path = Path(path)
    constants: list[np.ndarray] = []
    path.write_text(print_module(mod, constants_out=constants))
    save_params(params_path(path), constants)
    return path
