#!/usr/bin/env bash
# A Python engine pair over RDMA verbs: runs crates/hixl-py/tests/verbs_pair.py (an initiator and
# its target, two processes, READ and WRITE verified, a notify) inside the Soft-RoCE guest of
# tools/softroce-vm.sh with HIXL_VERBS_DEVICE=rxe0, with the installed `hixl` wheel; then
# crates/hixl-py/tests/sglang_verbs_pair.py, SGLang's engine (hixl.sglang) configured by the
# connectors' settings (HIXL_SGLANG_TRANSPORT=verbs, _VERBS_DEVICES, _PORT), every page checked.
#
#   tools/guest-python.sh          # after tools/python-tests.sh (whose venv has the wheel)
#
# The guest gets the smallest Python that runs the pair: the interpreter, the files of the
# modules the pair imports (found by running it over tcp on the host with the same environment
# the guest gives it), their cached bytecode, and their shared libraries; no package manager, no
# image. Environment: HIXL_PYTHON (a python whose `import hixl` is the wheel; default the venv of
# tools/python-tests.sh), and softroce-vm.sh's (WORK, TIMEOUT, ...).
# Exits non-zero if the pair fails in the guest or on the host, or the guest does not come up.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t0=$SECONDS
py=${HIXL_PYTHON:-$root/target/python/test-venv/bin/python}
pair=$root/crates/hixl-py/tests/verbs_pair.py
sglang_pair=$root/crates/hixl-py/tests/sglang_verbs_pair.py
work=$root/target/guest-python
die() { echo "guest-python: $*" >&2; exit 2; }
"$py" -c 'import hixl' 2>/dev/null ||
  die "$py cannot import hixl (tools/python-tests.sh builds the wheel and installs it there)"
mkdir -p "$work"

# The interpreter's real file, its home, and the directory holding the hixl package: the guest
# runs that file with PYTHONHOME and PYTHONPATH set, so no venv or site configuration is needed.
read -r exe home site < <("$py" -c '
import os, sys, hixl
print(os.path.realpath(sys.executable), sys.base_prefix,
      os.path.dirname(os.path.dirname(hixl.__file__)))')
run_env=(PATH=/usr/bin:/bin HOME=/tmp PYTHONHOME="$home" PYTHONPATH="$site"
  PYTHONDONTWRITEBYTECODE=1)

# What the pairs import, from both processes of each (same environment as in the guest).
rm -f "$work/modules"
for p in "$pair" "$sglang_pair"; do
  env -i "${run_env[@]}" HIXL_PAIR_TRANSPORT=tcp HIXL_PAIR_MODULES="$work/modules" "$exe" "$p" ||
    die "$(basename "$p") failed over tcp on the host"
done
# The file list: the interpreter, the pair, each module's file and its cached bytecode, and
# os.py (the landmark by which Python recognises its standard library).
env -i "${run_env[@]}" "$exe" - "$work/modules" "$exe" "$pair" "$sglang_pair" > "$work/files" <<'LIST'
import importlib.util, os, sys
files = {sys.argv[2], sys.argv[3], sys.argv[4], os.__file__}
with open(sys.argv[1]) as f:
    files.update(line.strip() for line in f if line.strip())
for p in list(files):
    if p.endswith(".py"):
        try:
            files.add(importlib.util.cache_from_source(p))
        except NotImplementedError:
            pass
    # A wheel's bundled libraries (auditwheel's PKG.libs beside PKG, e.g. numpy.libs): its
    # extensions find them through an $ORIGIN-relative RPATH, so they go where the package
    # goes (a venv under the host's /tmp lands under /host-tmp in the guest).
    d = os.path.dirname(p)
    while d not in ("/", ""):
        if os.path.isdir(d + ".libs"):
            files.update(os.path.join(d + ".libs", n) for n in os.listdir(d + ".libs"))
        d = os.path.dirname(d)
print("\n".join(sorted(p for p in files if os.path.isfile(p))))
LIST
# Each file goes to its own path in the guest, but for the host's /tmp (a fresh tmpfs there).
guest() { case $1 in /tmp/*) echo "/host-tmp/${1#/tmp/}" ;; *) echo "$1" ;; esac; }
if grep -q '[[:blank:]]' "$work/files"; then
  die "a path with a blank in it: $(grep '[[:blank:]]' "$work/files" | head -n 1)"
fi
while read -r f; do echo "$f $(guest "$f")"; done < "$work/files" > "$work/root-files"
echo "guest-python: $(wc -l < "$work/files") files for the guest's Python ($exe)"

ROOT_FILES=$work/root-files tools/softroce-vm.sh build
cmd="export HIXL_VERBS_DEVICE=rxe0 PATH=/usr/bin:/bin HOME=/tmp PYTHONDONTWRITEBYTECODE=1"
cmd="$cmd PYTHONHOME=$(guest "$home") PYTHONPATH=$(guest "$site"); cd /tmp"
cmd="$cmd; $(guest "$exe") $(guest "$pair") && $(guest "$exe") $(guest "$sglang_pair")"
tools/softroce-vm.sh run "$cmd"
echo "guest-python: total $((SECONDS - t0))s"
