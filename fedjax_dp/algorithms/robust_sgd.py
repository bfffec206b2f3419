"""Byzantine-robust stochastic-gradient aggregation: the baselines of Zhu and Ling (IJCAI 2022).

Every iteration the master broadcasts ``x_0``; each worker k in the cohort
computes a stochastic gradient ``g_k`` of its local loss at ``x_0`` (one
minibatch of ``batch_size`` examples); the Byzantine workers (the fixed set of
the last ``byzantine`` client ids) replace theirs by the attack's rows; the
master aggregates and steps

  ``x_0 <- x_0 - alpha (A(g_1, ..., g_K) + grad f_0(x_0))``,  ``f_0(x) = (u/2) ||x||^2``

with ``alpha = client_lr``. One program for every aggregator ``A``:

* ``sgd``: mean;  ``signsgd``: majority vote of signs (Bernstein et al. 2019);
* ``gm``: geometric median (Weiszfeld, ``gm_tol``, ``gm_max_iter``);
* ``median``, ``trimmed_mean`` (``trim_beta``), ``krum`` (f = ``byzantine``,
  ``krum_m``), ``centered_clipping`` (``cc_tau``, ``cc_iters``).

Rows with Inf/NaN are rejected by every aggregator (``nonfinite_rows`` in the
metrics). Privacy: none (exact gradients are sent). What honest workers
release is their raw gradient, so an attack reading the regular rows reads
only released rows (``attacker_knowledge`` is "released" either way).

Options (``--set name=value``): ``byzantine`` (b, default 0), ``attack``
(:data:`fedjax_dp.attacks.ATTACKS`), ``attack_sigma``, ``attack_scale``,
``alie_z``, ``ipm_epsilon``, ``nonfinite_value``, ``attacker_knowledge``
("released" or "omniscient", see :mod:`fedjax_dp.attacks`), ``l2`` (u,
default 0.004: f_0 = 0.002 ||x||^2 as in the paper) and the aggregator's
parameters above.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_dp import attacks, objectives
from fedjax_dp.aggregators import robust
from fedjax_dp.algorithms import Setup, read_options
from fedjax_dp.client import sample_batch
from fedjax_dp.errors import check, check_choice
from fedjax_dp.transforms import global_norm

AGGREGATORS = {"sgd": "mean", "signsgd": "sign_vote", "gm": "geometric_median",
               "median": "coordinate_median", "trimmed_mean": "trimmed_mean", "krum": "krum",
               "centered_clipping": "centered_clipping"}

BYZANTINE_OPTIONS = {"byzantine": 0, "attack": "none", "attack_sigma": 1e4, "attack_scale": -5.0,
                     "alie_z": None, "ipm_epsilon": 0.1, "nonfinite_value": "nan", "l2": 0.004,
                     "attacker_knowledge": "released"}
AGGREGATOR_OPTIONS = {"trim_beta": 0.1, "gm_tol": 1e-6, "gm_max_iter": 100, "krum_m": 1,
                      "cc_tau": 1.0, "cc_iters": 1}


def byzantine_pieces(config, data, opts):
  """``(num_byzantine, attack, knowledge)`` from the options, validated against the population.

  ``knowledge`` is what the attack actually reads: "omniscient" only when
  the attack reads the regular rows and ``attacker_knowledge`` asks for their
  raw state; else "released" (see :mod:`fedjax_dp.attacks`).
  """
  b = opts["byzantine"]
  check(isinstance(b, int) and 0 <= b < data.num_clients, "byzantine", b,
        f"must be an int in [0, num_clients={data.num_clients})")
  check(opts["l2"] is not None and opts["l2"] >= 0, "l2", opts["l2"], "must be >= 0")
  check_choice("attacker_knowledge", opts["attacker_knowledge"], attacks.KNOWLEDGE)
  attack = attacks.get(opts["attack"], sigma=opts["attack_sigma"], scale=opts["attack_scale"],
                       alie_z=opts["alie_z"], ipm_epsilon=opts["ipm_epsilon"],
                       nonfinite_value=opts["nonfinite_value"])
  omniscient = attack.reads_honest and b > 0 and opts["attacker_knowledge"] == "omniscient"
  return b, attack, "omniscient" if omniscient else "released"


def stochastic_gradient(objective: Callable, batch_size: int) -> Callable:
  """``(params, x, y, count, key) -> (loss, grad)`` on one minibatch of the worker's data."""
  grad_fn = jax.value_and_grad(objective)

  def fn(params, x, y, count, key):
    return grad_fn(params, sample_batch(x, y, count, key, batch_size), params)

  return fn


def nonfinite_count(updates, mask) -> jax.Array:
  return jnp.sum(mask) - jnp.sum(robust.finite_rows(updates, mask))


class MasterState(NamedTuple):
  params: Any
  agg_state: Any
  round: jax.Array


@dataclasses.dataclass(frozen=True, eq=False)
class RobustSGDProgram:
  """Stochastic-gradient aggregation with attacks (see module docstring)."""

  model: Any
  gradient: Callable
  aggregator: Any
  attack: Callable
  num_clients: int
  num_byzantine: int
  lr: float
  l2: float
  mechanism: Any
  clip: Any = None
  released_metrics = ("aggregate_norm",)

  def init(self, key):
    params = self.model.init(key)
    return MasterState(params, self.aggregator.init(params), jnp.zeros((), jnp.int32))

  def eval_params(self, state):
    return state.params

  def round_step(self, state, batch, key):
    k_workers, k_attack, k_agg = jax.random.split(key, 3)
    keys = jax.random.split(k_workers, batch.mask.shape[0])
    losses, grads = jax.vmap(self.gradient, in_axes=(None, 0, 0, 0, 0))(
        state.params, batch.x, batch.y, batch.counts, keys)
    norms = jax.vmap(global_norm)(grads)
    byz = attacks.byzantine_mask(batch.ids, self.num_clients, self.num_byzantine)
    sent = self.attack(grads, byz, k_attack, mask=batch.mask)
    agg, agg_state = self.aggregator.aggregate(sent, jnp.ones_like(batch.mask), batch.mask,
                                               state.agg_state, k_agg)
    params = jax.tree_util.tree_map(lambda p, a: p - self.lr * (a + self.l2 * p), state.params, agg)
    metrics = {"client_loss": losses, "update_norm": norms, "mask": batch.mask,
               "aggregate_norm": global_norm(agg), "nonfinite_rows": nonfinite_count(sent, batch.mask)}
    return MasterState(params, agg_state, state.round + 1), metrics


def build_robust_sgd(config, data, method: str) -> Setup:
  """Builds the baseline ``method`` (a key of :data:`AGGREGATORS`)."""
  from fedjax_dp.accounting import LedgerAccounting
  from fedjax_dp.algorithms.dp_fedavg import make_model
  from fedjax_dp.privacy import NonPrivate
  from fedjax_dp.sampling import make_sampler
  check_choice("method", method, sorted(AGGREGATORS))
  opts = read_options(config, {**BYZANTINE_OPTIONS, **AGGREGATOR_OPTIONS})
  b, attack, _ = byzantine_pieces(config, data, opts)
  aggregator = robust.get(AGGREGATORS[method], num_byzantine=b, trim_beta=opts["trim_beta"],
                          gm_tol=opts["gm_tol"], gm_max_iter=opts["gm_max_iter"],
                          krum_m=opts["krum_m"], cc_tau=opts["cc_tau"], cc_iters=opts["cc_iters"])
  model = make_model(config, data)
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  mechanism = NonPrivate(relation="replace_one")
  program = RobustSGDProgram(
      model=model, gradient=stochastic_gradient(objectives.supervised(model.apply), config.batch_size),
      aggregator=aggregator, attack=attack, num_clients=data.num_clients, num_byzantine=b,
      lr=float(config.client_lr), l2=float(opts["l2"]), mechanism=mechanism)
  return Setup(program, sampler, LedgerAccounting(mechanism, config.delta, config.accountant,
                                                  attacker_knowledge="released"))


def _builder(method):
  def build(config, data):
    return build_robust_sgd(config, data, method)
  build.__name__ = f"build_{method}"
  build.__doc__ = f"Stochastic-gradient aggregation with '{AGGREGATORS[method]}' (see module docstring)."
  return build


build_sgd = _builder("sgd")
build_signsgd = _builder("signsgd")
build_gm = _builder("gm")
build_median = _builder("median")
build_trimmed_mean = _builder("trimmed_mean")
build_krum = _builder("krum")
build_centered_clipping = _builder("centered_clipping")
