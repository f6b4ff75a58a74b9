#!/usr/bin/env bash
# The test files added since commit $1, as pytest --ignore options on one line (for benchmarks/suite_time.sh and
# benchmarks/suite_workers.sh, which time the suite on the test files that existed then).  Run inside the checkout to
# compare.  tests/dashboard/test_heal_panel.py existed at ab5e475 under another name, so it is never left out.
set -eu
git diff -M --name-only --diff-filter=A "$1"..HEAD -- tests/ | grep -E "/test_[^/]*\.py$" \
  | grep -v "^tests/dashboard/test_heal_panel.py$" | sed 's/^/--ignore=/' | tr '\n' ' '
