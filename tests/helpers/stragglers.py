"""The job the straggler and stall tests share (ps/worker in
test_stragglers_and_stalls.py, Horovod in test_horovod_stall.py): a convnet reading
large JPEG TFRecords; no end of its own (the tests end it by signals); the phases
sampled often and stragglers judged after 20 steps, so both show within seconds.

Every process of a job reads the same data (its part of each global batch), so the
straggler is made by its input pipeline instead: SLOW_INPUT decodes one JPEG at a time
with one batch prefetched, so its process waits on input; the others keep the parallel
decode and a deeper prefetch, which fill while they wait for the slow one in the
exchange, so their input hides behind the step (and they decode only a small central
crop of each image, to leave the CPU to the slow one)."""

from helpers.data_files import class_images, encode, image_feature_map, write_examples

WARNING_SECS = 3

SLOW_INPUT_JOB = [
    "--set", "model.name=convnet", "--set", "model.channels=3",
    "--set", "model.num_classes=2", "--set", "optimizer.learning_rate=0.005",
    "--set", "optimizer.clip_norm=1", "--set", "data.source=tfrecord",
    "--set", "data.schema=imagenet", "--set", "data.image.augment=false",
    "--set", "train.batch_size=32", "--set", "train.steps=1000000",
    "--set", "train.log_every_steps=40",
    "--set", f"train.stall_warning_secs={WARNING_SECS}", "--set", "train.phase_sample_secs=0.2",
    "--set", "train.straggler_steps=20", "--set", "metrics.port=0"]


# A process's own input settings that make it the slow one.
SLOW_INPUT = ["--set", "data.num_parallel_calls=1", "--set", "data.threads=1",
              "--set", "data.prefetch=1"]
# The others': more decoding threads than cores, so they take most of a shared CPU, and
# batches to spare (the defaults' autotuning settles too slowly to leave a clear margin);
# and only a small central crop of each image, which decode_and_crop_jpeg decodes in
# about 40% of the CPU time of the whole (2.9 ms against 7.4 ms at 1,024 px): the job's
# CPU goes to the slow process's input, which is what the tests are about.
FAST_INPUT = ["--set", "data.num_parallel_calls=4", "--set", "data.prefetch=4",
              "--set", "data.image.eval_crop=0.05"]


def jpeg_records(path, size: int) -> str:
    """16 records: two JPEGs (one of each class) of size x size, 8 times over."""
    images, labels = class_images(2, size=size, classes=2)
    records = [image_feature_map(encode(x), int(y)) for x, y in zip(images, labels, strict=True)]
    return write_examples(path, records * 8)
