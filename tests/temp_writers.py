"""Tests that write to temp directories the ways the suite does; run only by ``test_temp_directory``."""

import subprocess
import sys
import tempfile


def test_writes_under_tmp_path(tmp_path):
    (tmp_path / "file.txt").write_text("文本", encoding="utf-8")


def test_a_library_and_a_subprocess_write_to_the_temp_directory(tmp_path_factory):
    tmp_path_factory.mktemp("shared")
    tempfile.mkstemp(prefix="left_by_a_library_")  # as torch's compiler and torchrun do
    subprocess.run([sys.executable, "-c", "import tempfile; tempfile.mkdtemp()"], check=True)
