"""Issue 26 (notebook 09): what changes on real GPUs, practised on any machine: mixed precision, restart after failure, debugging drills."""
