import keras
import numpy as np
import pytest

from tests.conftest import run_python
from tftrain.runtime import precision as prec
from tftrain.runtime.devices import DeviceInfo

CPU = DeviceInfo("cpu", ("/device:CPU:0",))


def gpu(*caps):
    return DeviceInfo("gpu", tuple(f"/device:GPU:{i}" for i in range(len(caps))), compute_capabilities=caps)


@pytest.mark.parametrize(
    "devices, bf16, expected",
    [
        (gpu((8, 0)), False, "mixed_float16"),
        (gpu((7, 0), (8, 6)), False, "mixed_float16"),
        (gpu((6, 1)), False, "float32"),
        (gpu((8, 0), (6, 0)), False, "float32"),
        (CPU, False, "float32"),
        (CPU, True, "mixed_bfloat16"),
    ],
)
def test_auto_choice(devices, bf16, expected):
    assert prec.resolve_precision("auto", devices, native_bf16=bf16) == expected


def test_explicit_names_pass_through_and_bad_name_fails():
    assert prec.resolve_precision("mixed_bfloat16", CPU) == "mixed_bfloat16"
    with pytest.raises(ValueError, match="Invalid precision 'fp16'"):
        prec.resolve_precision("fp16", CPU)


def test_cpu_flags_detection(tmp_path):
    with_bf16 = tmp_path / "a"
    with_bf16.write_text("processor: 0\nflags\t\t: fpu avx2 avx512_bf16 fma\n")
    without = tmp_path / "b"
    without.write_text("processor: 0\nflags\t\t: fpu avx2 fma\n")
    assert prec.cpu_has_native_bf16(str(with_bf16))
    assert not prec.cpu_has_native_bf16(str(without))
    assert not prec.cpu_has_native_bf16(str(tmp_path / "missing"))


def test_set_and_restore_policy_records_loss_scaling():
    before = keras.mixed_precision.global_policy().name
    with prec.precision_policy("mixed_bfloat16", CPU) as info:
        assert info.policy == "mixed_bfloat16" and info.compute_dtype == "bfloat16"
        assert not info.loss_scaling
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
    assert keras.mixed_precision.global_policy().name == before


def test_mixed_float16_on_cpu_warns():
    with pytest.warns(UserWarning, match="slow"):
        with prec.precision_policy("mixed_float16", CPU) as info:
            assert info.loss_scaling and info.variable_dtype == "float32"


def test_mixed_float16_compile_wraps_optimizer_in_loss_scaling():
    with pytest.warns(UserWarning):
        with prec.precision_policy("mixed_float16", CPU):
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            model.compile(optimizer="adam", loss="mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_ensure_float32_outputs_wraps_low_precision_outputs():
    with prec.precision_policy("mixed_bfloat16", CPU):
        inputs = keras.Input((4,))
        model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
        assert str(model.outputs[0].dtype) == "bfloat16"
        fixed = prec.ensure_float32_outputs(model)
    assert str(fixed.outputs[0].dtype) == "float32"
    assert fixed.count_params() == model.count_params()
    out = fixed.predict(np.ones((2, 4), "float32"), verbose=0)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"


@pytest.mark.parametrize("kind", ["sequential", "list_of_one"])
def test_ensure_float32_outputs_keeps_the_output_structure(kind):
    with prec.precision_policy("mixed_bfloat16", CPU):
        if kind == "sequential":  # has `outputs` but no `output` until called (Keras 3.15)
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        else:
            inputs = keras.Input((4,))
            model = keras.Model(inputs, [keras.layers.Dense(3)(inputs)])
        fixed = prec.ensure_float32_outputs(model)
    assert isinstance(fixed.output, list) == (kind == "list_of_one")
    assert [str(o.dtype) for o in fixed.outputs] == ["float32"]
    out = fixed.predict(np.ones((2, 4), "float32"), verbose=0)
    assert keras.backend.standardize_dtype((out[0] if isinstance(out, list) else out).dtype) == "float32"


def test_ensure_float32_outputs_keeps_float32_model():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    assert prec.ensure_float32_outputs(model) is model


def test_ensure_float32_outputs_rejects_unbuilt_subclassed_model():
    class Net(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(ValueError, match="dtype='float32'"):
        prec.ensure_float32_outputs(Net())


def test_ensure_float32_outputs_keeps_output_names_for_a_loss_dict():
    with prec.precision_policy("mixed_bfloat16", CPU):
        inputs = keras.Input((4,))
        model = keras.Model(inputs, [keras.layers.Dense(1, name="a")(inputs), keras.layers.Dense(2, name="b")(inputs)])
        fixed = prec.ensure_float32_outputs(model)
        fixed.compile("sgd", loss={"a": "mse", "b": "mse"})
        x = np.ones((8, 4), "float32")
        history = fixed.fit(x, {"a": np.ones((8, 1)), "b": np.ones((8, 2))}, epochs=1, verbose=0)
    assert fixed.output_names == ["a", "b"] and "a_loss" in history.history


def test_ensure_float32_outputs_keeps_a_dict_of_outputs_and_a_dict_of_inputs():
    # A dict of outputs keyed unlike its layers (the loss dict's keys); the sweep of 2026-12-03 found it failing
    # "Expected keys ['cls_layer', 'reg_layer'] in loss dict" under every mixed policy, where plain Keras trains it.
    with prec.precision_policy("mixed_bfloat16", CPU):
        a, b = keras.Input((3,), name="a"), keras.Input((1,), name="b")
        hidden = keras.layers.Concatenate()([a, b])
        model = keras.Model({"a": a, "b": b}, {"cls": keras.layers.Dense(2, activation="softmax", name="cls_layer")(
            hidden), "reg": keras.layers.Dense(1, name="reg_layer")(hidden)})
        fixed = prec.ensure_float32_outputs(model)
        fixed.compile("sgd", loss={"cls": "sparse_categorical_crossentropy", "reg": "mse"})
        x = {"a": np.ones((8, 3), "float32"), "b": np.ones((8, 1), "float32")}
        history = fixed.fit(x, {"cls": np.zeros((8,), "int64"), "reg": np.ones((8, 1))}, epochs=1, verbose=0)
    assert isinstance(fixed.output, dict) and {k: str(v.dtype) for k, v in fixed.output.items()} == \
        {"cls": "float32", "reg": "float32"}
    assert {"cls_loss", "reg_loss"} <= set(history.history)


def test_the_remapper_tftrain_turned_off_is_turned_on_again():
    import tensorflow as tf

    from tftrain.runtime import core

    core.unfuse_float16_on_cpu()
    assert tf.config.optimizer.get_experimental_options()["remapping"] is False
    core._restore_remapper()  # what setup does for any other precision
    assert tf.config.optimizer.get_experimental_options()["remapping"] is True and not core._REMAPPER_OFF


@pytest.mark.parametrize("policy,remapping", [("mixed_float16", "False"), ("float32", "None")])
@pytest.mark.slow
def test_setup_turns_the_remapper_off_for_float16_on_a_cpu_only(policy, remapping):
    # Grappler fuses MatMul + BiasAdd into oneDNN's float16 kernel, 700x slower on an AVX512-FP16 Xeon.
    r = run_python("from tftrain import runtime\nfrom tftrain.config import RuntimeConfig\nimport tensorflow as tf\n"
                   f"runtime.setup(RuntimeConfig(precision={policy!r}, device='cpu'))\n"
                   "print('RESULT', tf.config.optimizer.get_experimental_options().get('remapping'))")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"RESULT {remapping}" in r.stdout


def test_bfloat16_is_timed_only_where_its_largest_gain_repays_the_timing():
    gain = 1 - 1 / prec.BF16_MAX_SPEEDUP  # the most a step can save under mixed_bfloat16
    probe_s, step_s = 0.7, 1e-3
    steps_to_repay = probe_s / (gain * step_s)
    assert prec.bfloat16_repays(step_s, probe_s, int(steps_to_repay) + 2)
    assert not prec.bfloat16_repays(step_s, probe_s, int(steps_to_repay) - 2)
    assert prec.bfloat16_repays(step_s, probe_s, None)  # an epoch of unknown length: timed


def test_a_dtype_mismatch_names_the_mixed_dtype_and_float32_on_one_line():
    import tensorflow as tf

    clash = TypeError("Exception encountered when calling Scale.call().\n\nInput 'y' of 'Mul' Op has type "
                      "float32 that does not match type bfloat16 of argument 'x'.")
    eager = tf.errors.InvalidArgumentError(None, None, "cannot compute Mul as input #1(zero-based) was expected "
                                           "to be a half tensor but is a float tensor [Op:Mul]")
    assert prec.is_dtype_mismatch(clash, "bfloat16") and prec.is_dtype_mismatch(eager, "float16")
    assert not prec.is_dtype_mismatch(clash, "float16")
    xla = tf.errors.InternalError(None, None, "Seen floating point types of different precisions in %ReluGrad.27 = "
                                  "f32[8,16,16,4]{3,2,1,0} relu-grad(f32[8,16,16,4]{3,2,1,0} %a, "
                                  "bf16[8,16,16,4]{3,2,1,0} %b), but mixed precision is disallowed.")  # keras#20931
    assert prec.is_dtype_mismatch(xla, "bfloat16") and not prec.is_dtype_mismatch(xla, "float16")
    oom = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor with shape[512] and type "
                                           "bfloat16 (float32 master weights)")
    footer = ValueError("Invalid reshape.\nArguments received by Dense.call():\n  • inputs=tf.Tensor(shape=(8, 4), "
                        "dtype=bfloat16)")
    assert not prec.is_dtype_mismatch(oom, "bfloat16") and not prec.is_dtype_mismatch(footer, "bfloat16")
