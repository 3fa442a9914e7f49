"""The words of the grader's feedback that send a student after a bug: no correct script's feedback may hold one
(issue 24). Used by tests/grader/test_fair_idioms.py and tests/grader/test_submissions.py."""

from grader.results import Results

# each one is in some wrong submission's feedback (test_fair_idioms proves the list catches every WRONG one)
ACCUSING = ("not averaged", "unaveraged", "differ after", "do not match", "did not match", "tamper", "forged",
            "did not produce", "integrity violation", "also fetched", "under-scaled", "without combining",
            "crash", "out of scope", "train without it", "instead of", "summed", "divided by", "not assessed",
            "cannot be assessed", "not run", "never joined", "took no optimizer step", "not available",
            "not the final model", "multiplied by")


def accusations(results: Results) -> list[str]:
    """The lines of a run's feedback (its status detail and every check's message) that accuse it of something."""
    lines = [results.detail, *(f"{c.name}: {c.message}" for c in results.checks)]
    return [line for line in lines if any(word in line.lower() for word in ACCUSING)]
