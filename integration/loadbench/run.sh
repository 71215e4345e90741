#!/usr/bin/env bash
# Load benchmark of llm_route against a plain reverse_proxy (issue #7).
#
#   ./integration/loadbench/run.sh            # full run (~6.5 min, the fleet scenario included)
#   QUICK=1 ./integration/loadbench/run.sh    # smoke run (~1.5 min)
#
# Builds one Caddy binary with the module and the benchmark program into
# integration/loadbench/out/bin, pins the proxies to the first allowed CPU and
# the load generator (+ fake upstream) to the others, runs, and writes
# integration/loadbench/out/report.md. Knobs (environment):
#
#   QUICK=1          1 s windows, 300 ms warm-up, 2 rounds
#   DURATION=5s      measured window per scenario, target and round
#   WARMUP=1s        warm-up before each window
#   ROUNDS=3         rounds (target order alternates; rotates with a baseline)
#   SCENARIOS=all    comma list: nonstream-16,nonstream-64,router-nonstream-64,stream-16,stream-64,guard-stream-64,
#                    paced-32,think-split-64,
#                    messages-native-64,messages-native-nonstream-64,messages-translated-64,responses-translated-64,
#                    gemini-translated-64,
#                    redis-nonstream-64,redis-stream-64 (these start a redis-server of their own),
#                    fleet (simulated GPU servers in a pool, one run per placement: ~2.5 min)
#   PROFILE=10s      also capture CPU profiles (out/cpu-*.pprof) and print their top
#   PLAIN_IDLE=1024  reverse_proxy max_idle_conns_per_host (0 = Caddy's default 32)
#   PIN=0            do not pin
#   REDIS_CPU=proxy  where redis-server runs in the redis scenarios: proxy (the proxies' CPU), gen (the
#                    generator's), none (unpinned), or a CPU list
#   BASELINE=path    also run llm_route's config from this Caddy binary (the previous build) as a third target
#   BASELINE_REV=rev build that git revision's Caddy into out/bin/caddy-baseline (from a temporary git worktree)
#                    and use it as BASELINE, e.g. BASELINE_REV=6551ace
#   FLEET_SLOTS=2    fleet scenario: slots per simulated server
#   FLEET_SEED=24    fleet scenario: seed of the session replay
#   NOTE="..."       free text for the report header
#
# Extra arguments are passed to the program (see `out/bin/loadbench -h`).
# Exit status: 0 ok (budget misses are only reported), 1 invalid responses,
# 2 the benchmark itself failed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${OUT:-$here/out}
mkdir -p "$out/bin"

cd "$root"
echo "building Caddy with llm_route and the benchmark into $out/bin ..." >&2
go build -o "$out/bin/caddy" ./integration/loadbench/caddy
go build -o "$out/bin/loadbench" ./integration/loadbench

note=${NOTE:-}
baseline=${BASELINE:-}
if [[ -n "${BASELINE_REV:-}" ]]; then
	rev=$(git rev-parse --short "$BASELINE_REV^{commit}")
	tmp=$(mktemp -d)
	trap 'git -C "$root" worktree remove --force "$tmp/src" 2>/dev/null || true; rm -rf "$tmp"' EXIT
	echo "building the baseline Caddy of $BASELINE_REV ($rev) into $out/bin/caddy-baseline ..." >&2
	git worktree add --quiet --detach "$tmp/src" "$rev"
	(cd "$tmp/src" && go build -o "$out/bin/caddy-baseline" ./integration/loadbench/caddy)
	git worktree remove --force "$tmp/src"
	baseline=$out/bin/caddy-baseline
	label=$BASELINE_REV
	[[ "$label" != "$rev" ]] && label="$label = $rev"
	note="${note:+$note; }baseline $label ($(git log -1 --format=%cs "$rev"))"
fi

args=(-caddy "$out/bin/caddy" -out "$out")
[[ "${QUICK:-0}" == 1 ]] && args+=(-quick)
[[ -n "${DURATION:-}" ]] && args+=(-duration "$DURATION")
[[ -n "${WARMUP:-}" ]] && args+=(-warmup "$WARMUP")
[[ -n "${ROUNDS:-}" ]] && args+=(-rounds "$ROUNDS")
[[ -n "${SCENARIOS:-}" ]] && args+=(-scenarios "$SCENARIOS")
[[ -n "${PROFILE:-}" ]] && args+=(-profile "$PROFILE")
[[ -n "${PLAIN_IDLE:-}" ]] && args+=(-plain-idle "$PLAIN_IDLE")
[[ -n "${FLEET_SLOTS:-}" ]] && args+=(-fleet-slots "$FLEET_SLOTS")
[[ -n "${FLEET_SEED:-}" ]] && args+=(-fleet-seed "$FLEET_SEED")
[[ -n "$baseline" ]] && args+=(-baseline "$baseline")
redis_cpu=${REDIS_CPU:-proxy}

# expand_cpus "0-2,5" -> "0 1 2 5"
expand_cpus() {
	local part lo hi res=()
	IFS=, read -ra parts <<<"$1"
	for part in "${parts[@]}"; do
		if [[ "$part" == *-* ]]; then
			lo=${part%-*} hi=${part#*-}
			for ((c = lo; c <= hi; c++)); do res+=("$c"); done
		else
			res+=("$part")
		fi
	done
	echo "${res[@]}"
}

cmd=("$out/bin/loadbench")
if [[ "${PIN:-1}" == 0 ]]; then
	note="${note:+$note; }pinning disabled (PIN=0)"
elif ! command -v taskset >/dev/null 2>&1; then
	note="${note:+$note; }pinning unavailable: no taskset (util-linux)"
else
	read -ra cpus <<<"$(expand_cpus "$(taskset -cp $$ | sed 's/.*: *//')")"
	if ((${#cpus[@]} < 2)); then
		note="${note:+$note; }pinning unavailable: only ${#cpus[@]} CPU allowed"
	else
		gen=$(
			IFS=,
			echo "${cpus[*]:1}"
		)
		args+=(-proxy-cpu "${cpus[0]}")
		[[ "$redis_cpu" == gen ]] && redis_cpu=$gen
		cmd=(taskset -c "$gen" "$out/bin/loadbench")
	fi
fi
[[ "$redis_cpu" == gen ]] && redis_cpu=none # not pinned: no generator CPUs of its own
args+=(-redis-cpu "$redis_cpu")
[[ -n "$note" ]] && echo "loadbench: $note" >&2
[[ -n "$note" ]] && args+=(-note "$note")

status=0
"${cmd[@]}" "${args[@]}" "$@" || status=$?

if [[ -n "${PROFILE:-}" && $status -ne 2 ]]; then
	for f in "$out"/cpu-*.pprof; do
		[[ -e "$f" ]] || continue
		echo
		echo "=== $(basename "$f" .pprof) ==="
		go tool pprof -top -nodecount=25 "$out/bin/caddy" "$f" 2>/dev/null | sed -n '1,32p'
	done
	for f in "$out"/allocs-*.pprof; do
		[[ -e "$f" ]] || continue
		echo
		echo "=== $(basename "$f" .pprof) (alloc_space, whole run) ==="
		go tool pprof -top -sample_index=alloc_space -nodecount=15 "$out/bin/caddy" "$f" 2>/dev/null | sed -n '1,22p'
	done
fi
exit $status
