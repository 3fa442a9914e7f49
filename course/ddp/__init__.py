"""Unit 4b-5 (notebooks 04b, 05): buckets, the distributed optimizer, Horovod's recipe, overlap, DDP's internals
and scripts, the conversion's accuracy, the calibration of this machine and scaling."""
