"""Import-time stand-ins for the CPU smoke environment.

SGLang imports torchvision at module level (image helpers); PyPI torchvision cannot sit next to
the CPU torch build, so when it is absent every `torchvision.*` import resolves to an inert stub
module. Nothing the checks exercise calls into it.
"""
import importlib.abc, importlib.machinery, sys, types

class _Placeholder:
    def __init__(self, name): self._name = name
    def __call__(self, *a, **k): return _Placeholder(self._name + "()")
    def __getattr__(self, item):
        if item.startswith("__"): raise AttributeError(item)
        return _Placeholder(self._name + "." + item)
    def __getitem__(self, item): return _Placeholder(self._name + "[]")
    def __mro_entries__(self, bases): return (object,)

class _StubModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"): raise AttributeError(item)
        return _Placeholder(self.__name__ + "." + item)

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots): self.roots = roots
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        m = _StubModule(spec.name); m.__path__ = []
        m.__version__ = "0.0.0+stub"; m.__file__ = "<stub>"
        return m
    def exec_module(self, module): pass

def install(roots=("torchvision",)):
    missing = []
    for r in roots:
        try:
            __import__(r)
        except ImportError:
            missing.append(r)
    if missing:
        sys.meta_path.append(_Finder(set(missing)))
