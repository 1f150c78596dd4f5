#!/usr/bin/env bash
# The README's test command. Installs what the tests need (tools/setup.sh: as root on Debian or
# Ubuntu it apt-gets what is missing; otherwise it names it in one line and stops), then runs
# the Rust tests (`cargo test`, extra arguments go to it) and the wheel's (tools/python-tests.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
cargo test "$@"
tools/python-tests.sh
