"""--client-chunk: blocks of clients give the full vmap's result; memory stays flat in the cohort."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms import build
from fedjax_dp.config import make_config
from fedjax_dp.data import FederatedData
from fedjax_dp.engine import Experiment, RunOptions, run
from fedjax_dp.experiment import load_data
from fedjax_dp.round import compiled_step


def _run(config, data, chunk):
  setup = build(config, data)
  return run(setup.program, Experiment(setup.hparams, data, setup.sampler, 3, setup.accounting),
             config.rounds, RunOptions(client_chunk=chunk))


@pytest.mark.parametrize("algorithm,extra", [
    ("dp_fedavg", dict(clip=0.5, noise_multiplier=1.0)),            # linear: summed block by block
    ("gm", dict(attack="gaussian", byzantine=6)),                    # every row kept, attacked
    ("dp-rsa-f", dict(options={"keep_prob": 0.9})),                  # per-client state rows
])
def test_blocks_of_clients_equal_the_full_vmap(algorithm, extra):
  config = make_config(num_clients=60, sampling_prob=0.25, rounds=2, local_steps=2, batch_size=4,
                       model="mlp", eval_every=1, max_test=200, algorithm=algorithm,
                       target_epsilon=None, **extra)
  data = load_data(config)
  full = _run(config, data, None)
  got = _run(config, data, 7)  # capacity 38: five full blocks, then one of 3 clients and 4 padded slots
  for a, b in zip(jax.tree_util.tree_leaves(got.state), jax.tree_util.tree_leaves(full.state)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for name in ("test_accuracy", "update_norm.q50", "train_loss", "aggregate_norm"):
    np.testing.assert_allclose(got.metrics[name], full.metrics[name], rtol=1e-5, atol=1e-6)


def test_blocks_count_non_finite_uploads_as_the_full_vmap():
  # Every update diverges (client_lr 1e30); DP-FedAvg's clip sends them as zeros, so no upload is
  # non-finite, in blocks as in the whole cohort (blocks counted the raw updates).
  config = make_config(num_clients=20, sampling="fixed", cohort_size=5, rounds=2, local_steps=2,
                       batch_size=4, model="mlp", max_test=100, algorithm="dp_fedavg", clip=0.5,
                       noise_multiplier=1.0, target_epsilon=None, client_lr=1e30)
  data = load_data(config)
  full, got = _run(config, data, None), _run(config, data, 2)
  for run_ in (full, got):
    assert run_.metrics["nonfinite_updates"].tolist() == [5, 5]
    assert run_.metrics["nonfinite_rows"].tolist() == [0, 0]


def _temp_bytes(program, hparams, capacity: int, population: int, chunk):
  """Device scratch memory of the compiled round (XLA's own analysis; nothing is allocated)."""
  hp = {k: jnp.asarray(v) for k, v in hparams.items()}
  state = jax.eval_shape(lambda: program.init(jax.random.PRNGKey(0), hp))
  arrays = (jax.ShapeDtypeStruct((population, 8, 28, 28, 1), jnp.float32),
            jax.ShapeDtypeStruct((population, 8), jnp.int32),
            jax.ShapeDtypeStruct((population,), jnp.int32))
  ids = jax.ShapeDtypeStruct((capacity,), jnp.int32)
  mask = jax.ShapeDtypeStruct((capacity,), jnp.float32)
  compiled = compiled_step(program, "device", None, chunk).lower(
      state, hp, arrays, ids, mask, jax.random.PRNGKey(0)).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_round_memory_is_flat_in_the_cohort_with_a_chunk():
  population = 5000
  data = FederatedData("synthetic", np.zeros((population, 8, 28, 28, 1), np.float32),
                       np.zeros((population, 8), np.int32), np.full(population, 8, np.int32),
                       np.zeros((4, 28, 28, 1), np.float32), np.zeros(4, np.int32), 10)
  config = make_config(dataset="mnist", num_clients=population, model="mlp", sampling="fixed",
                       cohort_size=50, local_steps=2, batch_size=4, clip=0.5, noise_multiplier=1.0,
                       target_epsilon=None)
  setup = build(config, data)
  chunked = [_temp_bytes(setup.program, setup.hparams, c, population, 50) for c in (50, 500, 5000)]
  assert max(chunked) <= 1.1 * min(chunked), chunked
  whole = [_temp_bytes(setup.program, setup.hparams, c, population, None) for c in (50, 500)]
  assert whole[1] > 5 * whole[0], whole  # without blocks it grows with the cohort


def _conds(jaxpr) -> int:
  """``cond`` equations in a jaxpr and every jaxpr nested in its equations' parameters."""
  count = 0
  for eqn in jaxpr.eqns:
    count += eqn.primitive.name == "cond"
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          count += _conds(sub)
  return count


def test_a_sweep_still_skips_blocks_padded_in_every_experiment():
  """Under a sweep's vmap a per-experiment skip would become a select that computes every
  block; the skip is taken over all experiments instead, so it stays a branch."""
  population, capacity, experiments = 60, 14, 3
  data = FederatedData("synthetic", np.zeros((population, 8, 28, 28, 1), np.float32),
                       np.zeros((population, 8), np.int32), np.full(population, 8, np.int32),
                       np.zeros((4, 28, 28, 1), np.float32), np.zeros(4, np.int32), 10)
  config = make_config(dataset="mnist", num_clients=population, model="mlp", local_steps=2,
                       batch_size=4, clip=0.5, noise_multiplier=1.0, target_epsilon=None)
  setup = build(config, data)
  hp = {k: jnp.asarray(v) for k, v in setup.hparams.items()}
  state = jax.eval_shape(lambda: setup.program.init(jax.random.PRNGKey(0), hp))
  arrays = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype)
                 for a in (data.x, data.y, data.counts))
  one = (state, hp, arrays, jnp.zeros(capacity, jnp.int32), jnp.ones(capacity, jnp.float32),
         jax.random.PRNGKey(0))
  stack = lambda t: jax.tree_util.tree_map(
      lambda a: jax.ShapeDtypeStruct((experiments,) + a.shape, a.dtype), t)
  many = (stack(state), stack(hp), arrays) + tuple(stack(a) for a in one[3:])
  conds = {mode: _conds(jax.make_jaxpr(compiled_step(setup.program, "device", mode, 4))(*args).jaxpr)
           for mode, args in ((None, one), ("shared", many))}
  assert conds[None] >= 1 and conds["shared"] == conds[None], conds


def test_automatic_blocks_on_one_cpu_device(monkeypatch):
  """client_chunk unset: blocks of about 4 on one CPU device (fixed cohorts: the size in 2-6
  wasting the fewest slots; a model with a layer run by Winograd: 1), the whole cohort on
  accelerators (several CPU devices: tests/test_sharding.py); 0 is the whole cohort, k >= 1
  blocks of k. Recorded in the summary's provenance."""
  from fedjax_dp.experiment import client_blocks, simulate
  from fedjax_dp.models import get_model
  assert jax.default_backend() == "cpu" and jax.device_count() == 1
  base = make_config(num_clients=60, rounds=1)
  digits = get_model("digits_cnn", (8, 8, 1), 10)                 # auto: every layer by im2col
  fixed = lambda size: base.replace(sampling="fixed", cohort_size=size)
  assert client_blocks(base, digits) == 4                        # poisson: the padding is skipped
  assert [client_blocks(fixed(n), digits) for n in (10, 12, 7, 9, 4, 2)] == [5, 4, 4, 3, None, None]
  assert client_blocks(base.replace(client_chunk=0), digits) is None
  assert client_blocks(base.replace(client_chunk=7), digits) == 7
  winograd = get_model("digits_cnn", (8, 8, 1), 10, conv_impl="winograd")  # one client a block
  assert client_blocks(base, winograd) == 1 and client_blocks(fixed(10), winograd) == 1
  assert client_blocks(base.replace(client_chunk=7), winograd) == 7
  cnn2 = get_model("cnn2", (28, 28, 1), 62)         # auto: Winograd's second layer from batch 2
  assert client_blocks(base.replace(batch_size=64), cnn2) == 1
  assert client_blocks(base.replace(batch_size=1), cnn2) == 4
  assert client_blocks(base.replace(batch_size=64), cnn2, model_batch=1) == 4  # DP-SGD
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert client_blocks(base, digits) is None and client_blocks(fixed(10), digits) is None
  assert client_blocks(base.replace(batch_size=64), cnn2) is None
  monkeypatch.undo()
  tiny = dict(num_clients=40, rounds=1, local_steps=1, model="mlp", max_test=100)
  assert simulate(**tiny).summary["provenance"]["client_block"] == 4
  assert simulate(**tiny, client_chunk=0).summary["provenance"]["client_block"] is None
  # A block as wide as the cohort's slots is the whole cohort at once, and is recorded so.
  wide = dict(tiny, sampling="fixed", cohort_size=5, client_chunk=500)
  assert simulate(**wide).summary["provenance"]["client_block"] is None


@pytest.mark.parametrize("algorithm,extra,layers", [
    ("dp_fedavg", dict(clip=0.5), {"Conv_0": ["im2col"], "Conv_1": ["winograd"]}),
    # Per-example gradients: each layer sees one example, too few tiles for Winograd.
    ("dp-fl", dict(), {"Conv_0": ["im2col"], "Conv_1": ["im2col"]}),
])
def test_the_round_records_the_convolutions_its_clients_run(algorithm, extra, layers):
  """What the summary's provenance.conv_layers reports: each layer's implementation as the
  compiled round traced it (conv_impl auto, CNN-2-layers, batch 16), and the automatic blocks
  follow it (Winograd: blocks of one client)."""
  from fedjax_dp.experiment import client_blocks
  from fedjax_dp.round import traced_conv_layers
  population = 8
  data = FederatedData("synthetic", np.zeros((population, 16, 28, 28, 1), np.float32),
                       np.zeros((population, 16), np.int32), np.full(population, 16, np.int32),
                       np.zeros((4, 28, 28, 1), np.float32), np.zeros(4, np.int32), 62)
  config = make_config(dataset="mnist", num_clients=population, model="cnn2", local_steps=1,
                       batch_size=16, noise_multiplier=1.0, target_epsilon=None,
                       algorithm=algorithm, **extra)
  setup = build(config, data)
  program = setup.program
  hp = {k: jnp.asarray(v) for k, v in setup.hparams.items()}
  state = jax.eval_shape(lambda: program.init(jax.random.PRNGKey(0), hp))
  arrays = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (data.x, data.y, data.counts))
  jax.eval_shape(compiled_step(program, "device", None, 1), state, hp, arrays,
                 jnp.zeros(4, jnp.int32), jnp.ones(4, jnp.float32), jax.random.PRNGKey(0))
  assert traced_conv_layers(program) == layers
  winograd = any("winograd" in impls for impls in layers.values())
  assert client_blocks(config, program.model, program.model_batch) == (1 if winograd else 4)


def test_blocks_hold_each_devices_own_clients_and_come_back_in_order():
  """Over D devices, block i holds the i-th block of each device's ceil(C / D) clients (as XLA
  splits the client axis), padded with inert zeros, also where D does not divide C."""
  from fedjax_dp.round import _blocks, _unblocks
  for size, shards, chunk in ((10, 1, 3), (12, 2, 2), (10, 4, 2), (13, 3, 2), (5, 4, 1)):
    clients = jnp.arange(1, size + 1)                  # client c is c + 1: padding reads 0
    part = -(-size // shards)
    count = -(-part // chunk)
    blocks = np.asarray(_blocks({"c": clients}, chunk, count, shards)["c"])
    assert blocks.shape == (count, shards * chunk)
    for i in range(count):
      for d in range(shards):
        want = [d * part + i * chunk + j + 1 for j in range(chunk)]
        want = [c if c <= min((d + 1) * part, size) else 0 for c in want]
        assert blocks[i, d * chunk:(d + 1) * chunk].tolist() == want, (size, shards, chunk, i, d)
    back = _unblocks({"c": jnp.asarray(blocks)}, size, shards)["c"]
    assert np.asarray(back).tolist() == list(range(1, size + 1))


def test_a_cohort_is_dealt_out_evenly_over_the_devices():
  """A Poisson cohort's real clients come first in its slots; over D devices they are dealt out
  (the k-th to device k mod D), so every device runs as many as the others instead of the first
  device running them all, and the clients' norms come back in the cohort's order."""
  from fedjax_dp.engine import _pad_cohort, client_norms
  from fedjax_dp.sampling import Cohort
  cohort = Cohort(np.array([2, 5, 7, 11, 13, 0, 0], np.int32), np.array([1, 1, 1, 1, 1, 0, 0.]))
  one = _pad_cohort(cohort, 8)
  assert one.ids.tolist() == [2, 5, 7, 11, 13, 0, 0, 0] and one.mask.sum() == 5
  dealt = _pad_cohort(cohort, 8, 4)                  # 4 devices of 2 slots
  assert dealt.ids.tolist() == [2, 13, 5, 0, 7, 0, 11, 0]
  assert dealt.mask.tolist() == [1, 1, 1, 0, 1, 0, 1, 0]
  norms = {"update_norm": dealt.ids.astype(np.float32), "mask": dealt.mask}
  assert client_norms(norms, 4).tolist() == [2, 5, 7, 11, 13]
  assert client_norms({"update_norm": one.ids, "mask": one.mask}).tolist() == [2, 5, 7, 11, 13]
