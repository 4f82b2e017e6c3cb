"""The Kubernetes API, as the agent talks to it: the client and its credentials (:mod:`.client`, the only module that
imports the official ``kubernetes`` package), and the Events it writes (:mod:`.events`, deduplicated and rate
bounded). The watches that read the cluster are a source (sources/kube.py); what they found is joined in
sources/kubevolumes.py."""
