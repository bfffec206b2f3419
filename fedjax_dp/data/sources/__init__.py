"""One module per data source, each reading the sets of its kind.

A local source (:data:`LOCAL`, keyed by :attr:`DatasetSpec.source`) has
``load(spec, request)``, returning ``(train_x, train_y, test_x, test_y)`` or
``None`` when the files are absent, and ``expected_files(spec)`` and
``missing_files(spec, folder)`` (those a folder lacks) for the error message.
:mod:`~fedjax_dp.data.sources.tff` (TFF's HDF5 sets) also has
``load_natural``, the sets' own clients, and raises when its files are absent:
it has no download fallback. :mod:`~fedjax_dp.data.sources.tfds` is the
download fallback of the others. Heavy libraries (scikit-learn, PIL,
TensorFlow, h5py) are imported only inside the loads.
"""

from fedjax_dp.data.sources import cifar10, digits, idx, tfds, tff

LOCAL = {"digits": digits, "idx": idx, "cifar10": cifar10, "tff_emnist": tff,
         "tff_cifar100": tff, "tff_shakespeare": tff, "tff_stackoverflow": tff,
         "tff_stackoverflow_tags": tff}

__all__ = ["LOCAL", "cifar10", "digits", "idx", "tfds", "tff"]
