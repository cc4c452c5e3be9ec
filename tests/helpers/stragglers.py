"""The job the straggler and stall tests share (ps/worker in
test_stragglers_and_stalls.py, Horovod in test_horovod_stall.py): a convnet reading
JPEG TFRecords one record at a time, so a process given large JPEGs waits on its input
while the others do not; no end of its own (the tests end it by signals); the phases
sampled often and stragglers judged after 20 steps, so both show within seconds."""

from helpers.data_files import class_images, encode, image_feature_map, write_examples

WARNING_SECS = 3

SLOW_INPUT_JOB = [
    "--set", "model.name=convnet", "--set", "model.channels=3",
    "--set", "model.num_classes=2", "--set", "optimizer.learning_rate=0.005",
    "--set", "optimizer.clip_norm=1", "--set", "data.source=tfrecord",
    "--set", "data.schema=imagenet", "--set", "data.image.augment=false",
    "--set", "data.num_parallel_calls=1", "--set", "data.threads=1",
    "--set", "train.batch_size=32", "--set", "train.steps=1000000",
    "--set", "train.log_every_steps=40",
    "--set", f"train.stall_warning_secs={WARNING_SECS}", "--set", "train.phase_sample_secs=0.2",
    "--set", "train.straggler_steps=20", "--set", "metrics.port=0"]


def jpeg_records(path, size: int) -> str:
    """16 records: two JPEGs (one of each class) of size x size, 8 times over."""
    images, labels = class_images(2, size=size, classes=2)
    records = [image_feature_map(encode(x), int(y)) for x, y in zip(images, labels, strict=True)]
    return write_examples(path, records * 8)
