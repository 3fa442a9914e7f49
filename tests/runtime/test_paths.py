"""course.runtime.paths: tracebacks and stacks name files as the project and the packages do, not as the machine."""

import os
import sys
import sysconfig
import traceback

import torch.distributed

from course.runtime import paths
from course.runtime.rank_output import _last_traceback


def test_a_real_traceback_shows_no_absolute_path():
    try:
        torch.distributed.all_reduce(None)  # raises inside torch: a frame here, then torch's
    except Exception:  # noqa: BLE001 - any error will do: its traceback is the input
        text = traceback.format_exc()
    short = paths.shorten(text)
    assert os.path.abspath(__file__) in text and paths.ROOT not in short
    assert 'File "tests/runtime/test_paths.py"' in short
    assert 'File "torch/distributed/' in short and "site-packages" not in short


def test_the_standard_library_and_the_interpreter_are_named_by_module():
    stdlib = sysconfig.get_paths()["stdlib"]
    line = f'  File "{stdlib}/multiprocessing/process.py", line 108 in run; binary: {sys.executable}'
    assert paths.shorten(line) == (f'  File "multiprocessing/process.py", line 108 in run; binary: '
                                   f"{os.path.basename(sys.executable)}")


def test_another_environments_packages_are_shortened_too():
    line = '  File "/opt/other/.venv/lib/python3.12/site-packages/torch/utils/data/fetch.py", line 54 in fetch'
    assert paths.shorten(line) == '  File "torch/utils/data/fetch.py", line 54 in fetch'


def test_text_without_paths_is_unchanged():
    text = "RankTimeout: rank 1 made no progress for 20 s; 1/2 ranks, ratio 3/4"
    assert paths.shorten(text) == text


def test_the_tail_of_a_ranks_stderr_is_shortened():
    text = f'noise\nTraceback (most recent call last):\n  File "{paths.ROOT}/course/hello.py", line 9\nValueError: x'
    expected = 'Traceback (most recent call last):\n  File "course/hello.py", line 9\nValueError: x'
    assert _last_traceback(text, 10) == expected


def test_the_folder_torch_was_built_in_leaves_its_cpp_source_locations():
    gloo = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms"
    assert paths.shorten(gloo) == "[third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms"
    torch_build = "at /var/lib/jenkins/workspace/torch/csrc/distributed/c10d/ProcessGroupGloo.cpp:123 (EnforceNotMet)"
    assert paths.shorten(torch_build) == "at torch/csrc/distributed/c10d/ProcessGroupGloo.cpp:123 (EnforceNotMet)"
    assert paths.shorten("wrote /tmp/c10/report.txt") == "wrote /tmp/c10/report.txt"  # not a C++ source location
