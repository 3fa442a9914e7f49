"""Unit 3 (notebook 03): data parallelism by hand, who does the work, the parameter server, the input pipeline."""
