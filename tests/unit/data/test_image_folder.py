import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import run_python
from tests.image_folders import mnist_digits, write_mnist_image_folder
from tftrain.config import DataConfig
from tftrain.data import ImageFiles, image_folder_dataset, list_image_files, random_flip_and_translate
from tftrain.errors import ConfigError, DataError

PER_CLASS = 4  # 40 files: 20 PNG, 20 JPEG


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_mnist_image_folder(tmp_path_factory.mktemp("digits"), per_class=PER_CLASS)


@pytest.fixture(scope="module")
def png_folder(tmp_path_factory):
    return write_mnist_image_folder(tmp_path_factory.mktemp("png"), per_class=3, formats=("png",))


def batches(ds):
    out = [(x.numpy(), y.numpy()) for x, y in ds]
    return np.concatenate([x for x, _ in out]), np.concatenate([y for _, y in out]), [len(y) for _, y in out]


def keys(images):
    """One hashable key per image (the exact pixels)."""
    return [im.tobytes() for im in images]


# --- listing ---------------------------------------------------------------------


def test_listing_sorts_classes_and_labels_each_file_by_its_folder(tmp_path):
    write_mnist_image_folder(tmp_path, per_class=3, formats=("PNG", "jpeg", "JPG"))
    (tmp_path / "3" / "notes.txt").write_text("not an image")
    (tmp_path / ".cache").mkdir()  # hidden: not a class
    nested = tmp_path / "7" / "more"
    nested.mkdir()
    (nested / "x.png").write_bytes((tmp_path / "7" / "0.PNG").read_bytes())
    files = list_image_files(tmp_path)
    assert files.class_names == tuple("0123456789")
    assert len(files) == 31 and len(files.labels) == 31
    for path, label in zip(files.paths, files.labels):
        assert path.split("/")[-2] in (files.class_names[label], "more")
    assert files.paths[:3] == tuple(str(tmp_path / "0" / n) for n in ("0.PNG", "1.jpeg", "2.JPG"))
    assert str(nested / "x.png") in files.paths and files.labels[files.paths.index(str(nested / "x.png"))] == 7
    assert list(files.labels) == sorted(files.labels)
    assert files == list_image_files(str(tmp_path))  # deterministic; str or Path


def test_class_names_sort_as_strings(tmp_path):
    for name in ("b", "a", "10", "2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.png").write_bytes(b"")
    files = list_image_files(tmp_path)
    assert files.class_names == ("10", "2", "a", "b") and files.labels == (0, 1, 2, 3)


def test_split_is_disjoint_complete_and_seeded(folder):
    everything = list_image_files(folder)
    train = list_image_files(folder, validation_split=0.25, subset="training", seed=3)
    val = list_image_files(folder, validation_split=0.25, subset="validation", seed=3)
    assert (len(train), len(val)) == (30, 10)
    assert set(train.paths).isdisjoint(val.paths)
    assert set(train.paths) | set(val.paths) == set(everything.paths)
    truth = dict(zip(everything.paths, everything.labels))
    assert all(truth[p] == y for p, y in zip(val.paths, val.labels))
    assert val == list_image_files(folder, validation_split=0.25, subset="validation", seed=3)
    assert set(val.paths) != set(list_image_files(folder, validation_split=0.25, subset="validation", seed=4).paths)
    assert train.class_names == val.class_names == everything.class_names


# --- listing errors (each message names what was wrong and the fix) ---------------


def test_missing_folder(tmp_path):
    with pytest.raises(DataError, match=r"does not exist\. Expected a folder with one sub-folder per class"):
        list_image_files(tmp_path / "nope")


def test_file_instead_of_folder(tmp_path):
    (tmp_path / "a.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"is a file, not a folder\..*Pass the folder that holds the class folders"):
        list_image_files(tmp_path / "a.png")


def test_no_class_folders(tmp_path):
    (tmp_path / "a.png").write_bytes(b"")
    with pytest.raises(DataError) as e:
        list_image_files(tmp_path)
    message = str(e.value)
    assert "has no class sub-folders. It holds 1 image file(s) directly. Expected one sub-folder per class" in message
    assert "Move the images into one folder per class." in message
    assert isinstance(e.value, ConfigError)


def test_no_image_files(tmp_path):
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
    (tmp_path / "cat" / "readme.txt").write_text("")
    with pytest.raises(DataError, match=r"has 2 class folder\(s\) \(cat, dog\) but no image files\. "
                                        r"Expected files ending in \.bmp, \.gif, \.jpeg, \.jpg, \.png"):
        list_image_files(tmp_path)


@pytest.mark.parametrize("split", [1.0, -0.1, "0.2", True])
def test_split_out_of_range(folder, split):
    with pytest.raises(DataError, match=r"validation_split must be a fraction in \[0, 1\)\. Received: "):
        list_image_files(folder, validation_split=split, subset="training")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(validation_split=0.2, subset="train"),
         r"Invalid subset 'train'\. Expected one of: None, 'training', 'validation'\."),
        (dict(subset="validation"), r"subset='validation' needs a validation split, but validation_split=0\."),
        (dict(validation_split=0.2), r"validation_split=0\.2 needs a subset\. Received: subset=None\. Pass subset="),
        (dict(validation_split=0.02, subset="validation"),
         r"validation_split=0\.02 of 40 files holds out no file\. Pass validation_split >= 0\.025"),
    ],
)
def test_subset_errors(folder, kwargs, message):
    with pytest.raises(DataError, match=message):
        list_image_files(folder, **kwargs)


def test_listing_imports_no_tensorflow(folder):
    code = ("import sys; from tftrain.data import list_image_files; "
            f"print(len(list_image_files({str(folder)!r})), 'tensorflow' in sys.modules)")
    proc = run_python(code, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["40", "False"]


# --- decoding, batching, sharding --------------------------------------------------


def test_decodes_png_and_jpeg_to_the_source_pixels(folder):
    files = list_image_files(folder)
    images, labels, sizes = batches(image_folder_dataset(files, (28, 28), 16, training=False))
    assert images.shape == (40, 28, 28, 3) and images.dtype == np.float32 and labels.dtype == np.int32
    assert sizes == [16, 16, 8]  # evaluation keeps the last partial batch
    assert images.min() >= 0 and images.max() <= 255 and images.max() > 200
    np.testing.assert_array_equal(labels, files.labels)
    np.testing.assert_array_equal(images[..., 0], images[..., 2])  # grayscale -> RGB
    source = mnist_digits(PER_CLASS)
    for image, label, path in zip(images, labels, files.paths):
        truth = source[label][int(path.rsplit("/", 1)[1].split(".")[0])].astype(np.float32)
        if path.endswith(".png"):
            np.testing.assert_array_equal(image[..., 0], truth)  # lossless
        else:
            assert abs(image.mean() - truth.mean()) < 2 and np.abs(image[..., 0] - truth).mean() < 6


def test_resizes_and_converts_channels(png_folder):
    files = list_image_files(png_folder)
    ds = image_folder_dataset(files, (32, 24), 10, training=False, num_channels=1)
    assert ds.element_spec[0].shape.as_list() == [None, 32, 24, 1]
    images, _, _ = batches(ds)
    assert images.shape == (30, 32, 24, 1) and 0 <= images.min() and images.max() <= 255


def test_training_drops_the_remainder_and_shuffles_with_the_seed(folder):
    files = list_image_files(folder)

    def epoch(seed):
        return batches(image_folder_dataset(files, (28, 28), 16, training=True, seed=seed))

    images, labels, sizes = epoch(0)
    assert sizes == [16, 16]
    assert images.shape == (32, 28, 28, 3)
    assert list(labels) != sorted(labels)
    np.testing.assert_array_equal(labels, epoch(0)[1])
    assert not np.array_equal(labels, epoch(1)[1])


def test_each_epoch_reshuffles_the_cached_images(folder):
    ds = image_folder_dataset(list_image_files(folder), (28, 28), 40, training=True, seed=0)
    first, second = [batches(ds)[1] for _ in range(2)]
    assert sorted(first) == sorted(second) and not np.array_equal(first, second)


@pytest.mark.parametrize("training", [False, True])
def test_input_pipelines_see_disjoint_files(png_folder, training):
    files = list_image_files(png_folder)
    everything = keys(batches(image_folder_dataset(files, (28, 28), 30, training=False))[0])
    seen = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=2)
        ds = image_folder_dataset(files, (28, 28), 10, training=training, input_context=context)
        images, _, sizes = batches(ds)
        assert sizes == [5, 5, 5]  # 15 files each, per-replica batch 10 / 2
        seen.append(set(keys(images)))
    assert seen[0].isdisjoint(seen[1])
    assert seen[0] | seen[1] == set(everything)


def test_options_name_the_auto_shard_policy_and_determinism(folder):
    files = list_image_files(folder)
    policy = tf.data.experimental.AutoShardPolicy
    plain = image_folder_dataset(files, (28, 28), 8, training=True, config=DataConfig(private_threads=2))
    assert plain.options().experimental_distribute.auto_shard_policy == policy.DATA
    assert plain.options().deterministic is False and plain.options().threading.private_threadpool_size == 2
    context = tf.distribute.InputContext(2, 0, 2)
    sharded = image_folder_dataset(files, (28, 28), 8, training=False, input_context=context)
    assert sharded.options().experimental_distribute.auto_shard_policy == policy.OFF
    assert sharded.options().deterministic is True


def test_without_cache_parallel_map_and_prefetch_the_result_is_the_same(folder):
    files = list_image_files(folder)
    config = DataConfig(cache=False, parallel_map=False, prefetch=False)
    a = batches(image_folder_dataset(files, (28, 28), 16, training=True, seed=2, config=config))
    b = batches(image_folder_dataset(files, (28, 28), 16, training=True, seed=2))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_a_small_shuffle_buffer_still_mixes_the_classes(folder):
    files = list_image_files(folder)
    config = DataConfig(shuffle_buffer=2)
    _, labels, _ = batches(image_folder_dataset(files, (28, 28), 8, training=True, seed=0, config=config))
    assert len(set(labels[:8])) >= 4  # the listing is grouped by class: 4 files per class


# --- augmentation ---------------------------------------------------------------------


def test_augment_runs_only_when_training(folder):
    files = list_image_files(folder)

    def mark(images, labels):
        return tf.fill(tf.shape(images), 7.0), labels

    train, _, _ = batches(image_folder_dataset(files, (28, 28), 8, training=True, augment=mark))
    evaluate, _, _ = batches(image_folder_dataset(files, (28, 28), 8, training=False, augment=mark))
    assert (train == 7).all() and not (evaluate == 7).all()


def test_random_flip_and_translate_changes_images_reproducibly(folder):
    files = list_image_files(folder)

    def run(seed):
        return batches(image_folder_dataset(files, (28, 28), 8, training=True, seed=0,
                                            augment=random_flip_and_translate(seed=seed)))[0]

    plain = batches(image_folder_dataset(files, (28, 28), 8, training=True, seed=0))[0]
    augmented = run(5)
    assert augmented.shape == plain.shape and augmented.dtype == np.float32
    assert 0 <= augmented.min() and augmented.max() <= 255.001
    changed = [not np.array_equal(a, p) for a, p in zip(augmented, plain)]
    assert sum(changed) > len(changed) // 2
    np.testing.assert_array_equal(augmented, run(5))


def test_augmentation_stays_float32_under_mixed_precision(png_folder):
    import keras

    keras.mixed_precision.set_global_policy("mixed_float16")  # restored by conftest
    ds = image_folder_dataset(list_image_files(png_folder), (28, 28), 10, training=True, seed=0,
                              augment=random_flip_and_translate(seed=0))
    assert ds.element_spec[0].dtype == tf.float32


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(flip="sideways"), r"Invalid flip 'sideways'\. Expected one of: horizontal, vertical, "),
        (dict(translation=1.5), r"translation must be a fraction in \[0, 1\)\. Received: translation=1\.5"),
    ],
)
def test_random_flip_and_translate_rejects_bad_values(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        random_flip_and_translate(**kwargs)


# --- dataset argument errors ------------------------------------------------------------


@pytest.mark.parametrize(
    "change, error, message",
    [
        (dict(files=("a.png",)), ConfigError,
         r"files must be an ImageFiles \(from list_image_files\)\. Received: files of type tuple\."),
        (dict(files=ImageFiles((), (), ("a",))), DataError, r"files holds no image\. Expected at least one file"),
        (dict(batch_size=0), ConfigError, r"batch_size must be an integer >= 1\. Received: batch_size=0\."),
        (dict(image_size=(28,)), ConfigError,
         r"image_size must be \(height, width\), two positive integers\. Received: image_size=\(28,\)\."),
        (dict(num_channels=2), ConfigError,
         r"num_channels must be 1 \(grayscale\), 3 \(RGB\) or 4 \(RGBA\)\. Received: num_channels=2\."),
    ],
)
def test_dataset_rejects_bad_arguments(png_folder, change, error, message):
    kwargs = dict(files=list_image_files(png_folder), image_size=(28, 28), batch_size=8, training=True)
    kwargs.update(change)
    with pytest.raises(error, match=message):
        image_folder_dataset(**kwargs)


def test_an_image_file_that_does_not_decode_is_named_after_a_failure(tmp_path):
    import tftrain

    write_mnist_image_folder(tmp_path, per_class=2, formats=("png",))
    broken = tmp_path / "3" / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0garbage")
    from tftrain.data.image_folder import undecodable

    paths = list_image_files(tmp_path).paths
    assert undecodable(paths, 1) == [str(broken)]
    task = tftrain.ImageFolderTask(lambda: None, tmp_path, image_size=(28, 28), num_channels=1).bind(
        tftrain.ImageFolderTask(lambda: None, tmp_path, image_size=(28, 28), num_channels=1).default_config())
    with pytest.raises(tf.errors.InvalidArgumentError) as failed:
        list(task.train_data(4))
    assert task.data_error_hint(failed.value) == f"{broken} cannot be decoded as an image: remove or replace it"
    assert task.data_error_hint(ValueError("another failure")) == ""
