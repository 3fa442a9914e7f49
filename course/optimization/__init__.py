"""Unit 1-2 (notebooks 01, 02): gradient descent vs SGD, large batches, learning-rate scaling, LARS."""
