"""Issue 26 (notebook 09): what changes on real GPUs, practised on any machine.

Mixed precision, restart after a failure, debugging drills."""
