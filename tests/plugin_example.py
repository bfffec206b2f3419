"""A user's own aggregator, attack and algorithm, declared in one module outside the package.

``fedjax-dp run --plugin plugin_example --aggregator shrunk_mean --attack constant_rows ...``
imports this module first (the folder holding it on ``PYTHONPATH``), and its declarations make
both names, and their ``--set`` options, known to the run, its sweeps and ``fedjax-dp
algorithms`` (tests/test_plugins.py).
"""

import jax
import jax.numpy as jnp

from fedjax_dp.aggregators import Aggregator, weighted_sum
from fedjax_dp.algorithms.base import LOCAL, NONE, algorithm
from fedjax_dp.algorithms.dp_fedavg import build_fedavg
from fedjax_dp.components import Option, declare


@declare("aggregator", "shrunk_mean", reference="a test of the plugin path",
         about="the realized-weight mean times a factor", options=(
             Option("shrink", 0.5, "shrunk_mean: factor on the mean", low=0, high=1),))
def shrunk_mean(shrink) -> Aggregator:
  """``shrink * sum_i w_i u_i / sum_i w_i`` over the real rows (``shrink`` a hyper-parameter)."""

  def aggregate(updates, weights, mask, state, key):
    del key
    total = jnp.maximum(jnp.sum(weights * mask), 1.0)
    return jax.tree_util.tree_map(lambda s: shrink * s / total,
                                  weighted_sum(updates, weights, mask)), state

  return Aggregator(lambda params: (), aggregate)


@declare("attack", "constant_rows", reference="a test of the plugin path",
         about="every attacker sends a row of one value", reads_honest=False, options=(
             Option("row_value", 3.0, "constant_rows: the value of every entry"),
             Option("row_sign", "plus", "constant_rows: the sign of every entry (static: it "
                    "shapes the round)", kind="choice", choices=("plus", "minus"))))
def constant_rows(row_value, row_sign):
  """Every Byzantine row becomes ``row_value`` (negated with ``row_sign`` "minus") in every
  entry."""
  value = -row_value if row_sign == "minus" else row_value

  def attack(updates, byz, key, mask, ids):
    del key, mask, ids
    return jax.tree_util.tree_map(
        lambda u: jnp.where(byz.reshape((-1,) + (1,) * (u.ndim - 1)) > 0,
                            jnp.full_like(u, value), u), updates)

  return attack


@algorithm("fedavg_in_tens", reference="a test of the plugin path", privacy_unit=NONE,
           reads=LOCAL, defaults={"sampling": "fixed", "cohort_size": 10},
           about="FedAvg whose runs default to fixed cohorts of 10")
def fedavg_in_tens(config, data):
  """FedAvg's setup (:func:`fedjax_dp.algorithms.dp_fedavg.build_fedavg`)."""
  return build_fedavg(config, data)
