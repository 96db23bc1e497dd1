"""Packaging shim: all metadata is declarative, in setup.cfg."""

from setuptools import setup

setup()
