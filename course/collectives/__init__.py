"""Unit 4 (notebook 04): the allreduce algorithms, their protocol, simulation, timing and cost model.

:mod:`~course.collectives.allreduce` holds the algorithms and the one table that names them
(``ALGORITHMS``); the protocol, the simulation, the cost model and the performance model read it.
"""
