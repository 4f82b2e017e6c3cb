"""A restricted, bounded reader of pickles found in checkpoints: it imports nothing and calls nothing the data names.

Pickles are programs: the standard unpickler imports any module and calls any function a file names, so a checkpoint
can run code as whoever reads it. This reader runs the pickle machine itself, opcode by opcode (decoded by
``pickletools.genops``). Each global a pickle names is one of three things:

  * allowed: a stand-in of our own (an inert ``Record``, a tuple, a string) that lets the structural check go on;
  * unsafe (:func:`unsafe_global`): a name that runs code, or opens files, processes or sockets, when the standard
    unpickler loads it (``os.system``, ``builtins.exec``, ``subprocess.Popen``, ``torch.load``...): the read stops
    there with :class:`UnsafeGlobal`, before anything else happens;
  * unknown: any other class or function (a framework's dataclass the lists do not name). Since nothing is ever
    imported or called here, it stands as an inert ``Record`` of that name and the read goes on; the name is noted
    (``unknown``) so the caller can say so. A class the reader does not know is not damage.

Bounds: the input size (the caller reads at most ``max_pickle_bytes``), the objects built (every value and container
slot counts, so memo tricks that re-push one large object many times still count against it), the nesting of tuples
(hashing a deeply nested tuple recurses in C without a guard), and a wall-time deadline. Huge length fields cannot
allocate: every read is clamped to what is left of the input (``load_stream`` reads a file through a window).

Allow-lists:
  * ``DCP_METADATA``: what torch.distributed.checkpoint's ``.metadata`` holds (torch 1.13 to 2.13 layouts).
  * ``TORCH_WEIGHTS_ONLY``: torch's own ``weights_only`` set (rebuild functions, storages, dtypes, OrderedDict...).
  * ``HARMLESS_DATA``: plain data classes real checkpoints carry (argparse.Namespace, Lightning's AttributeDict,
    numpy arrays and scalars, pathlib paths, datetime values, slices, defaultdicts), and the one use of ``getattr``
    and ``operator.or_`` that Python's own enum pickling writes (a member by its name; a flag combination).
  * ``DEEPSPEED``, ``MEGATRON`` and ``HF_TRAINER``: the library classes those frameworks pickle into their files.
Plus the configured ``checkpoints.allowed_globals``, which only quiets the note on unknown names: an unsafe name stays
unsafe whatever the configuration says.

Why one file: it is one machine. The opcode loop, the stack and memo it keeps, the allow-lists, the unsafe names and
the stand-ins they map to are read together when judging whether a pickle can make the reader do anything; split,
the one question a reviewer must answer (can any opcode reach an import or a call?) would span modules.
"""

from __future__ import annotations

import _compat_pickle
import io
import pickletools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from storwatch.checkpoints.limits import Deadline, LimitReached

_DEADLINE_EVERY = 4096
_MAX_TUPLE_DEPTH = 100
_MAX_MARK_DEPTH = 10_000


class PickleError(Exception):
    """The pickle is malformed, or does something its format never does."""


class UnsafeGlobal(Exception):
    """The pickle names a global that runs code (or opens files, processes or sockets) when unpickled the standard
    way; ``name`` is ``module.name``, ``why`` says what it would do. Not a PickleError: it says nothing of damage."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"names {name}, which {why} when unpickled")
        self.name = name
        self.why = why


class Record:
    """An inert stand-in for an instance of an allowed class: its name, constructor arguments and state."""

    __slots__ = ("args", "items", "kind", "state")

    def __init__(self, kind: str, args: tuple[Any, ...] = ()) -> None:
        self.kind = kind
        self.args = args
        self.state: Any = None
        self.items: Any = None
        """Items set by SETITEM(S) (a dict subclass) or APPEND(S) (a list subclass)."""

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the record's state (a dict state, or the dict half of a (dict, slots) state)."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            slots = state[1]
            if key in slots:
                return slots[key]
            state = state[0]
        return state.get(key, default) if isinstance(state, dict) else default

    def __repr__(self) -> str:
        return f"<{self.kind}>"


class Global:
    """What a GLOBAL opcode pushes: the name and what calling or instantiating it does (None: it is a value)."""

    __slots__ = ("call", "name", "new")

    def __init__(
        self,
        name: str,
        call: Callable[[Reader, tuple[Any, ...]], Any] | None = None,
        new: Callable[[Reader, tuple[Any, ...]], Any] | None = None,
    ) -> None:
        self.name = name
        self.call = call
        self.new = new

    def __repr__(self) -> str:
        return self.name


# ---- stand-ins -------------------------------------------------------------------------------------------------


def _record(name: str) -> Global:
    """An allowed class: calling it (REDUCE) or creating it (NEWOBJ) makes an inert Record."""

    def make(reader: Reader, args: tuple[Any, ...]) -> Record:
        return Record(name, args)

    return Global(name, make, make)


def _value(name: str) -> Global:
    """An allowed constant (a dtype, a storage class): a value, never called."""
    return Global(name)


def _torch_size(reader: Reader, args: tuple[Any, ...]) -> tuple[Any, ...]:
    (dims,) = args if len(args) == 1 else (args,)
    if not isinstance(dims, (tuple, list)) or not all(type(d) is int for d in dims):
        raise PickleError("torch.Size is given something other than whole numbers")
    return reader.tuple_of(dims)


def _text(name: str) -> Global:
    """A function of plain strings whose result only needs to be recognisable (torch.device, a layout)."""

    def make(reader: Reader, args: tuple[Any, ...]) -> str:
        if not all(isinstance(a, (str, int)) for a in args):
            raise PickleError(f"{name} is given something other than strings and numbers")
        reader.charge(len(args))
        return f"{name}{args!r}"[:200]

    return Global(name, make)


def _path(name: str) -> Global:
    def make(reader: Reader, args: tuple[Any, ...]) -> str:
        if not all(isinstance(a, str) for a in args):
            raise PickleError(f"{name} is given something other than strings")
        reader.charge(sum(len(a) for a in args) // 64 + len(args))
        return "/".join(args)

    return Global(name, make, make)


def _ordered_dict(reader: Reader, args: tuple[Any, ...]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    if args:
        (pairs,) = args
        if not isinstance(pairs, (list, tuple)):
            raise PickleError("OrderedDict is given something other than a list of pairs")
        reader.charge(len(pairs))
        for pair in pairs:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise PickleError("OrderedDict is given something other than a list of pairs")
            out[pair[0]] = pair[1]
    return out


def _defaultdict(reader: Reader, args: tuple[Any, ...]) -> dict[Any, Any]:
    # The factory is only recorded, never called: the items follow as SETITEMS.
    if len(args) > 1 or (args and args[0] is not None and not isinstance(args[0], Global)):
        raise PickleError("defaultdict is given something other than a factory")
    return {}


def _set(frozen: bool) -> Callable[[Reader, tuple[Any, ...]], Any]:
    def make(reader: Reader, args: tuple[Any, ...]) -> Any:
        items: Any = args[0] if args else ()
        if not isinstance(items, (list, tuple, set, frozenset)):
            raise PickleError("a set is given something other than a list")
        reader.charge(len(items))
        return reader.frozenset_of(items) if frozen else set(items)

    return make


def _bytearray(reader: Reader, args: tuple[Any, ...]) -> bytearray:
    data: Any = args[0] if args else b""
    if not isinstance(data, (bytes, bytearray, list)):
        raise PickleError("bytearray is given something other than bytes")
    reader.charge_bytes(len(data))
    return bytearray(data) if not isinstance(data, list) else bytearray(bytes(len(data)))


def _bytes(reader: Reader, args: tuple[Any, ...]) -> bytes:
    # Protocol 2 writes b"" as bytes() and a bytes subclass's value as bytes(list of ints).
    data: Any = args[0] if args else []
    if len(args) > 1 or not isinstance(data, (list, bytes)) or not all(type(b) is int and 0 <= b < 256 for b in data):
        raise PickleError("bytes is given something other than byte values")
    reader.charge_bytes(len(data))
    return bytes(data)


def _codecs_encode(reader: Reader, args: tuple[Any, ...]) -> bytes:
    # Protocol 2 writes bytes as _codecs.encode(text, "latin1").
    if len(args) != 2 or not isinstance(args[0], str) or args[1] not in ("latin1", "latin-1"):
        raise PickleError("_codecs.encode is used for something other than bytes")
    reader.charge_bytes(len(args[0]))
    return args[0].encode("latin-1")


def _complex(reader: Reader, args: tuple[Any, ...]) -> complex:
    if not all(type(a) in (int, float) for a in args) or len(args) > 2:
        raise PickleError("complex is given something other than numbers")
    return complex(*(float(a) for a in args))


def _reconstructor(reader: Reader, args: tuple[Any, ...]) -> Any:
    # copyreg._reconstructor(cls, base, state): protocol 0/1 pickles of plain objects.
    if len(args) != 3 or not isinstance(args[0], Global) or args[0].new is None:
        raise PickleError("copyreg._reconstructor is used on something that is not an allowed class")
    if not isinstance(args[1], Global) or args[1].name not in ("builtins.object", "builtins.dict", "builtins.list"):
        raise PickleError("copyreg._reconstructor is used with a base other than object, dict or list")
    return args[0].new(reader, ())


def _rebuild_from_type(reader: Reader, args: tuple[Any, ...]) -> Any:
    # torch._tensor._rebuild_from_type_v2(func, new_type, args, state): func must itself be an allowed rebuild.
    if len(args) != 4 or not isinstance(args[0], Global) or args[0].call is None or not isinstance(args[2], tuple):
        raise PickleError("torch._tensor._rebuild_from_type_v2 is used on something that is not a rebuild function")
    if not isinstance(args[1], Global):
        raise PickleError("torch._tensor._rebuild_from_type_v2 names a type that is not allowed")
    return args[0].call(reader, args[2])


def _tensor(name: str) -> Global:
    """torch._utils rebuild functions: a Record whose first argument (usually the storage) the caller may check."""

    def make(reader: Reader, args: tuple[Any, ...]) -> Record:
        return Record(name, args)

    return Global(name, make)


_ATTRIBUTE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}", re.ASCII)


def _getattr(reader: Reader, args: tuple[Any, ...]) -> Global:
    # Python 3.11 and later pickle a plain Enum member as getattr(TheEnum, "NAME") (and a Flag combination as
    # operator.or_ of such): that one form is allowed. Its result is a name that is never called: calling it, or
    # getattr on anything but a named class, or of a private or dunder name, is what a gadget does.
    if len(args) != 2 or not isinstance(args[0], Global) or not isinstance(args[1], str):
        raise UnsafeGlobal("builtins.getattr", f"{_RUNS_CODE} (it is used on something other than a named class)")
    owner, attr = args[0].name, args[1]
    why = unsafe_global(owner, attr) if _ATTRIBUTE_NAME.fullmatch(attr) else "reaches a private or dunder attribute"
    if why is not None:
        raise UnsafeGlobal(f"builtins.getattr({owner[:120]}, {attr[:60]!r})", why)
    reader.charge(_UNKNOWN_GLOBAL_OBJECTS)
    return _attribute(f"{owner}.{attr}")


def _attribute(name: str) -> Global:
    """What getattr(a named class, a public name) gives: an enum member, say; calling it is a method call."""

    def call(reader: Reader, args: tuple[Any, ...]) -> Any:
        raise UnsafeGlobal(name[:300], f"{_RUNS_CODE} (it calls an attribute reached by getattr)")

    return Global(name, call, call)


def _enum_or(reader: Reader, args: tuple[Any, ...]) -> Record:
    # operator.or_(FLAG_A, FLAG_B): how a Flag combination pickles. Nothing is or-ed here.
    if len(args) != 2 or not all(isinstance(a, (Global, Record, int)) for a in args):
        raise UnsafeGlobal("operator.or_", f"{_RUNS_CODE} (it is used on something other than enum flags)")
    return Record("operator.or_", args)


# ---- allow-lists -----------------------------------------------------------------------------------------------

TORCH_DTYPES = [
    "float32",
    "float",
    "float64",
    "double",
    "float16",
    "half",
    "bfloat16",
    "complex32",
    "chalf",
    "complex64",
    "cfloat",
    "complex128",
    "cdouble",
    "uint8",
    "int8",
    "int16",
    "short",
    "int32",
    "int",
    "int64",
    "long",
    "bool",
    "uint16",
    "uint32",
    "uint64",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint7",
    "int1",
    "int2",
    "int3",
    "int4",
    "int5",
    "int6",
    "int7",
    "qint8",
    "quint8",
    "qint32",
    "quint4x2",
    "quint2x4",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "bits8",
    "bits16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
]
TORCH_LAYOUTS = ("strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc", "_mkldnn", "jagged")
TORCH_MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")
TORCH_QSCHEMES = (
    "per_tensor_affine",
    "per_tensor_symmetric",
    "per_channel_affine",
    "per_channel_symmetric",
    "per_channel_affine_float_qparams",
)
_STORAGE_NAMES = [
    "Double",
    "Float",
    "Half",
    "BFloat16",
    "Long",
    "Int",
    "Short",
    "Char",
    "Byte",
    "Bool",
    "ComplexFloat",
    "ComplexDouble",
    "QInt8",
    "QUInt8",
    "QInt32",
    "QUInt4x2",
    "QUInt2x4",
]
STORAGE_ELEMENT_BYTES: dict[str, int] = {
    **{
        f"torch.{n}Storage": size
        for n, size in zip(_STORAGE_NAMES, (8, 4, 2, 2, 8, 4, 2, 1, 1, 1, 8, 16, 1, 1, 4, 1, 1), strict=True)
    },
    "torch.storage.UntypedStorage": 1,
    "torch.UntypedStorage": 1,
    "torch.ByteStorage": 1,
}
"""Bytes per element of each storage class a torch.save persistent id names (numel counts these elements)."""
_TENSOR_TYPES = ["Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool"]
_REBUILD_FUNCTIONS = [
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor",
    "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_numpy",
    "_rebuild_device_tensor_from_cpu_tensor",
]


def _table(entries: Iterable[Global]) -> dict[str, Global]:
    return {g.name: g for g in entries}


def _torch_weights_only() -> dict[str, Global]:
    entries: list[Global] = [
        Global("collections.OrderedDict", _ordered_dict, _ordered_dict),
        _record("collections.Counter"),
        _record("torch.nn.parameter.Parameter"),
        _text("torch.serialization._get_layout"),
        Global("torch.Size", _torch_size, _torch_size),
        _record("torch.Tensor"),
        _text("torch.device"),
        Global("_codecs.encode", _codecs_encode),
        Global("builtins.bytearray", _bytearray),
        Global("builtins.bytes", _bytes),
        Global("builtins.set", _set(False)),
        Global("builtins.frozenset", _set(True)),
        Global("builtins.complex", _complex),
        Global("torch._tensor._rebuild_from_type_v2", _rebuild_from_type),
    ]
    entries += [_value(f"torch.{d}") for d in TORCH_DTYPES]
    entries += [_value(f"torch.{q}") for q in TORCH_QSCHEMES]
    entries += [_value(f"torch.{layout}") for layout in TORCH_LAYOUTS]
    entries += [_value(f"torch.{m}") for m in TORCH_MEMORY_FORMATS]
    entries += [_value(name) for name in STORAGE_ELEMENT_BYTES]
    entries += [_value("torch.storage.TypedStorage"), _value("torch.TypedStorage")]
    for prefix in ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse"):
        entries += [_value(f"{prefix}.{t}Tensor") for t in _TENSOR_TYPES]
    entries += [_value(f"torch.cuda.{n}Storage") for n in _STORAGE_NAMES[:12]]
    entries += [_tensor(f"torch._utils.{f}") for f in _REBUILD_FUNCTIONS]
    return _table(entries)


TORCH_WEIGHTS_ONLY: Mapping[str, Global] = _torch_weights_only()
"""torch's own ``weights_only`` allow-list (torch/_weights_only_unpickler.py, ``_get_allowed_globals``), as inert
stand-ins."""

_RECONSTRUCTOR = Global("copyreg._reconstructor", _reconstructor)

HARMLESS_DATA: Mapping[str, Global] = _table(
    [
        _record("argparse.Namespace"),
        _record("types.SimpleNamespace"),
        _record("lightning.fabric.utilities.data.AttributeDict"),
        _record("lightning.pytorch.utilities.parsing.AttributeDict"),
        _record("pytorch_lightning.utilities.parsing.AttributeDict"),
        Global("collections.defaultdict", _defaultdict, _defaultdict),
        Global("builtins.getattr", _getattr),
        *(Global(f"{m}.or_", _enum_or) for m in ("operator", "_operator")),
        *(_value(f"builtins.{t}") for t in ("list", "dict", "int", "float", "str", "bool", "tuple", "object")),
        _record("builtins.slice"),
        _record("builtins.range"),
        *(_record(f"datetime.{t}") for t in ("datetime", "date", "time", "timedelta", "timezone")),
        *(_path(f"{m}.{c}") for m in ("pathlib", "pathlib._local") for c in ("PosixPath", "PurePosixPath")),
        *(_record(f"{m}.multiarray.{f}") for m in ("numpy.core", "numpy._core") for f in ("_reconstruct", "scalar")),
        *(_record(f"{m}.numeric._frombuffer") for m in ("numpy.core", "numpy._core")),
        _record("numpy.ndarray"),
        _record("numpy.dtype"),
        *(
            _record(f"numpy.dtypes.{t}DType")
            for t in [
                "Float64",
                "Float32",
                "Float16",
                "Int64",
                "Int32",
                "Int16",
                "Int8",
                "UInt64",
                "UInt32",
                "UInt16",
                "UInt8",
                "Bool",
                "Complex64",
                "Complex128",
                "Bytes",
                "Str",
                "Object",
            ]
        ),
        _RECONSTRUCTOR,
    ]
)
"""Plain data classes that real checkpoints carry (Lightning hyper-parameters, HF's numpy RNG state, argparse
arguments): harmless when never called, as here."""

DCP_METADATA: Mapping[str, Global] = _table(
    [
        *(
            _record(f"torch.distributed.checkpoint.metadata.{c}")
            for c in (
                "Metadata",
                "TensorStorageMetadata",
                "BytesStorageMetadata",
                "ChunkStorageMetadata",
                "MetadataIndex",
                "TensorProperties",
                "StorageMeta",
                "_MEM_FORMAT_ENCODING",
                "TensorInfo",
            )
        ),
        _record("torch.distributed.checkpoint.filesystem._StorageInfo"),
        _record("torch.distributed.checkpoint.filesystem._StoragePrefix"),
        # torch 1.13 to 2.2 took TensorProperties from the sharded-tensor package.
        _record("torch.distributed._shard.sharded_tensor.metadata.TensorProperties"),
        _record("torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING"),
        Global("torch.Size", _torch_size, _torch_size),
        _text("torch.serialization._get_layout"),
        _text("torch.device"),
        Global("collections.OrderedDict", _ordered_dict, _ordered_dict),
        *(_value(f"torch.{d}") for d in TORCH_DTYPES),
        *(_value(f"torch.{layout}") for layout in TORCH_LAYOUTS),
        *(_value(f"torch.{m}") for m in TORCH_MEMORY_FORMATS),
        *(_path(f"{m}.{c}") for m in ("pathlib", "pathlib._local") for c in ("PosixPath", "PurePosixPath")),
        Global("_codecs.encode", _codecs_encode),
        Global("builtins.set", _set(False)),
        Global("builtins.frozenset", _set(True)),
        _value("builtins.object"),
        _RECONSTRUCTOR,
        Global("builtins.getattr", _getattr),
        *(Global(f"{m}.or_", _enum_or) for m in ("operator", "_operator")),
    ]
)
"""torch.distributed.checkpoint ``.metadata``: the metadata dataclasses (torch 1.13 to 2.13), torch.Size, dtypes,
layouts, the checkpoint id's path, plain containers and enum members by name."""

DEEPSPEED: Mapping[str, Global] = _table(
    _record(n)
    for n in (
        "deepspeed.runtime.zero.config.ZeroStageEnum",
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
        "deepspeed.utils.tensor_fragment.fragment_address",
        "deepspeed.runtime.zero.stage_1_and_2.DeepSpeedZeroOptimizer",
        "deepspeed.runtime.zero.stage3.DeepSpeedZeroOptimizer_Stage3",
    )
)
"""Classes DeepSpeed pickles into its model and optimizer states (the ZeRO stage, the fp16 loss scaler)."""

MEGATRON: Mapping[str, Global] = _table(
    _record(n)
    for n in (
        "megatron.core.enums.ModelType",
        "megatron.core.transformer.enums.AttnBackend",
        "megatron.core.transformer.enums.AttnMaskType",
        "megatron.core.transformer.enums.AttnType",
        "megatron.core.transformer.enums.LayerType",
        "megatron.core.rerun_state_machine.RerunMode",
        "megatron.core.rerun_state_machine.RerunState",
    )
)
"""Enums Megatron's ``args`` carry into ``common.pt`` and ``model_optim_rng.pt``."""

HF_TRAINER: Mapping[str, Global] = _table(
    _record(n)
    for n in (
        "transformers.training_args.TrainingArguments",
        "transformers.training_args.OptimizerNames",
        "transformers.trainer_utils.IntervalStrategy",
        "transformers.trainer_utils.SaveStrategy",
        "transformers.trainer_utils.HubStrategy",
        "transformers.trainer_utils.SchedulerType",
        "transformers.trainer_utils.FSDPOption",
        "transformers.debug_utils.DebugOption",
        "transformers.training_args.ParallelMode",
        "transformers.trainer_pt_utils.AcceleratorConfig",
        "accelerate.utils.dataclasses.DistributedType",
        "accelerate.state.PartialState",
    )
)
"""What the Hugging Face Trainer pickles into ``training_args.bin`` (its arguments and their enums)."""


_RUNS_CODE = "runs code"
_FILES = "opens, writes or removes files"
_NETWORK = "opens network connections"
_PROCESSES = "starts processes or threads, or signals them"

UNSAFE: Mapping[str, str] = {
    **dict.fromkeys(
        (
            # The interpreter itself: names that import, compile, evaluate or reach any object.
            "builtins",
            "__builtin__",
            "sys",
            "importlib",
            "imp",
            "runpy",
            "pkgutil",
            "zipimport",
            "site",
            "code",
            "codeop",
            "types",
            "inspect",
            "gc",
            "operator",
            "_operator",
            "ctypes",
            "_ctypes",
            "cffi",
            "pydoc",
            "pdb",
            "bdb",
            "doctest",
            "timeit",
            "trace",
            "profile",
            "cProfile",
            "unittest",
            "test",
            "idlelib",
            "ensurepip",
            "venv",
            "distutils",
            "setuptools",
            "pip",
            "compileall",
            "py_compile",
            "logging.config",
            # Other deserialisers: loading one of their objects loads a pickle (or code) of its own.
            "pickle",
            "_pickle",
            "cPickle",
            "marshal",
            "shelve",
            "dbm",
            "copy_reg",
            "dill",
            "cloudpickle",
            "joblib",
            "jsonpickle",
            "yaml",
            "IPython",
            "torch.load",
            "torch.storage._load_from_bytes",
            "torch.serialization",
            "torch.hub",
            "torch.jit",
            "torch.package",
            "torch.fx",
            "torch.utils.cpp_extension",
            "torch._C",
            "torch.ops",
            "torch._ops",
            "torch.classes",
            "torch.library",
            "torch.compile",
            "torch.compiler",
            "torch._dynamo",
            "torch._inductor",
            "torch.distributed.rpc",
            "numpy.testing",
            "numpy.f2py",
            "numpy.distutils",
            "numpy.ctypeslib",
            "numpy.load",
            "numpy.lib.npyio",
            "numpy.lib._npyio_impl",
            "numpy.lib.format",
            "pandas.read_pickle",
            "pandas.io",
        ),
        _RUNS_CODE,
    ),
    **dict.fromkeys(
        (
            "os",
            "posix",
            "nt",
            "subprocess",
            "_posixsubprocess",
            "commands",
            "popen2",
            "pty",
            "platform",
            "webbrowser",
            "multiprocessing",
            "_multiprocessing",
            "concurrent",
            "asyncio",
            "threading",
            "_thread",
            "signal",
            "_signal",
            "faulthandler",
            "atexit",
            "resource",
            "uuid._get_command_stdout",
            "uuid._popen",
        ),
        _PROCESSES,
    ),
    **dict.fromkeys(
        (
            "io",
            "_io",
            "codecs.open",
            "shutil",
            "tempfile",
            "fileinput",
            "mmap",
            "fcntl",
            "tarfile",
            "zipfile",
            "gzip",
            "bz2",
            "lzma",
            "sqlite3",
            "logging.FileHandler",
            "logging.basicConfig",
            "logging.handlers",
            "torch.save",
            "torch.from_file",
            "numpy.save",
            "numpy.savez",
            "numpy.savez_compressed",
            "numpy.savetxt",
            "numpy.loadtxt",
            "numpy.genfromtxt",
            "numpy.fromfile",
            "numpy.memmap",
            "numpy.core.memmap",
            "numpy._core.memmap",
        ),
        _FILES,
    ),
    **dict.fromkeys(
        (
            "socket",
            "_socket",
            "ssl",
            "select",
            "http",
            "urllib",
            "urllib2",
            "httplib",
            "ftplib",
            "smtplib",
            "poplib",
            "imaplib",
            "nntplib",
            "telnetlib",
            "xmlrpc",
            "socketserver",
            "requests",
            "urllib3",
            "httpx",
            "aiohttp",
        ),
        _NETWORK,
    ),
}
"""Names that run code, or reach files, processes or the network, when the standard unpickler loads a pickle naming
them: a whole module (and every name below it) or one function. Allowed stand-ins are looked up first, so
``builtins.set`` stays allowed while every other builtin (``eval``, ``exec``, ``getattr``, ``open``, ``__import__``)
is unsafe. ``functools.partial`` and the like are not here: they call only what they are given, which is a global the
pickle must name too (``partial(os.system, ...)`` names ``posix.system``)."""

_CLASS_LIKE = re.compile(r"_*[A-Z]")
_MODULE_NAMES = frozenset(
    [
        "os",
        "posix",
        "nt",
        "sys",
        "subprocess",
        "builtins",
        "importlib",
        "runpy",
        "pickle",
        "marshal",
        "shutil",
        "socket",
        "ctypes",
        "pty",
    ]
)
"""Modules a global must not reach as an attribute of another module (``logging`` + ``os``: the os module)."""
_DUNDER_OK = frozenset({"copyreg.__newobj__", "copyreg.__newobj_ex__"})


def unsafe_global(module: str, name: str) -> str | None:
    """What the global ``module.name`` would do when unpickled the standard way, if that is dangerous; else None.

    Beyond the names in UNSAFE: a dunder anywhere in the name (``__builtins__``, ``__globals__``, ``__import__``),
    and an attribute path (pickle protocol 4 walks dotted names with getattr) that passes through anything but a
    class: ``logging.os.system`` or ``collections.abc.sys`` reach a dangerous module through a harmless one, and
    pickle itself writes dotted names for classes nested in classes, and for methods reached through their class
    (``pathlib.Path.write_text``), which no checkpoint needs."""
    full = f"{module}.{name}"
    parts = full.split(".")
    for i in range(len(parts), 0, -1):
        why = UNSAFE.get(".".join(parts[:i]))
        if why is not None:
            return why
    attrs = name.split(".")
    if attrs[-1] in _MODULE_NAMES:
        return f"{_RUNS_CODE} (it names the module {attrs[-1]} as an attribute of {module[:120]})"
    if full not in _DUNDER_OK and any(a.startswith("__") and a.endswith("__") for a in attrs):
        return f"{_RUNS_CODE} (it reaches into an object's internals)"
    if len(attrs) > 1 and not all(_CLASS_LIKE.match(a) for a in attrs):
        return f"{_RUNS_CODE} (it reaches {attrs[-1][:80]} through the attribute path {name[:120]})"
    return None


def with_extra(base: Mapping[str, Global], extra: Iterable[str]) -> Callable[[str], Global | None]:
    """A resolver: ``base``, plus configured ``module.name`` (or ``module.*``) entries as inert records. Unsafe names
    are never resolved (the reader refuses them); any other name resolves to None (unknown, noted by the reader)."""
    exact = {n for n in extra if not n.endswith(".*")}
    prefixes = tuple(n[:-1] for n in extra if n.endswith(".*"))

    def resolve(name: str) -> Global | None:
        found = base.get(name)
        if found is not None:
            return found
        if (name in exact or (prefixes and name.startswith(prefixes))) and not _unsafe_full(name):
            return _record(name)
        return None

    return resolve


def _unsafe_full(full: str) -> str | None:
    module, _, name = full.rpartition(".")
    return unsafe_global(module, name) if module else None


# ---- the machine -----------------------------------------------------------------------------------------------


class _Mark:
    __slots__ = ()


_UNKNOWN_GLOBAL_OBJECTS = 12
MAX_UNKNOWN_NAMES = 1000
"""Distinct unknown names noted per dict passed as ``unknown`` (a pickle naming more is still read)."""


class Reader:
    """One run (or several, one pickle after another) of the restricted pickle machine."""

    def __init__(
        self,
        resolve: Callable[[str], Global | None],
        persistent_load: Callable[[Reader, Any], Any] | None = None,
        max_objects: int = 4_000_000,
        deadline: Deadline | None = None,
        unknown: dict[str, int] | None = None,
    ) -> None:
        self.resolve = resolve
        self.persistent_load = persistent_load
        self.max_objects = max_objects
        self.deadline = deadline
        self.unknown: dict[str, int] = {} if unknown is None else unknown
        """Names neither allowed nor unsafe, each with how often the pickle names it; read as inert records."""
        self.objects = 0
        self.bytes_made = 0
        self.max_bytes_made = 0
        self._tuple_depth: dict[int, int] = {}
        self._unknown_globals: dict[str, Global] = {}

    # -- accounting

    def charge(self, n: int) -> None:
        self.objects += n
        if self.objects > self.max_objects:
            raise LimitReached(
                "max_pickle_objects",
                f"stopped at the pickle object limit ({self.max_objects:,} objects, "
                "checkpoints.deep_max_pickle_objects)",
            )

    def charge_bytes(self, n: int) -> None:
        # Stand-ins that copy strings into bytes may copy at most as much as the input holds, in all.
        self.bytes_made += n
        if self.bytes_made > self.max_bytes_made:
            raise PickleError("the pickle copies more bytes than it holds (a memo amplification)")
        self.charge(1)

    def tuple_of(self, items: Iterable[Any]) -> tuple[Any, ...]:
        t = tuple(items)
        self.charge(len(t) + 1)
        depth = 1
        for item in t:
            if type(item) is tuple or type(item) is frozenset:
                depth = max(depth, self._tuple_depth.get(id(item), 1) + 1)
        if depth > _MAX_TUPLE_DEPTH:
            raise PickleError(f"tuples nested deeper than {_MAX_TUPLE_DEPTH} levels")
        self._tuple_depth[id(t)] = depth
        return t

    def frozenset_of(self, items: Iterable[Any]) -> frozenset[Any]:
        items = self.tuple_of(items)
        f = frozenset(items)
        self._tuple_depth[id(f)] = self._tuple_depth[id(items)]
        return f

    # -- the run

    def load(self, data: bytes) -> Any:
        return self.load_stream(io.BytesIO(data), len(data))

    def load_stream(self, stream: Any, size: int) -> Any:
        """Read one pickle from ``stream`` (a binary file object whose reads never return more than is left of the
        ``size`` bytes it may hold), leaving the stream just past its STOP."""
        self.max_bytes_made += size
        try:
            return self._run(stream)
        except (PickleError, LimitReached, UnsafeGlobal):
            raise
        except RecursionError:  # pragma: no cover - depth is bounded above; kept so nothing escapes as a crash
            raise PickleError("nested too deeply") from None
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, UnicodeError) as err:
            raise PickleError(f"malformed pickle ({type(err).__name__}: {str(err)[:200]})") from None

    def _global(self, module: Any, name: Any, called: bool = False) -> Global:
        if not isinstance(module, str) or not isinstance(name, str):
            raise PickleError("a global is named by something other than two strings")
        # What the standard unpickler would resolve: Python 2 names map to Python 3 modules.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        found = self.resolve(full)
        if found is not None:
            return found
        why = unsafe_global(module, name)
        if why is not None:
            raise UnsafeGlobal(full[:300], why)
        # Unknown: never imported, never called; an inert record of that name stands in for it.
        full = full[:300]
        if full in self.unknown:
            self.unknown[full] += 1
        elif len(self.unknown) < MAX_UNKNOWN_NAMES:
            self.unknown[full] = 1
        record = self._unknown_globals.get(full)
        if record is None:
            # A stand-in (a Global and its closure) costs about a dozen objects' worth of memory: charged as such, so
            # a pickle naming millions of distinct classes stops at the object limit like any other.
            self.charge(_UNKNOWN_GLOBAL_OBJECTS)
            record = self._unknown_globals[full] = _record(full)
        return record

    def _call(self, fn: Any, args: Any) -> Any:
        if not isinstance(fn, Global):
            raise PickleError("REDUCE on something that is not a global")
        if not isinstance(args, tuple):
            raise PickleError("REDUCE with arguments that are not a tuple")
        if fn.call is None:
            raise PickleError(f"it calls {fn.name}, which is a value, not a function or class")
        self.charge(len(args) + 1)
        return fn.call(self, args)

    def _new(self, cls: Any, args: Any) -> Any:
        if not isinstance(cls, Global):
            raise PickleError("NEWOBJ on something that is not a class")
        if not isinstance(args, tuple):
            raise PickleError("NEWOBJ with arguments that are not a tuple")
        if cls.new is None:
            raise PickleError(f"it instantiates {cls.name}, which is a value, not a class")
        self.charge(len(args) + 1)
        return cls.new(self, args)

    def _run(self, stream: Any) -> Any:
        stack: list[Any] = []
        metastack: list[list[Any]] = []
        memo: dict[int, Any] = {}
        count = 0

        def pop_mark() -> list[Any]:
            nonlocal stack
            items = stack
            stack = metastack.pop()
            return items

        arg: Any
        for opcode, arg, _pos in pickletools.genops(stream):
            count += 1
            if self.deadline is not None and not count % _DEADLINE_EVERY:
                self.deadline.check()
            self.charge(1)
            name = opcode.name
            if name in ("PROTO", "FRAME"):
                if name == "PROTO" and not 0 <= arg <= 5:
                    raise PickleError(f"unsupported pickle protocol {arg}")
                continue
            if name == "STOP":
                if len(stack) != 1 or metastack:
                    raise PickleError("the pickle stops with a malformed stack")
                return stack.pop()
            if name in _PUSH_ARG:
                value = arg
                if isinstance(value, (bytes, bytearray, str)):
                    self.charge(len(value) // 64)
                if name == "BYTEARRAY8":
                    value = bytearray(arg)
                stack.append(value)
            elif name in _PUSH_CONST:
                stack.append(_PUSH_CONST[name]())
            elif name == "EMPTY_TUPLE":
                stack.append(self.tuple_of(()))
            elif name == "MARK":
                if len(metastack) >= _MAX_MARK_DEPTH:
                    raise PickleError(f"marks nested deeper than {_MAX_MARK_DEPTH}")
                metastack.append(stack)
                stack = []
            elif name == "POP":
                if stack:
                    stack.pop()
                else:
                    pop_mark()
            elif name == "POP_MARK":
                pop_mark()
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    raise PickleError(f"{name} on a stack of {len(stack)}")
                items = stack[-n:]
                del stack[-n:]
                stack.append(self.tuple_of(items))
            elif name == "TUPLE":
                items = pop_mark()  # first: it rebinds ``stack``
                stack.append(self.tuple_of(items))
            elif name == "LIST":
                items = pop_mark()
                self.charge(len(items))
                stack.append(items)
            elif name == "DICT":
                items = pop_mark()
                self.charge(len(items))
                stack.append(dict(zip(items[::2], items[1::2], strict=True)))
            elif name == "FROZENSET":
                items = pop_mark()
                stack.append(self.frozenset_of(items))
            elif name == "APPEND":
                value = stack.pop()
                self._extend(stack[-1], [value])
            elif name == "APPENDS":
                items = pop_mark()
                self._extend(stack[-1], items)
            elif name == "SETITEM":
                value, key = stack.pop(), stack.pop()
                self._setitems(stack[-1], [key, value])
            elif name == "SETITEMS":
                items = pop_mark()
                self._setitems(stack[-1], items)
            elif name == "ADDITEMS":
                items = pop_mark()
                target = stack[-1]
                if not isinstance(target, set):
                    raise PickleError("ADDITEMS on something that is not a set")
                self.charge(len(items))
                for item in items:
                    target.add(item)
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise PickleError(f"memo key {arg} read before it was written")
                stack.append(memo[arg])
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                if not stack:
                    raise PickleError("PUT on an empty stack")
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                if not stack:
                    raise PickleError("MEMOIZE on an empty stack")
                memo[len(memo)] = stack[-1]
            elif name == "GLOBAL":
                module, _, attr = arg.partition(" ")
                stack.append(self._global(module, attr))
            elif name == "STACK_GLOBAL":
                attr, module = stack.pop(), stack.pop()
                stack.append(self._global(module, attr))
            elif name == "REDUCE":
                args = stack.pop()
                fn = stack.pop()
                stack.append(self._call(fn, args))
            elif name == "NEWOBJ":
                args = stack.pop()
                cls = stack.pop()
                stack.append(self._new(cls, args))
            elif name == "NEWOBJ_EX":
                kwargs, args = stack.pop(), stack.pop()
                cls = stack.pop()
                if not isinstance(kwargs, dict):
                    raise PickleError("NEWOBJ_EX with keyword arguments that are not a dict")
                self.charge(len(kwargs))
                stack.append(self._new(cls, args))
            elif name == "BUILD":
                state = stack.pop()
                self._build(stack[-1], state)
            elif name == "INST":
                module, _, attr = arg.partition(" ")
                cls = self._global(module, attr)
                items = pop_mark()
                stack.append(self._new(cls, self.tuple_of(items)))
            elif name == "OBJ":
                items = pop_mark()
                if not items:
                    raise PickleError("OBJ without a class")
                stack.append(self._new(items[0], self.tuple_of(items[1:])))
            elif name in ("PERSID", "BINPERSID"):
                pid = arg if name == "PERSID" else stack.pop()
                if self.persistent_load is None:
                    raise PickleError("a persistent id where the format has none")
                stack.append(self.persistent_load(self, pid))
            else:
                # EXT1/2/4 (the copyreg extension registry), NEXT_BUFFER and READONLY_BUFFER (out-of-band data):
                # nothing a checkpoint writes.
                raise PickleError(f"opcode {name} is not allowed here")
        raise PickleError("the pickle ends without STOP")

    def _extend(self, target: Any, items: list[Any]) -> None:
        self.charge(len(items))
        if isinstance(target, list):
            target.extend(items)
        elif isinstance(target, Record):
            if target.items is None:
                target.items = []
            if not isinstance(target.items, list):
                raise PickleError("APPEND on a record that holds a dict")
            target.items.extend(items)
        else:
            raise PickleError("APPEND on something that is not a list")

    def _setitems(self, target: Any, items: list[Any]) -> None:
        if len(items) % 2:
            raise PickleError("SETITEMS with an odd number of items")
        self.charge(len(items))
        if isinstance(target, Record):
            if target.items is None:
                target.items = {}
            target = target.items
        if not isinstance(target, dict):
            raise PickleError("SETITEM on something that is not a dict")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def _build(self, target: Any, state: Any) -> None:
        if isinstance(target, Record):
            # The state is kept by reference, never copied: a memoised state built into many objects costs nothing.
            target.state = state
        elif isinstance(target, dict) and (state is None or isinstance(state, dict)):
            if state:
                self.charge(len(state))
                target.update(state)
        else:
            raise PickleError(f"BUILD on a {type(target).__name__}")


_PUSH_ARG = frozenset(
    [
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "UNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
    ]
)
_PUSH_CONST: dict[str, Callable[[], Any]] = {
    "NONE": lambda: None,
    "NEWTRUE": lambda: True,
    "NEWFALSE": lambda: False,
    "EMPTY_LIST": list,
    "EMPTY_DICT": dict,
    "EMPTY_SET": set,
}


def load(
    data: bytes,
    resolve: Callable[[str], Global | None],
    persistent_load: Callable[[Reader, Any], Any] | None = None,
    max_objects: int = 4_000_000,
    deadline: Deadline | None = None,
    unknown: dict[str, int] | None = None,
) -> Any:
    """Run ``data`` through the restricted machine; raise UnsafeGlobal, PickleError or LimitReached. Names neither
    allowed nor unsafe are counted in ``unknown``."""
    return Reader(resolve, persistent_load, max_objects, deadline, unknown).load(data)
