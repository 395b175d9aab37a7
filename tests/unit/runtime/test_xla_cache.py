"""`tftrain.runtime.xla_cache`: XLA's persistent compilation cache, turned on before TensorFlow starts."""

import os

import pytest

from tests.conftest import run_python
from tftrain.runtime import xla_cache


def test_enable_names_the_directory_in_tf_xla_flags_and_keeps_the_users_flags(tmp_path):
    env = {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2"}
    directory = xla_cache.enable(tmp_path / "xla", env=env)
    assert directory == tmp_path / "xla" and directory.is_dir()
    assert env["TF_XLA_FLAGS"] == f'--tf_xla_auto_jit=2 --tf_xla_persistent_cache_directory="{directory}"'
    users = {"TF_XLA_FLAGS": "--tf_xla_persistent_cache_directory=/elsewhere"}
    assert xla_cache.enable(tmp_path / "other", env=users) is None  # the user's own cache is kept
    assert users["TF_XLA_FLAGS"] == "--tf_xla_persistent_cache_directory=/elsewhere"
    assert not (tmp_path / "other").exists()


def test_prune_deletes_the_oldest_files_beyond_the_limit(tmp_path):
    for age, name in enumerate(["newest", "middle", "oldest"]):
        path = tmp_path / name
        path.write_bytes(b"x" * 100)
        os.utime(path, (1_000_000 - age, 1_000_000 - age))
    assert xla_cache.prune(tmp_path, max_bytes=250) == 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle", "newest"]
    assert xla_cache.prune(tmp_path, max_bytes=250) == 0


def test_the_key_differs_from_another_tensorflow_or_cpu(monkeypatch):
    from tftrain import host

    key = xla_cache.cache_key()
    assert key == xla_cache.cache_key() and len(key) == 16
    monkeypatch.setattr(host, "cpu_model", lambda *a: "another CPU")
    assert xla_cache.cache_key() != key


_COMPILE = """
import tensorflow as tf
from tftrain.config import RuntimeConfig
from tftrain.runtime.core import setup
setup(RuntimeConfig(device="cpu", precision="float32", execution="auto"))
f = tf.function(lambda x: tf.nn.relu(x @ x) + 1.0, jit_compile=True)
print(float(tf.reduce_sum(f(tf.ones((4, 4))))))
"""


@pytest.mark.slow
def test_setup_makes_tensorflow_keep_xla_executables_in_the_cache(tmp_path):
    cache = tmp_path / "a folder with spaces"  # the flag is quoted: TensorFlow splits TF_XLA_FLAGS on spaces
    done = run_python(_COMPILE, env={"TFTRAIN_CACHE_DIR": str(cache), "TF_XLA_FLAGS": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) == 16 * 5.0
    kept = list((cache / "xla").glob("*/*"))
    assert len(kept) == 1 and kept[0].name.startswith("xla_compile_cache") and kept[0].stat().st_size > 0
