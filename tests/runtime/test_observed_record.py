"""course.runtime.observed_record: the line a rule or a log names is the learner's, never the standard library's."""

import multiprocessing.process
import os

from course.practice import drills
from course.runtime import observed_record


def test_the_standard_library_and_torch_are_not_the_learners_code():
    assert not observed_record._learners(multiprocessing.process.__file__)  # a rank's outermost frame
    assert not observed_record._learners(observed_record.TORCH + "distributed/distributed_c10d.py")
    assert not observed_record._learners(os.path.abspath(observed_record.__file__))  # the course's own


def test_a_learners_file_and_the_drills_planted_bugs_are():
    assert observed_record._learners("/home/me/project/train_4gpu.py")
    assert observed_record._learners(os.path.abspath(drills.__file__))
