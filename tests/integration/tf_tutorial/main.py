# Copyright 2019 The TensorFlow Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
# https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#
# Source: TensorFlow tutorial "Multi-worker training with Keras",
#   https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras
#   (github.com/tensorflow/docs, site/en/tutorials/distribute/multi_worker_with_keras.ipynb
#   at commit 7c3650212740204359d4ceae481abc79345541be), its `%%writefile main.py` cell.
# Changed by tftrain: the strategy line builds tftrain.runtime.KerasMultiWorkerMirroredStrategy
#   (Keras 3's model.fit fails under the plain strategy, keras-team/keras#20585), and
#   `import tftrain.runtime` is added; nothing else. The original cell is main.py.orig.

import os
import json

import tensorflow as tf
import mnist_setup
import tftrain.runtime

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tftrain.runtime.KerasMultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()


multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)
