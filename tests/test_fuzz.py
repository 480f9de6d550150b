"""The fault fuzzer, through the CLI: generated overrides, names, recipe files, damaged run files, a value for every
option and argument, every kind of file for every path and every environment variable euclip reads, the commands,
options and variables found in the app and the source rather than listed by hand.

Every generated invocation is held to the fault suite's rules (tests/test_faults.py): exit 0 where
the input is good, else 1 with exactly one ``error:`` line that names the culprit, or 2 with one
``error:`` line per problem (a configuration reports all of its problems at once), each naming its
culprit; no traceback, an answer within a time limit, no memory filled, and nothing already in the folder
changed. Where
every input is good the command still stops early on purpose: each invocation carries a
*stopper*, an input that is wrong in a known way (a training folder that does not exist, a run
that was never trained), so the error names either a generated value or the stopper, and never
anything a valid value could have started (a training run, a download, a world).

``make test`` runs every file kind on every path and a few dozen examples per other property, the same ones each
time (derandomised);
``EUCLIP_FUZZ=long pytest tests/test_fuzz.py`` runs a thousand (two hundred per option), freshly drawn.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import resource
import signal
import tempfile
import typing
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.main import get_command
from typer.testing import CliRunner

from euclip_cli import config as C
from euclip_cli.cli.main import app

# The suite's profile: a fixed, derandomized set of examples, under a minute of the suite on the 2-core machine (this
# file's measured seconds in tests/file-seconds.json, held to the suite's budget by tests/test_suite_budget.py).
settings.register_profile("suite", max_examples=25, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("long", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
LONG = os.environ.get("EUCLIP_FUZZ") == "long"
settings.load_profile("long" if LONG else "suite")

runner = CliRunner()
COMMAND = get_command(app)
TIME_LIMIT_S = 60
# What one refused or stopped invocation may add to the process's peak memory: a reader that took a file of
# HUGE_BYTES (below) whole would pass it.
MEMORY_LIMIT = 2 ** 30
ABSENT_TRAIN = "{tmp}/absent-world/train"
ABSENT_RUN = "never-trained"

# Values that have broken command lines before, or that each kind of check must refuse: empty and
# blank, option look-alikes, path tricks, numbers out of every range, list punctuation, non-ASCII.
# No NUL: a shell cannot put one into an argument (execve ends each at the first).
NASTY = ["", " ", "-", "--", "--help", "-1", "0", "1", "2", "1e309", "-1e309", "nan", "inf", "1.5", "0x10",
         "9" * 40, "true", "null", "[", "\x80", ",", ",,", "a,,b", "1,2", ".", "..", "/", "./..", "../outside", "~", "a\\b",
         "\n", "\t", "é", "🦆", "x" * 300, "{tmp}", "{tmp}/absent", "{tmp}/a-file", "{tmp}/a-file/below",
         "{tmp}/a-folder", "http://127.0.0.1:9/", "tiny", "auto", "cpu", "cuda:7", "md", "world", "datacomp"]
# Numbers at the edges of the types a machine keeps them in: 32- and 64-bit integers, signed or not, one
# past each, and doubles (the largest, the smallest subnormal and normal, negative zero).
EDGE_INTEGERS = [2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 63 - 1, 2 ** 63, -2 ** 63, -2 ** 63 - 1, 2 ** 64 - 1,
                 2 ** 64, -2 ** 31 - 1]
EDGE_FLOATS = ["1.7976931348623157e308", "-1.7976931348623157e308", "5e-324", "2.2250738585072014e-308", "-0.0"]
EDGE_NUMBERS = [str(n) for n in EDGE_INTEGERS] + EDGE_FLOATS
NASTY += EDGE_NUMBERS
text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=24)
values = st.one_of(st.sampled_from(NASTY), text, st.integers(-2 ** 70, 2 ** 70).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr))


class TimeLimit(BaseException):
    """An invocation's time is up: not an Exception, so that no handler of the command's takes it for its own."""


@contextlib.contextmanager
def folder():
    """A fresh working folder with a file and a folder in it (what the nasty paths point at)."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "a-file").write_text("not a folder\n")
        (Path(tmp) / "a-folder").mkdir()
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(previous)


def snapshot(root: Path) -> dict[str, str]:
    """Each regular file under ``root`` by its digest; a file too large to read here (a sparse one the file
    kinds make) by its size and time of change."""
    def mark(p: Path) -> str:
        info = p.stat()
        if info.st_size > SNAPSHOT_READ_LIMIT:
            return f"{info.st_size} bytes, changed at {info.st_mtime_ns}"
        return hashlib.sha256(p.read_bytes()).hexdigest()
    return {str(p.relative_to(root)): mark(p) for p in sorted(root.rglob("*")) if p.is_file()}


SNAPSHOT_READ_LIMIT = 64 * 2 ** 20


def invoke(argv: list[str], tmp: Path, env: dict | None = None):
    """``euclip ARGV`` under the time limit, with ``{tmp}`` filled in and ``env`` set (None: unset),
    checked against the rules; returns the result and its errors, each whitespace-normalised (Rich wraps
    long lines) with the lines that continue it."""
    argv = [a.replace("{tmp}", str(tmp)) for a in argv]

    expired = []

    def expire(signum, frame):
        # Recorded as well as raised: a command may turn what interrupts it into its own one-line error.
        expired.append(True)
        raise TimeLimit(f"euclip {argv} did not answer within {TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIME_LIMIT_S)
    try:
        before = snapshot(tmp)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB, the process's high-water mark
        result = runner.invoke(app, argv, env=env)
        grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024
        after = snapshot(tmp)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    output = result.output
    context = f"euclip {argv!r}\n{output}"
    assert not expired, f"no answer within {TIME_LIMIT_S} s: {context}"
    assert grown < MEMORY_LIMIT, f"memory grew by {grown / 2 ** 30:.1f} GiB: {context}"
    assert result.exit_code in (0, 1, 2), context
    assert "Traceback" not in output, context
    assert not (result.exception and not isinstance(result.exception, SystemExit)), (repr(result.exception), context)
    assert {k: v for k, v in after.items() if k in before} == before, context  # nothing already there changed
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    if result.exit_code == 0:
        assert not errors, context
        return result, []
    assert errors and (len(errors) == 1 or result.exit_code == 2), context
    ends = errors[1:] + [len(lines)]
    return result, [" ".join(" ".join(lines[start:end]).split()) for start, end in zip(errors, ends)]


def named(errors: list[str], *culprits: str) -> bool:
    """Whether each error names one of ``culprits`` (as the user gave it, or as Python shows it)."""
    def forms(culprit: str) -> set[str]:
        controls_escaped = re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", lambda m: repr(m.group())[1:-1], culprit)
        return {culprit, repr(culprit), repr(culprit)[1:-1], culprit.strip(), controls_escaped}

    def names(error: str) -> bool:
        return any(form.strip() and " ".join(form.split()) in error for culprit in culprits for form in forms(culprit))
    return all(names(error) for error in errors)


# ---- overrides: every key of the schema, and keys that are not, with every kind of value

def schema_keys() -> list[str]:
    def walk(table: dict, prefix: str):
        for key, value in table.items():
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}"
    return sorted(walk(C.to_dict(C.Config()), ""))


KEYS = schema_keys()
keys = st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS).map(lambda k: k.upper()),
                 st.sampled_from(KEYS).map(lambda k: k.replace(".", "..", 1)), st.sampled_from(KEYS).map(lambda k: k + ".x"),
                 st.sampled_from(KEYS).map(lambda k: k.split(".")[0]), text)
overrides = st.lists(st.one_of(st.tuples(keys, values).map(lambda kv: f"{kv[0]}={kv[1]}"), text), max_size=4)


@given(items=overrides)
def test_generated_overrides_are_taken_or_refused_by_name_before_anything_is_written(items):
    """Each generated list of overrides on ``euclip train``, with the training folder absent: a usage
    error naming an override, or (all good) the failure naming the absent folder; no run is created."""
    with folder() as tmp:
        argv = ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs", *items, f"data.train_dir={ABSENT_TRAIN}"]
        result, errors = invoke(argv, tmp)
        assert result.exit_code in (1, 2)
        items = [item.replace("{tmp}", str(tmp)) for item in items]
        given_keys = [item.split("=", 1)[0].strip() for item in items]
        assert named(errors, *items, *given_keys, str(tmp / "absent-world")), (items, errors)
        assert not (tmp / "runs").exists() or not any((tmp / "runs").iterdir()), items


def default_of(key: str):
    value = C.to_dict(C.Config())
    for part in key.split("."):
        value = value[part]
    return value


NUMERIC_KEYS = [k for k in KEYS if isinstance(default_of(k), (int, float)) and not isinstance(default_of(k), bool)]


@given(key=st.sampled_from(NUMERIC_KEYS), value=st.sampled_from(EDGE_NUMBERS))
def test_a_number_at_the_edge_of_its_type_is_taken_or_refused_naming_its_key(key, value):
    """Every numeric key of the schema given a number at an edge of a machine type: a usage error naming
    the key, or (in its range) the failure naming the absent training folder; never an overflow."""
    with folder() as tmp:
        result, errors = invoke(["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs", f"{key}={value}",
                                 f"data.train_dir={ABSENT_TRAIN}"], tmp)
        assert result.exit_code in (1, 2)
        assert named(errors, key, str(tmp / "absent-world")), (key, value, errors)


# ---- environment variables: every one euclip's code reads (found in its source), each where it is read

TRAIN_ABSENT = ["train", "--recipe", "tiny-clip", "--runs-dir", "{tmp}/runs", f"data.train_dir={ABSENT_TRAIN}"]
HUB_IMPORT = ["import", "euclip-export", "hf://me/model", "--name", "x", "--runs-dir", "{tmp}/runs"]
# Each variable a command reads before its stopper, with the variables set beside it (the others unset), so
# that a good value ends in the next refusal, never in a run, a download or a wait for peers: alone, a
# WORLD_SIZE above 1 lacks RANK; beside WORLD_SIZE and RANK, a good LOCAL_RANK or MASTER_PORT lacks MASTER_PORT
# or MASTER_ADDR; a good token goes to an endpoint where nothing listens.
NOTHING_LISTENS = "http://127.0.0.1:9"
ENVIRONMENT = {
    "WORLD_SIZE": (TRAIN_ABSENT, {}),
    "RANK": (TRAIN_ABSENT, {}),
    "LOCAL_RANK": (TRAIN_ABSENT, {"WORLD_SIZE": "2", "RANK": "0"}),
    "MASTER_PORT": (TRAIN_ABSENT, {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}),
}
# Read once in a process, as it starts (the Hub client when it is first imported; the consoles' width as euclip's
# CLI is imported; TERM by Rich, not by euclip's code): these are tried in a fresh process each, as a user's
# command meets them (fewer examples: each starts Python).
FRESH_ENVIRONMENT = {
    "HF_TOKEN": (HUB_IMPORT, {"HF_ENDPOINT": NOTHING_LISTENS}),
    "HUGGING_FACE_HUB_TOKEN": (HUB_IMPORT, {"HF_ENDPOINT": NOTHING_LISTENS}),
    "HF_ENDPOINT": (HUB_IMPORT, {}),
    "HF_HUB_DISABLE_XET": (HUB_IMPORT, {"HF_ENDPOINT": NOTHING_LISTENS}),
    "COLUMNS": (["eval", ABSENT_RUN], {}),
    "TERM": (["eval", ABSENT_RUN], {}),
}


def _host_threads_on_a_gpu():
    from euclip_cli.train.loop import host_threads
    return host_threads(0, __import__("torch").device("cuda"), 1)


def _threads_each():
    from euclip_cli.workers import threads_each
    return threads_each(2)


def _ray_address():
    from euclip_cli.data.fetch import check_ray_address
    return check_ray_address()


# Read only once a run, a study's runs or a Ray download has started, past every command's stopper: tried at
# the function that reads them, which takes each value (returning what it uses) or refuses it naming it.
AT_THE_READER = {"OMP_NUM_THREADS": _threads_each, "LOCAL_WORLD_SIZE": _host_threads_on_a_gpu,
                 "RAY_ADDRESS": _ray_address}
# Not fuzzed, and why.
NOT_FUZZED_VARIABLES = {
    "MASTER_ADDR": "any value beside a good WORLD_SIZE, RANK and MASTER_PORT waits for the peers (rank 0 serves "
                   "the rendezvous, whatever the address); an unset one is refused (tests/test_faults.py)",
    "TORCHELASTIC_RUN_ID": "its value is never read, only whether torchrun set it, and only after a process group's "
                           "variables passed, where a rank waits for its peers",
    "PYTHONWARNINGS": "read only to add one filter for img2dataset's spawned children (download.webshards) and put "
                      "it back; its value is the interpreter's to parse, in every process, before euclip runs",
    "TMPDIR": "read only to be put back once img2dataset's spawned children had a temporary folder of the command's "
              "own (download.webshards); the command's own is tempfile's choice, which passes over a folder it "
              "cannot use",
}
UNSET = dict.fromkeys(["WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR", *FRESH_ENVIRONMENT])
ENV_CULPRITS = (*UNSET, "absent-world", "127.0.0.1:9", "me/model", ABSENT_RUN)


def test_every_environment_variable_euclip_reads_is_fuzzed_or_says_why_not():
    import euclip_bench
    import euclip_cli
    from tests.environment_reads import variables_read

    read = variables_read(Path(euclip_cli.__file__).parent, Path(euclip_bench.__file__).parent)
    assert "?" not in read, f"a variable whose name the fuzzer cannot see is read at {read.get('?')}"
    fuzzed = set(ENVIRONMENT) | set(FRESH_ENVIRONMENT) | set(AT_THE_READER)
    assert set(read) <= fuzzed | set(NOT_FUZZED_VARIABLES), set(read) - fuzzed - set(NOT_FUZZED_VARIABLES)
    assert set(NOT_FUZZED_VARIABLES) <= set(read) and not fuzzed & set(NOT_FUZZED_VARIABLES)


def test_the_source_reader_finds_every_form_of_read_and_says_what_it_cannot_name(tmp_path):
    from tests.environment_reads import variables_read

    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text(
        "import os\n"
        "def number(name, default):\n    return int(os.environ.get(name, default))\n"
        "A = os.environ.get('A')\nB = os.environ['B']\nC = os.getenv('C')\nD = 'D' in os.environ\n"
        "for name in ('E1', 'E2'):\n    os.environ.get(name)\n"
        "os.environ.setdefault('NOT_READ', '1')\nchild = dict(os.environ, ALSO_NOT_READ='1')\n"
        "built = os.environ.get('G' + str(1))\n")
    (package / "b.py").write_text("from pkg.a import number\nF = number('F', 1)\n")
    read = variables_read(package)
    assert set(read) == {"A", "B", "C", "D", "E1", "E2", "F", "?"} and read["F"] == {"pkg/b.py"}
    assert read["?"] == {"pkg/a.py:12"}


@given(variable=st.sampled_from(sorted(ENVIRONMENT)), value=values)
def test_a_generated_environment_variable_is_taken_or_refused_naming_it(variable, value):
    """Each variable given any value: refused where it is first read, naming it (exit 2), or taken and then
    stopped by the next refusal or the stopper; no traceback, no wait."""
    argv, beside = ENVIRONMENT[variable]
    with folder() as tmp:
        result, errors = invoke(argv, tmp, env=UNSET | beside | {variable: value})
        assert result.exit_code in (1, 2)
        assert named(errors, variable, *ENV_CULPRITS), (variable, value, errors)


@settings(max_examples=100 if LONG else 6)
@given(variable=st.sampled_from(sorted(FRESH_ENVIRONMENT)), value=values)
def test_a_generated_variable_read_as_a_process_starts_is_taken_or_refused_naming_it(variable, value):
    import subprocess
    import sys

    argv, beside = FRESH_ENVIRONMENT[variable]
    with folder() as tmp:
        env = {k: v for k, v in os.environ.items() if k not in UNSET} | beside | {variable: value}
        result = subprocess.run([sys.executable, "-m", "euclip_cli", *(a.replace("{tmp}", str(tmp)) for a in argv)],
                                capture_output=True, text=True, env=env, timeout=TIME_LIMIT_S)
        context = (variable, value, result.stderr)
        errors = [" ".join(line.split()) for line in " ".join(result.stderr.split("\n  ")).splitlines()
                  if line.startswith("error:")]
        assert result.returncode in (1, 2) and "Traceback" not in result.stderr and len(errors) == 1, context
        assert named(errors, variable, *ENV_CULPRITS), context
        assert not (tmp / "runs").exists() or not any((tmp / "runs").iterdir()), context


@settings(max_examples=100 if LONG else 8)
@given(variable=st.sampled_from(sorted(AT_THE_READER)), value=values)
@example(variable="RAY_ADDRESS", value="\x80")  # found by this test: IDNA's UnicodeError escaped as a traceback
@example(variable="RAY_ADDRESS", value="[")  # found by this test: urllib's ValueError (an unclosed IPv6 host)
def test_a_generated_variable_read_once_work_has_started_is_taken_or_refused_naming_it(variable, value, monkeypatch):
    """At its reader: a thread count taken is a whole number of at least one; a refusal is euclip's own error,
    one line naming the variable; never a traceback or a wait beyond the reader's own time limit."""
    from euclip_cli.errors import EuclipError

    for other in AT_THE_READER:  # unset: a thread count in OMP_NUM_THREADS is obeyed before LOCAL_WORLD_SIZE is read
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(variable, value)
    try:
        taken = AT_THE_READER[variable]()
    except EuclipError as err:
        assert variable in str(err) and "\n" not in str(err), (variable, value, str(err))
    else:
        assert taken is None or (isinstance(taken, int) and taken >= 1), (variable, value, taken)


# ---- names: what becomes a folder

@given(name=st.one_of(st.sampled_from(NASTY), text))
@pytest.mark.parametrize("command", ["train", "import"])
def test_a_generated_name_is_a_plain_folder_name_or_refused_naming_the_option(command, name):
    """``--name`` on the commands that make a run: refused as a usage error naming ``--name``, or
    taken and then stopped by the absent input; either way nothing appears outside the runs folder."""
    with folder() as tmp:
        argv = {"train": ["train", "--recipe", "tiny-clip", f"data.train_dir={ABSENT_TRAIN}"],
                "import": ["import", "openclip", "{tmp}/absent.pt"]}[command]
        before = set(os.listdir(tmp))
        result, errors = invoke([*argv, "--name", name, "--runs-dir", "{tmp}/runs"], tmp)
        assert result.exit_code in (1, 2)
        if result.exit_code == 2 and named(errors, "--name"):
            assert named(errors, name.replace("{tmp}", str(tmp))) or not name.strip(), errors
        else:
            assert named(errors, "absent"), errors
        assert set(os.listdir(tmp)) <= before | {"runs"}, os.listdir(tmp)


# ---- recipe files: TOML of every shape, extends chains and cycles, bytes that are not TOML

def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(value, "nan" if value != value else repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's


scalars = st.one_of(st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.sampled_from(EDGE_INTEGERS), st.floats(), text,
                    st.sampled_from(NASTY))
toml_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(text, inner, max_size=2)), max_leaves=4)
sections = st.sampled_from(sorted({k.split(".")[0] for k in KEYS}) + ["nosuch", "extends"])
recipe_tables = st.dictionaries(sections, st.dictionaries(st.one_of(st.sampled_from([k.split(".")[-1] for k in KEYS]),
                                                                    text), toml_values, max_size=3), max_size=3)


def recipe_text(tables: dict, extends) -> str:
    lines = [] if extends is None else [f"extends = {toml_value(extends)}"]
    for section, table in tables.items():
        lines.append(f"[{json.dumps(section)}]")
        lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


@given(chain=st.lists(st.tuples(recipe_tables, st.one_of(st.none(), st.sampled_from(["next", "self", "first", "absent",
                                                                                      "tiny-clip"]), toml_values)),
                      min_size=1, max_size=3),
       damage=st.one_of(st.none(), st.binary(max_size=8), st.integers(0, 200)))
def test_a_generated_recipe_file_validates_or_is_refused_naming_the_file_or_key(chain, damage):
    """Files ``r0.toml`` .. ``rN.toml``, each perhaps extending the next, itself, the first (a cycle),
    a recipe that does not exist or a shipped one, some cut short or with bytes that are not UTF-8:
    ``recipes validate`` says ok or names the file (and the key) at fault, exit 2; ``train`` on the
    first file fails only on its absent training folder or with that usage error."""
    with folder() as tmp:
        for i, (tables, extends) in enumerate(chain):
            target = {"next": f"{tmp}/r{i + 1}.toml", "self": f"{tmp}/r{i}.toml", "first": f"{tmp}/r0.toml",
                      "absent": "no-such-recipe"}.get(extends, extends) if isinstance(extends, str) else extends
            data = recipe_text(tables, target).encode()
            if isinstance(damage, int):
                data = data[:damage]
            elif isinstance(damage, bytes):
                data = damage + data
            (tmp / f"r{i}.toml").write_bytes(data)
        first = f"{tmp}/r0.toml"
        result, errors = invoke(["recipes", "validate", first], tmp)
        assert result.exit_code in (0, 2)
        if result.exit_code:
            assert named(errors, "r0.toml", "r1.toml", "r2.toml", "r3.toml", "no-such-recipe", *KEYS), errors
        result, errors = invoke(["train", "--recipe", first, "--runs-dir", "{tmp}/runs",
                                f"data.train_dir={ABSENT_TRAIN}"], tmp)
        assert result.exit_code in (1, 2)
        if result.exit_code == 1:
            assert named(errors, str(tmp / "absent-world")), errors


# ---- every option of every command

@functools.cache
def commands() -> dict[str, click.Command]:
    root = COMMAND
    ctx = click.Context(root)
    found = {}

    def walk(cmd, path):
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), path + [name])
        else:
            found[" ".join(path)] = cmd

    walk(root, [])
    return found


# Each command with its stopper: arguments that make it stop early whatever the generated option's
# value, so that no valid value can start a long computation.
STOPPERS = {
    "train": ["--recipe", "tiny-clip", f"data.train_dir={ABSENT_TRAIN}"],
    "eval": [ABSENT_RUN],
    "import": ["openclip", "{tmp}/absent.pt", "--name", "imported"],
    "export": [ABSENT_RUN, "{tmp}/out"],
    "push": [ABSENT_RUN, "me/repo"],
    "report": [],
    "study": ["--recipe", "study-geometries", "--out", "{tmp}/a-file"],
    "recipes list": [],
    "recipes show": ["tiny-clip"],
    "recipes validate": [],
    "download world": ["--out", "{tmp}/a-file"],
    "download datacomp-like": ["--out", "{tmp}/a-file"],
    "download evalsets": ["--root", "{tmp}/a-file"],
    "download probesets": ["--root", "{tmp}/a-file"],
    "download wordnet": ["--out", "{tmp}/a-file"],
    "download redcaps": ["--out", "{tmp}/a-file"],
    "download grit": ["--out", "{tmp}/a-file"],
    "download datacomp": ["--scale", "small", "--out", "{tmp}/a-file"],
    "download urls": ["--parquet", "{tmp}/absent.parquet", "--out", "{tmp}/a-file"],
    "analyze distances": [ABSENT_RUN],
    "analyze isotropy": [ABSENT_RUN],
    "analyze equilibrium": [ABSENT_RUN],
    "analyze traverse": [ABSENT_RUN],
    "analyze hierarchy": [ABSENT_RUN],
    "analyze imagenet-tree": ["--out", "{tmp}/a-file"],
    **{f"bench {kind}": ["--out", "{tmp}/a-file"] for kind in ("train", "text", "loader", "profile", "feed", "ops",
                                                                 "decode")},
}
# Not fuzzed, and why: --nproc-per-node > 1 replaces the process with torchrun; an option that holds a
# command's stopper would let a valid value start the work the stopper prevents (a folder that is a
# file stops a command as its line is parsed: cli.common.writable_folder).
UNFUZZED_OPTIONS = {("train", "--nproc-per-node"), ("study", "--recipe"), ("study", "--out"), ("download world", "--out"),
                    ("download datacomp-like", "--out"),
                    ("download evalsets", "--root"), ("download probesets", "--root"), ("download datacomp", "--out"), ("download urls", "--out"),
                    ("download wordnet", "--out"), ("download redcaps", "--out"), ("download grit", "--out"),
                    *((f"bench {kind}", "--out") for kind in ("train", "text", "loader", "profile", "feed", "ops",
                                                              "decode"))}
OPTION_EXAMPLES = 200 if LONG else 25


def fuzzed_options() -> list[tuple[str, str]]:
    pairs = []
    for path, cmd in commands().items():
        for param in cmd.params:
            if param.param_type_name == "option" and not param.is_flag and param.name != "help" \
                    and (path, param.opts[0]) not in UNFUZZED_OPTIONS:
                pairs.append((path, param.opts[0]))
    return pairs


def test_every_command_has_a_stopper():
    assert set(commands()) == set(STOPPERS)


@pytest.mark.parametrize("command, option", fuzzed_options())
@settings(max_examples=OPTION_EXAMPLES)
@given(value=values)
def test_a_generated_option_value_is_taken_or_refused_naming_the_option(command, option, value):
    with folder() as tmp:
        result, errors = invoke([*command.split(), *STOPPERS[command], option, value], tmp)
        if result.exit_code:
            # Refused by name (or for an option it needs beside), or taken and then stopped: by the
            # stopper, or by what the value names.
            options = [o for param in commands()[command].params for o in param.opts if o.startswith("--")]
            assert named(errors, *options, value.replace("{tmp}", str(tmp)), "absent", ABSENT_RUN, "a-file",
                         "127.0.0.1"), (option, value, errors)


def typed_as_path(param) -> bool:
    annotation = param.type_descriptor.annotation
    return Path in (annotation, *typing.get_args(annotation))


def test_every_path_a_command_takes_is_checked_as_its_line_is_parsed():
    """The path kind has one owner: every option or argument typed as a path goes through
    ``cli.common.checked_path`` (read) or ``writable_folder`` (written), so a path no file system could
    hold, or a folder that is a file, is refused before the command reads, fetches or trains."""
    from euclip_cli.cli.common import checked_path, writable_folder

    paths = [(path, param) for path, cmd in commands().items() for param in cmd.params if typed_as_path(param)]
    unchecked = [f"{path} {param.name}" for path, param in paths
                 if param.type_descriptor.parameter_info.callback not in (checked_path, writable_folder)]
    assert len(paths) > 30 and not unchecked, unchecked


# ---- every positional argument of every command, in its place, with the rest of the command's stopper

ARGUMENTS = {
    ("train", "overrides"): ["train", "--recipe", "tiny-clip", "{value}", f"data.train_dir={ABSENT_TRAIN}"],
    ("eval", "runs"): ["eval", "{value}"],
    ("import", "fmt"): ["import", "{value}", "{tmp}/absent.pt", "--name", "imported"],
    ("import", "source"): ["import", "openclip", "{value}", "--name", "imported"],
    ("export", "run"): ["export", "{value}", "{tmp}/out"],
    ("export", "out"): ["export", ABSENT_RUN, "{value}"],
    ("push", "source"): ["push", "{value}", "me/repo"],
    ("push", "repo"): ["push", ABSENT_RUN, "{value}"],
    ("study", "overrides"): ["study", "--recipe", "study-geometries", "--out", "{tmp}/a-file", "{value}"],
    ("recipes show", "name"): ["recipes", "show", "{value}"],
    ("recipes validate", "names"): ["recipes", "validate", "{value}"],
    **{(f"analyze {kind}", "run"): ["analyze", kind, "{value}"]
       for kind in ("distances", "isotropy", "equilibrium", "traverse", "hierarchy")},
}


def test_every_positional_argument_is_fuzzed():
    found = {(path, p.name) for path, cmd in commands().items() for p in cmd.params if p.param_type_name == "argument"}
    assert found == set(ARGUMENTS)


@pytest.mark.parametrize("command, argument", list(ARGUMENTS))
@settings(max_examples=OPTION_EXAMPLES)
@given(value=values)
def test_a_generated_argument_is_taken_or_refused_naming_it(command, argument, value):
    """A name or path where a command takes one (a run, a recipe, a checkpoint, an override): taken, or
    refused naming the value (or the stopper it then meets)."""
    if value.startswith("-"):
        return  # an option to the parser, not an argument: the option fuzz covers those
    with folder() as tmp:
        argv = [value if a == "{value}" else a for a in ARGUMENTS[(command, argument)]]
        result, errors = invoke(argv, tmp)
        # A blank value (spaces, a no-break space) is quoted but cannot be seen: the rules above hold for it.
        if result.exit_code and value.strip():
            options = [o for param in commands()[command].params for o in param.opts if o.startswith("--")]
            assert named(errors, argument, value.replace("{tmp}", str(tmp)), *options, "absent", ABSENT_RUN,
                         "a-file", "recipe"), (argv, errors)


# ---- every kind of file, wherever a command takes a path

# Where a command takes a path: an option or argument typed as one, or a name that may be one (a recipe, a
# run, a checkpoint), as its help says; found in the app, so that a new one is covered without a list.
NAMES_A_FILE = re.compile(r"\b(paths?|files?|folders?|director(y|ies))\b", re.IGNORECASE)
# Every kind of file a user may name by mistake, each as its own path; each is made afresh for each try.
FILE_KINDS = ["missing", "folder", "fifo", "/dev/zero", "/dev/null", "/dev/full", "not utf-8", "empty", "huge"]
# Sparse: larger than any reader's bound (readers.JSON_LIMIT is the largest) and no disk used.
HUGE_BYTES = 4 * 2 ** 30
def file_of_kind(kind: str, tmp: Path) -> str:
    if kind.startswith("/dev/"):
        return kind
    path = tmp / f"given-{kind.replace(' ', '-')}"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "not utf-8":
        path.write_bytes("caf\xe9 = 1\n".encode("latin-1") + b"\xff\xfe\x00")
    elif kind == "empty":
        path.touch()
    elif kind == "huge":
        with path.open("wb") as handle:
            handle.truncate(HUGE_BYTES)
    return str(path)


def takes_a_path(param) -> bool:
    return typed_as_path(param) or NAMES_A_FILE.search(param.type_descriptor.parameter_info.help or "") is not None


def writes_a_folder(param) -> bool:
    from euclip_cli.cli.common import writable_folder
    return param.type_descriptor.parameter_info.callback is writable_folder


def path_tries() -> list[tuple[str, str, str]]:
    """(command, option or argument, kind of file): every kind for every path a command takes. An option that
    holds its command's stopper (UNFUZZED_OPTIONS) is a folder the command writes, and is given only what cannot
    be one (a valid folder there would start the work its stopper prevents)."""
    tries = []
    for command, cmd in commands().items():
        for param in cmd.params:
            if not (param.param_type_name in ("option", "argument") and not getattr(param, "is_flag", False)
                    and param.name != "help" and takes_a_path(param)):
                continue
            name = param.opts[0] if param.param_type_name == "option" else param.name
            kinds = FILE_KINDS
            if (command, name) in UNFUZZED_OPTIONS:
                if not writes_a_folder(param):
                    continue
                kinds = [kind for kind in FILE_KINDS if kind not in ("missing", "folder")]
            tries += [(command, name, kind) for kind in kinds]
    return tries


def test_the_file_kinds_meet_every_path_a_command_takes():
    """Arguments and options alike, found in the app: a new path option is tried without anyone adding it."""
    paths = {(command, name) for command, name, _ in path_tries()}
    assert {(c, n) for c, n in paths if not n.startswith("-")} <= set(ARGUMENTS)
    assert ("report", "--readme") in paths and ("recipes validate", "names") in paths and len(paths) > 70


@pytest.mark.parametrize("command, name, kind", path_tries())
def test_every_kind_of_file_where_a_command_takes_a_path_is_taken_or_refused_in_one_line(command, name, kind):
    """Each path a command takes, given a missing path, a folder, a FIFO (which would block a reader that
    opened it: the time limit fails it), a device that never ends (/dev/zero), one that is empty
    (/dev/null) or that refuses writes (/dev/full), bytes that are not UTF-8, an empty file or a 4 GiB one:
    taken and then stopped, or refused in one line naming it; no traceback, no wait, no memory filled,
    nothing already there changed."""
    with folder() as tmp:
        value = file_of_kind(kind, tmp)
        if name.startswith("-"):
            argv = [*command.split(), *STOPPERS[command], name, value]
        else:
            argv = [value if a == "{value}" else a for a in ARGUMENTS[(command, name)]]
        result, errors = invoke(argv, tmp)
        if result.exit_code:
            options = [o for param in commands()[command].params for o in param.opts if o.startswith("--")]
            assert named(errors, value, name, *options, "absent", ABSENT_RUN, "a-file", "recipe", "127.0.0.1"), \
                (argv, errors)


# ---- damaged run files: cut, a byte flipped, bytes inserted, another JSON value in the file's place, or
# a file of another run (of another recipe and step) in its place, under its own name or another's

# What ``report --table embedded`` reads (metrics.jsonl: a fault-table case, through the figures' curves).
RUN_FILES = ("config.json", "meta.json", "eval.jsonl")


def _run_files(recipe: str = "tiny-clip", steps: int = 4) -> dict[str, bytes]:
    """A run's JSON files as euclip writes them (no checkpoint: ``report`` reads JSON alone)."""
    config = C.to_dict(C.load_config(recipe))
    evals = [{"key": key, "dataset": key, "checkpoint": f"checkpoints/step_{steps}.pt", "step": steps, "protocol": 2,
              "metrics": {"acc1": 0.5, "main_metric": 0.5}} for key in ("world/shapes", "world/colour")]
    records = [{"step": step, "samples": 128 * step, "contrastive": 2.0 - 0.1 * step, "logit_scale": 14.3}
               for step in range(1, steps + 1)]
    return {"config.json": json.dumps(config).encode(), "meta.json": json.dumps({"seed": 0}).encode(),
            "eval.jsonl": "".join(json.dumps(e) + "\n" for e in evals).encode(),
            "metrics.jsonl": "".join(json.dumps(r) + "\n" for r in records).encode()}


damages = st.one_of(
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.floats(0, 1)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("replace"), st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                                               lambda inner: st.lists(inner, max_size=3)
                                               | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                                               max_leaves=6)),
    st.tuples(st.just("swap"), st.sampled_from(["tiny-euclip", "tiny-meru"]), st.sampled_from(list(_run_files()))))


@pytest.mark.parametrize("where", ["middle", "end"])
def test_a_line_cut_by_a_crash_is_skipped_and_said_once_unless_it_may_be_still_written(tmp_path, where):
    """A crash mid-write cuts a record short; the next append ends that line (``append_jsonl``), so a cut line
    with a newline after it is damage: the command goes on with the other records and says so, once, naming
    the file, however often it reads it. A cut last line may be a record being written now: skipped silently."""
    import subprocess
    import sys

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    for file, data in _run_files().items():
        (run / file).write_bytes(data)
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    if where == "middle":
        lines[1] = lines[1][:20] + b"\n"
    else:
        lines[-1] = lines[-1][:20]
    (run / "metrics.jsonl").write_bytes(b"".join(lines))
    result = subprocess.run([sys.executable, "-m", "euclip_cli", "report", "--table", "embedded", "--runs-dir",
                             str(tmp_path / "runs"), "--out", str(tmp_path / "tables")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    warned = [line for line in " ".join(result.stderr.split("\n  ")).splitlines() if "warning" in line.lower()]
    if where == "end":
        assert warned == [], result.stderr
    else:
        assert len(warned) == 1 and warned[0].startswith("warning:"), result.stderr
        assert str(run / "metrics.jsonl") in warned[0] and "skipped 1 line(s) cut short" in warned[0]


@settings(max_examples=200 if LONG else 25)
@given(name=st.sampled_from(RUN_FILES), damage=damages)
def test_a_damaged_run_file_is_named_or_harmless(name, damage):
    with folder() as tmp:
        run = tmp / "runs" / "r"
        run.mkdir(parents=True)
        for file, data in _run_files().items():
            (run / file).write_bytes(data)
        data = (run / name).read_bytes()
        kind, *how = damage
        at = int(how[0] * len(data)) if kind not in ("replace", "swap") else 0
        damaged = {"cut": lambda: data[:at],
                   "flip": lambda: data[:at] + bytes([data[min(at, len(data) - 1)] ^ 0xA5]) + data[at + 1:],
                   "insert": lambda: data[:at] + how[-1] + data[at:],
                   "replace": lambda: json.dumps(how[0]).encode(),
                   "swap": lambda: _run_files(how[0], steps=8)[how[-1]]}[kind]()
        (run / name).write_bytes(damaged)
        result, errors = invoke(["report", "--table", "embedded", "--runs-dir", "{tmp}/runs", "--out", "{tmp}/tables"],
                                tmp)
        if result.exit_code:
            assert named(errors, str(run / name), str(run)), (name, damage, errors)
