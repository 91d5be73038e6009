#!/usr/bin/env bash
# The docs check: every banlieue command the docs show parses (subcommand and flags), every
# script and manifest they name exists. See scripts/docs-check.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
# shellcheck source=../lib/env.sh
source scripts/lib/env.sh
build_banlieue
scripts/docs-check "$CARGO_TARGET_DIR/debug/banlieue"
