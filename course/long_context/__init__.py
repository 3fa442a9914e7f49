"""Unit 08b, long sequences: attention's memory against sequence length, blockwise attention with the
online-softmax merge, causal ring attention (context parallelism), its load balance, and the all-gather and
all-to-all (Ulysses) variants. Taught in ``notebooks/08b_long_context_and_experts.ipynb``."""
