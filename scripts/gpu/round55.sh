#!/usr/bin/env bash
# Issue 16, round 55, one device call: the acceptance at HEAD and, on an
# H200 with time left, round49.sh (round54.sh); then the metrics endpoint
# with a real PyTorch process (metrics_check.sh).
# Usage (device, repo root): GS_LEFT_S=… OUT=$OUT bash scripts/gpu/round55.sh target/release/gpusleuth
set -u
OUT=${OUT:-/tmp/gs-out}
GS_LEFT_S=$(( ${GS_LEFT_S:-480} - 30 )) OUT=$OUT bash scripts/gpu/round54.sh "$1"
OUT=$OUT timeout 60 bash scripts/gpu/metrics_check.sh "$1"
