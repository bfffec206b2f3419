"""--compute-dtype bfloat16: the model computes in bfloat16, everything DP stays float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_dp.algorithms import build
from fedjax_dp.config import make_config
from fedjax_dp.errors import ConfigError
from fedjax_dp.experiment import load_data, simulate
from fedjax_dp.models import get_model
from fedjax_dp.objectives import supervised
from fedjax_dp.transforms.per_example import GradientRule, dp_args, dp_gradient, per_example_grads


def _dot_dtypes(jaxpr) -> set:
  """The operand dtypes of every dot_general in a jaxpr and its sub-jaxprs (scan, pjit, ...)."""
  out = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      out |= {str(v.aval.dtype) for v in eqn.invars}
    for p in eqn.params.values():
      for sub in p if isinstance(p, (tuple, list)) else (p,):
        sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
        if hasattr(sub, "eqns"):
          out |= _dot_dtypes(sub)
  return out


def _batch(n=6):
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.random((n, 8, 8, 1), dtype=np.float32)),
          jnp.asarray(rng.integers(0, 10, n).astype(np.int32)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_runs_in_the_compute_dtype_and_the_clipped_gradients_are_float32(dtype):
  model = get_model("mlp", (8, 8, 1), 10, hidden=(16,), compute_dtype=dtype)
  params = model.init(jax.random.PRNGKey(0))
  objective = supervised(model)
  x, y = _batch()
  assert model.apply(params, x).dtype == jnp.float32
  # The per-example gradients dp_gradient clips, and the noisy gradient it returns.
  _, grads = per_example_grads(objective, params, params, x, y)
  args = dp_args(clip=1.0, noise_multiplier=1.0)
  g, _ = dp_gradient(objective, params, params, (x, y, jnp.ones(6)), args, jax.random.PRNGKey(1),
                     GradientRule(6.0))
  for leaf in jax.tree_util.tree_leaves((grads, g)):
    assert leaf.dtype == jnp.float32
  # The model's matmuls (forward and backward) run in the compute dtype...
  jaxpr = jax.make_jaxpr(lambda p: per_example_grads(objective, p, p, x, y))(params)
  assert _dot_dtypes(jaxpr.jaxpr) == {dtype}
  # ...and the clip's weighted sum of the per-example gradients in float32.
  jaxpr = jax.make_jaxpr(lambda p: dp_gradient(objective, p, p, (x, y, jnp.ones(6)), args,
                                               jax.random.PRNGKey(1), GradientRule(6.0)))(params)
  assert _dot_dtypes(jaxpr.jaxpr) == {dtype, "float32"}


def test_the_round_is_keyed_by_the_compute_dtype_and_uploads_float32():
  base = make_config(num_clients=20, rounds=1, local_steps=2, noise_multiplier=1.0,
                     target_epsilon=None)
  data = load_data(base)
  f32, bf16 = build(base, data), build(base.replace(compute_dtype="bfloat16"), data)
  assert f32.program is not bf16.program  # a separate compiled round, not a shared one
  assert (f32.program.model.compute_dtype, bf16.program.model.compute_dtype) == (
      "float32", "bfloat16")
  program = bf16.program
  hp = {k: jnp.asarray(v) for k, v in bf16.hparams.items()}
  params = program.init(jax.random.PRNGKey(0), hp).params
  client = program.client(hp)
  args = (params, jnp.asarray(data.x[0]), jnp.asarray(data.y[0]), jnp.asarray(data.counts[0]),
          (), (), jax.random.PRNGKey(1))
  upload = client(*args).upload  # the client's update, clipped and noised by the aggregator
  assert {leaf.dtype for leaf in jax.tree_util.tree_leaves(upload)} == {jnp.dtype(jnp.float32)}
  assert _dot_dtypes(jax.make_jaxpr(client)(*args).jaxpr) == {"bfloat16"}


def test_compute_dtype_is_checked():
  with pytest.raises(ConfigError, match="compute_dtype"):
    make_config(compute_dtype="float16")
  with pytest.raises(ConfigError, match="compute_dtype"):
    get_model("mlp", (4,), 2, compute_dtype="int8")


@pytest.mark.slow  # two 20-round quickstarts, about 40 s of one core: `make test-slow`
def test_bfloat16_quickstart_accuracy_is_within_one_point_of_float32():
  # Both runs draw the same cohorts, batches and noise (same seed): only rounding differs.
  # bfloat16 keeps 8 significant bits, so the trajectories drift apart a little; over the 359
  # digits test examples the quickstart's accuracies after 20 rounds differed by 0.000-0.006
  # (at most two examples) across seeds 0-2, at 0.78-0.81. One point (3 examples) leaves room
  # for another machine's rounding, while a forward pass broken by bfloat16 (overflow, lost
  # gradients) costs tens of points.
  config = make_config(rounds=20)
  data = load_data(config)
  acc = {d: simulate(config.replace(compute_dtype=d), data).summary["final_accuracy"]
         for d in ("float32", "bfloat16")}
  assert acc["float32"] > 0.7
  assert abs(acc["bfloat16"] - acc["float32"]) <= 0.01, acc
