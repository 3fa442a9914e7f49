def updates_to_converge(loss, optimum, eps, k):
    """Index of the first of k consecutive records with abs(loss - optimum) <= eps; None if there is none."""
    run = 0
    for index, value in enumerate(loss):
        run = run + 1 if abs(value - optimum) <= eps else 0
        if run == k:
            return index - k + 1
    return None
