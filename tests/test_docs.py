"""The documentation keeps its promises: README.md and every docs/**/*.md, checked against this checkout.

Per page (the tests are parametrized by it, and each lists all its problems as ``file:line: problem``):

- **Shell blocks** (info string ``bash``, ``sh``, ``shell``, ``console`` or none). Each line is split
  into commands as a shell splits it: continued lines joined, ``&&``, ``||``, ``;``, ``|`` between
  commands, comments dropped, and before a command its ``VAR=value`` assignments and wrappers
  (``env``, ``timeout N``, ...). Where some line of a block has a ``$ `` prompt, only prompted lines
  are commands and the rest is their output. Then:
  ``python -m oracle.report|repro|bench|sanitize|mutate ...`` must parse with that tool's own parser; any
  other ``python -m oracle.X`` must be a module ``python -m`` can run; ``pytest ...`` may use only
  options pytest knows in this repository (its own, its installed plugins', oracle/pytest_plugin.py's)
  and name only test files that exist; ``pip install '.[extra,...]'`` only extras of pyproject.toml;
  ``bash x.sh`` and ``python x.py`` only scripts that exist. Commands are parsed, never run, so
  placeholders (``'<case JSON>'``, ``$OUT/x.json``, ``path/to/...``) are fine; a ``$VAR`` reads as 1.
  A line that cannot be split (an unbalanced quote) is a problem: a block that is not shell wants an
  info string such as ``text``.
- **Python blocks** (``python``, ``py``, ``pycon``): each compiles, and each of its import statements
  imports from the repository root (``from X import Y`` must find Y). The info string ``python run``
  (GitHub highlights by the first word only) marks a complete example: it runs from the repository
  root (Triton's CPU interpreter is picked by itself without a GPU) and must exit 0 within 60 s.
  ``>>>`` examples run under doctest (ELLIPSIS, NORMALIZE_WHITESPACE).
- **Links and images** with a relative target, outside code: the file exists in the repository,
  and an ``#anchor`` names a heading of the target page (GitHub's slugs; repeated headings get
  ``-1``, ``-2``) or an explicit ``<a id="...">``/``<a name="...">``; ``#anchor`` alone is this page.
- README.md is at most 220 lines: a README that is a page.

Opt-out: the line ``<!-- docs-test: skip -->`` (a reason may follow ``skip``) right above a fence
exempts that block, e.g. a tutorial's code for the reader's own repository. Opted-out blocks are
listed per page in test_opted_out_blocks's skip reason, so the session summary shows them; an
opt-out line above no fence is a problem.

Imports and the tools' parsers run in a separate process (``python tests/test_docs.py --probe``),
one per session, so that reading the docs registers no op and sets no variable in this session.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import functools
import glob
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import tomllib
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 220
RUN_TIMEOUT_S = 60
PROBE_TIMEOUT_S = 300

SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
PYTHON_LANGUAGES = {"python", "py", "pycon"}
SKIP_MARK = re.compile(r"^\s*<!--\s*docs-test:\s*skip\b.*?-->\s*$")

# The tools whose command lines the docs test parses, with the very parser each one uses.
TOOL_PARSERS = {
    "oracle.report": lambda argv: importlib.import_module("oracle.report.__main__").parse(argv),
    "oracle.repro": lambda argv: importlib.import_module("oracle.repro").parser().parse_args(argv),
    "oracle.bench": lambda argv: importlib.import_module("oracle.bench").parser().parse_args(argv),
    "oracle.sanitize": lambda argv: importlib.import_module("oracle.sanitize.__main__").parse(argv),
    "oracle.mutate": lambda argv: importlib.import_module("oracle.mutate.__main__").parse(argv),
}


def doc_pages() -> list[str]:
    """README.md and every docs/**/*.md, relative to the repository root."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [path.relative_to(ROOT).as_posix() for path in paths if path.is_file()]


PAGES = doc_pages()


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    kind: str  # "markdown", "shell" or "python": the test that reports it
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


# ---------------------------------------------------------------------------------------------
# Markdown: fenced blocks, the prose around them, headings


@dataclass(frozen=True)
class Block:
    info: str
    body: str  # dedented by the fence's own indentation (a fence inside a list item)
    line: int  # the page's line of the body's first line
    skipped: bool

    @property
    def language(self) -> str:
        return self.info.split()[0].lower() if self.info.split() else ""

    @property
    def runs(self) -> bool:
        return "run" in self.info.split()[1:]

    def padded(self) -> str:
        """The body after blank lines, so that compilers and tracebacks count the page's lines."""
        return "\n" * (self.line - 1) + self.body + "\n"


@dataclass(frozen=True)
class Page:
    path: str
    blocks: tuple[Block, ...]
    prose: str  # the text with every fenced block and HTML comment blanked, lines kept
    problems: tuple[Problem, ...]  # of the markup itself


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)


def read_page(text: str, path: str) -> Page:
    lines = text.splitlines()
    prose = list(lines)
    blocks, problems = [], []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening or (opening["fence"][0] == "`" and "`" in opening["info"]):  # ``` inline ``` code
            i += 1
            continue
        fence = opening["fence"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        if end is None:
            problems.append(Problem(path, i + 1, "markdown", "this code fence is never closed"))
            end = len(lines)
        body = [_dedent(line, len(opening["indent"])) for line in lines[i + 1:end]]
        blocks.append(Block(opening["info"].strip(), "\n".join(body), i + 2,
                            skipped=i > 0 and bool(SKIP_MARK.match(lines[i - 1]))))
        prose[i:end + 1] = [""] * len(prose[i:end + 1])
        i = end + 1
    openings = {block.line - 1 for block in blocks}
    problems += [Problem(path, number, "markdown", "`<!-- docs-test: skip -->` is not right above a code fence")
                 for number, line in enumerate(prose, 1) if SKIP_MARK.match(line) and number + 1 not in openings]
    return Page(path, tuple(blocks), _blank(HTML_COMMENT, "\n".join(prose)), tuple(problems))


def _dedent(line: str, indent: int) -> str:
    return line[min(indent, len(line) - len(line.lstrip(" \t"))):]


def _blank(pattern: re.Pattern, text: str) -> str:
    """The text with each match replaced by spaces (newlines kept, so offsets and lines stay)."""
    return pattern.sub(lambda match: re.sub(r"[^\n]", " ", match.group()), text)


ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]+(?P<text>.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")
NOT_PARAGRAPH = re.compile(r"^\s*(?:$|[#>|]|[-*+]\s|\d+[.)]\s)")
EXPLICIT_ANCHOR = re.compile(r"<a\s[^>]*?\b(?:id|name)\s*=\s*([\"'])(?P<anchor>.*?)\1", re.I | re.S)


def headings(page: Page) -> list[str]:
    """The text of every ATX (``## x``) and setext (``x`` over ``---``) heading, in order."""
    lines, found = page.prose.splitlines(), []
    for number, line in enumerate(lines):
        atx = ATX_HEADING.match(line)
        if atx:
            found.append(atx["text"] or "")
        elif SETEXT_UNDERLINE.match(line) and number and not NOT_PARAGRAPH.match(lines[number - 1]):
            found.append(lines[number - 1].strip())
    return found


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text in lower case, punctuation other than - and _ dropped,
    each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link reads as its text
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Page) -> set[str]:
    """Every anchor a link into the page may name: heading slugs, repeats numbered, and explicit ids."""
    taken, repeats = set(), {}
    for heading in headings(page):
        slug = base = github_slug(heading)
        while slug in taken:  # github-slugger: the second "x" is x-1, the third x-2
            repeats[base] = repeats.get(base, 0) + 1
            slug = f"{base}-{repeats[base]}"
        taken.add(slug)
    return taken | {match["anchor"] for match in EXPLICIT_ANCHOR.finditer(_blank(INLINE_CODE, page.prose))}


@functools.cache
def anchors_of_file(path: Path) -> frozenset[str]:
    return frozenset(anchors(read_page(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())))


# ---------------------------------------------------------------------------------------------
# Links

INLINE_CODE = re.compile(r"(`+)(?!`)(?:[^\n]|\n(?![ \t]*\n))+?(?<!`)\1(?!`)")  # within a paragraph
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(?P<target><[^<>\n]*>|[^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*)"
                  r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[(?!\^)[^\]]+\]:[ \t]*(?P<target><[^<>\n]*>|\S+)", re.M)
HTML_TARGET = re.compile(r"<(?:a|img|source)\b[^>]*?\s(?:href|src)\s*=\s*([\"'])(?P<target>.*?)\1", re.I | re.S)
EXTERNAL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:|//)")  # https:, mailto:, protocol-relative


def link_problems(page: Page) -> list[Problem]:
    visible = _blank(INLINE_CODE, page.prose)
    problems = []
    for pattern in (LINK, REFERENCE_DEFINITION, HTML_TARGET):
        for match in pattern.finditer(visible):
            message = target_problem(match["target"].strip().removeprefix("<").removesuffix(">"), page)
            if message:
                problems.append(Problem(page.path, visible.count("\n", 0, match.start("target")) + 1, "markdown",
                                        message))
    return problems


def target_problem(target: str, page: Page) -> str | None:
    """Why a link target does not resolve in the repository, or None."""
    if EXTERNAL.match(target):
        return None
    if not target:
        return "a link with an empty target"
    file_part, _, anchor = (urllib.parse.unquote(part) for part in target.partition("#"))
    if not file_part:
        known, where = anchors(page), page.path
    else:
        base = ROOT if file_part.startswith("/") else (ROOT / page.path).parent
        resolved = Path(os.path.normpath(base / file_part.lstrip("/")))
        if not resolved.is_relative_to(ROOT):
            return f"link to {target} leaves the repository"
        where = resolved.relative_to(ROOT).as_posix()
        if not resolved.exists():
            return f"link to {target}: there is no {where}"
        if not anchor or resolved.suffix.lower() not in (".md", ".markdown"):
            return None
        known = anchors_of_file(resolved)
    if anchor and anchor not in known:
        return f"link to {target}: {where} has no heading or anchor #{anchor}"
    return None


# ---------------------------------------------------------------------------------------------
# Shell blocks: from lines to commands


@dataclass(frozen=True)
class Command:
    line: int
    words: tuple[str, ...]
    text: str  # the line it came from, for messages


PROMPT = re.compile(r"^\s*\$ ")
HEREDOC = re.compile(r"(?<!<)<<-?\s*(['\"]?)(?P<delimiter>[A-Za-z_]\w*)\1")
OPERATOR_CHARS = set(";&|()<>")
ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
WRAPPERS = {"time", "nohup", "exec", "nice"}


def command_lines(block: Block) -> list[tuple[int, str]]:
    """(page line, text) of each command line: continued lines joined, heredoc bodies left out;
    where some line has a ``$ `` prompt, the prompted lines only (the others are their output)."""
    lines = block.body.splitlines()
    prompted = any(PROMPT.match(line) for line in lines)
    found, i = [], 0
    while i < len(lines):
        start, text = i, lines[i]
        i += 1
        if prompted:
            prompt = PROMPT.match(text)
            if not prompt:
                continue
            text = text[prompt.end():]
        while text.endswith("\\") and i < len(lines):
            text, i = text[:-1] + lines[i], i + 1
        heredoc = HEREDOC.search(text)
        if heredoc:  # the lines up to its delimiter are data, not commands
            while i < len(lines) and lines[i].strip() != heredoc["delimiter"]:
                i += 1
            i += 1
        found.append((block.line + start, text))
    return found


def without_comment(text: str) -> str:
    """The line up to an unquoted ``#`` that starts a word, as a shell reads it (``a#b`` is a word)."""
    quote, escaped = None, False
    for k, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (k == 0 or text[k - 1].isspace()):
            return text[:k]
    return text


def split_commands(text: str) -> list[list[str]]:
    """The words of each simple command of a line, redirections dropped. Raises ValueError where a
    shell could not split it either (an unbalanced quote)."""
    lexer = shlex.shlex(without_comment(text), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, ""
    tokens = iter(list(lexer))
    commands, words = [], []
    for token in tokens:
        if token and set(token) <= OPERATOR_CHARS and ("<" in token or ">" in token):
            if words and words[-1].isdigit():  # the 2 of 2>&1
                words.pop()
            next(tokens, None)  # the redirection's target
        elif token and set(token) <= OPERATOR_CHARS:
            commands.append(words)
            words = []
        else:
            words.append(token)
    return [command for command in [*commands, words] if command]


def without_prefixes(words: list[str]) -> list[str]:
    """The command itself, past ``VAR=value`` assignments and the wrappers that run it."""
    words = list(words)
    while words:
        head = words[0]
        if ASSIGNMENT.match(head) or head in WRAPPERS:
            words.pop(0)
        elif head == "env":
            words.pop(0)
            while words and words[0].startswith("-"):
                if words.pop(0) in ("-u", "--unset", "-C", "--chdir"):
                    words[:1] = []
        elif head == "timeout":
            words.pop(0)
            while words and words[0].startswith("-"):
                if words.pop(0) in ("-s", "--signal", "-k", "--kill-after"):
                    words[:1] = []
            words[:1] = []  # the duration
        else:
            break
    return words


def shell_commands(page: Page) -> tuple[list[Command], list[Problem]]:
    commands, problems = [], []
    for block in page.blocks:
        if block.skipped or block.language not in SHELL_LANGUAGES:
            continue
        unsplit = []
        for line, text in command_lines(block):
            try:
                split = split_commands(text)
            except ValueError as exc:
                unsplit.append((line, text, exc))
                continue
            commands += [Command(line, tuple(words), text.strip()) for words in map(without_prefixes, split) if words]
        if unsplit:  # once per block: a block of prose or output fails on many lines
            (line, text, exc), more = unsplit[0], len(unsplit) - 1
            problems.append(Problem(page.path, line, "shell", f"`{_short(text)}` cannot be split into words ({exc})"
                                    + (f", nor can {more} more line(s) of this block" if more else "")
                                    + "; a block that is not shell wants an info string such as `text`"))
    return commands, problems


def _short(text: str, width: int = 110) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Shell blocks: what each command runs, and its checks

PYTHON = re.compile(r"python(?:\d+(?:\.\d+)?)?")
PYTHON_OPTIONS_WITH_VALUE = {"-X", "-W"}
PLACEHOLDER = re.compile(r"[<>{}$…]|\.\.\.|(?:^|/)path/to/")
VARIABLE = re.compile(r"\$(?:\{[^}]*\}|\([^)]*\)|[A-Za-z_]\w*|\d)")
VARIABLE_STAND_IN = "1"  # parses as an int, a float, a path or a name alike


@dataclass(frozen=True)
class Invocation:
    tool: str  # "oracle" (a python -m oracle.X), "pytest", "pip", "script" or "python-code"
    target: str  # the oracle module, the script's path or the code
    args: tuple[str, ...]


def invocation(words: tuple[str, ...]) -> Invocation | None:
    """What a command runs, for the commands the docs test checks; None for any other."""
    program, args = words[0].rsplit("/", 1)[-1], list(words[1:])
    if PYTHON.fullmatch(program):
        return python_invocation(args)
    if program in ("pytest", "py.test"):
        return Invocation("pytest", "", tuple(args))
    if program in ("pip", "pip3"):
        return Invocation("pip", "", tuple(args))
    if program in ("bash", "sh") and args and not args[0].startswith("-"):
        return Invocation("script", args[0], tuple(args[1:]))
    if _runs_a_file_of_the_checkout(words[0]):
        return Invocation("script", words[0], tuple(args))
    return None


def _runs_a_file_of_the_checkout(program: str) -> bool:
    """``./x``, ``scripts/x.py``, ``.ci/run``: a relative path a shell runs as it is (a bare
    ``x.py`` would be looked up on PATH, and in a block of output is more likely a file name)."""
    return "/" in program and not program.startswith("/") and (
        program.startswith(("./", "../", "scripts/", ".ci/")) or program.endswith((".sh", ".py")))


def python_invocation(args: list[str]) -> Invocation | None:
    while args:
        head = args.pop(0)
        if head == "-m" and args:
            module, rest = args[0], tuple(args[1:])
            if module in ("pytest", "pip"):
                return Invocation(module, "", rest)
            return Invocation("oracle", module, rest) if module.split(".")[0] == "oracle" else None
        if head == "-c" and args:
            return Invocation("python-code", args[0], ())
        if head in PYTHON_OPTIONS_WITH_VALUE:
            args[:1] = []
        elif head == "-" or not head.startswith("-"):
            return None if head == "-" else Invocation("script", head, tuple(args))
    return None


def oracle_question(module: str, args: tuple[str, ...]) -> tuple:
    if module in TOOL_PARSERS:
        return ("parse", module, tuple(VARIABLE.sub(VARIABLE_STAND_IN, arg) for arg in args))
    return ("runnable", module)


def command_questions(command: Command) -> list[tuple]:
    """What the probe must answer for a command: its tool's parse, or the modules it names."""
    call = invocation(command.words)
    if call is None:
        return []
    if call.tool == "oracle":
        return [oracle_question(call.target, call.args)]
    if call.tool == "pytest" and "--pyargs" in call.args:
        return [("importable", name.split("::")[0]) for name in read_pytest_args(call.args)[1]
                if not _looks_like_path(name) and not PLACEHOLDER.search(name)]
    return []


def command_problems(command: Command, path: str) -> list[Problem]:
    call = invocation(command.words)
    if call is None:
        return []
    if call.tool == "oracle":
        error = answer(oracle_question(call.target, call.args))
        messages = [f"{call.target} refuses it: {error}" if error and call.target in TOOL_PARSERS else error]
    elif call.tool == "pytest":
        messages = pytest_messages(call.args)
    elif call.tool == "pip":
        messages = pip_messages(call.args)
    elif call.tool == "script":
        messages = [f"there is no script {call.target} in the repository" if missing_path(call.target) else None]
    else:
        messages = [compile_message(call.target)]
    return [Problem(path, command.line, "shell", f"`{_short(command.text)}`: {message}")
            for message in messages if message]


def missing_path(word: str) -> bool:
    """Whether a path a command names, relative to the repository root, is missing (placeholders,
    absolute paths and a user's home are not this repository's to hold)."""
    path = word.split("::", 1)[0]
    if PLACEHOLDER.search(path) or path.startswith(("/", "~")):
        return False
    if any(char in path for char in "*?["):
        return not glob.glob(path, root_dir=ROOT)
    return not (ROOT / path).exists()


def _looks_like_path(word: str) -> bool:
    return "/" in word or "::" in word or word.endswith(".py")


def compile_message(code: str) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SyntaxWarning)  # a warning of the docs' code is its problem
            compile(code, "<python -c>", "exec")
    except (SyntaxError, ValueError) as exc:
        return f"the code does not compile: {exc}"
    return None


# pytest


_PYTEST_HELP: list[str] = []  # the session's ``pytest --help``, once the probed fixture has read it


@functools.cache
def pytest_options() -> dict[str, bool]:
    """Every option pytest accepts in this repository (its own, its plugins', the oracle plugin's),
    and whether it takes a value: read from ``pytest --help`` at the root, where pyproject.toml and
    conftest.py apply as they do for a reader. Under the probed fixture, the help its session ran
    once (a pytest start-up took 13 s per xdist worker on the GPU machine); else run here."""
    return options_in_help(_PYTEST_HELP[0] if _PYTEST_HELP else pytest_help())


def pytest_help() -> str:
    done = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=ROOT, env=clean_env(COLUMNS="200"),
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"pytest --help failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


HELP_OPTION_LINE = re.compile(r"^  (-[^ ].*?)(?: {2,}|$)")
HELP_OPTION = re.compile(r"(?P<name>--?[\w-]+)(?:[ =](?P<metavar>\S+))?")


def options_in_help(help_text: str) -> dict[str, bool]:
    """{option: takes a value} from an argparse help text (``-k EXPRESSION``, ``--maxfail=num``,
    ``-x, --exitfirst``; an optional value, ``--debug=[FILE]``, is not taken from the next word)."""
    options = {}
    for line in help_text.splitlines():
        listed = HELP_OPTION_LINE.match(line)
        for spec in listed[1].split(", ") if listed else []:
            option = HELP_OPTION.fullmatch(spec)
            if option:
                options[option["name"]] = bool(option["metavar"]) and not option["metavar"].startswith("[")
    return options


def read_pytest_args(args: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(options pytest does not know, positional arguments) of a pytest command line."""
    options, unknown, positionals = pytest_options(), [], []
    rest = iter(args)
    for word in rest:
        if word == "--":
            positionals += list(rest)
        elif word.startswith("--"):
            name = word.partition("=")[0]
            if name not in options:
                unknown.append(name)
            elif options[name] and "=" not in word:
                next(rest, None)
        elif word.startswith("-") and word != "-":
            unknown += _read_short_options(word, rest, options)
        else:
            positionals.append(word)
    return unknown, positionals


def _read_short_options(word: str, rest, options: dict[str, bool]) -> list[str]:
    """``-q``, ``-vx`` (flags joined), ``-n4``, ``-ra`` (a value attached) or ``-n 4``."""
    for k in range(1, len(word)):
        name = "-" + word[k]
        if name not in options:
            return [word]
        if options[name]:
            if k == len(word) - 1:
                next(rest, None)
            return []
    return []


def pytest_messages(args: tuple[str, ...]) -> list[str | None]:
    unknown, positionals = read_pytest_args(args)
    messages = [f"pytest knows no option {option} here" for option in unknown]
    if "--pyargs" in args:
        messages += [answer(("importable", name.split("::")[0])) for name in positionals
                     if not _looks_like_path(name) and not PLACEHOLDER.search(name)]
    return messages + [f"there is no test file or directory {name} in the repository" for name in positionals
                       if _looks_like_path(name) and missing_path(name)]


# pip


@functools.cache
def project_metadata() -> tuple[str, frozenset[str]]:
    """(this project's name, its extras), normalized as pip compares them."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        project = tomllib.load(file).get("project", {})
    return _normalized(project.get("name", "")), frozenset(map(_normalized, project.get("optional-dependencies", {})))


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


REQUIREMENT_WITH_EXTRAS = re.compile(r"(?P<base>[^\[\]]+)\[(?P<extras>[^\[\]]*)\]")


def pip_messages(args: tuple[str, ...]) -> list[str]:
    """The extras a ``pip install`` of this project asks that pyproject.toml does not define."""
    if next((arg for arg in args if not arg.startswith("-")), None) != "install":
        return []
    name, extras = project_metadata()
    messages = []
    for arg in args:
        requirement = REQUIREMENT_WITH_EXTRAS.fullmatch(arg)
        if requirement and _names_this_project(requirement["base"], name):
            messages += [f"pyproject.toml has no extra {extra!r} (it has {', '.join(sorted(extras))})"
                         for extra in map(str.strip, requirement["extras"].split(","))
                         if extra and _normalized(extra) not in extras]
    return messages


def _names_this_project(base: str, name: str) -> bool:
    """A local path (the checkout, its wheel) or this project's name on an index."""
    return base in (".", "..") or base.startswith(("./", "../", "/", "~", "$")) or "/" in base \
        or base.endswith(".whl") or _normalized(base) == name


# ---------------------------------------------------------------------------------------------
# Python blocks


def is_doctest(block: Block) -> bool:
    return block.language == "pycon" or any(line.lstrip().startswith(">>>") for line in block.body.splitlines())


def python_sources(block: Block) -> list[tuple[int, str, str]]:
    """(page line of its first line, source, compile mode) of each piece of code in a block: the
    whole block, or each of its ``>>>`` examples."""
    if not is_doctest(block):
        return [(1, block.padded(), "exec")]
    return [(block.line + example.lineno, example.source, "single")
            for example in doctest.DocTestParser().get_examples(block.body)]


def python_problems(page: Page) -> list[Problem]:
    problems = []
    for block in page.blocks:
        if block.skipped or block.language not in PYTHON_LANGUAGES:
            continue
        for first_line, source, mode in python_sources(block):
            tree, error = parse_python(source, mode, page.path)
            if error:
                problems.append(Problem(page.path, (error.lineno or 1) + first_line - 1, "python",
                                        f"the Python block does not compile: {error.msg}"))
                continue
            problems += [Problem(page.path, line + first_line - 1, "python", f"`{statement}` fails: {failure}")
                         for line, statement in import_statements(tree) if (failure := answer(("import", statement)))]
        failure = run_doctest(block, page.path) if is_doctest(block) else run_example(block, page.path) \
            if block.runs else None
        if failure:
            problems.append(Problem(page.path, failure[0], "python", failure[1]))
    return problems


def parse_python(source: str, mode: str, path: str) -> tuple[ast.AST | None, SyntaxError | None]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SyntaxWarning)  # an invalid escape in the docs is theirs to fix
            tree = ast.parse(source, path, mode)
            compile(tree, path, mode)  # what parsing lets through: a return outside a function, say
        return tree, None
    except SyntaxError as exc:
        return None, exc


def import_statements(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, statement) of every import in the code, one statement per import, as written."""
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def run_example(block: Block, path: str) -> tuple[int, str] | None:
    """Run a ``python run`` block from the repository root: (line, why it failed) or None."""
    try:
        done = subprocess.run([sys.executable, "-"], input=block.padded(), cwd=ROOT, env=clean_env(),
                              capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return block.line, f"the `python run` example did not finish in {RUN_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    where = re.findall(r'File "<stdin>", line (\d+)', done.stderr)
    last = " | ".join(done.stderr.strip().splitlines()[-2:]).replace("<stdin>", path)
    return (int(where[-1]) if where else block.line), \
        f"the `python run` example exits {done.returncode}" + (f": {last}" if last else "")


def run_doctest(block: Block, path: str) -> tuple[int, str] | None:
    """Run a block's ``>>>`` examples under doctest, from the repository root: (line, why) or None."""
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "block.txt"
        file.write_text(block.padded(), encoding="utf-8")
        try:
            done = subprocess.run([sys.executable, "-m", "doctest", "-o", "ELLIPSIS", "-o", "NORMALIZE_WHITESPACE",
                                   str(file)], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return block.line, f"the >>> examples did not finish in {RUN_TIMEOUT_S} s"
    if done.returncode == 0:
        return None
    report = done.stdout.split("*" * 70)
    first = report[1] if len(report) > 1 else done.stdout + done.stderr
    line = re.search(r", line (\d+)", first)
    details = " | ".join(part.strip() for part in first.strip().splitlines()[1:] if part.strip())
    return (int(line[1]) if line else block.line), f"a >>> example fails under doctest: {details}"


# ---------------------------------------------------------------------------------------------
# The probe: the questions only this checkout's Python, in a process of its own, can answer

_ANSWERS: dict[tuple, str | None] = {}


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what a test session sets for itself (the ops it declared, its
    pytest options), so that the docs are read as a reader's shell runs them."""
    env = {name: value for name, value in os.environ.items() if name not in ("ORACLE_OP_MODULES", "PYTEST_ADDOPTS")}
    return env | extra


def probe(questions) -> None:
    """Answer, in one process, every question not answered yet."""
    missing = list(dict.fromkeys(question for question in questions if question not in _ANSWERS))
    if missing:
        _ANSWERS.update(zip(missing, answers_of(missing)))


def answers_of(questions: list[tuple]) -> list[str | None]:
    """The probe process's answers to ``questions``, in their order."""
    with tempfile.TemporaryDirectory() as folder:
        answers = Path(folder) / "answers.json"
        done = subprocess.run([sys.executable, __file__, "--probe", str(answers)], input=json.dumps(questions),
                              cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"the docs probe failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads(answers.read_text())


def answer(question: tuple) -> str | None:
    """What is wrong (a tool's usage error, an import's exception), or None."""
    probe([question])
    return _ANSWERS[question]


def probe_main(answers_file: str) -> int:
    sys.path[0] = str(ROOT)  # as `python -m` from the root: the checkout's kernels/ and tests/ import
    sys.path.append(str(ROOT / "docs" / "tutorial"))  # the tutorial's commands run beside its two modules
    questions = json.load(sys.stdin)
    Path(answers_file).write_text(json.dumps([answer_here(*question) for question in questions]))
    return 0


def answer_here(kind: str, *args) -> str | None:
    output = io.StringIO()
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            return PROBE_QUESTIONS[kind](*args)
    except SystemExit as exc:  # argparse's way out: a usage error, or --help
        lines = output.getvalue().strip().splitlines()
        if exc.code in (0, None):
            return None
        return re.sub(r"^.*?: error: ", "", lines[-1]) if lines else f"exit status {exc.code}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _parse(module: str, argv: list[str]) -> None:
    TOOL_PARSERS[module](list(argv))


def _runnable(module: str) -> str | None:
    spec = importlib.util.find_spec(module)
    if spec is None:
        return f"there is no module {module}"
    if spec.submodule_search_locations is not None and importlib.util.find_spec(f"{module}.__main__") is None:
        return f"{module} is a package without __main__: python -m cannot run it"
    return None


def _importable(module: str) -> str | None:
    return None if importlib.util.find_spec(module) else f"there is no module {module}"


def _import(statement: str) -> None:
    exec(statement, {"__name__": "docs_probe"})


PROBE_QUESTIONS = {"parse": _parse, "runnable": _runnable, "importable": _importable, "import": _import}


# ---------------------------------------------------------------------------------------------
# A page's problems


def questions_of(page: Page) -> list[tuple]:
    commands, _ = shell_commands(page)
    questions = [question for command in commands for question in command_questions(command)]
    for block in page.blocks:
        if not block.skipped and block.language in PYTHON_LANGUAGES:
            for _, source, mode in python_sources(block):
                tree, error = parse_python(source, mode, page.path)
                questions += [("import", statement) for _, statement in import_statements(tree)] if tree else []
    return questions


def problems_in(text: str, path: str) -> list[Problem]:
    """Every problem of one page (``path`` relative to the repository root, where its links start)."""
    page = read_page(text, path)
    probe(questions_of(page))
    commands, split_problems = shell_commands(page)
    problems = [*page.problems, *link_problems(page), *split_problems,
                *(problem for command in commands for problem in command_problems(command, path)),
                *python_problems(page)]
    return sorted(problems, key=lambda problem: problem.line)


@functools.cache
def page_problems(path: str) -> tuple[Problem, ...]:
    return tuple(problems_in((ROOT / path).read_text(encoding="utf-8"), path))


def fail_with(problems: list[Problem], what: str) -> None:
    if problems:
        pytest.fail(f"{len(problems)} {what} problem(s):\n" + "\n".join(map(str, problems)), pytrace=False)


# ---------------------------------------------------------------------------------------------
# The tests of the docs


@pytest.fixture(scope="session")
def probed(tmp_path_factory) -> None:
    """One probe process for the questions of every page and every self-test snippet, and one
    ``pytest --help`` beside it, for the whole session (each xdist worker reads what they stored:
    the questions are the same in each)."""
    from tests.conftest import once_per_session  # not at the top: this file also runs as the probe script

    texts = [((ROOT / path).read_text(encoding="utf-8"), path) for path in PAGES]
    texts += [(text, SNIPPET_PATH) for text in [GOOD_PAGE, *(case[0] for case in BAD_SNIPPETS)]]

    def questions() -> list[tuple]:  # a pytest command's questions depend on which of its options take values
        return list(dict.fromkeys(question for text, path in texts for question in questions_of(read_page(text, path))))

    def make(folder) -> dict:
        _PYTEST_HELP[:] = [pytest_help()]
        return {"pytest_help": _PYTEST_HELP[0], "answers": answers_of(questions())}

    stored = once_per_session(tmp_path_factory, "docs-probe", make)
    _PYTEST_HELP[:] = [stored["pytest_help"]]
    _ANSWERS.update(zip(questions(), stored["answers"]))


def test_there_are_docs():
    assert "README.md" in PAGES and len(PAGES) > 1, f"expected README.md and docs/**/*.md, found {PAGES}"


def test_readme_is_a_page():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}: a README that " \
                                      "is a page links to docs/ for the rest"


@pytest.mark.parametrize("path", PAGES)
def test_shell_blocks(path, probed):
    fail_with([problem for problem in page_problems(path) if problem.kind == "shell"], "shell block")


@pytest.mark.parametrize("path", PAGES)
def test_python_blocks(path, probed):
    fail_with([problem for problem in page_problems(path) if problem.kind == "python"], "Python block")


@pytest.mark.parametrize("path", PAGES)
def test_links_and_markup(path, probed):
    fail_with([problem for problem in page_problems(path) if problem.kind == "markdown"], "link or markup")


@pytest.mark.parametrize("path", PAGES)
def test_opted_out_blocks(path):
    """Skipped (in the summary's list of skips) when the page opts blocks out, naming them."""
    page = read_page((ROOT / path).read_text(encoding="utf-8"), path)
    skipped = [f"{path}:{block.line - 1} ({block.language or 'no info string'})" for block in page.blocks
               if block.skipped]
    if skipped:
        pytest.skip(f"{len(skipped)} of {len(page.blocks)} code blocks opted out of the docs test "
                    f"(<!-- docs-test: skip -->): {', '.join(skipped)}")


# ---------------------------------------------------------------------------------------------
# Self-tests: each check catches what it is there for, and lets a correct page through

SNIPPET_PATH = "docs/snippet.md"  # not a file: its relative links start in docs/

GOOD_PAGE = """\
# A page that keeps its promises

## Install and run

<a id="explicit"></a>

```bash
$ python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test,report]'   # install
$ CI=true timeout 600 pytest -n auto -q -ra --impl=hf --ops rms_norm tests/test_ops.py -k 'matches_hf and not slow' 2>&1 | tee log
$ python -m oracle.report --impl hf --ops rms_norm --workers $N --json $OUT/drift.json \\
    --html "${OUT}/drift.html"
$ python -m oracle.repro --impl liger --check shared-input '<case JSON>'
$ python -m oracle.repro '{"op": ...}'
its output: (an unbalanced ' is no command)
$ env -u CI python scripts/tune_rms_norm.py --help; bash scripts/h200.sh
$ pytest --pyargs oracle.suite --impl mylib.ops:impl -- tests/test_ops.py::test_x
$ python -m oracle.bench --quick && python -m oracle.sanitize --ops rope --tools memcheck
$ python -m oracle.report --help
```

```sh
cat > notes.txt <<'EOF'
pytest --no-such-flag: data of a heredoc, not a command
EOF
```

<!-- docs-test: skip (the reader's own repository) -->
```bash
pytest --no-such-flag mylib/tests/test_mine.py
```

```python
from oracle.declare.implementations import OPS
import json, os.path
```

```python run
import sys
print(sys.version)
```

```pycon
>>> 1 + 1
2
```

```text
plain text, 'unbalanced
```

## Install and run

[the project](../pyproject.toml "its metadata"), [a folder](../oracle/), [from the root](/tests/conftest.py),
[a heading](#install-and-run), [its repeat](#install-and-run-1), [explicit](#explicit),
[a page's heading](../README.md#kernel-oracle), ![an image](https://example.com/x.png), [mail](mailto:a@b.c),
[a reference][ref], `[in code](nowhere.md)`, <!-- [commented out](nowhere.md) -->

[ref]: ../pyproject.toml

```bash
# [in a code block](nowhere.md)
```
"""

# (markdown, expected text of the one problem, expected line)
BAD_SNIPPETS = [
    ("# T\n\n```bash\npython -m oracle.report --no-such-option\n```\n", "unrecognized arguments: --no-such-option", 4),
    ("```bash\npython -m oracle.report --ops no_such_op\n```\n", "invalid choice: 'no_such_op'", 2),
    ("```bash\npython -m oracle.repro --impl hf\n```\n", "required: case", 2),
    ("```bash\npython -m oracle.bench --no-such-flag\n```\n", "unrecognized arguments: --no-such-flag", 2),
    ("```bash\npython -m oracle.sanitize --tools nocheck\n```\n", "invalid choice: 'nocheck'", 2),
    ("```bash\npython -m oracle.no_such_tool\n```\n", "there is no module oracle.no_such_tool", 2),
    ("```\n$ ls\noutput\n$ pytest --no-such-flag tests/\n```\n", "pytest knows no option --no-such-flag", 4),
    ("```console\n$ pytest --no-such=1\n```\n", "pytest knows no option --no-such", 2),
    ("```bash\npytest -qZ\n```\n", "pytest knows no option -qZ", 2),
    ("```bash\npytest -n 2 tests/test_no_such_file.py::test_x\n```\n",
     "no test file or directory tests/test_no_such_file.py::test_x", 2),
    ("```bash\npytest --pyargs oracle.no_such_suite\n```\n", "there is no module oracle.no_such_suite", 2),
    ("```bash\npip install -e '.[test,no-such-extra]'\n```\n", "no extra 'no-such-extra'", 2),
    ("```bash\ncd x && bash scripts/no_such.sh --fast\n```\n", "no script scripts/no_such.sh", 2),
    ("```bash\npython -c 'print(('\n```\n", "does not compile", 2),
    ("```sh\npytest -k 'unbalanced\n```\n", "cannot be split into words", 2),
    ("See [gone](no-such-page.md).\n", "there is no docs/no-such-page.md", 1),
    ("\n[x](../README.md#no-such-heading)\n", "README.md has no heading or anchor #no-such-heading", 2),
    ("# Here\n[x](#nowhere)\n", "docs/snippet.md has no heading or anchor #nowhere", 2),
    ("[x](../../outside.md)\n", "leaves the repository", 1),
    ('<img src="no-such.png">\n', "there is no docs/no-such.png", 1),
    ("```python\nx = 1\ndef f(:\n    pass\n```\n", "does not compile", 3),
    ("```python\n\nimport no_such_module_for_the_docs_test\n```\n", "No module named 'no_such_module_for_the_docs_test'", 3),
    ("```py\nfrom oracle import no_such_name\n```\n", "cannot import name 'no_such_name'", 2),
    ("```python run\nimport sys\n\nsys.exit(3)\n```\n", "exits 3", 2),
    ("```python run\nx = 1\nraise ValueError('from the example')\n```\n", "ValueError: from the example", 3),
    ("```pycon\n>>> 1 + 1\n3\n```\n", "Expected: | 3 | Got: | 2", 2),
    ("```bash\nls\n", "never closed", 1),
    ("<!-- docs-test: skip -->\n\n```bash\nls\n```\n", "not right above a code fence", 1),
]


def test_a_correct_page_has_no_problem(probed):
    assert problems_in(GOOD_PAGE, SNIPPET_PATH) == []


def test_an_opted_out_block_is_counted():
    blocks = read_page(GOOD_PAGE, SNIPPET_PATH).blocks
    assert [block.line for block in blocks if block.skipped] == [29]


@pytest.mark.parametrize("text, expected, line", BAD_SNIPPETS, ids=[case[1][:40] for case in BAD_SNIPPETS])
def test_each_check_can_fail(text, expected, line, probed):
    problems = problems_in(text, SNIPPET_PATH)
    assert len(problems) == 1 and expected in problems[0].message and problems[0].line == line, \
        "\n".join(map(str, problems)) or "no problem found"


def test_commands_split_as_a_shell_splits_them():
    text = 'A=1 env B=2 timeout -s KILL 5 python -m oracle.report --gate && pytest -q 2>&1; echo "a && b" | tee x # c'
    assert [without_prefixes(words) for words in split_commands(text)] == [
        ["python", "-m", "oracle.report", "--gate"], ["pytest", "-q"], ["echo", "a && b"], ["tee", "x"]]


def test_pytest_options_include_its_plugins(probed):
    assert {"-k", "-n", "--impl", "--ops", "--scale", "--op-module", "--noise-model", "--hypothesis-profile"} \
        <= set(pytest_options())
    assert pytest_options()["-n"] and not pytest_options()["--scale"]


@pytest.mark.parametrize("heading, slug", [
    ("Performance on the H200: `python -m oracle.bench`", "performance-on-the-h200-python--m-oraclebench"),
    ("JSON schema (`kernel-oracle/drift/2`)", "json-schema-kernel-oracledrift2"),
    ("2. The contract an implementation meets", "2-the-contract-an-implementation-meets"),
    ("Why the wheel installs no `kernels` package", "why-the-wheel-installs-no-kernels-package"),
    ("`rms_norm`'s [launch](x.md) <em>table</em>", "rms_norms-launch-table"),
])
def test_github_slugs(heading, slug):
    assert github_slug(heading) == slug


def test_repeated_headings_are_numbered():
    page = read_page("# A\n## A\nA\n---\n```\n# A\n```\n", SNIPPET_PATH)
    assert anchors(page) == {"a", "a-1", "a-2"}


if __name__ == "__main__" and sys.argv[1:2] == ["--probe"]:
    sys.exit(probe_main(sys.argv[2]))
