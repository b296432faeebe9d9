"""The Spark jobs on a machine without PySpark: one line saying what to install.

The jobs share the distribution with the server, so ``pip install
durable-streams-py`` without the ``spark`` extra gives their commands but not
PySpark; they printed an import traceback. ``None`` in ``sys.modules`` makes
the import fail as it does when the package is not installed.
"""

from __future__ import annotations

import sys

import pytest

from stream_spark.jobs import extract, stats


@pytest.mark.parametrize(
    ("job", "flags", "missing"),
    [(stats, [], "pyspark"), (extract, ["--field", "n=$.n"], "pyarrow")],
)
def test_a_job_without_spark_says_what_to_install_and_exits_2(
    job, flags, missing, monkeypatch, capsys, tmp_path
):
    for name in [m for m in sys.modules if m == missing or m.startswith(missing + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(SystemExit) as exited:
        job.main([str(tmp_path), "--out", str(tmp_path / "out"), *flags])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{missing} is not installed" in err
    assert "pip install 'durable-streams-py[spark]'" in err
    assert "Traceback" not in err
