"""``python -m course_kernels.grading ...`` is an alias of ``python -m course_grader ...``."""

import sys

from course_grader.cli import main

if __name__ == "__main__":
    sys.exit(main())
