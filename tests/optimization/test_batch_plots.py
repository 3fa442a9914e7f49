"""course.optimization.batch_plots: each view draws what it is given (one line per series, unreached targets left
out)."""

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course.optimization import batch_plots  # noqa: E402
from course.optimization.batch_sweep import RunResult  # noqa: E402
from course.optimization.noise_scale import NoiseScale, TrackPoint  # noqa: E402


def run(global_batch_size, rule, warmup, steps):
    epochs = None if steps is None else steps * global_batch_size / 1000
    return RunResult(global_batch_size, rule, warmup, 0.1, steps, epochs, False, 0.9, 0.8, 0.3, 0.4, [2.3, 1.0, 0.5])


def test_steps_and_epochs_plot_one_line_per_rule_and_warmup_plus_perfect_scaling():
    results = [run(b, rule, w, s) for rule in ("none", "linear") for w in (0, 10)
               for b, s in ((8, 100), (16, 60), (32, None))]
    fig = batch_plots.steps_and_epochs_to_target(results, 0.95)
    steps_ax, epochs_ax = fig.axes
    assert len(steps_ax.lines) == 5 and len(epochs_ax.lines) == 4
    assert list(steps_ax.lines[0].get_xdata()) == [8, 16]  # batch 32 never reached the target
    assert list(steps_ax.lines[-1].get_ydata()) == pytest.approx([100, 50, 25])
    plt.close(fig)


def test_the_axes_state_the_target_the_notebook_prints():
    results = [run(8, "linear", 0, 100), run(16, "linear", 0, 60)]
    fig = batch_plots.steps_and_epochs_to_target(results, 0.955)
    assert batch_plots.target_text(0.955) == "95.5%"  # not rounded to 96%
    assert all(f"to {batch_plots.target_text(0.955)} val. accuracy" in ax.get_ylabel() for ax in fig.axes)
    plt.close(fig)


def test_log_axes_label_their_ticks_as_plain_numbers():
    results = [run(b, "linear", 0, s) for b, s in ((8, 800), (64, 104), (1024, 27))]  # epochs 6.4 to 27.6
    fig = batch_plots.steps_and_epochs_to_target(results, 0.95)
    fig.canvas.draw()
    labels = [label.get_text() for ax in fig.axes for label in ax.yaxis.get_ticklabels(minor=True)
              + ax.yaxis.get_ticklabels()]
    assert "20" in labels and not any("times" in label or "^" in label for label in labels), labels
    plt.close(fig)


def test_noise_scale_plot_shows_both_estimates():
    points = [TrackPoint(s, 1.0 / s, NoiseScale(1.0, 1.0 / s), NoiseScale(1.0, 2.0 / s)) for s in (10, 20)]
    fig = batch_plots.noise_scale_during_training(points)
    assert [list(line.get_ydata()) for line in fig.axes[1].lines] == [[10, 20], [5, 10]]
    plt.close(fig)


def test_other_views_draw_each_run():
    runs = [run(16, "sqrt", 10, 5), run(256, "sqrt", 10, None)]
    for fig, lines in ((batch_plots.warmup_losses(runs[0], runs[1]), 2),
                       (batch_plots.accuracy_against_batch_size(runs, "after 3 epochs each"), 2),
                       (batch_plots.optimizers_against_lr({"sgd": runs, "lars": runs}, 100), 3)):
        assert len(fig.axes[0].lines) == lines
        plt.close(fig)


def test_steps_and_epochs_plot_refuses_results_where_no_run_reached_the_target():
    results = [run(b, "linear", 0, None) for b in (8, 16)]
    with pytest.raises(ValueError, match=r"none of the 2 runs reached 95.0% accuracy.*raise SweepConfig.max_steps"):
        batch_plots.steps_and_epochs_to_target(results, 0.95)
