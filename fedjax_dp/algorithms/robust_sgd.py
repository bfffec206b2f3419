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

Byzantine workers and their attack come from the run's ``byzantine`` and
``attack`` settings (the same for every algorithm). Options (``--set
name=value``): ``l2`` (u, default 0.004: f_0 = 0.002 ||x||^2 as in the
paper), the attack strengths (``attack_sigma``, ``attack_scale``,
``alie_z``, ``ipm_epsilon``, ``nonfinite_value``) and the aggregator's
parameters above. Each is one round of :mod:`fedjax_dp.round`: a worker's
upload is its stochastic gradient, the aggregate a gradient (``descent``),
and the master's rate ``alpha`` is ``hp["server_lr"]``.
"""

from __future__ import annotations

from typing import Callable

import jax

from fedjax_dp import components, objectives
from fedjax_dp.algorithms.base import (Setup, algorithm, cached_round, common_hparams,
                                       read_options, round_key)
from fedjax_dp.algorithms.options import L2
from fedjax_dp.algorithms.fedavg import Pieces, make_aggregator
from fedjax_dp.client import sample_batch
from fedjax_dp.errors import check
from fedjax_dp.round import ClientOut, Round
from fedjax_dp.transforms import global_norm
from fedjax_dp.attacks import get as get_attack, static_options
from fedjax_dp.algorithms.dp_fedavg import make_model
from fedjax_dp.privacy import NonPrivate
from fedjax_dp.privacy.accounting import LedgerAccounting
from fedjax_dp.sampling import make_sampler


def attacker_knowledge(config) -> str:
  """"omniscient" when the attack reads the regular rows and is told to read their raw state."""
  reads = get_attack(config.attack).reads_honest
  return "omniscient" if config.byzantine and reads and config.attacker_knowledge == "omniscient" \
      else "released"


def stochastic_gradient(objective: Callable, batch_size: int) -> Callable:
  """``(params, x, y, count, key) -> (loss, grad)`` on one minibatch of the worker's data."""
  grad_fn = jax.value_and_grad(objective)

  def fn(params, x, y, count, key):
    """The loss and gradient at ``params`` of one minibatch (:func:`sample_batch`).

    Args:
      params: the model the gradient is taken at (also the objective's anchor).
      x: the worker's padded examples ``[M, ...]``.
      y: its padded labels ``[M]``.
      count: its number of real examples.
      key: PRNG key of the minibatch.
    """
    return grad_fn(params, sample_batch(x, y, count, key, batch_size), params)

  return fn


def gradient_client(model, batch_size: int) -> Callable:
  """``hp -> client`` uploading one stochastic gradient at the master's model."""
  gradient = stochastic_gradient(objectives.supervised(model), batch_size)

  def client(hp):
    del hp

    def fn(params, x, y, count, row, chp, key):
      """One worker's stochastic gradient at the master's model.

      Args:
        params: the master's model ``x_0``.
        x: the worker's padded examples ``[M, ...]``.
        y: its padded labels ``[M]``.
        count: its number of real examples.
        row: unused (no per-client state).
        chp: unused (no per-client hyper-parameters).
        key: PRNG key of its minibatch.

      Returns:
        A :class:`fedjax_dp.round.ClientOut`: the gradient, its minibatch loss and its norm.
      """
      del row, chp
      loss, g = gradient(params, x, y, count, key)
      return ClientOut(upload=g, loss=loss, norm=global_norm(g))

    return fn

  return client


def build_robust_sgd(config, data) -> Setup:
  """Builds the baseline ``config.algorithm``, the aggregator it declares (its ``aggregator``
  trait) on the workers' stochastic gradients (see the module docstring).

  Raises:
    ConfigError: for another aggregator than the algorithm's, or a bad option.
  """
  method = config.algorithm
  own = components.get("algorithm", method)["aggregator"]
  check(config.aggregator in (None, own), "aggregator", config.aggregator,
        f"must be unset or {own!r}: algorithm {method!r} is that aggregator")
  opts = read_options(config)
  model = make_model(config, data)
  pieces = Pieces(aggregator=own, weighting="uniform")
  rnd = cached_round(round_key(config, opts, model, data.num_clients), lambda: Round(
      model=model, num_clients=data.num_clients, client=gradient_client(model, config.batch_size),
      aggregator=make_aggregator(pieces, opts), attack=config.attack,
      attack_options=static_options(config.attack, opts), descent=True, server_optimizer="sgd"))
  sampler = make_sampler(config.sampling, data.num_clients, config.seed, config.sampling_prob,
                         config.cohort_size, config.capacity)
  hparams = common_hparams(config, opts, server_lr=config.client_lr, l2=opts["l2"],
                           expected_size=sampler.expected_size)
  mechanism = NonPrivate(relation="replace_one")
  # Workers send their raw gradients: what an attack reads of them is what they release.
  accounting = LedgerAccounting(mechanism, config.delta, config.accountant,
                                attacker_knowledge="released")
  return Setup(rnd, sampler, accounting, hparams)


# name -> (the aggregator it is, its reference).
BASELINES = {
    "sgd": ("mean", "mean of stochastic gradients (Zhu and Ling's baseline)"),
    "signsgd": ("sign_vote", "Bernstein et al. 2019, majority vote"),
    "gm": ("geometric_median", "geometric median (Weiszfeld)"),
    "median": ("coordinate_median", "coordinate-wise median"),
    "trimmed_mean": ("trimmed_mean", "Yin et al., ICML 2018"),
    "krum": ("krum", "Blanchard et al., NeurIPS 2017"),
    "centered_clipping": ("centered_clipping", "Karimireddy et al., ICML 2021"),
}
for _name, (_aggregator, _reference) in BASELINES.items():
  algorithm(_name, reference=_reference, options=L2, aggregator=_aggregator,
            about=f"stochastic gradients aggregated by {_aggregator} (Zhu and Ling's baselines)"
            )(build_robust_sgd)
del _name, _aggregator, _reference
