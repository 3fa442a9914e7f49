"""course.naive.input_pipeline: the slow transform, the timed loop and the min(data, device) model."""

import pytest
import torch
from torch.utils.data import TensorDataset

from course.models import LinearModel
from course.naive import input_pipeline as ip


def test_slow_transform_costs_what_it_says_and_shifts_by_at_most_one_pixel():
    image = torch.zeros(1, 8, 8)
    image[0, 4, 4] = 1
    for kind in ("sleep", "spin"):
        transform = ip.SlowTransform(0.003, kind)
        dataset = ip.TransformedDataset(TensorDataset(image[None].repeat(4, 1, 1, 1), torch.arange(4)), transform)
        assert ip.data_seconds_per_sample(dataset, batch_size=2, steps=2) >= 0.003
        out, label = dataset[1]
        y, x = divmod(int(out.flatten().argmax()), 8)
        assert label == 1 and out.sum() == 1 and abs(y - 4) <= 1 and abs(x - 4) <= 1


@pytest.mark.parametrize("cost, kind", [(-1.0, "sleep"), (0.0, "disk")])
def test_slow_transform_rejects_bad_settings(cost, kind):
    with pytest.raises(ValueError, match="cost_s must be >= 0|kind must be"):
        ip.SlowTransform(cost, kind)


def test_model_is_serial_without_workers_and_the_slower_side_with_them():
    assert ip.modelled_samples_per_s(0.003, 0.001, 0) == pytest.approx(250.0)
    assert ip.modelled_samples_per_s(0.003, 0.001, 1) == pytest.approx(1000 / 3)
    assert ip.modelled_samples_per_s(0.003, 0.001, 3) == pytest.approx(1000.0)
    assert ip.modelled_samples_per_s(0.003, 0.001, 8) == pytest.approx(1000.0)  # device-bound
    assert ip.modelled_samples_per_s(0.003, 0.001, 8, cores=2, kind="spin") == pytest.approx(2000 / 3)
    assert ip.workers_needed(0.003, 0.001) == 3 and ip.workers_needed(0.0031, 0.001) == 4
    with pytest.raises(ValueError, match="compute_s > 0"):
        ip.modelled_samples_per_s(0.003, 0.0, 1)


@pytest.mark.timeout(120)
def test_measure_splits_the_loop_into_waiting_and_computing():
    data = TensorDataset(torch.rand(40, 1, 8, 8), torch.randint(0, 10, (40,)))
    slow = ip.TransformedDataset(data, ip.SlowTransform(0.02))
    serial, parallel = ip.sweep(slow, LinearModel(), batch_size=4, num_workers=(0, 2), steps=4)
    assert (serial.num_workers, serial.steps, parallel.num_workers) == (0, 4, 2)
    # Serial: 4 samples x 20 ms of waiting per step against a linear model's microseconds of compute.
    assert serial.wait_fraction > 0.5
    assert serial.samples_per_s < 1 / 0.02
    assert 0 <= parallel.wait_fraction <= 1


def test_measure_rejects_too_little_data_and_negative_workers():
    data = TensorDataset(torch.rand(8, 1, 8, 8), torch.randint(0, 10, (8,)))
    with pytest.raises(ValueError, match="need 12 samples, the dataset has 8"):
        ip.measure(data, LinearModel(), batch_size=4, num_workers=0, steps=2)
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0"):
        ip.measure(data, LinearModel(), batch_size=4, num_workers=-1, steps=1)


def test_plot_sweep_draws_measured_and_modelled_throughput_and_wait_bars():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [ip.Measurement(0, 100.0, 0.9, 4), ip.Measurement(2, 180.0, 0.5, 4)]
    throughput_ax, wait_ax = ip.plot_sweep(measured, [110.0, 200.0])
    assert [list(line.get_ydata()) for line in throughput_ax.lines] == [[100.0, 180.0], [110.0, 200.0]]
    assert [bar.get_height() for bar in wait_ax.patches] == pytest.approx([90.0, 50.0])
    plt.close(throughput_ax.figure)


def test_plot_sweep_draws_the_printed_medians_and_intervals_when_given_rates():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course import timing

    runs = [[ip.Measurement(0, rate, 0.9, 4), ip.Measurement(2, 2 * rate, 0.5, 4)] for rate in (90.0, 100.0, 130.0)]
    rates = [timing.summarize([run[i].samples_per_s for run in runs]) for i in range(2)]
    throughput_ax, _ = ip.plot_sweep(runs[2], [110.0, 200.0], rates=rates)
    assert list(throughput_ax.lines[0].get_ydata()) == [100.0, 200.0]  # the medians, not run 2's 130 and 260
    assert any("median of 3 runs" in text.get_text() for text in throughput_ax.get_legend().get_texts())
    plt.close(throughput_ax.figure)
    with pytest.raises(ValueError, match="one rate per worker count"):
        ip.plot_sweep(runs[0], rates=rates[:1])
