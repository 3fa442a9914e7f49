"""Unit 08b, many experts: the router, top-k gating, capacity and dropped tokens, the load-balancing loss, a
mixture-of-experts layer on one process, and expert parallelism with all-to-all dispatch and combine.
Taught in ``notebooks/08b_long_context_and_experts.ipynb``."""
