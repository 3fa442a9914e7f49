"""The autograder for the course's final assignment: a 4-GPU conversion of a single-GPU script."""
