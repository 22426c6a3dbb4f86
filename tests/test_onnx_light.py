"""The nine light models of the onnx package with random weights (`relay_tune.testing.onnx_light`)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from relay_tune.testing.onnx_light import LIGHT, light_folder, light_model

pytestmark = pytest.mark.skipif(not light_folder().is_dir(), reason="this onnx package ships no light models")


@pytest.mark.parametrize("name", LIGHT)
def test_every_weight_is_an_initializer_at_a_sane_scale(name: str) -> None:
    model = light_model(name)
    onnx.checker.check_model(model)
    assert not any(node.op_type == "ConstantOfShape" for node in model.graph.node)
    produced = {out for node in model.graph.node for out in node.output}
    available = produced | {i.name for i in model.graph.initializer} | {i.name for i in model.graph.input}
    assert all(name in available for node in model.graph.node for name in node.input if name)
    original = onnx.load(str(light_folder() / f"light_{name}.onnx"))
    filled = {node.output[0] for node in original.graph.node if node.op_type == "ConstantOfShape"}
    weights = [onnx.numpy_helper.to_array(init) for init in model.graph.initializer if init.name in filled]
    assert len(weights) == len(filled) and all(np.isfinite(w).all() and np.abs(w).max() < 10 for w in weights)
    assert len({i.name for i in model.graph.input} - {i.name for i in model.graph.initializer}) == 1


def test_weights_are_seeded() -> None:
    first, again, other = light_model("squeezenet"), light_model("squeezenet"), light_model("squeezenet", seed=1)
    assert first.SerializeToString() == again.SerializeToString() != other.SerializeToString()


def test_relay_tune_matches_onnxruntime_on_a_light_model() -> None:
    ort = pytest.importorskip("onnxruntime")
    import relay_tune
    from relay_tune.frontend import from_onnx

    model = light_model("squeezenet")
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, 224, 224)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    mod, _ = from_onnx(model)  # the weights are constants of the module
    got = relay_tune.build(mod).run(x)
    np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-4, atol=1e-6)


def test_an_unknown_name_lists_the_nine() -> None:
    with pytest.raises(KeyError, match="bvlc_alexnet"):
        light_model("lenet")
