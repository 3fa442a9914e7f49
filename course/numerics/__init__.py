"""Numerics for every unit: how far a correct distributed result may be from the one-process result (bounds,
propagate), and where a wrong one first went wrong (divergence). Used by the labs' checks and notebook 08."""
