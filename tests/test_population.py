"""Large populations: data kept on the host (or generated from client ids), cohorts prefetched."""

import jax
import numpy as np
import pytest

from fedjax_dp.algorithms import build
from fedjax_dp.config import make_config
from fedjax_dp.data.synthetic import synthetic_population
from fedjax_dp.engine import Experiment, RunOptions, run
from fedjax_dp.errors import ConfigError


def _config(num_clients, **kw):
  return make_config(**{**dict(dataset="mnist", num_clients=num_clients, model="mlp",
                                sampling="fixed", cohort_size=16, rounds=3, local_steps=2,
                                batch_size=4, clip=0.5, noise_multiplier=1.0, target_epsilon=None,
                                placement="host", eval_every=1), **kw})


def test_a_million_generated_clients_run_on_the_host():
  data = synthetic_population(1_000_000, examples=4)
  assert data.x.strides == (0,) * data.x.ndim  # no per-client arrays are held
  x, y, c = data.rows(np.array([3, 999_999]))
  x2, _, _ = data.rows(np.array([999_999]))
  np.testing.assert_array_equal(x[1], x2[0])  # a client's data is a function of its id
  assert x.shape == (2, 4, 28, 28, 1) and 0 <= x.min() and x.max() <= 1 and list(c) == [4, 4]
  assert not np.array_equal(x[0], x[1]) and set(y.ravel()) <= set(range(10))
  config = _config(1_000_000)
  setup = build(config, data)
  result = run(setup.program, Experiment(setup.hparams, data, setup.sampler,
                                        accounting=setup.accounting),
               config.rounds, RunOptions(placement="host"))
  assert [h["round"] for h in result.history] == [1, 2, 3]
  assert np.isfinite(result.summary["final_test_loss"]) and result.summary["epsilon"] > 0
  with pytest.raises(ConfigError, match="placement"):
    run(setup.program, Experiment(setup.hparams, data, setup.sampler), 1,
        RunOptions(placement="device"))


def test_prefetched_host_cohorts_give_the_device_placement_result():
  from fedjax_dp.experiment import load_data
  config = _config(60, dataset="digits", sampling="poisson", sampling_prob=0.3, cohort_size=None)
  data = load_data(config)
  results = []
  for placement in ("device", "host"):
    setup = build(config, data)
    results.append(run(setup.program, Experiment(setup.hparams, data, setup.sampler,
                                                 accounting=setup.accounting),
                       config.rounds, RunOptions(placement=placement)))
  device, host = results
  for a, b in zip(jax.tree_util.tree_leaves(device.state), jax.tree_util.tree_leaves(host.state)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert [h["diagnostics"]["cohort_size"] for h in device.history] == [
      h["diagnostics"]["cohort_size"] for h in host.history]
