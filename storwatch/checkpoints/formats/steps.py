"""Step directories that a tracker file or a rename commits: DeepSpeed (``latest`` -> ``global_stepN``), Megatron
(``latest_checkpointed_iteration.txt`` -> ``iter_NNNNNNN``), Hugging Face Trainer (``checkpoint-N``, complete once
settled), Accelerate's ``save_state`` directory (each process's ``random_states_N.pkl`` after the model, optimizer,
scheduler and sampler states, the registered objects' states last; complete once settled) and Orbax (committed by
renaming its temporary directory, or ``commit_success.txt`` on object stores). Their members are checkpoints of other
formats, checked through the registry the context carries.

"Settled" is the agent's rule (nothing changed within ``settle_seconds``): a directory with no end marker can look
finished while its writer is still saving. A caller that has seen that no process holds any of its files open for
writing (``storwatch verify`` reads /proc) says so (``ctx.closed``), and it is judged at once."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Collection, Iterable

from storwatch.checkpoints.formats.common import (
    _DCP_METADATA,
    _NUMBER,
    _OK,
    FALLBACK,
    TORCH_SUFFIXES,
    _Bad,
    _Ctx,
    _dir_names,
    _Finding,
    _inside,
    _NotRegular,
    _read_marker,
    _safe_relative,
    _walk_files,
    _walk_stats,
    _worst,
)
from storwatch.checkpoints.formats.dcp import _check_dcp, identify_dcp
from storwatch.checkpoints.formats.safetensors import SAFETENSORS_INDEX_SUFFIX, _safetensors_file
from storwatch.checkpoints.limits import LimitReached

# ASCII digits only, and few of them: str.isdigit() and \d accept digits int() cannot read ('²') or reads slowly.
_HF_STEP = re.compile(r"checkpoint-\d{1,18}", re.ASCII)
_MEGATRON_STEP = re.compile(r"iter_(\d{7})", re.ASCII)
_DEEPSPEED_STEP = re.compile(r"global_step(\d{1,18})", re.ASCII)
_ORBAX_TMP = ".orbax-checkpoint-tmp-"
_ORBAX_MARKERS = ("commit_success.txt", "_CHECKPOINT_METADATA", "_METADATA", "manifest.ocdbt")
_MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
# Accelerate 1.15's save_state (accelerator.py ``save_state``, checkpointing.py ``save_accelerator_state`` and
# ``save_custom_state``) writes each file straight to its final name, in this order: every model's weights
# (``model.safetensors``, ``pytorch_model.bin`` without safe_serialization, ``model_1.safetensors``... for further
# models; FSDP: ``pytorch_model_fsdp*.bin`` or a DCP directory ``pytorch_model_fsdp_N``), every optimizer's state
# (``optimizer.bin``, ``optimizer_1.bin``...; FSDP: ``optimizer_N`` DCP directories or ``optimizer*.bin``), every
# scheduler's (``scheduler.bin``...), each data loader's seedable sampler (``sampler.bin``...) and stateful loader's
# state (``dl_state_dict.bin``...), the GradScaler's (``scaler.pt``); then each process its own random states
# (``random_states_<process index>.pkl``, in every save); last, each registered object's state
# (``custom_checkpoint_N.pkl``), which load_state cannot do without.
ACCELERATE_MARKER = "random_states_0.pkl"
"""What Accelerate's save_state writes in every save (process 0's RNG states), after the model, optimizer, scheduler,
sampler and scaler states; only custom objects' ``custom_checkpoint_N.pkl`` follow it."""
_ACCELERATE_RNG = re.compile(r"random_states_(\d{1,9})\.pkl", re.ASCII)
_ACCELERATE_WEIGHTS = re.compile(
    r"model(?:_\d{1,9})?\.safetensors|pytorch_model(?:_\d{1,9})?\.bin"
    r"|pytorch_model_fsdp(?:_\d{1,9})?(?:_rank\d{1,9})?(?:\.bin)?",
    re.ASCII,
)
_ACCELERATE_OWN_STATES = re.compile(
    r"(?:optimizer|scheduler|sampler|dl_state_dict)(?:_\d{1,9})?\.bin|optimizer_\d{1,9}(?:_rank\d{1,9}\.bin)?", re.ASCII
)
"""States only save_state names so (the Trainer writes ``optimizer.pt`` and ``scheduler.pt``)."""
_ACCELERATE_CUSTOM = re.compile(r"custom_checkpoint_(\d{1,9})\.pkl", re.ASCII)
STEP_NAME = re.compile(r"(\D*)(\d{1,18})", re.ASCII)
"""A step directory's name: a prefix and a number (``checkpoint_3``, ``step_300``, ``epoch=2``)."""
_MAX_SIBLINGS_LISTED = 10_000
"""Entries of a step directory's parent read to find its sibling steps."""
_MAX_SIBLINGS_LOOKED = 8
"""Sibling step directories listed, the nearest first, to find one that is an Accelerate save_state."""
_MEMBER_FORMATS = ("torch-zip", "torch-legacy", "safetensors", "safetensors-sharded")


# ---- layouts with marker files -------------------------------------------------------------------------------


def _check_orbax(path: str, ctx: _Ctx) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    if _ORBAX_TMP in name:
        return (
            "incomplete",
            "this is an Orbax temporary directory: Orbax renames it to its step name when the save "
            f"commits, so the save did not finish (or is still running); {FALLBACK}",
        )
    # commit_success.txt is the commit on object stores; on a POSIX filesystem the rename above is.
    return (
        "complete",
        "committed (Orbax renamed its temporary directory); its tensorstore chunks are not compared with its "
        "metadata (only tensorstore knows their layout), so a chunk cut short afterwards is not seen",
    )


def _check_members(root: str, ctx: _Ctx, extra_suffixes: tuple[str, ...] = ()) -> tuple[_Finding, int]:
    """Check every checkpoint file below ``root`` (torch.save, safetensors); the worst finding and how many."""
    finding, count = _OK, 0
    for file_path in _walk_files(root, ctx.deadline):
        rel = os.path.relpath(file_path, root)
        if not rel.endswith((*TORCH_SUFFIXES, ".safetensors", SAFETENSORS_INDEX_SUFFIX, *extra_suffixes)):
            continue
        fmt = ctx.identify(file_path)
        if fmt is None and rel.endswith(TORCH_SUFFIXES) and not os.path.islink(file_path):
            no_format = _member_of_no_format(file_path, rel)
            if no_format is not None:
                count += 1
                finding = _worst(finding, no_format)
                continue
        if fmt not in _MEMBER_FORMATS:
            if os.path.islink(file_path):
                why = f"{rel} is a symbolic link that leads nowhere readable; it was not followed"
                return ("incomplete", why), count
            continue
        if not _inside(file_path, root):
            return ("incomplete", f"{rel} is a symbolic link leading out of {root}; it was not followed"), count
        count += 1
        try:
            member = (
                ctx.checks[fmt](file_path, ctx) if fmt != "safetensors" else _safetensors_file(file_path, root, ctx)[0]
            )
        except _Bad as err:
            member = err.finding
        except _NotRegular as err:
            member = ("unknown", str(err))
        except LimitReached as err:
            raise LimitReached(err.limit, f"{rel}: {err}", err.verdict) from None
        if member[0] != "complete":
            finding = _worst(finding, (member[0], f"{rel}: {member[1]}"))
    return finding, count


def _member_of_no_format(path: str, rel: str) -> _Finding | None:
    """A member the step directory's framework writes with torch.save (its ``.pt``, ``.bin``...) whose bytes are no
    format's: on its own such a file is no checkpoint (``unknown``), but here the directory is the evidence that a
    save wrote it, so it is one that never got its bytes (empty, or zeros where a crash lost what was not yet on
    disk) or lost them since. None for what is not a regular file (the member walk says what it is)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    if st.st_size == 0:
        return "incomplete", f"{rel} is empty: the save created it and wrote nothing; {FALLBACK}"
    return (
        "incomplete",
        f"{rel} holds no torch.save format (neither a ZIP archive nor torch's legacy magic number) where this "
        f"checkpoint keeps a torch.save file: it was never written in full, or was overwritten; {FALLBACK}",
    )


def _tracked_step(tracked: str, parse: re.Pattern[str]) -> int | None:
    """The step a tracker names (``global_step20``, ``iter_0000020``, ``20``); None when it names none."""
    match = parse.fullmatch(tracked)
    if match:
        return int(match.group(1))
    if _NUMBER.fullmatch(tracked):
        return int(tracked)
    return None


def _bad_tracker(tracker: str, tracked: str) -> _Finding:
    return (
        "corrupt",
        f"{tracker} holds {tracked[:40]!r}, which is not a step it could name (ASCII digits or a step directory): "
        f"the tracker is damaged or hostile; {FALLBACK}",
    )


def _check_step_dir(
    path: str, tracker: str, tracked: str | None, step: int, parse: re.Pattern[str], what: str, ctx: _Ctx
) -> _Finding:
    if tracked is None:
        return (
            "incomplete",
            f"{tracker} is missing next to this step: {what} writes it after a save finishes, so "
            f"this save did not finish; {FALLBACK}",
        )
    tracked_step = _tracked_step(tracked, parse)
    if tracked_step is None and tracked != "release":
        return _bad_tracker(tracker, tracked)
    if tracked_step is None or tracked_step < step:
        return (
            "incomplete",
            f"{tracker} names {tracked[:40]!r}, not this step or a later one: {what} writes it when a "
            f"save finishes, so this save did not finish (or is still running); {FALLBACK}",
        )
    finding, count = _check_members(path, ctx)
    if count == 0 and not any(_DCP_METADATA.fullmatch(e) for e in _dir_names(path)):
        return "incomplete", f"no checkpoint files in the step directory: the save did not write them; {FALLBACK}"
    return finding


def _check_tracked_root(
    path: str, tracker: str, dir_for: Callable[[str], str | None], ctx: _Ctx, what: str
) -> _Finding:
    tracked = _read_marker(os.path.join(path, tracker), path)
    if tracked is None:
        return (
            "incomplete",
            f"no {tracker}: {what} writes it after the first save finishes, so no save has finished here",
        )
    step_name = dir_for(tracked)
    if step_name is None or not _safe_relative(step_name) or "/" in step_name:
        return _bad_tracker(tracker, tracked)
    step_dir = os.path.join(path, step_name)
    if not os.path.isdir(step_dir) or not _inside(step_dir, path):
        return (
            "incomplete",
            f"{tracker} names {tracked[:40]!r} but {step_name[:80]} is missing: the "
            f"directory was cleaned up or copied in part; {FALLBACK}",
        )
    return ctx.checks[what.lower()](step_dir, ctx)


def _deepspeed_dir(tracked: str) -> str | None:
    return tracked if tracked and "\0" not in tracked else None


def _check_deepspeed(path: str, ctx: _Ctx) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    match = _DEEPSPEED_STEP.fullmatch(name)
    if match is None:
        return _check_tracked_root(path, "latest", _deepspeed_dir, ctx, "DeepSpeed")
    parent = os.path.dirname(os.path.abspath(path))
    tracked = _read_marker(os.path.join(parent, "latest"), parent)
    return _check_step_dir(path, "latest", tracked, int(match.group(1)), _DEEPSPEED_STEP, "DeepSpeed", ctx)


def _megatron_dir(tracked: str) -> str | None:
    if _NUMBER.fullmatch(tracked):
        return f"iter_{int(tracked):07d}"
    return "release" if tracked == "release" else None


def _check_megatron(path: str, ctx: _Ctx) -> _Finding:
    name = os.path.basename(os.path.normpath(path))
    match = _MEGATRON_STEP.fullmatch(name)
    if match is None:
        return _check_tracked_root(path, _MEGATRON_TRACKER, _megatron_dir, ctx, "Megatron")
    parent = os.path.dirname(os.path.abspath(path))
    tracked = _read_marker(os.path.join(parent, _MEGATRON_TRACKER), parent)
    finding = _check_step_dir(path, _MEGATRON_TRACKER, tracked, int(match.group(1)), _MEGATRON_STEP, "Megatron", ctx)
    if finding[0] == "complete" and identify_dcp(path):
        finding = _worst(finding, _check_dcp(path, ctx))
    return finding


def _unsettled(path: str, ctx: _Ctx) -> _Finding | None:
    """``incomplete`` while anything in the directory changed within the settle time (a save with no end marker may
    still be writing); None once it has settled, or when no process holds any of its files open for writing."""
    if ctx.closed:
        return None
    newest = max((st.st_mtime for st in _walk_stats(path, ctx.deadline)), default=os.stat(path).st_mtime)
    newest = max(newest, os.stat(path).st_mtime)
    age = ctx.now - newest
    if age < ctx.settle:
        return (
            "incomplete",
            f"something in the directory changed {max(age, 0.0):.0f} s ago, less than the "
            f"{ctx.settle:.0f} s settle time: the save may still be running; check again later",
        )
    return None


def _check_hf_trainer(path: str, ctx: _Ctx) -> _Finding:
    if not os.path.exists(os.path.join(path, "trainer_state.json")):
        if os.path.exists(os.path.join(path, ACCELERATE_MARKER)):
            # Accelerate's save_state into a directory named checkpoint-N (a Trainer's own under FSDP holds
            # Accelerate's model and optimizer names too, so only the random states say so).
            return _check_accelerate(path, ctx)
        return (
            "incomplete",
            "no trainer_state.json: the Hugging Face Trainer writes it at the end of a save, so this "
            f"save did not finish (or is still running); {FALLBACK}",
        )
    unsettled = _unsettled(path, ctx)
    if unsettled is not None:
        return unsettled
    finding, _ = _check_members(path, ctx)
    return finding


# ---- Accelerate's save_state -------------------------------------------------------------------------------------


def is_accelerate_entry(name: str) -> bool:
    """A process's random states: only save_state names a file so."""
    return bool(_ACCELERATE_RNG.fullmatch(name))


def is_accelerate_member(name: str) -> bool:
    """What save_state writes before the random states (weights, optimizer, scheduler, sampler and scaler states)."""
    return bool(_ACCELERATE_WEIGHTS.fullmatch(name) or _ACCELERATE_OWN_STATES.fullmatch(name)) or name == "scaler.pt"


def accelerate_layout(names: Collection[str]) -> bool:
    """Entries that make a directory an Accelerate save_state by themselves: a process's random states, or a model's
    weights beside a state only save_state names so (``optimizer.bin``, ``scheduler.bin``...), which is what a save
    killed before its random states leaves; not in a Trainer's directory (``trainer_state.json``)."""
    # One pass, a prefix test before each expression: the scan asks this of every directory it lists.
    own = weights = False
    trainer = False
    for n in names:
        if n.startswith(("optimizer", "scheduler", "sampler", "dl_state_dict")):
            own = own or bool(_ACCELERATE_OWN_STATES.fullmatch(n))
        elif n.startswith(("model", "pytorch_model")):
            weights = weights or bool(_ACCELERATE_WEIGHTS.fullmatch(n))
        elif n.startswith("random_states_") and _ACCELERATE_RNG.fullmatch(n):
            return True
        trainer = trainer or n == "trainer_state.json"
    # The Trainer under FSDP saves its model and optimizer through Accelerate's functions, by their names.
    return own and weights and not trainer


def accelerate_beside(path: str, names: Collection[str]) -> bool:
    """A step directory (``checkpoint_3``) holding nothing, or only what save_state writes before its random states
    (a model's weights alone), beside a sibling of the same prefix that is an Accelerate save_state by its own
    entries: a save of that series killed early, not a checkpoint of some other kind."""
    if not all(is_accelerate_member(n) for n in names):
        return False
    return _accelerate_sibling(path, earlier=False) is not None


def _step_siblings(path: str, earlier: bool) -> list[str]:
    """The sibling step directories of ``path`` with its name's prefix, the nearest step first (only the earlier
    steps when ``earlier``); empty when its name is no step's."""
    parent, name = os.path.split(os.path.normpath(os.path.abspath(path)))
    match = STEP_NAME.fullmatch(name)
    if match is None:
        return []
    prefix, step = match.group(1), int(match.group(2))
    found: list[tuple[int, str]] = []
    try:
        with os.scandir(parent) as it:
            for n, entry in enumerate(it):
                if n >= _MAX_SIBLINGS_LISTED:
                    break
                other = STEP_NAME.fullmatch(entry.name)
                if (
                    other is None
                    or other.group(1) != prefix
                    or entry.name == name
                    or (earlier and int(other.group(2)) >= step)
                    or not entry.is_dir(follow_symlinks=False)
                ):
                    continue
                found.append((abs(step - int(other.group(2))), entry.path))
    except OSError:
        return []
    return [p for _, p in sorted(found)]


def _accelerate_sibling(path: str, earlier: bool) -> tuple[str, set[str]] | None:
    """The nearest sibling step directory that is an Accelerate save_state by its own entries (one that finished,
    with its random states, when ``earlier``), and its entries."""
    for sibling in _step_siblings(path, earlier)[:_MAX_SIBLINGS_LOOKED]:
        try:
            names = _dir_names(sibling)
        except OSError:
            continue
        if (ACCELERATE_MARKER in names) if earlier else accelerate_layout(names):
            return os.path.basename(sibling), names
    return None


def _listed(names: Iterable[str], limit: int = 6) -> str:
    shown = sorted(names)
    text = ", ".join(shown[:limit])
    return text + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def _accelerate_missing(names: set[str]) -> _Finding | None:
    """``incomplete`` when random states every save_state writes are missing: process 0's, or another process's
    below the highest one present."""
    processes = sorted(int(m.group(1)) for n in names if (m := _ACCELERATE_RNG.fullmatch(n)))
    if not processes or processes[0] != 0:
        found = sorted(n for n in names if is_accelerate_member(n) or is_accelerate_entry(n))
        holds = f"it holds {_listed(found)} but no" if found else "it is empty, with no"
        return (
            "incomplete",
            f"{holds} {ACCELERATE_MARKER}: Accelerate's save_state makes the directory, then writes the model, "
            "optimizer, scheduler, sampler and scaler states, then each process's random states, so this save did "
            f"not finish (or is still running); {FALLBACK}",
        )
    gaps = sorted(set(range(processes[-1])) - set(processes))
    if gaps:
        missing = _listed(f"random_states_{i}.pkl" for i in gaps)
        return (
            "incomplete",
            f"{missing} missing beside random_states_{processes[-1]}.pkl: every process writes its own random states "
            f"in every save, so this save did not finish on every process; {FALLBACK}",
        )
    return None


def _custom_missing(path: str, names: set[str]) -> _Finding | None:
    """``incomplete`` when a registered object's state that the run's nearest earlier finished save holds is missing
    (save_state writes those last, after the random states)."""
    earlier = _accelerate_sibling(path, earlier=True)
    if earlier is not None:
        sibling, sibling_names = earlier
        lacking = {n for n in sibling_names if _ACCELERATE_CUSTOM.fullmatch(n)} - names
        if lacking:
            return (
                "incomplete",
                f"no {_listed(lacking)}, which the run's earlier save {sibling} holds: save_state writes each "
                "registered object's state last, after the random states, so this save did not finish (and "
                f"load_state would fail on it); {FALLBACK}",
            )
    return None


def _check_accelerate(path: str, ctx: _Ctx) -> _Finding:
    """One ``Accelerator.save_state`` directory: ``model.safetensors`` or ``pytorch_model.bin`` (``_N`` for further
    models), ``optimizer.bin``, ``scheduler.bin``, ``sampler.bin``, ``scaler.pt``, ``random_states_N.pkl`` (one per
    process) and ``custom_checkpoint_N.pkl``, all torch.save or safetensors files; FSDP's sharded states are DCP
    subdirectories."""
    names = _dir_names(path)
    missing = _accelerate_missing(names)
    if missing is not None:
        return missing
    unsettled = _unsettled(path, ctx)
    if unsettled is not None:
        return unsettled
    finding, _ = _check_members(path, ctx, (".pkl",))
    for name in sorted(names):
        sub = os.path.join(path, name)
        if os.path.isdir(sub) and not os.path.islink(sub) and identify_dcp(sub):
            finding = _worst(finding, _check_dcp(sub, ctx))
    if finding[0] == "complete":
        finding = _custom_missing(path, names) or finding
    return finding
