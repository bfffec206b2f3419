"""One call from a configuration to a finished run: load data, build, run."""

from __future__ import annotations

from typing import Optional

from fedjax_dp.config import RunConfig
from fedjax_dp.engine import RunResult, run


def load_data(config: RunConfig):
  """The configuration's :class:`FederatedData` (local files first; tfds only with ``download``)."""
  from fedjax_dp.data import load_federated
  return load_federated(
      config.dataset, config.num_clients, partition=config.partition, seed=config.seed,
      data_dir=config.data_dir, alpha=config.dirichlet_alpha,
      shards_per_client=config.shards_per_client, max_train=config.max_train,
      max_test=config.max_test, download=config.download,
      min_labels=config.min_labels_per_client)


def simulate(config: RunConfig, data=None, output_dir: Optional[str] = None,
             progress: bool = False, on_round=None, release: str = "all") -> RunResult:
  """Runs the simulation ``config`` describes (``data`` may be passed in to reuse it).

  ``release``: "all" or "private" (see :func:`fedjax_dp.engine.run`).
  """
  from fedjax_dp.algorithms import build
  if data is None:
    data = load_data(config)
  setup = build(config, data)
  result = run(setup.program, data, setup.sampler, config.rounds, hparams=setup.hparams,
               seed=config.seed,
               accounting=setup.accounting, eval_every=config.eval_every, output_dir=output_dir,
               progress=progress, config=config.to_dict(), placement=config.placement,
               on_round=on_round, release=release)
  return result
