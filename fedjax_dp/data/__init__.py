"""Data layer: data-set specs, sources, partitioners and padded client arrays.

:mod:`~fedjax_dp.data.specs` is the table of data sets, one module of
:mod:`~fedjax_dp.data.sources` per source reads their files, and
:mod:`~fedjax_dp.data.loaders` holds the entry points; :mod:`~fedjax_dp.data.tff_h5`
reads TensorFlow Federated's HDF5 sets (Shakespeare, EMNIST) with their own
clients. NumPy only at import time; TensorFlow, h5py, PIL and scikit-learn are
imported by the sources that need them.
"""

from fedjax_dp.data.federated import CentralDataset, FederatedData
from fedjax_dp.data.loaders import (
    Split,
    load_central,
    load_federated,
    partition_indices,
)
from fedjax_dp.data.partition import (
    PARTITIONERS,
    dirichlet,
    iid,
    natural,
    shards,
)
from fedjax_dp.data.sources.common import (
    balanced_subset,
    resolve_cache_dir,
    resolve_data_dir,
)
from fedjax_dp.data.sources.idx import load_idx, read_idx
from fedjax_dp.data.specs import DATASETS, SPECS, DatasetSpec, check_partition
from fedjax_dp.data.tff_h5 import (
    H5Set,
    client_ids,
    load_federated_cifar100,
    load_federated_emnist,
    load_federated_shakespeare,
    load_federated_stackoverflow,
    load_federated_stackoverflow_tags,
    load_tff_h5_federated,
    read_client,
    shakespeare_windows,
)

__all__ = [
    "CentralDataset", "FederatedData", "DATASETS", "SPECS", "DatasetSpec", "Split",
    "PARTITIONERS", "balanced_subset", "load_central", "load_federated",
    "load_idx", "partition_indices", "read_idx", "resolve_cache_dir",
    "resolve_data_dir", "dirichlet", "iid", "natural", "shards", "H5Set", "client_ids",
    "load_federated_cifar100", "load_federated_emnist", "load_federated_shakespeare",
    "load_federated_stackoverflow", "load_federated_stackoverflow_tags",
    "load_tff_h5_federated", "read_client", "shakespeare_windows",
    "check_partition",
]
