"""`lm_eval --model frenzy` on lm-eval releases that do not read the `lm_eval.models` entry points.

Frenzy declares its model as the entry point `frenzy = tasks.evaluation.lmeval.model:FrenzyLM` in the group
`lm_eval.models`, which lm-eval's plugin discovery reads. lm-eval 0.4.13 has no such discovery: its registry knows
only its own models, and its CLI resolves `--model` before any user code runs. For those releases

    python -m tasks.evaluation.lmeval.plugin install      # once per environment; `uninstall` removes it

writes `frenzy-lmeval.pth` into the environment's site-packages. Python runs its one line at start-up: it puts an
import hook in place that, when `lm_eval.api.registry` is first imported, registers every `lm_eval.models` entry
point not already registered as a lazy placeholder (nothing is imported until a run asks for that model, and
lm-eval's own models keep their names). Nothing else is imported at start-up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path
from types import ModuleType

GROUP = "lm_eval.models"
REGISTRY = "lm_eval.api.registry"
PTH_NAME = "frenzy-lmeval.pth"
#: what the .pth runs at start-up: a finder that imports nothing until `lm_eval.api.registry` is imported, and then
#: nothing at all when this package is gone or another `tasks` package shadows it (a .pth line that raises prints a
#: traceback at every start-up)
HOOK = """import sys
class _FrenzyLmevalHook:
    frenzy_hook = True
    def find_spec(self, name, path=None, target=None):
        if name != "lm_eval.api.registry":
            return None
        try:
            from tasks.evaluation.lmeval.plugin import registry_spec
        except Exception:
            return None
        return registry_spec(name, path, target)
sys.meta_path.insert(0, _FrenzyLmevalHook())
"""
#: Python runs .pth lines that start with `import`; the hook is one line of it
PTH_LINE = f"import sys; exec({HOOK!r})\n"


def register_entry_points(registry: ModuleType) -> list[str]:
    """Register each `lm_eval.models` entry point that the registry does not know yet (as a 'module:attr' string,
    which lm-eval materialises on first use and which the class's own `@register_model` upgrades in place), after
    lm-eval's own models, which keep their names."""
    import importlib.metadata

    import lm_eval.models  # noqa: F401 - lm-eval's own models first (its get_model imports them only into an empty registry)

    added = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        if ep.name not in registry.model_registry:
            registry.model_registry.register(ep.name, target=ep.value)
            added.append(ep.name)
    return added


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        register_entry_points(module)


def registry_spec(name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
    """lm-eval's registry module as the other finders find it, loaded so that the entry points are registered as
    soon as it has run."""
    for finder in sys.meta_path:
        if getattr(finder, "frenzy_hook", False) or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
            return spec
    return None


class _Finder(importlib.abc.MetaPathFinder):
    frenzy_hook = True

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return registry_spec(name, path, target) if name == REGISTRY else None


def install() -> None:
    """Arrange for the entry points to be registered when lm-eval's registry is imported (at once if it is); for
    programs that set this up themselves instead of through the .pth."""
    if REGISTRY in sys.modules:
        register_entry_points(sys.modules[REGISTRY])
    elif not any(getattr(f, "frenzy_hook", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def pth_path(site_dir: str | None = None) -> Path:
    import sysconfig

    return Path(site_dir or sysconfig.get_paths()["purelib"]) / PTH_NAME


def main(argv: list[str] | None = None) -> int:
    import argparse
    import importlib.metadata

    ap = argparse.ArgumentParser(prog="python -m tasks.evaluation.lmeval.plugin", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["install", "uninstall", "status"])
    ap.add_argument("--site-dir", help="site-packages directory (default: this interpreter's)")
    a = ap.parse_args(argv)
    p = pth_path(a.site_dir)
    if a.action == "install":
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(PTH_LINE)
        print(f"wrote {p}: `lm_eval --model frenzy` now resolves in this environment")
    elif a.action == "uninstall":
        p.unlink(missing_ok=True)
        print(f"removed {p}")
    else:
        names = sorted(ep.name for ep in importlib.metadata.entry_points(group=GROUP))
        print(f"{p}: {'present' if p.is_file() else 'absent'}; {GROUP} entry points: {', '.join(names) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
