"""The API references keep up with the code: every public name of the `fmha` Python package is
documented in docs/api-python.md (with every argument), and every public declaration of
include/fmha/*.h in docs/api-cpp.md. A function or field added without its documentation fails here.
Reads files and imports fmha; needs no GPU."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

import fmha

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON_DOC = ROOT / "docs" / "api-python.md"
CPP_DOC = ROOT / "docs" / "api-cpp.md"
HEADERS = sorted((ROOT / "include" / "fmha").glob("*.h"))


# ---- Markdown: what a page names -----------------------------------------------------------------


def _markdown(path: pathlib.Path) -> tuple[list[str], str]:
    """(headings, code): the page's heading lines, and the text of its fenced blocks and inline code
    spans joined together (the places where a reference names an API)."""
    text = path.read_text(encoding="utf-8")
    fences = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    spans = re.findall(r"`([^`\n]+)`", prose)
    headings = [line for line in prose.splitlines() if re.match(r"#{1,6}\s", line)]
    return headings, "\n".join(fences + spans)


def _word(name: str) -> re.Pattern:
    return re.compile(rf"(?<![\w.]){re.escape(name)}\b|\.{re.escape(name)}\b")


# ---- Python: the package's public names ----------------------------------------------------------


def _python_public_names() -> list[str]:
    """__all__, plus any public callable the package exports from its own modules (so that a
    function added to the package but not to __all__ is caught too)."""
    names = set(getattr(fmha, "__all__", ()))
    for name, value in vars(fmha).items():
        if name.startswith("_") or inspect.ismodule(value) or not callable(value):
            continue
        if getattr(value, "__module__", "").split(".")[0] == "fmha":
            names.add(name)
    return sorted(names)


PYTHON_NAMES = _python_public_names()


def test_the_package_exports_public_names():
    assert PYTHON_NAMES, "found no public names in the fmha package"
    assert "attention" in PYTHON_NAMES


@pytest.mark.parametrize("name", PYTHON_NAMES)
def test_python_name_is_documented(name):
    headings, code = _markdown(PYTHON_DOC)
    in_heading = any(_word(name).search(line) for line in headings)
    in_code = re.search(rf"\bfmha\.{re.escape(name)}\b|(?<![\w.]){re.escape(name)}\s*\(", code)
    assert in_heading or in_code, (
        f"fmha.{name} is public but docs/api-python.md has no heading or code naming it"
    )


@pytest.mark.parametrize(
    "name", [n for n in PYTHON_NAMES if inspect.isfunction(getattr(fmha, n, None))]
)
def test_python_arguments_are_documented(name):
    _, code = _markdown(PYTHON_DOC)
    missing = [
        parameter
        for parameter in inspect.signature(getattr(fmha, name)).parameters
        if not _word(parameter).search(code)
    ]
    assert not missing, f"fmha.{name}: arguments {missing} do not appear in docs/api-python.md"


# ---- C++: the public declarations of include/fmha/*.h --------------------------------------------


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", "", source)


def _closing_brace(text: str, open_index: int) -> int:
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced braces")


def _collapse_braces(text: str) -> str:
    """Function bodies become ';' (they end a declaration), brace initialisers disappear."""
    while True:
        collapsed = re.sub(r"\{[^{}]*\}", "\0", text)
        if collapsed == text:
            break
        text = collapsed
    text = re.sub(r"(\)\s*(?:const\s*)?(?:noexcept\s*)?(?:override\s*)?)\0", r"\1;", text)
    return text.replace("\0", "")


def _strip_template_arguments(text: str) -> str:
    while True:
        stripped = re.sub(r"<[^<>;(){}]*>", "", text)
        if stripped == text:
            return text
        text = stripped


def _members(body: str, kind: str, type_name: str) -> list[tuple[str, str]]:
    """The public data members and member functions of a struct or class body."""
    found = []
    public = kind == "struct"
    for piece in re.split(r"\b(public|private|protected)\s*:", _collapse_braces(body)):
        if piece in ("public", "private", "protected"):
            public = piece == "public"
            continue
        if not public:
            continue
        for statement in piece.split(";"):
            statement = _strip_template_arguments(" ".join(statement.split()))
            if not statement or re.match(r"(static_assert|using|friend|typedef)\b", statement):
                continue
            if "(" in statement:
                prefix = statement[: statement.index("(")]
                match = re.search(r"(\w+)\s*$", prefix)
                if re.search(r"\boperator\b", prefix) or not match or match.group(1) == type_name:
                    continue  # operators and constructors
                found.append(("member function", match.group(1)))
                continue
            for declarator in statement.split(","):
                match = re.search(r"(\w+)\s*$", declarator.split("=")[0])
                if match:
                    found.append(("field", match.group(1)))
    return found


def _scan_header(source: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(declarations, free functions) of one header. Declarations are (kind, name) pairs: macros,
    types, enumerators, public members, free functions and constants in namespace fmha. Free
    functions are (name, first parameter type) pairs, one per overload."""
    declarations = [("macro", m) for m in re.findall(r"^\s*#\s*define\s+(\w+)", source, flags=re.M)]
    source = re.sub(r"^\s*#[^\n]*(?:\\\n[^\n]*)*", "", _strip_comments(source), flags=re.M)
    functions = []
    for opening in re.finditer(r"\bnamespace\s+fmha\s*\{", source):
        start = opening.end() - 1
        text = source[start + 1 : _closing_brace(source, start)]
        free = ""
        position = 0
        type_pattern = re.compile(
            r"\b(enum\s+class|enum|struct|class)\s+(?:\[\[[^\]]*\]\]\s*)?(\w+)[^;{]*\{"
        )
        for match in type_pattern.finditer(text):
            if match.start() < position:
                continue  # nested inside a type already read
            kind, name = " ".join(match.group(1).split()), match.group(2)
            body_end = _closing_brace(text, match.end() - 1)
            body = text[match.end() : body_end]
            declarations.append((kind, name))
            if kind.startswith("enum"):
                for item in body.split(","):
                    enumerator = re.match(r"\s*(\w+)", item)
                    if enumerator:
                        declarations.append(("enumerator", enumerator.group(1)))
            else:
                declarations.extend(_members(body, kind, name))
            free += text[position : match.start()] + ";"
            position = body_end + 1
        free += text[position:]
        for statement in _collapse_braces(free).split(";"):
            statement = " ".join(statement.split())
            if not statement:
                continue
            call = re.search(r"(\w+)\s*\(([^)]*)\)", statement)
            if call and "=" not in statement[: call.start()]:
                name = call.group(1)
                first = re.sub(r"\bconst\b|[&*]", " ", call.group(2).split(",")[0]).split()
                functions.append((name, first[0] if len(first) > 1 else ""))
                declarations.append(("function", name))
                continue
            constant = re.search(r"(\w+)\s*=", statement)
            if constant:
                declarations.append(("constant", constant.group(1)))
    return declarations, functions


def _cpp_declarations():
    declarations, functions = [], []
    for header in HEADERS:
        found, overloads = _scan_header(header.read_text(encoding="utf-8"))
        declarations += [(header.name, kind, name) for kind, name in found]
        functions += [(header.name, name, first) for name, first in overloads]
    return sorted(set(declarations)), sorted(set(functions))


CPP_DECLARATIONS, CPP_FUNCTIONS = _cpp_declarations()


def test_the_header_scan_finds_the_known_declarations():
    names = {name for _, _, name in CPP_DECLARATIONS}
    for known in ("run", "check", "built_with_cuda", "version", "Status", "StatusCode",
                  "TensorView", "AttentionForwardParams", "MergeBackwardParams", "kMaxRank",
                  "FMHA_RETURN_IF_ERROR", "contiguous", "causal_alignment", "kBottomRight"):  # fmt: skip
        assert known in names, f"the scan of include/fmha/*.h did not find {known}"
    overloads = {(name, first) for _, name, first in CPP_FUNCTIONS}
    assert ("run", "MergeBackwardParams") in overloads and ("check", "VarlenForwardParams") in overloads


@pytest.mark.parametrize(
    "header,kind,name", CPP_DECLARATIONS, ids=[f"{h}:{k}:{n}" for h, k, n in CPP_DECLARATIONS]
)
def test_cpp_declaration_is_documented(header, kind, name):
    _, code = _markdown(CPP_DOC)
    assert _word(name).search(code), (
        f"{kind} {name} of include/fmha/{header} does not appear in the code of docs/api-cpp.md"
    )


@pytest.mark.parametrize(
    "header,name,first", CPP_FUNCTIONS, ids=[f"{h}:{n}({f})" for h, n, f in CPP_FUNCTIONS]
)
def test_cpp_function_overload_is_documented(header, name, first):
    _, code = _markdown(CPP_DOC)
    pattern = rf"\b{re.escape(name)}\s*\(\s*" + (rf"(?:const\s+)?{re.escape(first)}\b" if first else "")
    assert re.search(pattern, code), (
        f"{name}({first}) of include/fmha/{header} is not declared in the code of docs/api-cpp.md"
    )
