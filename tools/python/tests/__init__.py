"""Tests of the zpccl Python package; run them with tools/python/tests/run.py."""
