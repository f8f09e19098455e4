"""``python -m course_kernels.grading ...``: the instructor's command line (also ``course-grade``)."""

import sys

from course_kernels.grading.instructor.cli import main

if __name__ == "__main__":
    sys.exit(main())
