#!/usr/bin/env bash
# Fuzz every Go fuzz target of the module, one after the other, each for a
# count of executions (make fuzz; README.md, "Quick start").
#
#   scripts/fuzz-sweep.sh [PATTERN]      targets whose name matches PATTERN (grep -E)
#
#   FUZZ_EXECS  executions per target (default 100000): a count, not a
#               duration: `-fuzztime 15s` can end with a bare "context
#               deadline exceeded" FAIL and no input written, a race in Go's
#               fuzzing coordinator at the deadline (golang/go#75804, open
#               in the Go 1.26 we use); a count never meets that deadline.
#   FUZZ_CAP    seconds a target may take at most (default 120): a slow
#               target stops there and is reported as capped, not failed.
#   FUZZ_LOGS   directory for each target's whole output (default: a new
#               temporary directory, named at the end).
#
# A target fails when go test exits non-zero before the cap: its whole
# output is printed, and the input that failed is the file Go wrote under
# the package's testdata/fuzz/NAME/ (rerun it with go test -run NAME/FILE).
# Exit status: 0 when no target failed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
execs=${FUZZ_EXECS:-100000}
cap=${FUZZ_CAP:-120}
logs=${FUZZ_LOGS:-$(mktemp -d -t kvtier-fuzz-XXXXXX)}
pattern=${1:-.}
case $execs in '' | *[!0-9]*) echo "fuzz-sweep: FUZZ_EXECS=$execs: want a count of executions" >&2; exit 2 ;; esac
case $cap in '' | *[!0-9]*) echo "fuzz-sweep: FUZZ_CAP=$cap: want seconds" >&2; exit 2 ;; esac
mkdir -p "$logs"

# Every package with a fuzz target, then its targets as go test lists them
# (build constraints applied).
mapfile -t pkgs < <(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u)
passed=0 capped=() failed=()
for pkg in "${pkgs[@]}"; do
	mapfile -t names < <($GO test -list '^Fuzz' "$pkg" | grep '^Fuzz' | grep -E -- "$pattern")
	for name in "${names[@]}"; do
		log="$logs/$(echo "${pkg#./}" | tr / _).$name.log"
		start=$SECONDS
		timeout "$cap" $GO test -run '^$' -fuzz "^$name\$" -fuzztime "${execs}x" "$pkg" >"$log" 2>&1
		rc=$?
		took=$((SECONDS - start))
		case $rc in
		0)
			passed=$((passed + 1))
			echo "ok      $pkg $name (${took}s)"
			;;
		124)
			capped+=("$pkg $name")
			echo "capped  $pkg $name (${cap}s; $(grep -o 'execs: [0-9]*' "$log" | tail -1))"
			;;
		*)
			failed+=("$pkg $name")
			echo "FAIL    $pkg $name (exit $rc, ${took}s): its output ($log):"
			sed 's/^/        /' "$log"
			;;
		esac
	done
done
echo "fuzz-sweep: ${passed} passed, ${#capped[@]} capped at ${cap}s, ${#failed[@]} failed; ${execs} executions a target; logs in $logs"
for f in "${failed[@]}"; do echo "failed: $f"; done
[ ${#failed[@]} -eq 0 ]
