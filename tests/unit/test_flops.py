"""FLOP counts against figures worked out by hand from the layer shapes."""

import pytest

from tftrain.flops import count_training_flops, layer_macs


def test_mnist_mlp_matches_hand_count():
    from tftrain.recipes.mnist import mlp

    count = count_training_flops(mlp())
    # Multiply-adds: 784*512 = 401,408; 512*512 = 262,144; 512*10 = 5,120.
    assert [layer.macs for layer in count.layers] == [401_408, 262_144, 5_120]
    assert count.forward == 2 * 668_672 == 1_337_344
    # Backward: weight gradients (= forward) plus input gradients of layers 2 and 3
    # (the first layer's input is the data): 2 * (262,144 + 5,120) = 534,528.
    assert count.backward == 1_337_344 + 534_528
    assert count.training == 3_209_216
    assert [layer.input_gradient for layer in count.layers] == [False, True, True]


def test_mnist_cnn_matches_hand_count():
    from tftrain.recipes.mnist import cnn

    count = count_training_flops(cnn())
    # conv 3x3x1->32 on 28x28 (valid): 26*26*32*9 = 194,688
    # conv 3x3x32->64 on 13x13 (valid): 11*11*64*288 = 2,230,272
    # dense 5*5*64 = 1,600 -> 10: 16,000
    assert [layer.macs for layer in count.layers] == [194_688, 2_230_272, 16_000]
    assert count.forward == 2 * 2_440_960
    assert count.backward == 2 * 2_440_960 + 2 * (2_230_272 + 16_000)
    assert count.training == 14_256_384
    assert count.to_dict()["training"] == count.training


def test_strided_same_padding_conv_and_dense_on_sequences():
    import keras

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(4, 3, strides=2, padding="same", name="conv")(inputs)  # -> 4x4x4
    x = keras.layers.Reshape((16, 4))(x)
    x = keras.layers.Dense(7, name="dense")(x)  # 16 rows of 4 -> 7
    model = keras.Model(inputs, x)
    assert layer_macs(model.get_layer("conv")) == 4 * 4 * 4 * (3 * 3 * 3)
    assert layer_macs(model.get_layer("dense")) == 16 * 4 * 7
    assert layer_macs(model.layers[2]) is None  # Reshape: no matrix work


def test_depthwise_and_separable_convs():
    import keras

    inputs = keras.Input((6, 6, 2))
    x = keras.layers.DepthwiseConv2D(3, depth_multiplier=2, name="dw")(inputs)  # -> 4x4x4
    x = keras.layers.SeparableConv2D(5, 3, name="sep")(x)  # -> 2x2x5
    model = keras.Model(inputs, x)
    assert layer_macs(model.get_layer("dw")) == 4 * 4 * (3 * 3 * 2 * 2)
    # depthwise 3x3 over 4 channels (multiplier 1) + pointwise 4 -> 5, at each of 2x2 positions.
    assert layer_macs(model.get_layer("sep")) == 2 * 2 * (3 * 3 * 4 + 4 * 5)


def test_unknown_dimensions_are_an_error():
    import keras

    inputs = keras.Input((None, 4))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    with pytest.raises(ValueError, match="unknown dimensions"):
        count_training_flops(model)
