# The agent's image: docker build -t storwatch:0.1.0 .   (README, "Kubernetes", says how to load it into a cluster)
# No torch (deep checks then read a checkpoint's structure and CRCs without torch.load): the image stays slim, and
# pip would otherwise pull several GB of CUDA wheels. The base is pinned to an exact Python and Debian release.
FROM python:3.11.13-slim-bookworm

# The root file system is read-only in the DaemonSet: no .pyc written at run time (pip compiles them at install).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY storwatch ./storwatch
# The training side, whose contract (request and event-log names, temporaries) the agent reads: storwatch/training.py.
COPY storwatch_training ./storwatch_training
# The shipped policy set is package data (storwatch/policies/, read by storwatch/agent/policy.py, SHIPPED_DEFAULT). The
# build fails if the installed package lacks it, or if torch came in after all.
RUN pip install . \
    && cd / && rm -rf /src \
    && python -c "import os, storwatch.agent.policy as p; assert os.path.isfile(p.SHIPPED_DEFAULT), p.SHIPPED_DEFAULT" \
    && python -c "import importlib.util as u; assert u.find_spec('torch') is None, 'torch in the image'"
WORKDIR /

# Root, as the DaemonSet's runAsUser: 0 and the systemd unit's User=root; an image cannot drop capabilities, the
# runtime does: the manifests drop every one but DAC_READ_SEARCH. By hand:
#   docker run --cap-drop ALL --cap-add DAC_READ_SEARCH --security-opt no-new-privileges --read-only \
#     -v /proc:/host/proc:ro -v /sys:/host/sys:ro -v /:/host/root:ro,rslave -p 9477:9477 storwatch:0.1.0 \
#     agent --path.procfs /host/proc --path.sysfs /host/sys --path.rootfs /host/root
USER 0:0
EXPOSE 9477
ENTRYPOINT ["storwatch"]
CMD ["agent"]
