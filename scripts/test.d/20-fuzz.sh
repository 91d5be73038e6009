#!/usr/bin/env bash
# Bounded fuzzing of the libvirt receive path on stable (see fuzz/README.md). A debug build,
# so arithmetic overflow panics too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=../lib/env.sh
source scripts/lib/env.sh
BANLIEUE_FUZZ_SECS="${BANLIEUE_FUZZ_SECS:-20}" \
    cargo test --locked -p banlieue-libvirt --test fuzz_packet -- --nocapture
