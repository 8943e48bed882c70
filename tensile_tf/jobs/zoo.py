"""Small Keras models for examples, tests and benchmarks (builders for YAML
``model: {builder: "tensile_tf.jobs.zoo:NAME"}``). Each takes ``input_shape`` and
``classes`` and returns an uncompiled keras.Model ending in a softmax."""
from __future__ import annotations

import keras
from keras import layers


def mlp(input_shape=(784,), classes=10, hidden=(256, 128)):
    """A multilayer perceptron."""
    x = inputs = keras.Input(tuple(input_shape))
    if len(input_shape) > 1:
        x = layers.Flatten()(x)
    for width in hidden:
        x = layers.Dense(width, activation="relu")(x)
    return keras.Model(inputs, layers.Dense(classes, activation="softmax")(x), name="mlp")


def small_cnn(input_shape=(32, 32, 3), classes=10, filters=(16, 32)):
    """Two conv blocks and a dense head."""
    x = inputs = keras.Input(tuple(input_shape))
    for f in filters:
        x = layers.Conv2D(f, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    return keras.Model(inputs, layers.Dense(classes, activation="softmax")(x), name="small_cnn")


def residual_net(input_shape=(32, 32, 3), classes=10, filters=32, blocks=2):
    """Conv stem plus residual blocks with batch norm (a miniature ResNet)."""
    x = inputs = keras.Input(tuple(input_shape))
    x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    for _ in range(blocks):
        y = layers.Conv2D(filters, 3, padding="same")(x)
        y = layers.BatchNormalization()(y)
        y = layers.Activation("relu")(y)
        y = layers.Conv2D(filters, 3, padding="same")(y)
        y = layers.BatchNormalization()(y)
        x = layers.Activation("relu")(layers.Add()([x, y]))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(classes, activation="softmax")(x), name="residual_net")


def transformer_encoder(input_shape=(64, 128), classes=10, heads=4, layers_count=2, ff_dim=256):
    """A stack of Transformer encoder blocks over (sequence, features) inputs."""
    seq_len, d_model = input_shape
    x = inputs = keras.Input((seq_len, d_model))
    for _ in range(layers_count):
        attn = layers.MultiHeadAttention(num_heads=heads, key_dim=d_model // heads)(x, x)
        x = layers.LayerNormalization()(layers.Add()([x, attn]))
        ff = layers.Dense(ff_dim, activation="relu")(x)
        ff = layers.Dense(d_model)(ff)
        x = layers.LayerNormalization()(layers.Add()([x, ff]))
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(classes, activation="softmax")(x), name="transformer_encoder")
