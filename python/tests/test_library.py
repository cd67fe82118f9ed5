"""How the package finds libkiln.so, and what it says when it cannot."""
import os
import subprocess
import sys

from conftest import REPO


def import_kiln(env_lib):
    env = dict(os.environ, KILN_LIBRARY=env_lib, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", "import kiln; print(kiln.library_path)"],
                          cwd=os.path.join(REPO, "python"), env=env, capture_output=True,
                          text=True)


def test_kiln_library_is_used_and_a_bad_one_is_an_import_error():
    import kiln
    r = import_kiln(kiln.library_path)
    assert r.returncode == 0 and r.stdout.strip() == kiln.library_path, r.stderr
    r = import_kiln("/nonexistent/libkiln.so")
    assert r.returncode != 0
    assert "ImportError: kiln: cannot find libkiln.so" in r.stderr
    assert "$KILN_LIBRARY: /nonexistent/libkiln.so does not exist" in r.stderr
    assert "find_library" not in r.stderr  # no silent fallback to another library
    libm = "/lib/x86_64-linux-gnu/libm.so.6"
    if os.path.exists(libm):
        r = import_kiln(libm)
        assert "lacks kiln_" in r.stderr and "an older libkiln?" in r.stderr, r.stderr
