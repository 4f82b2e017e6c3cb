"""The YAML configuration: defaults, a full file, errors that name file, line and field, and the agent's reload."""

from __future__ import annotations

import dataclasses
import logging
import math
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from storwatch import registry
from storwatch.agent import Agent
from storwatch.config import (
    RANGE,
    Config,
    ConfigError,
    MountsConfig,
    OverrideConfig,
    PathsConfig,
    TLSConfig,
    load_config,
    parse_config,
)
from storwatch.vocabulary import Durability, Mount, Override


def write(tmp_path: Path, text: str, name: str = "storwatch.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults_without_a_file() -> None:
    config = load_config(None)
    assert config == Config()
    assert config.listen == ":9477"
    assert config.platform == "auto"
    assert config.log_level == "info"
    assert config.tick_seconds == 1.0
    assert config.history_size == 30
    assert config.paths == PathsConfig("/proc", "/sys", "/")
    assert config.tls == TLSConfig("", "", "")
    assert config.mounts == MountsConfig(10.0, 1.0, 16, (), ())
    assert config.overrides() == ()


@pytest.mark.parametrize(
    "text",
    ["", "\n\n", "# nothing configured yet\n", "---\n", "--- # rendered by helm\n", "null\n"],
    ids=["empty", "blank", "comment", "empty-document", "empty-document-with-comment", "null"],
)
def test_defaults_with_an_empty_file(tmp_path: Path, text: str) -> None:
    assert load_config(write(tmp_path, text)) == Config()


FULL = """\
listen: "127.0.0.1:9500"
platform: together-k8s
log_level: debug
tick_seconds: 0.5
history_size: 600
paths:
  procfs: /host/proc
  sysfs: /host/sys
  rootfs: /host
tls:
  cert_file: /etc/storwatch/tls.crt
  key_file: /etc/storwatch/tls.key
  client_ca_file: /etc/storwatch/ca.crt
mounts:
  interval_seconds: 15
  statvfs_timeout_seconds: 2.5
  max_inflight: 8
  exclude_fstypes: [squashfs, vfat]
  overrides:
    - mountpoint: /mnt/local-nvme
      durability: cluster
      reason: replicated by DRBD
    - mountpoint: "/var/lib/kubelet/pods/*/volumes/kubernetes.io~empty-dir/*"
      durability: node
"""


def test_full_valid_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL))
    assert config == Config(
        listen="127.0.0.1:9500",
        platform="together-k8s",
        log_level="debug",
        tick_seconds=0.5,
        history_size=600,
        paths=PathsConfig("/host/proc", "/host/sys", "/host"),
        tls=TLSConfig("/etc/storwatch/tls.crt", "/etc/storwatch/tls.key", "/etc/storwatch/ca.crt"),
        mounts=MountsConfig(
            interval_seconds=15.0,
            statvfs_timeout_seconds=2.5,
            max_inflight=8,
            exclude_fstypes=("squashfs", "vfat"),
            overrides=(
                OverrideConfig("/mnt/local-nvme", Durability.CLUSTER, "replicated by DRBD"),
                OverrideConfig("/var/lib/kubelet/pods/*/volumes/kubernetes.io~empty-dir/*", Durability.NODE, ""),
            ),
        ),
    )
    assert isinstance(config.mounts.interval_seconds, float)
    assert config.host_paths().proc("1", "mountinfo") == "/host/proc/1/mountinfo"
    assert config.overrides() == (
        Override("/mnt/local-nvme", Durability.CLUSTER, "replicated by DRBD"),
        Override("/var/lib/kubelet/pods/*/volumes/kubernetes.io~empty-dir/*", Durability.NODE, ""),
    )


def test_shipped_example_is_valid_and_says_the_defaults() -> None:
    example = Path(__file__).parent.parent / "docs" / "config.example.yaml"
    if not example.exists():
        pytest.skip(f"{example} is not in this checkout")
    # Its header promises "these are the defaults": hold it to that, for the sections of every registered source too.
    loaded = registry.load_config(str(example))
    assert dataclasses.replace(loaded, extra_sections={}) == Config()
    assert loaded.extra_sections == {name: kind() for name, kind in registry.extra_sections().items()}


# text -> (line, field, what the message says). Each file is otherwise valid.
ERRORS = [
    pytest.param("platform: generic\nmounts:\n  intervl_seconds: 5\n", 3, "mounts.intervl_seconds",
                 "unknown field; known: exclude_fstypes, interval_seconds, max_inflight", id="unknown-field"),
    pytest.param("lisen: ':9000'\n", 1, "lisen", "unknown field", id="unknown-top-level-field"),
    pytest.param("platform: generic\nmounts:\n  interval_seconds: \"10\"\n", 3, "mounts.interval_seconds",
                 "expected a number, got '10'", id="string-for-a-number"),
    pytest.param("history_size: 2.5\n", 1, "history_size", "expected a whole number, got 2.5", id="float-for-an-int"),
    pytest.param("mounts:\n  max_inflight: true\n", 2, "mounts.max_inflight", "expected a whole number, got True",
                 id="bool-for-an-int"),
    pytest.param("mounts:\n  exclude_fstypes: squashfs\n", 2, "mounts.exclude_fstypes", "expected a list",
                 id="scalar-for-a-list"),
    pytest.param("paths: /host\n", 1, "paths", "expected a mapping of fields", id="scalar-for-a-section"),
    pytest.param(
        "mounts:\n  overrides:\n    - mountpoint: /home\n      durability: node\n"
        "    - mountpoint: /mnt/s3\n      durability: forever\n",
        6, "mounts.overrides[1].durability", "'forever' is not one of volatile, node, cluster, region",
        id="bad-durability-in-overrides-1",
    ),
    pytest.param("mounts:\n  overrides:\n    - durability: node\n      reason: scratch\n", 3, "mounts.overrides[0]",
                 "missing required field(s): mountpoint", id="override-without-mountpoint"),
    pytest.param("listen: localhost\n", 1, "listen", "'localhost' is not HOST:PORT", id="listen-without-port"),
    pytest.param("platform: generic\nlisten: \":99999\"\n", 2, "listen", "is not HOST:PORT", id="listen-port-range"),
    pytest.param("platform: generic\nmounts:\n  interval_seconds: 0\n", 3, "mounts.interval_seconds",
                 "must be 0.1 to 3600, got 0.0", id="zero-interval"),
    pytest.param("mounts:\n  statvfs_timeout_seconds: -1\n", 2, "mounts.statvfs_timeout_seconds",
                 "must be 0.01 to 600, got -1.0", id="negative-timeout"),
    pytest.param("tick_seconds: -0.5\n", 1, "tick_seconds", "must be 0.1 to 3600, got -0.5", id="negative-tick"),
    pytest.param("tick_seconds: .nan\n", 1, "tick_seconds", "must be 0.1 to 3600, got nan", id="nan-tick"),
    pytest.param("mounts:\n  statvfs_timeout_seconds: .NaN\n", 2, "mounts.statvfs_timeout_seconds",
                 "must be 0.01 to 600, got nan", id="nan-timeout"),
    pytest.param("mounts:\n  interval_seconds: .inf\n", 2, "mounts.interval_seconds", "must be 0.1 to 3600, got inf",
                 id="inf-interval"),
    pytest.param("gpu:\n  call_timeout_seconds: -.inf\n", 2, "gpu.call_timeout_seconds",
                 "must be 0.01 to 600, got -inf", id="minus-inf-timeout"),
    pytest.param("probes:\n  timeout_seconds: 1.0e+400\n", 2, "probes.timeout_seconds", "must be 0.01 to 600, got inf",
                 id="float-overflowing-to-inf"),
    pytest.param("kube:\n  interval_seconds: 1" + "0" * 400 + "\n", 2, "kube.interval_seconds", "is out of range",
                 id="integer-too-large-for-a-float"),
    pytest.param("history_size: 100000000000000000000\n", 1, "history_size",
                 "must be 1 to 86400 (a day at one tick a second), got 100000000000000000000", id="huge-history"),
    pytest.param("history_size: 1e20\n", 1, "history_size", "expected a whole number, got '1e20'",
                 id="yaml11-exponent-is-a-string"),
    pytest.param("checkpoints:\n  max_depth: 0\n", 2, "checkpoints.max_depth", "must be 1 to 64, got 0",
                 id="int-below-range"),
    pytest.param("mounts:\n  ? [a, b]\n  : 1\n", 2, "mounts", "a key must be a field name", id="complex-key"),
    pytest.param("? {a: 1}\n: 1\n", 1, "(top level)", "a key must be a field name", id="complex-key-top-level"),
    pytest.param("gpu:\n  samples_interval_seconds: 30\n", 2, "gpu.samples_interval_seconds",
                 "must be 0 to 10 (the driver keeps about 14 s of samples), got 30.0", id="samples-past-buffer"),
    pytest.param("log_level: chatty\n", 1, "log_level", "'chatty' is not one of debug", id="bad-log-level"),
    pytest.param("platform: aws\n", 1, "platform", "'aws' is not one of auto, generic", id="bad-platform"),
    pytest.param("tls:\n  cert_file: /tls.crt\n", 2, "tls", "cert_file and key_file go together", id="tls-half"),
    pytest.param("nfs:\n  operations: [READ, 'GET ATTR']\n", 2, "nfs.operations",
                 "'GET ATTR' is not a procedure name (READ, GETATTR...) or '*'", id="nfs-operation-name"),
    pytest.param("nfs:\n  operations: READ\n", 2, "nfs.operations", "expected a list", id="nfs-operations-scalar"),
    pytest.param("nfs: {interval_seconds: 5}\nmounts: {}\nnfs: {operations: ['*']}\n", 3, "nfs",
                 "given twice (first on line 1)", id="section-twice"),
    pytest.param("mounts:\n  interval_seconds: 5\n  interval_seconds: 6\n", 3, "mounts.interval_seconds",
                 "given twice (first on line 2)", id="field-twice"),
    pytest.param("alertmanager:\n  enabled: true\n", 2, "alertmanager.enabled",
                 "needs alertmanager.token_file or tls.client_ca_file", id="alertmanager-unauthenticated"),
    pytest.param("alertmanager:\n  node_label: kubernetes.io/hostname\n", 2, "alertmanager.node_label",
                 "'kubernetes.io/hostname' is not a Prometheus label name", id="alertmanager-node-label"),
    pytest.param("alertmanager:\n  max_body_bytes: 1073741824\n", 2, "alertmanager.max_body_bytes",
                 "must be 1024 to 16777216", id="alertmanager-body-bound"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "field", "message"), ERRORS)
def test_errors_name_file_line_and_field(tmp_path: Path, text: str, line: int, field: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    text_of_error = str(excinfo.value)
    assert text_of_error.startswith(f"{path}:{line}: {field}: "), text_of_error
    assert message in text_of_error


def test_several_problems_are_reported_together_each_with_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "listen: nowhere\nmounts:\n  max_inflight: 0\n  interval_seconds: -3\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    lines = str(excinfo.value).splitlines()
    assert lines == [
        f"{path}:1: listen: 'nowhere' is not HOST:PORT",
        f"{path}:3: mounts.max_inflight: must be 1 to 1024, got 0",
        f"{path}:4: mounts.interval_seconds: must be 0.1 to 3600, got -3.0",
    ]
    assert excinfo.value.errors == tuple(lines)


ELEVEN_PROBLEMS = """\
listen: nowhere
mounts:
  intervl_seconds: 5
  max_inflight: true
  overrides:
    - mountpoint: /mnt/s3
      durability: forever
    - durability: node
tick_seconds: -1
tls:
  cert_file: /t.crt
  key_file: [a, b]
nfs: {}
nfs: {}
gpu: yes-please
lustre: {interval_seconds: 0, intervals: 3}
"""


def eleven_problems(path: str) -> list[str]:
    """What ELEVEN_PROBLEMS (written at ``path``) is told, line by line."""
    return [
        f"{path}:1: listen: 'nowhere' is not HOST:PORT",
        f"{path}:3: mounts.intervl_seconds: unknown field; known: exclude_fstypes, interval_seconds, max_inflight, "
        "max_series, max_stuck, overrides, statvfs_timeout_seconds",
        f"{path}:4: mounts.max_inflight: expected a whole number, got True",
        f"{path}:7: mounts.overrides[0].durability: 'forever' is not one of volatile, node, cluster, region",
        f"{path}:8: mounts.overrides[1]: missing required field(s): mountpoint",
        f"{path}:9: tick_seconds: must be 0.1 to 3600, got -1.0",
        # key_file could not be read, so "cert_file and key_file go together" (about its default) is not said.
        f"{path}:12: tls.key_file: expected a str, got a list",
        f"{path}:14: nfs: given twice (first on line 13)",
        f"{path}:15: gpu: expected a mapping of fields",
        f"{path}:16: lustre.intervals: unknown field; known: enabled, interval_seconds",
        f"{path}:16: lustre.interval_seconds: must be 0.1 to 3600, got 0.0",
    ]


def test_every_problem_of_a_file_is_named_in_one_pass(tmp_path: Path) -> None:
    """Wrong fields, wrong types, a section's missing field, a key given twice and values out of range: all said at
    once, in the order of the file, rather than one a run (a registered source's section included)."""
    path = write(tmp_path, ELEVEN_PROBLEMS)
    with pytest.raises(ConfigError) as excinfo:
        registry.load_config(path)
    assert list(excinfo.value.errors) == eleven_problems(path)
    assert str(excinfo.value) == "\n".join(eleven_problems(path))


@pytest.mark.parametrize(
    ("text", "line"),
    [
        pytest.param("platform: generic\nmounts:\n  interval_seconds: [1, 2\n", 4, id="unclosed-flow-list"),
        pytest.param("platform: generic\nmounts:\n  overrides:\n   - mountpoint: /a\n  - bad\n", 5, id="bad-indent"),
        pytest.param("listen: ':9477'\nplatform: 'generic\n", 3, id="unclosed-quote"),
        pytest.param("mounts:\n\tinterval_seconds: 5\n", 2, id="tab-indent"),
    ],
)
def test_broken_yaml_names_the_line(tmp_path: Path, text: str, line: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert str(excinfo.value).startswith(f"{path}:{line}: invalid YAML: "), str(excinfo.value)


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        pytest.param(
            "mounts: " + "[" * 5000 + "]" * 5000 + "\n", 1, "nested deeper than 16 levels", id="5000-deep-flow"
        ),
        pytest.param(
            "".join(" " * i + f"k{i}:\n" for i in range(40)), 16, "nested deeper than 16 levels", id="deep-block"
        ),
        pytest.param("nfs:\n  operations: [" + "READ, " * 100_001 + "]\n", 2, "too many nodes", id="100k-nodes"),
    ],
)
def test_parsing_is_bounded(tmp_path: Path, text: str, line: int, message: str) -> None:
    """Depth (the composer recurses: 5,000 levels was a RecursionError) and node count are bounded, with the line."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert str(excinfo.value) == f"{path}:{line}: invalid YAML: {message}"


def test_a_file_past_1_mib_is_refused_unread(tmp_path: Path) -> None:
    path = write(tmp_path, "# padding\n" * 110_000)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert str(excinfo.value) == f"{path}: larger than 1048576 bytes; not a storwatch configuration"


def numeric_fields(tp: Any = Config, prefix: str = "") -> Iterator[tuple[str, Any, dataclasses.Field[Any]]]:
    """(dotted name, owning dataclass, field) of every int or float field of the schema, sections within included."""
    hints = typing.get_type_hints(tp)
    for f in dataclasses.fields(tp):
        hint = hints[f.name]
        if hint in (int, float):
            yield f"{prefix}{f.name}", tp, f
        elif dataclasses.is_dataclass(hint):
            yield from numeric_fields(hint, f"{prefix}{f.name}.")


def test_every_number_in_the_schema_has_a_range() -> None:
    """A new numeric field is declared with config.number(default, minimum, maximum): NaN, infinity and absurd values
    are then refused like every other."""
    names = [name for name, _, _ in numeric_fields()]
    assert len(names) >= 20 and "tick_seconds" in names and "checkpoints.max_depth" in names
    missing = [name for name, _, f in numeric_fields() if RANGE not in f.metadata]
    assert not missing, f"declare these with config.number(default, minimum, maximum): {missing}"
    for name, _, f in numeric_fields():
        declared = f.metadata[RANGE]
        assert declared.minimum <= f.default <= declared.maximum, name
        assert math.isfinite(declared.minimum) and math.isfinite(declared.maximum), name


def with_value(name: str, value: float) -> Config:
    """The default Config with one field (a dotted name) set to ``value``."""

    def set_in(section: Any, parts: list[str]) -> Any:
        if len(parts) == 1:
            return dataclasses.replace(section, **{parts[0]: value})
        return dataclasses.replace(section, **{parts[0]: set_in(getattr(section, parts[0]), parts[1:])})

    return typing.cast(Config, set_in(Config(), name.split(".")))


@pytest.mark.parametrize("name", [name for name, _, _ in numeric_fields()])
def test_each_number_takes_its_bounds_and_refuses_what_lies_outside(name: str) -> None:
    f = next(f for n, _, f in numeric_fields() if n == name)
    declared = f.metadata[RANGE]
    for ok in (declared.minimum, declared.maximum):
        with_value(name, ok).validate()
    step = 1 if isinstance(f.default, int) and not isinstance(f.default, bool) else 1e-9
    bad = [declared.minimum - step, declared.maximum + step]
    if not isinstance(f.default, int):
        bad += [math.nan, math.inf, -math.inf]
    for value in bad:
        with pytest.raises(ConfigError) as excinfo:
            with_value(name, value).validate("cfg")
        assert str(excinfo.value).startswith(f"cfg: {name}: must be "), str(excinfo.value)


@pytest.mark.parametrize("text", ["- listen: ':9477'\n", "just a string\n"], ids=["list", "scalar"])
def test_top_level_must_be_a_mapping(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^cfg\.yaml:1: \(top level\): expected a mapping of fields$"):
        parse_config(text, "cfg.yaml")


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = str(tmp_path / "etc" / "storwatch.yaml")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path)
    assert str(excinfo.value).startswith(f"{path}: cannot read: ")
    assert "No such file or directory" in str(excinfo.value)


def test_non_utf8_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"platform: generic\n# caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(str(path))


# -- reload in a running agent


def nvme_mount() -> Mount:
    return Mount(
        mount_id=97,
        mountpoint="/mnt/local-nvme",
        device="/dev/nvme1n1",
        fstype="xfs",
        root="/",
        major=259,
        minor=4,
        readonly=False,
        options=("rw",),
        super_options=("rw",),
        usage=None,
        stuck=False,
        stuck_seconds=0.0,
    )


GOOD_WITH_OVERRIDE = """\
platform: together-k8s
history_size: 50
mounts:
  interval_seconds: 20
  overrides:
    - mountpoint: /mnt/local-nvme
      durability: cluster
      reason: replicated by DRBD
"""


def reload_metrics(agent: Agent) -> tuple[float, float]:
    """(storwatch_config_reload_errors_total, storwatch_config_last_reload_success) as the agent exports them."""
    text = agent.exporter.render(None).decode()
    values = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("storwatch_config_")
    }
    return values["storwatch_config_reload_errors_total"], values["storwatch_config_last_reload_success"]


def test_agent_reload_applies_a_good_file_and_keeps_it_when_the_next_is_bad(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "platform: together-k8s\n")
    # No sources: nothing reads this machine's mounts; only the configuration and classifier are exercised.
    agent = Agent(load_config(path), config_path=path, sources=[], process_metrics=False)
    try:
        assert reload_metrics(agent) == (0.0, 1.0)
        assert agent.platform.name == "together-k8s"
        assert agent.classifier.classify(nvme_mount()).durability is Durability.NODE

        write(tmp_path, GOOD_WITH_OVERRIDE)
        assert agent.reload() is True
        assert agent.config.mounts.interval_seconds == 20.0
        assert agent.history.capacity == 50
        assert agent.classifier.overrides == (Override("/mnt/local-nvme", Durability.CLUSTER, "replicated by DRBD"),)
        verdict = agent.classifier.classify(nvme_mount())
        assert verdict.durability is Durability.CLUSTER
        assert verdict.reason == "replicated by DRBD"
        good_config, good_classifier = agent.config, agent.classifier

        write(tmp_path, "platform: together-k8s\nmounts:\n  interval_seconds: -1\n")
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="storwatch.agent"):
            assert agent.reload() is False
        assert agent.config is good_config
        assert agent.classifier is good_classifier
        assert agent.classifier.classify(nvme_mount()).durability is Durability.CLUSTER
        assert agent.history.capacity == 50
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1
        message = errors[0].getMessage()
        assert "keeping the last good configuration" in message
        assert f"{path}:3: mounts.interval_seconds: must be 0.1 to 3600, got -1.0" in message
        assert not [r for r in caplog.records if "configuration reloaded" in r.getMessage()]
        assert reload_metrics(agent) == (1.0, 0.0)

        write(tmp_path, "platform: together-k8s\nmounts:\n  overrides: [\n")
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="storwatch.agent"):
            assert agent.reload() is False
        assert agent.config is good_config
        assert [r.levelno for r in caplog.records] == [logging.ERROR]
        assert f"{path}:4: invalid YAML" in caplog.records[0].getMessage()

        assert reload_metrics(agent) == (2.0, 0.0)

        # The file is fixed again: the reload goes through.
        write(tmp_path, GOOD_WITH_OVERRIDE.replace("cluster", "region"))
        assert agent.reload() is True
        assert agent.classifier.classify(nvme_mount()).durability is Durability.REGION
        assert reload_metrics(agent) == (2.0, 1.0)
    finally:
        agent.stop()


def test_agent_reload_logs_every_problem_of_a_bad_file_and_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, GOOD_WITH_OVERRIDE)
    agent = Agent(registry.load_config(path), config_path=path, sources=[], process_metrics=False)
    try:
        good = agent.config
        write(tmp_path, ELEVEN_PROBLEMS)
        with caplog.at_level(logging.ERROR, logger="storwatch.agent"):
            assert agent.reload() is False
        assert agent.config is good
        (record,) = caplog.records
        head, *problems = record.getMessage().splitlines()
        assert head == "reload failed, keeping the last good configuration:"
        assert [p.strip() for p in problems] == eleven_problems(path)
        assert reload_metrics(agent) == (1.0, 0.0)
    finally:
        agent.stop()


def test_agent_reload_keeps_config_when_the_file_disappears(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, GOOD_WITH_OVERRIDE)
    agent = Agent(load_config(path), config_path=path, sources=[], process_metrics=False)
    try:
        before = agent.config
        Path(path).unlink()
        with caplog.at_level(logging.ERROR, logger="storwatch.agent"):
            assert agent.reload() is False
        assert agent.config is before
        assert f"{path}: cannot read" in caplog.records[-1].getMessage()
    finally:
        agent.stop()


class RefusingMounts:
    """A mounts source whose configure() fails for an interval of 20 s (a bug in applying a reload, say)."""

    name = "mounts"
    interval_seconds = 3600.0

    def __init__(self) -> None:
        self.configured: list[float] = []

    def configure(self, config: MountsConfig) -> None:
        if config.interval_seconds == 20.0:
            raise RuntimeError("cannot take 20 s")
        self.configured.append(config.interval_seconds)

    def collect(self) -> tuple[Mount, ...]:
        return ()

    def close(self) -> None:
        pass


def test_agent_reload_that_fails_to_apply_puts_the_last_good_config_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path, "platform: generic\nhistory_size: 40\n")
    source = RefusingMounts()
    agent = Agent(load_config(path), config_path=path, sources=[source], process_metrics=False)
    try:
        good = agent.config
        write(tmp_path, GOOD_WITH_OVERRIDE)  # valid, but its mounts section makes the source raise
        with caplog.at_level(logging.ERROR, logger="storwatch.agent"):
            assert agent.reload() is False
        assert agent.config is good and agent.platform.name == "generic"
        assert agent.history.capacity == 40
        assert source.configured == [10.0]  # the last good section given back to the source
        assert [r.getMessage() for r in caplog.records] == [
            f"reload failed, keeping the last good configuration:\n{path}: cannot apply: RuntimeError: cannot take 20 s"
        ]
        assert reload_metrics(agent) == (1.0, 0.0)
    finally:
        agent.stop()


def test_the_alertmanager_receiver_is_on_only_with_a_credential(tmp_path: Path) -> None:
    assert load_config(None).alertmanager.enabled is False
    token = load_config(write(tmp_path, "alertmanager: {enabled: true, token_file: /run/secrets/am-token}\n"))
    assert token.alertmanager.enabled and token.alertmanager.token_file == "/run/secrets/am-token"
    mtls = "tls: {cert_file: /t.crt, key_file: /t.key, client_ca_file: /ca.crt}\nalertmanager: {enabled: true}\n"
    assert load_config(write(tmp_path, mtls)).alertmanager.enabled
