"""Imported by Python at start-up when tests/site is on PYTHONPATH (tests/logtee.PYTHONPATH): installs
the session's log collector in a pycni process started from source by the tests (tests/logtee.py)."""

from tests import logtee

logtee.install_from_env()
