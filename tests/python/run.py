# SPDX-License-Identifier: MIT
"""Run the Python suite with pytest; exit 77 (skipped) when pytest or the
built kvcache module is not there."""
import os
import sys

try:
    import pytest
except ImportError:
    print("pytest is not installed (Debian: python3-pytest); skipping")
    sys.exit(77)
try:
    import kvcache  # noqa: F401
except ImportError as e:
    print("the kvcache module is not importable (%s); skipping" % e)
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
args = [here, "-q", "-p", "no:cacheprovider", "-x"] + sys.argv[1:]
sys.exit(pytest.main(args))
