"""fedjax_dp.sampling: many cohorts at once (sample_many) against one at a time (sample)."""

import numpy as np
import pytest
from scipy.stats import chisquare

from fedjax_dp.errors import ConfigError
from fedjax_dp.sampling import FixedSizeSampler, PoissonSampler


def test_poisson_sample_many_draws_what_as_many_samples_draw():
  many, one = PoissonSampler(12, 0.3, seed=5), PoissonSampler(12, 0.3, seed=5)
  ids, mask = many.sample_many(500)
  cohorts = [one.sample() for _ in range(500)]
  assert ids.shape == mask.shape == (500, many.capacity)
  np.testing.assert_array_equal(ids, np.stack([c.ids for c in cohorts]))
  np.testing.assert_array_equal(mask, np.stack([c.mask for c in cohorts]))
  # The generators stay in step after the draws.
  np.testing.assert_array_equal(many.sample().ids, one.sample().ids)


def test_poisson_sample_many_refuses_a_draw_past_its_capacity():
  with pytest.raises(ConfigError, match="capacity"):
    PoissonSampler(20, 0.5, seed=0, capacity=2).sample_many(50)


def test_fixed_sample_many_draws_uniform_sorted_subsets():
  ids, mask = FixedSizeSampler(8, 3, seed=1).sample_many(40_000)
  assert ids.shape == (40_000, 3) and (mask == 1).all()
  assert (np.diff(ids, axis=1) > 0).all()  # distinct and ascending, as sample() gives them
  # Each of the 56 subsets of 3 clients is equally likely.
  codes = (1 << ids).sum(axis=1)
  counts = np.unique(codes, return_counts=True)[1]
  assert len(counts) == 56 and chisquare(counts).pvalue > 1e-3
