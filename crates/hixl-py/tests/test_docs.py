"""The README's Python quick start and the examples/python pair run as documented."""

import socket
import subprocess
import sys

from conftest import HERE

ROOT = HERE.parent.parent.parent


def test_readme_quick_start_runs():
    readme = (ROOT / "README.md").read_text()
    code = readme.split("## Quick start (Python)")[1].split("```python")[1].split("```")[0]
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "kv_ready" in p.stdout


def test_readme_llm_datadist_snippet_runs():
    import textwrap

    readme = (ROOT / "README.md").read_text()
    code = readme.split("- `hixl.llm_datadist` is a drop-in")[1].split("```python")[1].split("```")[0]
    code = textwrap.dedent(code).replace("127.0.0.1:26000", f"127.0.0.1:{free_port()}")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_examples_python_prefill_decode_pair():
    ex = ROOT / "examples" / "python"
    for transport in ("tcp", "fabric"):
        addr = f"127.0.0.1:{free_port()}"
        prefill = subprocess.Popen([sys.executable, str(ex / "prefill.py"), "--listen", addr,
                                    "--transport", transport],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            d = subprocess.run([sys.executable, str(ex / "decode.py"), "--prefill", addr,
                                "--transport", transport],
                               capture_output=True, text=True, timeout=120, cwd=str(ex))
            assert d.returncode == 0, d.stderr
            assert "every byte verified" in d.stdout and f"over {transport}" in d.stdout, d.stdout
            out, err = prefill.communicate(timeout=30)
            assert prefill.returncode == 0, err
            assert "kv_done request-1" in out
        finally:
            if prefill.poll() is None:
                prefill.kill()
                prefill.wait()
