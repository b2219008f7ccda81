"""The README's example runs; every public class and method has a
docstring; the native module's type stubs name what it has."""

import ast
import inspect
import pathlib
import re
import subprocess
import sys

import pmhash
from pmhash import _pmhash

HERE = pathlib.Path(__file__).resolve().parent.parent


def test_readme_example_runs(tmp_path):
    readme = (HERE / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "the README has no python block"
    script = tmp_path / "example.py"
    script.write_text("\n".join(blocks))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused: invalid argument: unknown index engine")


def public_members(cls):
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__getitem__", "__setitem__", "__delitem__",
                                                 "__iter__", "__len__", "__contains__",
                                                 "__enter__", "__exit__", "__next__"):
            continue
        yield name, member


def test_every_public_class_and_method_has_a_docstring():
    classes = [pmhash.Store, pmhash.Index, _pmhash.Store, _pmhash.Index, _pmhash.Pairs]
    classes += [getattr(pmhash, n) for n in pmhash.__all__ if inspect.isclass(getattr(pmhash, n))]
    undocumented = []
    for cls in classes:
        if not (cls.__doc__ or "").strip():
            undocumented.append(cls.__qualname__)
        for name, member in public_members(cls):
            if name == "__next__" or name == "__iter__" and cls is _pmhash.Pairs:
                continue  # the iterator protocol's own slots
            if not (getattr(member, "__doc__", None) or "").strip():
                undocumented.append(f"{cls.__qualname__}.{name}")
    for fn in (pmhash.engines,):
        if not (fn.__doc__ or "").strip():
            undocumented.append(fn.__name__)
    assert undocumented == []
    assert pmhash.__doc__.strip()


def test_stubs_name_what_the_native_module_has():
    tree = ast.parse((HERE / "pmhash" / "_pmhash.pyi").read_text())
    stub_top, stub_members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stub_top.add(node.name)
            stub_members[node.name] = {
                n.name for n in node.body if isinstance(n, ast.FunctionDef)
            } - {"__new__"}
        elif isinstance(node, ast.FunctionDef):
            stub_top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and not node.target.id.startswith("_"):
            stub_top.add(node.target.id)
    native_top = {n for n in dir(_pmhash) if not n.startswith("_")}
    assert stub_top == native_top
    for cls in ("Store", "Index", "Pairs"):
        native = {
            n for n in vars(getattr(_pmhash, cls))
            if not n.startswith("_") or n in ("__iter__", "__next__")
        }
        assert stub_members[cls] == native, cls
    assert (HERE / "pmhash" / "py.typed").exists()
