"""The compiled decode step (``tracemq_collector/_fastdecode.pyx``), built when it can be.

Everything else about the package is in pyproject.toml. The extension is optional: without a
C compiler, Python headers or Cython the install still succeeds and the decoder uses its
pure-Python path (``events._fast_rows``, the reference the compiled one is tested against).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # no Cython (a build outside the declared build requirements): pure Python
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension("tracemq_collector._fastdecode", ["src/tracemq_collector/_fastdecode.pyx"])],
        compiler_directives={"language_level": "3"},
        quiet=True,
    )
    for ext in ext_modules:
        # a failed compile is a warning, not a failed install (set here: cythonize's copies of
        # the extensions do not keep it)
        ext.optional = True

setup(ext_modules=ext_modules)
