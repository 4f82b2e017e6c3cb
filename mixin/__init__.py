"""The monitoring mixin: the Prometheus rules (alerts/), Grafana dashboards (dashboards/) and the agent's default
policy (storwatch/policies/default.yaml) generated from one table of thresholds, durations and severities, as
kubernetes-mixin ships its rules; ``python -m mixin`` writes them, ``--check`` says whether the checked-in
files are what the code makes.

A development tool: the agent never imports it, and the dashboards need ``grafana-foundation-sdk`` (a development
dependency, pinned to one Grafana build in the Makefile).
"""
