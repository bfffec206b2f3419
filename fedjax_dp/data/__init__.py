"""Data layer: loaders, partitioners and the padded client arrays.

NumPy only at import time; TensorFlow, h5py, PIL and scikit-learn are imported
by the loaders that need them.
"""

from fedjax_dp.data.federated import CentralDataset, FederatedData
from fedjax_dp.data.loaders import (
    DATASETS,
    balanced_subset,
    load_central,
    load_federated,
    load_idx,
    partition_indices,
    read_idx,
    resolve_cache_dir,
    resolve_data_dir,
)
from fedjax_dp.data.partition import (
    PARTITIONERS,
    dirichlet,
    iid,
    natural,
    shards,
)
from fedjax_dp.data.tff_h5 import (
    client_ids,
    load_federated_emnist,
    load_tff_h5_federated,
    read_client,
)

__all__ = [
    "CentralDataset", "FederatedData", "DATASETS", "PARTITIONERS",
    "balanced_subset", "load_central", "load_federated", "load_idx",
    "partition_indices", "read_idx", "resolve_cache_dir", "resolve_data_dir",
    "dirichlet", "iid", "natural", "shards", "client_ids",
    "load_federated_emnist", "load_tff_h5_federated", "read_client",
]
