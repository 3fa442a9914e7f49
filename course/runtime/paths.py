"""File paths as a learner reads them: a rank's traceback or stack names ``course/practice/drills.py``, not the
machine's ``/home/me/multigpu-course/course/practice/drills.py``.

:func:`shorten` rewrites every absolute path under the project to one relative to it, and every path into the
installed packages or Python's standard library to the module's own path (``torch/distributed/...``,
``multiprocessing/process.py``). The ranks' relayed stderr (:mod:`course.runtime.rank_output`) goes through it,
so tracebacks and faulthandler stacks in a notebook (notebooks 00, 09, 09b) show no machine's paths; nor do the
C++ source locations in torch's and gloo's messages, which name the folder torch was built in.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from functools import cache

#: The project's root: the folder that holds the ``course`` package.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@cache
def _prefixes() -> tuple[tuple[str, str], ...]:
    """(absolute prefix, what it becomes), longest first: site-packages before the standard library it is in."""
    stdlib = sysconfig.get_paths()["stdlib"]
    found = {ROOT + os.sep: "", stdlib + os.sep: "", os.path.realpath(stdlib) + os.sep: ""}
    for folder in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path}:
        if folder.endswith(("site-packages", "dist-packages")):
            found[folder + os.sep] = ""
    return tuple(sorted(found.items(), key=lambda item: -len(item[0])))


_SITE = re.compile(r"/[^\s\"':]*?/(?:site|dist)-packages/")  # another environment's packages (a rank's venv)
#: The folder torch was built in, in a C++ source location its messages quote: gloo's timeout says
#: ``[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]``, a path of PyTorch's build
#: machine that exists on no learner's. What stays names the source file inside torch's repository.
_BUILD = re.compile(r"/[^\s\"'\[\]:]*?/(?=(?:third_party|torch/csrc|c10|aten)/[^\s\"'\]:]*\.(?:cc|cpp|cu|h|hpp):)")


def shorten(text: str) -> str:
    """``text`` with every absolute path of the project, the installed packages and the standard library made short.

    >>> shorten(f'File "{ROOT}/course/hello.py", line 3')
    'File "course/hello.py", line 3'
    """
    text = text.replace(sys.executable, os.path.basename(sys.executable))  # first: it may lie under the project
    for prefix, short in _prefixes():
        text = text.replace(prefix, short)
    return _BUILD.sub("", _SITE.sub("", text))
