"""benchmarks/deepcam_profile.py: convolution ops named and classed from TensorFlow's own profiler trace."""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import deepcam_profile  # noqa: E402  (a script beside the benchmarks, not a package)


def test_op_types_are_classed_as_forward_or_either_gradient_and_other_ops_are_left_out():
    assert deepcam_profile.kind_of("_MklNativeConv2D") == "forward"
    assert deepcam_profile.kind_of("_MklNativeConv2DBackpropFilterWithBias") == "weight_gradient"
    assert deepcam_profile.kind_of("Conv2DBackpropInput") == "input_gradient"
    assert deepcam_profile.kind_of("_MklNativeDepthwiseConv2dNativeBackpropFilter") == "depthwise_weight_gradient"
    assert deepcam_profile.kind_of("MatMul") is None


def test_an_op_name_gives_its_keras_layer():
    assert deepcam_profile.layer_of("gradient_tape/deepcam_1/aspp1_1/convolution/Conv2DBackpropFilter") == "aspp1"
    assert deepcam_profile.layer_of("deepcam_1/decoder_up_final_1/conv_transpose") == "decoder_up_final"


def test_a_traced_training_step_gives_each_conv_layer_its_forward_and_gradient_seconds(tmp_path):
    import keras
    import tensorflow as tf
    inputs = keras.Input((16, 16, 3))
    hidden = keras.layers.Conv2D(4, 3, padding="same", name="first")(inputs)
    outputs = keras.layers.Conv2D(2, 1, name="second")(hidden)
    model = keras.Model(inputs, outputs, name="tiny")

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        return loss + tf.add_n([tf.reduce_sum(g) for g in grads]) * 0.0

    x, y = tf.random.uniform((2, 16, 16, 3)), tf.random.uniform((2, 16, 16, 2))
    float(step(x, y))
    seconds, xspace = deepcam_profile.traced_step(step, x, y, str(tmp_path))
    table = deepcam_profile.conv_seconds(xspace)
    assert seconds > 0
    assert {"first", "second"} <= set(table), table
    assert {"forward", "weight_gradient"} <= set(table["first"]) and "forward" in table["second"]
    # The first layer's input needs no gradient; the second's input (the first's output) does.
    assert "input_gradient" not in table["first"] and "input_gradient" in table["second"]
    assert all(0 < s < seconds for kinds in table.values() for s in kinds.values())
