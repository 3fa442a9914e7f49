"""Process plumbing under the lessons and the grader: where a process is started, watched and stopped.

Nothing here is a lesson; :mod:`course` (the lessons) and :mod:`grader` both stand on it, and it imports
neither the lessons nor the grader (only :mod:`course.runtime.launch` uses :mod:`course.world` to join the
process group it starts).

* :mod:`~course.runtime.process` -- ``run(argv, timeout_s, limits, capture) -> Outcome``: start a command in its own
  session, read its output through a capped reader, stop it (and everything it started) at the time limit;
* :mod:`~course.runtime.capture` -- the one capped output reader (keeps a head and a tail, counts the rest), of a pipe
  or of a file read as it grows;
* :mod:`~course.runtime.outcome` -- the one classifier of how a run ended (ok, error, timeout, out of memory,
  too many processes, killed by a signal, ...) and the :class:`~course.runtime.outcome.Limits` it is judged by;
* :mod:`~course.runtime.process_tree` -- the one process-tree kill, and the ``/proc`` reader it and the
  watchdog share;
* :mod:`~course.runtime.progress` -- slow or stuck: ranks are stuck only when none makes progress (CPU time, counted
  work) for a window, a pure decision on samples; :mod:`~course.runtime.pace` -- how much slower than the reference
  machine this one runs now, by which time limits grow;
* :mod:`~course.runtime.launch` -- ``launch(fn, world_size)``: a library function on N ranks from a notebook,
  with :mod:`~course.runtime.rank_output` (each rank's output in the notebook, prefixed by rank),
  :mod:`~course.runtime.rank_stacks` (where a hung rank is stuck) and :mod:`~course.runtime.ports`.

A subpackage of ``course``, not a top-level ``runtime`` package: a generic top-level name would be shadowed by
any ``runtime.py`` next to a notebook (the notebook's folder comes first on ``sys.path``) and would claim a common
name in the environment's ``site-packages``; one distribution keeps one import root. Importing it costs no
torch (the grader's launcher, which must start fast, imports :mod:`~course.runtime.ports`).
"""
