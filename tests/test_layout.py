"""The shape of the code, read from the source (design.md "Layers", issue 44): who imports whom,
how big modules and functions get, and whether README and docs link to files that exist.

Everything here parses files with `ast` or reads them as text: nothing is imported, so it runs
without torch and in well under a second.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "model")

# The report side reads run folders; it must load without the runtime or torch (design.md).
REPORT = "harness.report"
REPORT_FORBIDDEN = ("harness.run", "harness.launch", "harness.data", "harness.tools", "harness.cli",
                    "torch", "fbgemm_gpu")

MIN_WINGS = 3
MAX_TOP_MODULES = 8
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 450
MAX_COMMENTED_CPP_LINES = 200
MAX_CPP_COMMENT_SHARE = 0.25
MAX_README_LINES = 150


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    """Module name -> file, for every .py under harness/ and model/."""
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


SOURCES = _sources()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in SOURCES.items()}


def _imported(name: str, tree: ast.Module) -> set[str]:
    """What a module imports, anywhere in it (module level and inside functions): a module of
    harness/ or model/ by its full name (`from harness.x import y` is harness.x.y when that is a
    module, else harness.x), anything else by its top-level name (torch, numpy, ...)."""
    package = name if SOURCES[name].name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in SOURCES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in SOURCES and "." in target:
                target = target.rpartition(".")[0]
            out.add(target)
    return out


IMPORTS = {name: _imported(name, tree) for name, tree in TREES.items()}


def _internal_edges() -> dict[str, set[str]]:
    return {name: {t for t in targets if t in SOURCES and t != name} for name, targets in IMPORTS.items()}


def _cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """The strongly connected components with more than one module (Tarjan): each as (a shortest
    cycle through its first module, all its modules), sorted so the message is stable."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted((_one_cycle(graph, comp), comp) for comp in comps)


def _one_cycle(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """A shortest import cycle through the first module of a strongly connected component."""
    start, members = comp[0], set(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return comp


def _under(module: str, prefixes: tuple[str, ...]) -> str | None:
    return next((p for p in prefixes if module == p or module.startswith(p + ".")), None)


def _loads(name: str) -> dict[str, list[str]]:
    """Every module importing `name` loads, transitively, through harness/ and model/ (the
    packages above each module included: their __init__ runs too), each with the import chain."""
    graph = _internal_edges()
    chains = {name: [name]}
    todo = [name]
    while todo:
        v = todo.pop()
        parents = [".".join(v.split(".")[:i]) for i in range(1, v.count(".") + 1)]
        for w in sorted(IMPORTS[v] | {p for p in parents if p in SOURCES}):
            if w not in chains:
                chains[w] = chains[v] + [w]
                if w in graph:
                    todo.append(w)
    return chains


def _functions(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_import_circle():
    """No import circle among the modules of harness/ and model/ (imports inside functions count)."""
    cycles = _cycles(_internal_edges())
    assert not cycles, "import circles: " + "; ".join(
        " -> ".join(cycle) + (f" (circle of {', '.join(comp)})" if len(comp) > len(cycle) - 1 else "")
        for cycle, comp in cycles)


def test_report_never_loads_the_runtime():
    """No module of harness/report/ imports, directly or through harness/ and model/ modules,
    the runtime (harness.run, launch, data, tools, cli), torch or fbgemm_gpu."""
    offenders = []
    for name in sorted(SOURCES):
        if _under(name, (REPORT,)):
            for loaded, chain in sorted(_loads(name).items()):
                if _under(loaded, REPORT_FORBIDDEN):
                    offenders.append(" -> ".join(chain))
    assert not offenders, "report modules loading the runtime or torch: " + "; ".join(offenders)


def test_model_never_imports_harness():
    """model/ never imports harness/ (design.md, "Layers"), not even inside a function."""
    offenders = [f"{name} imports {t}" for name in sorted(SOURCES) if _under(name, ("model",))
                 for t in sorted(IMPORTS[name]) if _under(t, ("harness",))]
    assert not offenders, "model/ importing harness/: " + "; ".join(offenders)


def test_harness_is_in_wings():
    """At least three wings (sub-packages) under harness/, at most eight modules left at its top."""
    wings = sorted(p.name for p in (ROOT / "harness").iterdir() if (p / "__init__.py").is_file())
    top = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert len(wings) >= MIN_WINGS, f"harness/ has {len(wings)} wings ({', '.join(wings) or 'none'}), want >= {MIN_WINGS}"
    assert len(top) <= MAX_TOP_MODULES, f"harness/ has {len(top)} top modules, want <= {MAX_TOP_MODULES}: {', '.join(top)}"


def test_no_long_function():
    """No function of harness/ or model/ (methods and nested functions included) over 80 lines,
    counted from its def line to its last line."""
    offenders = [f"{SOURCES[name].relative_to(ROOT)}:{fn.lineno} {fn.name} ({fn.end_lineno - fn.lineno + 1} lines)"
                 for name, tree in sorted(TREES.items()) for fn in _functions(tree)
                 if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION_LINES]
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(offenders)


def test_no_long_module():
    """No .py module of harness/ or model/ over 450 lines."""
    sizes = {path.relative_to(ROOT): len(path.read_text().splitlines()) for path in SOURCES.values()}
    offenders = [f"{path} ({n} lines)" for path, n in sorted(sizes.items()) if n > MAX_MODULE_LINES]
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines: " + "; ".join(offenders)


def _comment_lines(text: str) -> int:
    """Lines that start with // or open or lie inside a /* */ block (after stripping)."""
    count, in_block = 0, False
    for line in text.splitlines():
        s = line.strip()
        if in_block:
            count += 1
            in_block = "*/" not in s
        elif s.startswith("//"):
            count += 1
        elif s.startswith("/*"):
            count += 1
            in_block = "*/" not in s[2:]
    return count


def test_cpp_files_are_not_mostly_comments():
    """No C++ file of csrc/ (*.cpp, *.h) over 200 lines whose comment lines exceed a quarter of it."""
    offenders = []
    for path in sorted(p for ext in ("*.cpp", "*.h") for p in (ROOT / "csrc").rglob(ext)):
        text = path.read_text()
        lines, comments = len(text.splitlines()), _comment_lines(text)
        if lines > MAX_COMMENTED_CPP_LINES and comments > MAX_CPP_COMMENT_SHARE * lines:
            offenders.append(f"{path.relative_to(ROOT)} ({comments} of {lines} lines comments)")
    assert not offenders, (f"C++ files over {MAX_COMMENTED_CPP_LINES} lines, more than "
                           f"{MAX_CPP_COMMENT_SHARE:.0%} comments: " + "; ".join(offenders))


def test_comment_counter():
    """The C++ comment counter counts // lines and whole /* */ blocks, not code."""
    text = "int a;\n// one\n/* two\n   three\n*/\nint b; // not counted\n/* five */\n"
    assert _comment_lines(text) == 5


def test_readme_is_short():
    """README.md is at most 150 lines (the rest lives in docs/, linked)."""
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines, want <= {MAX_README_LINES}"


LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def test_doc_links_resolve():
    """Every relative link [..](path) in README.md and docs/*.md points to an existing file
    (http(s) and mailto links and #anchors are not checked)."""
    offenders = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for target in LINK.findall(line):
                path = target.split("#", 1)[0]
                if not path or re.match(r"[a-z][a-z0-9+.-]*:", path, re.I):
                    continue
                if not (doc.parent / path).exists():
                    offenders.append(f"{doc.relative_to(ROOT)}:{n} -> {target}")
    assert not offenders, "links to missing files: " + "; ".join(offenders)
