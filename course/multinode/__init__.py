"""Unit 5b (notebook 05b): two "nodes" on one machine, torchrun rendezvous and network namespaces."""
