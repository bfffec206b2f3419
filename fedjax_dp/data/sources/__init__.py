"""One module per data source, each reading the sets of its kind.

A local source (:data:`LOCAL`, keyed by :attr:`DatasetSpec.source`) has
``load(spec, request)``, returning ``(train_x, train_y, test_x, test_y)`` or
``None`` when the files are absent, and ``expected_files(spec)`` for the error
message. :mod:`~fedjax_dp.data.sources.tfds` is the download fallback. Heavy
libraries (scikit-learn, PIL, TensorFlow) are imported only inside the loads.
"""

from fedjax_dp.data.sources import cifar10, digits, idx, tfds

LOCAL = {"digits": digits, "idx": idx, "cifar10": cifar10}

__all__ = ["LOCAL", "cifar10", "digits", "idx", "tfds"]
