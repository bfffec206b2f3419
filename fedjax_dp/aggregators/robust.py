"""Byzantine-robust aggregators under the shared contract, each declared as a component.

Every aggregator here is ``Aggregator(init, aggregate)`` with
``aggregate(updates, weights, mask, state, key) -> (aggregate, state)`` (its arguments:
:class:`fedjax_dp.aggregators.base.Aggregator`), where the leaves of ``updates`` have a leading
client axis ``[N, ...]``.

Each declares itself once, beside its function, with
``fedjax_dp.components.declare("aggregator", NAME, reference=..., about=..., options=...,
**traits)``; the registry gives ``--aggregator``'s values, the ``--set`` options, their refusal
when another aggregator runs, the hyper-parameters and the compile-cache key. The build contract
of the kind (what :func:`get` calls):

  ``build(**values) -> Aggregator``: one keyword argument per declared option, named as the
  option, with no default of its own (the :class:`fedjax_dp.components.Option` holds it). A
  numeric option's value comes from the round's hyper-parameters, so inside the compiled round
  it is a traced scalar (an unset one, None in its declaration, is NaN there); a static option's
  is a Python value. The build returns the aggregator without the non-finite guard, which
  :func:`get` adds.

Traits an aggregator may declare:

* ``reads_byzantine`` (default False): ``build`` also takes ``num_byzantine``, the run's
  Byzantine count f (hyper-parameter ``byzantine``), as Krum does.
* ``check_cohort`` (default none): ``check_cohort(values, cohort=n, byzantine=f, fixed=...)``
  raises :class:`fedjax_dp.errors.ConfigError` when the run's expected cohort of ``n`` clients
  (``fixed``: a fixed-size one) does not suit the aggregator with option ``values``; called once,
  when the run's settings are read.

Rows that must not count:

* padded rows (``mask == 0``) never influence the result: they are excluded,
  not zeroed (a zero row biases a median or a geometric median);
* rows holding any non-finite entry (Inf or NaN, which a Byzantine worker may
  send) are *rejected*: treated exactly like padding. :func:`finite_rows`
  gives the mask the aggregators use, so a program can report the number of
  rejected rows (``nonfinite_rows`` in the run's metrics). An aggregate of a
  cohort whose rows are all rejected is zero (no step), never NaN.

:func:`guard_nonfinite` wraps any aggregator (e.g. the plain ``mean`` of
:mod:`fedjax_dp.aggregators.base`) with the same rejection; :func:`get` builds
every declared aggregator by name already guarded.

Aggregators that need a whole-vector geometry (geometric median, Krum,
centered clipping) view each client's pytree as one flat vector.

Memory: every aggregator here except the guarded ``mean`` needs all the
cohort's rows at once, so a round holds ``[C, P]`` uploads (C clients, P
parameters) whatever its ``--client-chunk``: the coordinate median and the
trimmed mean also sort a ``[C, P]`` copy; Krum holds the ``[C, C]`` pairwise
distances; the geometric median iterates Weiszfeld steps over the ``[C, P]``
rows; centered clipping and the sign votes read each row once per iteration.
Only the mean, linear in the rows (``Aggregator.prepare``/``finish``), is summed
block by block without them.
"""

from __future__ import annotations

import functools
from typing import Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_dp import components
from fedjax_dp.aggregators.base import Aggregator, mean
from fedjax_dp.components import Option, declare
from fedjax_dp.errors import check, check_unless_traced


def _empty_init(params):
  del params
  return optax.EmptyState()


def _rows(tree) -> jax.Array:
  """``[N, D]`` float32: each client's leaves concatenated."""
  leaves = jax.tree_util.tree_leaves(tree)
  n = leaves[0].shape[0]
  return jnp.concatenate([x.reshape(n, -1).astype(jnp.float32) for x in leaves], axis=1)


def _unrows(vec: jax.Array, like):
  """Inverse of :func:`_rows` for one aggregated vector ``[D]`` (``like`` has the client axis)."""
  leaves, treedef = jax.tree_util.tree_flatten(like)
  out, start = [], 0
  for x in leaves:
    size = int(x[0].size)
    out.append(vec[start:start + size].reshape(x.shape[1:]).astype(x.dtype))
    start += size
  return jax.tree_util.tree_unflatten(treedef, out)


def finite_rows(updates, mask: jax.Array) -> jax.Array:
  """``mask`` with every row that holds a non-finite entry set to 0."""
  ok = jnp.ones(mask.shape, bool)
  for x in jax.tree_util.tree_leaves(updates):
    ok &= jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1)
  return jnp.where(ok, mask, 0.0).astype(mask.dtype)


def _zero_nonreal(updates, mask):
  """Rows outside ``mask`` replaced by exact zeros (so Inf * 0 never makes NaN)."""
  return jax.tree_util.tree_map(
      lambda u: jnp.where(mask.reshape((-1,) + (1,) * (u.ndim - 1)) > 0, u, jnp.zeros_like(u)),
      updates)


def guard_nonfinite(aggregator: Aggregator) -> Aggregator:
  """Rejects rows with Inf/NaN entries (treats them as padding) before ``aggregator``."""

  def guard(updates, mask):
    m = finite_rows(updates, mask)
    return _zero_nonreal(updates, m), m

  def _aggregate(updates, weights, mask, state, key):
    """``aggregator.aggregate`` of the rows with the non-finite ones rejected (as padding, zeroed)."""
    u, m = guard(updates, mask)
    return aggregator.aggregate(u, weights, m, state, key)

  prepare = None if aggregator.prepare is None else (
      lambda updates, mask: aggregator.prepare(*guard(updates, mask)))
  return Aggregator(aggregator.init, _aggregate, prepare, aggregator.finish)


@functools.lru_cache(maxsize=None)
def merge_sort_layers(n: int) -> tuple:
  """Batcher's odd-even merge sort network on ``n`` rows, layer by layer.

  The network of the next power of two ``m >= n`` has ``k (k + 1) / 2`` layers, ``k =
  log2(m)``, each of disjoint comparators ``(a, b)``, ``a < b``, that put the smaller value at
  ``a``. A comparator that reaches past row ``n - 1`` is left out: had the rows been padded to
  ``m`` with +inf, it would leave both of its rows as they are.

  Args:
    n: the number of rows, ``>= 1``.

  Returns:
    ``(partner, low)``: ``[layers, n]`` int32, the row each row is compared with in each layer
    (its own index where it is in no comparator), and ``[layers, n]`` bool, True where the row
    takes the smaller value.
  """
  m = 1 << (n - 1).bit_length()
  partner, low = [], []
  p = 1
  while p < m:
    k = p
    while k >= 1:
      part, lo = np.arange(n, dtype=np.int32), np.zeros(n, bool)
      for j in range(k % p, m - k, 2 * k):
        for i in range(min(k, m - j - k)):
          a, b = i + j, i + j + k
          if a // (2 * p) == b // (2 * p) and b < n:
            part[a], part[b], lo[a] = b, a, True
      partner.append(part)
      low.append(lo)
      k //= 2
    p *= 2
  return np.array(partner, np.int32).reshape(-1, n), np.array(low, bool).reshape(-1, n)


def sort_rows(values: jax.Array) -> jax.Array:
  """``values`` ``[N, D]`` sorted along axis 0 by :func:`merge_sort_layers`' network: each layer
  is one elementwise ``minimum``/``maximum`` against the rows' partners, ``O(N log^2 N)``
  comparisons in all, which XLA runs as vector code (its comparison sort, ``jnp.sort``, calls a
  comparator per pair).

  Args:
    values: ``[N, D]`` with no NaN (+inf is allowed).

  Returns:
    ``[N, D]``: every column in ascending order, equal to ``jnp.sort(values, axis=0)`` but for
    the sign of a zero that meets a zero of the other sign.
  """
  def layer(rows, comparators):
    part, lo = comparators
    other = jnp.take(rows, part, axis=0)
    return jnp.where(lo[:, None], jnp.minimum(rows, other), jnp.maximum(rows, other)), None

  # A loop over the layers keeps each layer one buffer: unrolled, XLA fuses each layer into the
  # next ones and recomputes it for every read.
  partner, low = merge_sort_layers(values.shape[0])
  return jax.lax.scan(layer, values, (jnp.asarray(partner), jnp.asarray(low)))[0]


def _sorted_real(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Sorts ``[N, D]`` along clients with non-real rows moved to the end (as +inf)."""
  return sort_rows(jnp.where(mask[:, None] > 0, values, jnp.inf))


def _coord_median(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Coordinate-wise median of the real rows of ``[N, D]`` (0 when none is real)."""
  n = jnp.sum(mask > 0).astype(jnp.int32)
  s = _sorted_real(values, mask)
  lo = jnp.maximum((n - 1) // 2, 0)
  hi = jnp.maximum(n // 2, 0)
  med = 0.5 * (s[lo] + s[hi])
  return jnp.where(n > 0, med, 0.0)


@declare("aggregator", "mean", reference="McMahan et al., AISTATS 2017",
         about="the realized-weight mean of the rows (not robust to large rows)")
def realized_mean() -> Aggregator:
  """The mean weighted by the realized weights, :func:`fedjax_dp.aggregators.mean`."""
  return mean("realized")


def _sign_total(updates, weights, mask):
  m = finite_rows(updates, mask)
  w = (weights * m).astype(jnp.float32)
  return jax.tree_util.tree_map(
      lambda u: jnp.tensordot(w, jnp.sign(jnp.where(
          m.reshape((-1,) + (1,) * (u.ndim - 1)) > 0, u, 0.0)).astype(jnp.float32), axes=(0, 0)),
      updates)


@declare("aggregator", "sign_vote", reference="Bernstein et al., ICLR 2019",
         about="majority vote of the rows' signs (signSGD)")
def sign_vote() -> Aggregator:
  """Majority vote of signs, ``sign(sum_i w_i sign(u_i))`` (signSGD, Bernstein et al., ICLR 2019).

  Ties give 0. Each real row casts a vote of weight ``w_i`` whatever its
  magnitude, so b attackers move each coordinate's vote by at most b weights.
  """

  def _aggregate(updates, weights, mask, state, key):
    """``sign(sum_i w_i m_i sign(u_i))`` per coordinate, in each leaf's dtype."""
    del key
    total = _sign_total(updates, weights, mask)
    return jax.tree_util.tree_map(lambda t, u: jnp.sign(t).astype(u.dtype), total, updates), state

  return Aggregator(_empty_init, _aggregate)


@declare("aggregator", "sign_sum", reference="Li et al., AAAI 2019",
         about="sum of the rows' signs, the master's term of RSA")
def sign_sum() -> Aggregator:
  """Sum of the rows' signs, ``sum_i w_i sign(u_i)``: the master's term of RSA (Li et al., AAAI 2019).

  This is the aggregation of RSA and DP-RSA (Zhu and Ling, IJCAI 2022, Eq. 11):
  the master takes the sign of whatever a worker sends, so a worker moves each
  coordinate by at most its weight. NaN entries count 0 only through row
  rejection (a row with any non-finite entry is rejected).
  """

  def _aggregate(updates, weights, mask, state, key):
    """``sum_i w_i m_i sign(u_i)`` per coordinate, in each leaf's dtype."""
    del key
    total = _sign_total(updates, weights, mask)
    return jax.tree_util.tree_map(lambda t, u: t.astype(u.dtype), total, updates), state

  return Aggregator(_empty_init, _aggregate)


def weiszfeld(values: jax.Array, w: jax.Array, tol: float, max_iter: int, eps: float = 1e-8):
  """Geometric median of the rows of ``[N, D]`` with weights ``w`` (zero weight: excluded).

  Weiszfeld's iterations ``z <- sum_i (w_i / ||x_i - z||) x_i / sum_i (...)`` from the
  coordinate-wise median, until the step's relative size ``||z' - z|| <= tol * max(||z||, 1)``
  or ``max_iter`` iterations. An iterate on rows (within ``eps``; the coordinate median often is
  one) takes Vardi and Zhang's (2000) step, which leaves it only if it is not the median: with
  ``T`` the step over the other rows, ``r = ||sum_i w_i (x_i - z) / ||x_i - z||||`` over them and
  ``eta`` the weight of the rows at ``z``, ``z <- (1 - g) T + g z``, ``g = min(1, eta / r)``
  (plain Weiszfeld stays on any row it reaches).

  Args:
    values: ``[N, D]`` float32 rows (one flattened client update each).
    w: ``[N]`` non-negative weights; a row of weight 0 (padding, a rejected row) is excluded.
    tol: relative step size at which the iterations stop (> 0; may be traced).
    max_iter: the most iterations (the ``lax.while_loop``'s bound; may be traced).
    eps: distance within which an iterate counts as on a row (Vardi and Zhang's step).

  Returns:
    ``(z, iterations)``: the median ``[D]`` (the coordinate median of no row, zeros, when every
    weight is 0) and the int32 number of iterations run.
  """
  real = w > 0
  values = jnp.where(real[:, None], values, 0.0)
  z0 = _coord_median(values, real.astype(jnp.float32))

  def cond(carry):
    _, it, step = carry
    return (it < max_iter) & (step > tol)

  def body(carry):
    z, it, _ = carry
    d = jnp.sqrt(jnp.sum(jnp.square(values - z), axis=1))
    at = real & (d <= eps)
    a = jnp.where(real & ~at, w / jnp.maximum(d, eps), 0.0)
    total = jnp.sum(a)
    t = jnp.where(total > 0, a @ values / jnp.maximum(total, 1e-30), z)
    eta = jnp.sum(jnp.where(at, w, 0.0))
    r = jnp.linalg.norm(a @ values - total * z)
    g = jnp.where(eta > 0, jnp.minimum(1.0, eta / jnp.maximum(r, 1e-30)), 0.0)
    z_new = (1.0 - g) * t + g * z
    step = jnp.linalg.norm(z_new - z) / jnp.maximum(jnp.linalg.norm(z), 1.0)
    return z_new, it + 1, step

  z, it, _ = jax.lax.while_loop(cond, body, (z0, jnp.zeros((), jnp.int32), jnp.asarray(jnp.inf)))
  return z, it


@declare("aggregator", "geometric_median", reference="Chen, Su and Xu, POMACS 2017",
         about="weighted geometric median of the flattened rows (Weiszfeld)", options=(
             Option("gm_tol", 1e-6, "geometric_median: Weiszfeld's relative tolerance", low=0,
                    low_open=True),
             Option("gm_max_iter", 100, "geometric_median: at most this many Weiszfeld "
                    "iterations", kind="int", low=1, static=True)))
def geometric_median(gm_tol, gm_max_iter) -> Aggregator:
  """Weighted geometric median of the flattened rows (:func:`weiszfeld`; Chen et al. 2017).

  Args:
    gm_tol: relative step size at which Weiszfeld's iterations stop.
    gm_max_iter: iteration cap (a Python int: the loop's bound).
  """

  def _aggregate(updates, weights, mask, state, key):
    """The weighted geometric median of the real, finite rows."""
    del key
    m = finite_rows(updates, mask)
    z, _ = weiszfeld(_rows(updates), weights * m, gm_tol, int(gm_max_iter))
    return _unrows(z, updates), state

  return Aggregator(_empty_init, _aggregate)


@declare("aggregator", "coordinate_median", reference="Yin et al., ICML 2018",
         about="coordinate-wise median of the rows")
def coordinate_median() -> Aggregator:
  """Coordinate-wise median of the real rows (Yin et al., ICML 2018). Weights are ignored."""

  def _aggregate(updates, weights, mask, state, key):
    """The coordinate-wise median of the real, finite rows (0 when there is none)."""
    del weights, key
    m = finite_rows(updates, mask)
    return _unrows(_coord_median(_rows(updates), m), updates), state

  return Aggregator(_empty_init, _aggregate)


@declare("aggregator", "trimmed_mean", reference="Yin et al., ICML 2018",
         about="coordinate-wise mean of the rows without the largest and smallest", options=(
             Option("trim_beta", 0.1, "trimmed_mean: fraction trimmed at each end", low=0,
                    high=0.5, high_open=True),))
def trimmed_mean(trim_beta) -> Aggregator:
  """Coordinate-wise trimmed mean (Yin et al., ICML 2018).

  For each coordinate, drops the ``floor(beta * n)`` largest and smallest of the
  ``n`` real values and averages the rest. Weights are ignored.

  Args:
    trim_beta: ``beta``, the fraction trimmed at each end, in [0, 0.5).
  """

  def _aggregate(updates, weights, mask, state, key):
    """The coordinate-wise mean of the real, finite rows without the ``floor(beta n)`` largest and
    smallest values."""
    del weights, key
    m = finite_rows(updates, mask)
    n = jnp.sum(m > 0).astype(jnp.int32)
    f = jnp.floor(trim_beta * n).astype(jnp.int32)
    s = _sorted_real(_rows(updates), m)
    idx = jnp.arange(s.shape[0])[:, None]
    keep = (idx >= f) & (idx < n - f)
    total = jnp.sum(jnp.where(keep, s, 0.0), axis=0)
    out = total / jnp.maximum(n - 2 * f, 1)
    return _unrows(out, updates), state

  return Aggregator(_empty_init, _aggregate)


def _krum_fits(values: Mapping, *, cohort: int, byzantine: int, fixed: bool) -> None:
  """Refuses cohorts outside Krum's assumption (the ``check_cohort`` trait).

  A fixed cohort of fewer than ``krum_m`` rows would make multi-Krum a plain mean; Krum's f is
  the population's Byzantine count (any of them may be sampled), and a cohort of
  ``n <= 2f + 2`` rows scores each row by one neighbour, where identical attackers win.
  """
  if fixed:
    check(values["krum_m"] <= cohort, "option krum_m", values["krum_m"],
          f"must be <= cohort_size={cohort} (multi-Krum averages the krum_m best-scored rows "
          "of a cohort)")
  if byzantine:
    check(cohort > 2 * byzantine + 2, "byzantine", byzantine,
          f"is too many for Krum with cohorts of {cohort} clients: it needs more than 2f + 2 = "
          f"{2 * byzantine + 2} rows (f: the Byzantine clients, any of whom may be in a "
          "cohort); lower byzantine or raise the cohort")


@declare("aggregator", "krum", reference="Blanchard et al., NeurIPS 2017",
         about="the (mean of the m) rows closest to their n - f - 2 nearest rows", options=(
             Option("krum_m", 1, "krum: average of the m best-scored rows (multi-Krum)",
                    kind="int", low=1, static=True),),
         reads_byzantine=True, check_cohort=_krum_fits)
def krum(num_byzantine, krum_m) -> Aggregator:
  """(Multi-)Krum (Blanchard et al., NeurIPS 2017). Weights are ignored.

  Each real row's score is the sum of squared distances to its
  ``n - f - 2`` nearest real rows (``f = num_byzantine``, at least 1 neighbour);
  the mean of the ``krum_m`` lowest-scoring rows is returned. A run passes the population's
  Byzantine count as ``f`` (any of them may be in a cohort) and refuses configurations whose
  expected cohort has ``n <= 2f + 2`` rows, outside Krum's assumption (:func:`_krum_fits`);
  a smaller realized Poisson cohort is scored with what it has (at least 1 neighbour).
  Distances are computed on the rows divided by their largest entry (the same order, no float32
  overflow from a finite row of huge entries).
  """
  check_unless_traced(lambda f: f >= 0, "krum_f", num_byzantine, "must be >= 0")

  def _aggregate(updates, weights, mask, state, key):
    """The mean of the ``krum_m`` real, finite rows of lowest Krum score."""
    del weights, key
    m = finite_rows(updates, mask)
    x = jnp.where(m[:, None] > 0, _rows(updates), 0.0)
    n = jnp.sum(m > 0).astype(jnp.int32)
    unit = x / jnp.maximum(jnp.max(jnp.abs(x)), jnp.finfo(x.dtype).tiny)
    sq = jnp.sum(unit * unit, axis=1)
    d = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * unit @ unit.T, 0.0)
    real = m > 0
    pair_ok = real[:, None] & real[None, :] & ~jnp.eye(x.shape[0], dtype=bool)
    d = jnp.sort(jnp.where(pair_ok, d, jnp.inf), axis=1)
    k = jnp.maximum(n - jnp.asarray(num_byzantine, jnp.int32) - 2, 1)
    take = jnp.arange(x.shape[0])[None, :] < k
    score = jnp.sum(jnp.where(take & jnp.isfinite(d), d, 0.0), axis=1)
    score = jnp.where(real, score, jnp.inf)
    order = jnp.argsort(score)
    chosen = jnp.zeros(x.shape[0]).at[order[:int(krum_m)]].set(1.0) * m
    out = chosen @ x / jnp.maximum(jnp.sum(chosen), 1.0)
    return _unrows(out, updates), state

  return Aggregator(_empty_init, _aggregate)


@declare("aggregator", "centered_clipping", reference="Karimireddy, He and Jaggi, ICML 2021",
         about="iterated clipping of the rows around the previous aggregate", options=(
             Option("cc_tau", 1.0, "centered_clipping: radius tau", low=0, low_open=True),
             Option("cc_iters", 1, "centered_clipping: iterations per round", kind="int", low=1,
                    static=True)))
def centered_clipping(cc_tau, cc_iters) -> Aggregator:
  """Centered clipping (Karimireddy, He and Jaggi, ICML 2021, Eq. 2).

  ``v <- v + (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||)``, ``cc_iters``
  times, from the previous round's aggregate (kept in the state; zeros at
  first), with ``tau = cc_tau``. Each row moves the result by at most ``tau / n``. Weights are
  ignored. A cohort with no usable row aggregates to zero (no step) and keeps the state.
  """

  def init(params):
    return jax.tree_util.tree_map(jnp.zeros_like, params)

  def _aggregate(updates, weights, mask, state, key):
    """``cc_iters`` clipping iterations around the previous aggregate."""
    del weights, key
    m = finite_rows(updates, mask)
    x = jnp.where(m[:, None] > 0, _rows(updates), 0.0)
    n = jnp.maximum(jnp.sum(m), 1.0)
    v = _rows(jax.tree_util.tree_map(lambda s: s[None], state))[0]
    for _ in range(int(cc_iters)):
      diff = x - v
      norm = jnp.sqrt(jnp.sum(diff * diff, axis=1))
      scale = jnp.minimum(1.0, cc_tau / jnp.maximum(norm, 1e-30)) * m
      v = v + scale @ diff / n
    kept = _unrows(v, updates)
    out = jax.tree_util.tree_map(lambda o: jnp.where(jnp.sum(m) > 0, o, 0.0), kept)
    return out, jax.tree_util.tree_map(lambda o, s: o.astype(s.dtype), kept, state)

  return Aggregator(init, _aggregate)


def get(name: str, hp: Optional[Mapping] = None, static: Optional[Mapping] = None) -> Aggregator:
  """The declared aggregator ``name``, guarded against non-finite rows (:func:`guard_nonfinite`).

  Args:
    name: a declared aggregator (``fedjax_dp.components.names("aggregator")``). "mean" is the
      realized-weight mean of :mod:`fedjax_dp.aggregators.base` (not robust to large rows).
    hp: where its numeric options are read (a round's hyper-parameters; ``byzantine``, the f of
      an aggregator declaring ``reads_byzantine``), by option name.
    static: where its static options are read (e.g. the run's options), by option name.

  Each option missing from both is at its default; other names are ignored. Python numbers and
  text are checked against the option's declaration (:meth:`fedjax_dp.components.Option.parse`);
  arrays (a round's hyper-parameters, checked when the settings were read) pass as they are.

  Returns:
    The :class:`fedjax_dp.aggregators.base.Aggregator`: ``init(params) -> state`` and
    ``aggregate(updates, weights, mask, state, key) -> (aggregate, state)``.

  Raises:
    ConfigError: for an undeclared name or a value its option does not allow.
  """
  component = components.get("aggregator", name)
  values = component.values(hp or {}, static or {})
  if component.traits.get("reads_byzantine", False):
    values["num_byzantine"] = (hp or {}).get("byzantine", 0)
  return guard_nonfinite(component.build(**values))
