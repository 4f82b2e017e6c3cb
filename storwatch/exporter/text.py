"""The exposition writer: metric families as lines of the Prometheus text format (0.0.4), and a scrape's bytes.

Every area of the exporter writes its families with :class:`Family`, each made from its entry in the metric catalog
(:mod:`.catalog`): a sample becomes its line of text when it is added (label names sorted, values escaped and
numbers formatted as prometheus_client's ``generate_latest`` writes them), so a scrape of a large node's series is a
join of lines already written. ``Family.samples`` parses the lines back, so any other consumer (a test,
prometheus_client's own writer) reads the samples as from any prometheus_client family.

One rule for numbers, here and nowhere else: a sample's value is finite, or it is not written. The text format could
carry ``NaN``, ``+Inf`` and ``-Inf``, but a NaN or infinity that reached a figure by accident (a tenant's event line
of ``"end": 1e999``, a division by a zero duration) would poison every ``sum()`` and ``rate()`` over it. The only
exception is ``+Inf`` in a family made with ``allow_inf=True``, whose entry in docs/metrics.md ("Where +Inf is
written") says what ``+Inf`` means there (test_strict_output checks the two agree).
"""

from __future__ import annotations

import io
import math
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import cast

from prometheus_client.metrics_core import METRIC_TYPES, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from storwatch.printable import shown

# prometheus_client's own number formatting (Go's, as Prometheus writes numbers), so our text is what it would write.
_float_text = cast(Callable[[float], str], floatToGoString)
# Names as the text format takes them unquoted (prometheus_client quotes or escapes any other; ours are all these).
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# prometheus_client's generate_latest renames these families and types for the text format.
_TEXT_NAME_SUFFIX = {"counter": "_total", "info": "_info"}
_TEXT_TYPE = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}
# The types prometheus_client's Metric takes.
_TYPES = frozenset(METRIC_TYPES)
# Samples generate_latest moves out of their family into a gauge family of their own, written after it.
_LATE_SUFFIXES = ("_created", "_gsum", "_gcount")

_NEG_INF = float("-inf")
_POS_INF = float("inf")
_FLOAT_MAX = sys.float_info.max
_EXACT_INT = 2**53
"""Below this every int converts to a float exactly, so its decimal digits are the float's."""


def label_value(value: str) -> str:
    """A label value escaped as the text format writes it inside its quotes; a name from disk as
    :func:`printable.shown` text (a byte that is not UTF-8 as ``\\xNN``), so the scrape is UTF-8."""
    if not value.isascii():
        value = shown(value)
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def value_text(value: float) -> str:
    """A sample's value as prometheus_client writes it."""
    # prometheus_client writes a number as Python's repr of the float, except infinities, NaN and positive numbers of
    # more than 6 integer digits (a Go-style exponent). Below 10**6 the repr is the answer: a count is "42.0".
    if type(value) is int:
        if 0 <= value < 1_000_000:
            return f"{value}.0"
        if 0 < value < _EXACT_INT:
            # floatToGoString's exponent form straight from the digits (byte counters are mostly this big):
            # 12345000 -> "1.2345e+07".
            digits = str(value)
            return f"{(digits[0] + '.' + digits[1:]).rstrip('0.')}e+{len(digits) - 1:02d}"
    elif type(value) is float and _NEG_INF < value < 1_000_000.0:  # NaN fails the comparison
        return repr(value)
    return _float_text(value)


def exportable(value: float, allow_inf: bool = False) -> bool:
    """Whether a sample of ``value`` is written: a finite number, or ``+Inf`` where ``allow_inf`` (module doc)."""
    if type(value) is int:
        # Compared exactly (math.isfinite would overflow converting one past a float's range, and so would the
        # writing): an int no float can hold would be written as an infinity, or not at all.
        return -_FLOAT_MAX <= value <= _FLOAT_MAX
    return math.isfinite(value) or (allow_inf and value == _POS_INF)


def labels_text(*pairs: tuple[str, str]) -> str:
    """A label set as the text format writes it; ``pairs`` come in the order of their names, as the format sorts
    them (the golden scrape, checked against prometheus_client's own writer, holds every family to it)."""
    return "{" + ",".join(f'{name}="{label_value(value)}"' for name, value in pairs) + "}"


def labels_template(names: Sequence[str], fixed: Mapping[str, str] | None = None) -> str:
    """A label set of these names as a ``str.format`` template, written sorted by name. ``fixed`` gives some of the
    names their value, written into the template; ``{0}``, ``{1}``... stand for the others' values, in the order of
    ``names``, already escaped (:func:`label_value`). For the families with a series or more per mount and
    operation: a template is made once a render, and filled once a series."""
    fixed = fixed or {}
    for key in names:
        if not _LABEL_NAME.fullmatch(key):
            raise ValueError(f"label name {key!r} would need escaping, which render_text does not do")
    if set(fixed) - set(names):
        raise ValueError(f"fixed values for labels not among {tuple(names)}: {sorted(set(fixed) - set(names))}")
    if not names:
        return ""
    slot = {name: i for i, name in enumerate(n for n in names if n not in fixed)}
    pairs = []
    for name in sorted(names):
        value = fixed.get(name)
        text = f"{{{slot[name]}}}" if value is None else label_value(value).replace("{", "{{").replace("}", "}}")
        pairs.append(f'{name}="{text}"')
    return "{{" + ",".join(pairs) + "}}"


class Family:
    """One metric family, its samples written as text lines as they are added.

    The exporter's areas make theirs from the metric catalog (``catalog.SPEC.family()``); prometheus_client's
    families come in through :meth:`from_metric`. ``name`` is the family's name as prometheus_client keeps it
    (without a counter's ``_total``), ``sample_name`` the name a scrape shows (a counter's ends in ``_total``).
    ``labels`` are the label names :meth:`add` takes values for, in the caller's order; lines are written with the
    names sorted. A value that is not finite is not written (:func:`exportable`), but ``+Inf`` where ``allow_inf``
    (docs/metrics.md says what it means).

    A Family is not a prometheus_client ``Metric``: its samples are its lines, written by :meth:`add` and the other
    writers here, and :attr:`samples` reads them back.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        typ: str = "gauge",
        labels: Sequence[str] = (),
        allow_inf: bool = False,
    ) -> None:
        if typ not in _TYPES:
            raise ValueError(f"{name}: unknown metric type {typ!r}")
        suffix = _TEXT_NAME_SUFFIX.get(typ, "")
        self.name = name.removesuffix(suffix) if suffix else name
        """The family's name as prometheus_client keeps it (a counter's without ``_total``)."""
        self.documentation = documentation
        self.type = typ
        self.sample_name = self.name + suffix
        """The name a scrape shows, on every sample line (a histogram's add ``_bucket``, ``_count`` and ``_sum``)."""
        self.lines: list[str] = []
        """The family's sample lines, each ending in a newline, in the order they were added."""
        for key in labels:
            if not _LABEL_NAME.fullmatch(key):
                raise ValueError(f"label name {key!r} would need escaping, which render_text does not do")
        self.label_names = tuple(labels)
        self._order = sorted(range(len(labels)), key=lambda i: labels[i])
        self.allow_inf = allow_inf
        """``+Inf`` is written: docs/metrics.md says what it means for this family."""

    def __repr__(self) -> str:
        return f"Family({self.sample_name!r}, {self.type}, {len(self.lines)} lines)"

    @property
    def samples(self) -> list[Sample]:
        """The lines parsed back by prometheus_client's text parser: what a scrape of this family reads."""
        if not self.lines:
            return []
        text = self.header() + "".join(self.lines)
        return [s for family in text_string_to_metric_families(text) for s in family.samples]

    def header(self) -> str:
        """The family's ``# HELP`` and ``# TYPE`` lines."""
        name = self.sample_name
        if not _METRIC_NAME.fullmatch(name):
            raise ValueError(f"metric name {name!r} would need escaping, which render_text does not do")
        doc = self.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        return f"# HELP {name} {doc}\n# TYPE {name} {_TEXT_TYPE.get(self.type, self.type)}\n"

    def labels_template(self, fixed: Mapping[str, str] | None = None) -> str:
        """The family's label set as a template (:func:`labels_template`) for :meth:`add_text`."""
        return labels_template(self.label_names, fixed)

    def labels_for(self, values: Sequence[str]) -> str:
        """The label set of a sample with these values (in the order of ``labels``) as :meth:`add` writes it, for
        :meth:`add_text`: written once, it serves every family with the same label names."""
        return self._labels(values)

    def _labels(self, values: Sequence[str], extra: tuple[str, str] | None = None) -> str:
        names = self.label_names
        if len(values) != len(names):
            raise ValueError(f"{self.name}: {len(names)} label values expected, got {len(values)}")
        pairs = [(names[i], values[i]) for i in self._order]
        if extra is not None:
            pairs.append(extra)
            pairs.sort()
        return labels_text(*pairs) if pairs else ""

    def add(self, values: Sequence[str], value: float | None) -> None:
        """One sample with these label values (in the order of ``labels``); None, or a value that is not finite
        (:func:`exportable`), writes nothing."""
        if value is not None and exportable(value, self.allow_inf):
            self.lines.append(f"{self.sample_name}{self._labels(values)} {value_text(value)}\n")

    def add_text(self, labels: str, value: float | None) -> None:
        """One sample whose label set is already written (:meth:`labels_for`, or ``""`` for none); None writes
        nothing. For the families with a series or more per mount, device or NFS procedure, nearly all of a large
        node's. As :meth:`add`, a value that is not finite writes nothing."""
        if value is not None and exportable(value, self.allow_inf):
            self.lines.append(f"{self.sample_name}{labels} {value_text(value)}\n")

    def add_lines(self, lines: str) -> None:
        """Sample lines already written whole (each ending in a newline), as :meth:`add_text` would write them. Their
        values are the caller's to keep finite: this is for counters the kernel keeps as integers (NFS)."""
        self.lines.append(lines)

    def add_histogram(self, values: Sequence[str], buckets: Sequence[tuple[str, float]], sum_value: float) -> None:
        """A histogram's cumulative ``buckets`` (upper bound as written, count; ``+Inf`` last), then its count and
        sum, as prometheus_client's HistogramMetricFamily has them written. Nothing of it is written when a count or
        the sum is not finite: a histogram without one of its series would be read wrong."""
        if not all(exportable(v) for v in (sum_value, *(count for _, count in buckets))):
            return
        name = self.name
        for bound, count in buckets:
            self.lines.append(f"{name}_bucket{self._labels(values, ('le', bound))} {value_text(count)}\n")
        labels = self._labels(values)
        self.lines.append(f"{name}_count{labels} {value_text(buckets[-1][1])}\n")
        self.lines.append(f"{name}_sum{labels} {value_text(sum_value)}\n")

    @classmethod
    def from_metric(cls, metric: Metric) -> list[Family]:
        """A family from another collector (prometheus_client's process metrics) as Families written as
        generate_latest writes it: ``_created``, ``_gsum`` and ``_gcount`` samples in gauge families of their own
        after it. A sample whose value is not finite is left out, as :meth:`add` leaves it out."""
        exposed = metric.name + _TEXT_NAME_SUFFIX.get(metric.type, "")
        family = cls(exposed, metric.documentation, metric.type)
        late: dict[str, Family] = {}
        late_names = {metric.name + suffix: suffix for suffix in _LATE_SUFFIXES}
        for sample in metric.samples:
            if not exportable(sample.value):
                continue
            labels = sample.labels
            for key in labels:
                if not _LABEL_NAME.fullmatch(key):
                    raise ValueError(f"label name {key!r} would need escaping, which render_text does not do")
            text = labels_text(*sorted(labels.items())) if labels else ""
            stamp = "" if sample.timestamp is None else f" {int(float(sample.timestamp) * 1000):d}"
            line = f"{sample.name}{text} {value_text(sample.value)}{stamp}\n"
            suffix = late_names.get(sample.name)
            if suffix is None:
                family.lines.append(line)
            else:
                if suffix not in late:
                    late[suffix] = cls(metric.name + suffix, metric.documentation)
                late[suffix].lines.append(line)
        return [family, *(late[suffix] for suffix in sorted(late))]


def render_text(families: Iterable[Family | Metric]) -> bytes:
    """The text exposition format (0.0.4) of ``families``, byte for byte what prometheus_client's generate_latest
    writes for them (tested). A Family's lines are already written; a prometheus_client family is written through
    :meth:`Family.from_metric`.

    Each family is encoded as it comes and added to one growing buffer, whose bytes are the result (``getvalue``
    hands them over without a copy): a large node's scrape (2.7 MB) is held once, where joining every line first
    held its lines, their text and its bytes at once, and each family's lines can go as soon as it is written."""
    out = io.BytesIO()
    write = out.write
    for metric in families:
        for family in (metric,) if isinstance(metric, Family) else Family.from_metric(metric):
            # Strict UTF-8 holds: every label value went through label_value (a name from disk's undecodable bytes
            # as \xNN text), and names and help are the catalog's own.
            write(family.header().encode("utf-8"))
            write("".join(family.lines).encode("utf-8"))
    return out.getvalue()
