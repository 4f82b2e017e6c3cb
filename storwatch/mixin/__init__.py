"""The monitoring mixin: the Prometheus rules (alerts/) and Grafana dashboards (dashboards/) generated from one set of
thresholds, as kubernetes-mixin ships them; ``python -m storwatch.mixin`` writes them, ``--check`` says whether the
checked-in files are what the code makes.

A development tool: the agent never imports it, and the dashboards need ``grafana-foundation-sdk`` (a development
dependency, pinned to one Grafana build in the Makefile).
"""
