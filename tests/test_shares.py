"""A call's measured shares (opcost.model.shares), computed by hand from made-up rows."""

import numpy as np
import pandas as pd

from opcost.model import shares


def test_busy_share_is_the_busy_time_over_the_summed_kernel_time() -> None:
    rows = pd.DataFrame(
        {
            "gpu_time_s": [100e-6, 40e-6, 0.0, 10e-6],
            "gpu_busy_time_s": [60e-6, 40e-6, 5e-6, None],
        }
    )
    share = shares.busy_share(rows)
    np.testing.assert_allclose(share[:2], [0.6, 1.0])  # 3 streams at once; one after another
    assert np.isnan(share[2:]).all()  # no kernel time; busy time not recorded
    assert np.isnan(shares.busy_share(rows.drop(columns="gpu_busy_time_s"))).all()


def test_graph_share_is_a_graphed_windows_time_per_call_over_the_busy_time() -> None:
    rows = pd.DataFrame(
        {
            "power_graphed": [True, True, False, None, True],
            "power_time_s": [30e-6, 12e-6, 10e-6, np.nan, 5e-6],
            "gpu_busy_time_s": [100e-6, 10e-6, 10e-6, 10e-6, np.nan],
            "n_kernels": [64.0, 1.0, 1.0, 1.0, 1.0],
        }
    )
    share = shares.graph_share(rows)
    np.testing.assert_allclose(share[:2], [0.3, 1.0])  # one kernel: 1
    np.testing.assert_allclose(shares.graph_share(rows.drop(columns="n_kernels"))[:2], [0.3, 1.2])
    assert np.isnan(share[2:]).all()  # eager window, none, no busy time
    assert np.isnan(shares.graph_share(rows.drop(columns="power_graphed"))).all()
    # A sample timed from a graph: that time, whatever its power window.
    timed = rows.assign(graph_time_s=[50e-6, np.nan, 8e-6, 10e-6, 1e-6])
    share = shares.graph_share(timed)
    np.testing.assert_allclose(share[:4], [0.5, 1.0, 1.0, 1.0])
    assert np.isnan(share[4])
    # In training, the kernels of its longer pass: 64 = 16 forward + 48 backward has 48.
    training = timed.assign(mode="training", forward_n_kernels=[16.0, 1.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(shares.kernels_per_pass(training), [48, 1, 1, 1, 1])
    np.testing.assert_allclose(shares.graph_share(training)[:2], [0.5, 1.0])
