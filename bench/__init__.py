"""flask-harvest benchmarks: each scenario measured beside a baseline taken in the same run.

Run ``python -m bench [--quick] [--only S1,S3]``; see ``bench/README.md``.
"""
