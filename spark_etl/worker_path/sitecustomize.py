"""Run at start-up by every Python process that the JVM of a pbft-etl session starts (this
directory is on their PYTHONPATH: `spark_etl.session`): Spark puts `pyspark.zip` first on
their path, and Python compiles what it imports from a zip from source each time, with no
bytecode cache; Spark's planning of a Python data source alone starts three such processes
in turn. pyspark is imported from the installed package instead when the zip is its own
copy (`spark_etl.worker_daemon`). Then the interpreter's own sitecustomize, if any, which
this module hides. The processes such a process starts inherit the PYTHONPATH too: in an
interpreter without spark_etl, this module only runs the interpreter's own."""

import sys
from importlib.machinery import PathFinder
from pathlib import Path

HERE = Path(__file__).resolve().parent

try:
    from spark_etl.worker_daemon import installed_pyspark_first
except ImportError:  # another interpreter, started by a process that holds a session
    pass
else:
    sys.path[:] = installed_pyspark_first(sys.path)
_hidden = PathFinder.find_spec(
    __name__, [p for p in sys.path if Path(p or ".").resolve() != HERE]
)
if _hidden is not None and _hidden.loader is not None:
    _hidden.loader.exec_module(sys.modules[__name__])
