"""A local SparkSession set up as the connector's tests, benches and examples need it.

Owns: `local_session` (the settings of docs/spark.md section 6: local[2], no UI, everything on
127.0.0.1, quick JVM flags, the Python workers on this very interpreter) and `java_problem`
(the one line that says what to install when there is no Java).

Never: chooses cluster settings: a real deployment builds its own session; what it needs from
here is the PYSPARK_PYTHON rule and, for an editable install, the PYTHONPATH rule below.

Two rules found by running (docs/spark.md section 1):
1. Spark starts Python workers with `python3` from PATH unless PYSPARK_PYTHON says otherwise;
   that interpreter may lack pyarrow and mqbox, and the job dies with "Python worker exited
   unexpectedly". So PYSPARK_PYTHON is this interpreter, set before the session starts.
2. Spark registers `format("mqbox")` by listing the top-level modules of its workers' sys.path
   (pkgutil.iter_modules) for `pyspark_*` names. An installed wheel puts pyspark_mqbox.py in
   site-packages, where the list finds it; an editable install only maps it through an import
   hook, which the list does not see, so its directory is added to PYTHONPATH here.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pyspark.sql import SparkSession

JAVA_INSTALL_HINT: Final = (
    "the Spark connector needs Java 17 (a JRE is enough): "
    "apt-get install -y openjdk-17-jre-headless, or set JAVA_HOME"
)
SESSION_CONF: Final = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    # C1 only and the serial collector: a quarter off short runs' wall time (measured).
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.sql.session.timeZone": "UTC",
}


def java_problem() -> str | None:
    """None when a `java` of version 17 or later runs; else one line saying what to install."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if java is None or not Path(java).exists():
        return JAVA_INSTALL_HINT
    try:
        shown = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
    except OSError:
        return JAVA_INSTALL_HINT
    version = shown.split('"')[1] if '"' in shown else ""
    major = version.split(".")[0]
    if not major.isdigit() or int(major) < 17:
        return f"{JAVA_INSTALL_HINT} (found {version or 'an unknown version'} at {java})"
    return None


def _workers_find_pyspark_mqbox() -> None:
    """Rule 2: put pyspark_mqbox.py's directory on the workers' PYTHONPATH if sys.path lacks it."""
    spec = importlib.util.find_spec("pyspark_mqbox")
    if spec is None or spec.origin is None:
        return
    directory = str(Path(spec.origin).resolve().parent)
    if directory in (str(Path(entry).resolve()) for entry in sys.path if entry):
        return
    paths = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    if directory not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([directory, *paths])


def local_session(
    app_name: str = "mqbox", *, master: str = "local[2]", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A local session with SESSION_CONF (and `conf` over it). RuntimeError without Java."""
    problem = java_problem()
    if problem is not None:
        raise RuntimeError(problem)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    _workers_find_pyspark_mqbox()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**SESSION_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
