"""AE-DPFL (Zhu, Yu, Wang et al.): the held-out public set, the clients' one-hot votes, the noisy
vote sum, its accounting against dp_accounting, and a run end to end."""

import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms import build
from fedjax_dp.config import make_config
from fedjax_dp.data.federated import FederatedData
from fedjax_dp.errors import ConfigError
from fedjax_dp.round import CohortBatch, messages


def _tagged_data(num_clients=12, examples=5):
  """Every training example's pixels hold its own id (client * 100 + row + 1; padding 0), test
  examples negative ids, so any example can be traced to where it came from."""
  counts = np.array([examples - (c % 3) for c in range(num_clients)])
  x = np.zeros((num_clients, examples, 8, 8, 1), np.float32)
  for c in range(num_clients):
    for j in range(counts[c]):
      x[c, j] = c * 100 + j + 1
  y = np.tile(np.arange(examples) % 10, (num_clients, 1)).astype(np.int32)
  test_x = -np.arange(1, 21, dtype=np.float32)[:, None, None, None] * np.ones((1, 8, 8, 1), np.float32)
  return FederatedData("digits", x, y, counts, test_x, np.arange(20) % 10, 10)


def _setup(data, public_size, **kw):
  settings = dict(algorithm="ae-dpfl", num_clients=data.num_clients, model="mlp", rounds=3,
                  sampling_prob=0.5, noise_multiplier=0.5, target_epsilon=None,
                  options={"public_size": public_size})
  settings.update(kw)
  return build(make_config(**settings), data)


def test_public_set_is_held_out_training_data_of_excluded_clients():
  data = _tagged_data()  # counts 5, 4, 3, 5, 4, 3, ...: the last three clients hold 3 + 4 + 5
  setup = _setup(data, public_size=10)
  public = setup.hparams["public_x"]
  assert public.shape == (10, 8, 8, 1) and "public_y" not in setup.hparams
  ids = public[:, 0, 0, 0].astype(int)
  # The first 10 examples of clients 9, 10, 11 in id order (client 11 keeps 3 of its 5 unused).
  assert list(ids) == [901, 902, 903, 904, 905, 1001, 1002, 1003, 1004, 1101]
  population = {int(v) for v in data.x[:9].reshape(-1) if v > 0}
  assert not population & set(ids)
  assert not set(ids) & {int(v) for v in data.test_x.reshape(-1)}
  # The public clients leave the population: never sampled, not in the round's rows.
  assert setup.program.num_clients == 9 and setup.sampler.num_clients == 9
  drawn = np.concatenate([setup.sampler.sample().real_ids for _ in range(300)])
  assert drawn.max() == 8 and drawn.min() == 0
  # Fixed cohorts are drawn from the population; the accounting counts its 9 clients.
  fixed = _setup(data, public_size=10, sampling="fixed", cohort_size=9)
  assert "SampledWithoutReplacementDpEvent(source_dataset_size=9, sample_size=9" in (
      fixed.accounting.report()["dp_event"])
  with pytest.raises(ConfigError) as e:
    _setup(data, public_size=10, sampling="fixed", cohort_size=10)
  assert e.value.field == "cohort_size"


@pytest.mark.parametrize("changes,field", [
    ({"options": {"public_size": 48}}, "public_size"),  # the last 11 clients hold only 47
    ({"byzantine": 1}, "byzantine"),
    ({"aggregator": "coordinate_median"}, "aggregator"),
    ({"options": {"public_size": 4, "server_steps": 0}}, "option server_steps"),
    ({"options": {"public_size": 4, "trim_beta": 0.2}}, "option"),  # no robust aggregator
])
def test_refused_settings_name_the_field(changes, field):
  with pytest.raises(ConfigError) as e:
    _setup(_tagged_data(), **{"public_size": 4, **changes})
  assert e.value.field == field


def test_listed_options_are_its_own_only():
  from fedjax_dp.algorithms import option_table
  assert [o.name for o in option_table("ae-dpfl")] == ["public_size", "server_steps", "server_batch"]


def _random_data(num_clients=8, examples=6, seed=0):
  rng = np.random.default_rng(seed)
  return FederatedData("digits", rng.random((num_clients, examples, 8, 8, 1), dtype=np.float32),
                       rng.integers(0, 10, (num_clients, examples)).astype(np.int32),
                       np.full(num_clients, examples), rng.random((8, 8, 8, 1), dtype=np.float32),
                       np.arange(8) % 10, 10)


def test_the_vote_norm_is_never_below_the_votes_sensitivity_in_float32():
  # sqrt(m) rounded to float32 may fall below sqrt(m), and the noise is scaled to it.
  from fedjax_dp.algorithms.ae_dpfl import _float32_at_least
  import math
  below = [m for m in range(1, 5000) if float(np.float32(math.sqrt(m))) < math.sqrt(m)]
  assert below  # the plain cast does round down for some m
  for m in range(1, 5000):
    v = _float32_at_least(math.sqrt(m))
    assert v >= math.sqrt(m) and float(np.float32(v)) == v
    assert v - math.sqrt(m) <= 2.5e-7 * math.sqrt(m)


def test_votes_are_one_hot_per_public_example_and_padding_votes_nothing():
  data = _random_data()
  # A vanishing client rate: each local model is the global one, so every client's vote is the
  # global model's argmax on each public example.
  setup = _setup(data, public_size=12, client_lr=1e-9, local_steps=1)
  rnd, hp = setup.program, setup.hparams
  state = rnd.init(jax.random.PRNGKey(0), hp)
  ids = np.array([0, 3, 5, 0, 0], np.int32)
  mask = np.array([1, 1, 1, 0, 0], np.float32)
  batch = CohortBatch(data.x[ids], data.y[ids], data.counts[ids], ids, mask)
  out, sent = jax.jit(lambda s, h, b, k: messages(rnd, s, h, b, k))(
      state, hp, batch, jax.random.PRNGKey(1))
  votes, sent = np.asarray(out.upload), np.asarray(sent)
  assert votes.shape == sent.shape == (5, 12, 10) and votes.dtype == np.float32
  assert set(np.unique(sent)) <= {0.0, 1.0}
  np.testing.assert_array_equal(sent.sum(-1), mask[:, None] * np.ones((1, 12)))
  expected = jax.nn.one_hot(jnp.argmax(rnd.model.apply(state.params, hp["public_x"]), -1), 10)
  for i in range(3):
    np.testing.assert_array_equal(sent[i], expected)
  # The declared bound is what every real upload's norm is.
  np.testing.assert_allclose(np.asarray(out.norm)[:3], math.sqrt(12))
  assert float(hp["vote_norm"]) == pytest.approx(math.sqrt(12))


def test_noisy_vote_sum_has_the_true_counts_as_mean_and_sigma_as_std():
  setup = _setup(_random_data(), public_size=4, noise_multiplier=0.75)
  hp = setup.hparams
  sigma = float(hp["noise_multiplier"]) * float(hp["vote_norm"])  # z sqrt(m) = 1.5
  assert sigma == pytest.approx(1.5)
  rng = np.random.default_rng(3)
  votes = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (6, 4))]  # 6 clients, 4 examples
  mask = np.array([1, 1, 1, 1, 0, 0], np.float32)  # the last two are padding
  counts = votes[:4].sum(0)
  agg = setup.program.aggregator(hp)

  def one(key):
    return agg.aggregate(jnp.asarray(votes), jnp.ones(6), jnp.asarray(mask), agg.init(None), key)[0]

  n = 20000
  draws = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(0), n)))
  assert np.all(np.abs(draws.mean(0) - counts) < 5 * sigma / math.sqrt(n))
  np.testing.assert_allclose(draws.std(0), sigma, rtol=0.04)
  # Coordinates get independent noise.
  flat = (draws - counts).reshape(n, -1)
  assert np.max(np.abs(np.corrcoef(flat.T) - np.eye(flat.shape[1]))) < 0.04


def _direct_epsilon(event, rounds, delta=1e-5):
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(event, rounds)
  return acc.get_epsilon(delta)


@pytest.mark.parametrize("q,z,m", [(0.3, 0.8, 16), (0.05, 2.0, 100)])
def test_ledger_epsilon_is_the_sampled_gaussian_of_sensitivity_sqrt_m(q, z, m):
  data = _random_data(num_clients=40, examples=6)
  setup = _setup(data, public_size=m, sampling_prob=q, noise_multiplier=z, rounds=60)
  hp = setup.hparams
  sigma = float(hp["noise_multiplier"]) * float(hp["vote_norm"])  # per-count std that runs
  for _ in range(60):
    setup.accounting.on_round(None)
  report = setup.accounting.report()
  assert report["formal_guarantee"] and report["neighbouring_relation"] == "add_remove"
  direct = _direct_epsilon(
      dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma / math.sqrt(m))), 60)
  assert report["epsilon"] == pytest.approx(direct, rel=1e-5)
  assert f"sqrt(m) = {math.sqrt(m):.4g}" in report["guarantee_note"]


def test_one_unsampled_release_is_m_unit_sensitivity_gaussians_composed():
  # q = 1: the whole histogram (sensitivity sqrt(m), noise sigma) has the RDP of m counts of
  # sensitivity 1 with noise sigma each.
  m, z = 9, 0.6
  setup = _setup(_random_data(num_clients=12), public_size=m, sampling_prob=1.0, noise_multiplier=z)
  hp = setup.hparams
  sigma = float(hp["noise_multiplier"]) * float(hp["vote_norm"])
  for _ in range(5):
    setup.accounting.on_round(None)
  per_count = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), m)
  assert setup.accounting.report()["epsilon"] == pytest.approx(_direct_epsilon(per_count, 5),
                                                              rel=1e-5)


def test_target_epsilon_calibrates_the_vote_noise():
  setup = _setup(_random_data(num_clients=40), public_size=25, noise_multiplier=None,
                 target_epsilon=4.0, sampling_prob=0.2, rounds=20)
  for _ in range(20):
    setup.accounting.on_round(None)
  eps = setup.accounting.report()["epsilon"]
  assert 3.99 <= eps <= 4.0


def test_run_end_to_end_on_digits(tmp_path):
  from fedjax_dp.cli import main
  out = tmp_path / "ae"
  assert main(["run", "--algorithm", "ae-dpfl", "--dataset", "digits", "--num-clients", "60",
               "--sampling-prob", "0.5", "--rounds", "3", "--local-steps", "10",
               "--batch-size", "8", "--client-lr", "0.1", "--noise-multiplier", "0.2",
               "--server-lr", "0.1", "--set", "public_size=150", "--set", "server_steps=40",
               "--output-dir", str(out), "--no-progress"]) == 0
  s = json.loads((out / "summary.json").read_text())
  assert s["formal_guarantee"] is True and 0 < s["epsilon"] < math.inf
  assert s["final_accuracy"] > 0.3  # chance is 0.1
  assert s["noise_multiplier"] == pytest.approx(0.2)
  assert "PoissonSampledDpEvent(sampling_probability=0.5" in s["dp_event"]
  assert "clip" in s["config"]["not_used"]
