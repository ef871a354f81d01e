#!/usr/bin/env bash
# Two hosts without GPUs: two Linux network namespaces joined by a veth pair (10.77.0.1 and
# 10.77.0.2) act as two hosts, each running 2 CPU ranks as processes over Gloo
# (`fsdp train --backend cpu --nproc 2 --nnodes 2 ...`). It checks that
#   1. a few steps across the two hosts give the losses of a one-host 4-rank run, exactly;
#   2. when a rank on host 1 is killed mid-run (SIGKILL), host 0's launcher exits non-zero
#      within a generous bound, and its ranks' errors name the lost rank and its signal.
# Traffic stays inside the namespaces, which are removed on every exit (trap).
#
#   tests/netns_two_hosts.sh FSDP_BINARY
# Exit 0: passed; 1: failed; 77: skipped (not root, or no `ip netns`), as ctest expects.
set -uo pipefail
fsdp=${1:?usage: netns_two_hosts.sh FSDP_BINARY}

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" = 0 ] || skip "making network namespaces needs root"
command -v ip >/dev/null || skip "the ip command (iproute2) is missing"

id=$$
ns0=fsdp-h0-$id ns1=fsdp-h1-$id
veth0=fv0-$id veth1=fv1-$id  # interface names: 15 characters at most
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for ns in "$ns0" "$ns1"; do
    # Whatever still runs in a namespace goes with it.
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

ip netns add "$ns0" 2>/dev/null || skip "ip netns add failed (no network namespaces here)"
ip netns add "$ns1" || fail "ip netns add $ns1"
ip link add "$veth0" type veth peer name "$veth1" || skip "veth pairs are not available"
ip link set "$veth0" netns "$ns0" && ip link set "$veth1" netns "$ns1" || fail "moving the veth ends"
ip -n "$ns0" addr add 10.77.0.1/24 dev "$veth0" && ip -n "$ns1" addr add 10.77.0.2/24 dev "$veth1" ||
  fail "addresses"
for ns in "$ns0" "$ns1"; do
  ip -n "$ns" link set lo up && ip -n "$ns" link set "$(ip -n "$ns" -o link show type veth |
    sed -n 's/^[0-9]*: \([^@:]*\).*/\1/p')" up || fail "links up in $ns"
done

# The two hosts' launchers meet at host 0's store with the job's secret (docs/launch.md).
FSDP_STORE_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export FSDP_STORE_SECRET
model="--model transformer --layers 2 --dim 32 --heads 4 --kv-heads 2 --ffn-dim 40 --seq-len 8
       --vocab 61 --tokens 16"
# "losses": [...] of a summary, on one line without spaces.
losses() { tr -d ' \n' <"$1" | sed -n 's/.*"losses":\(\[[^]]*\]\).*/\1/p'; }

# ---- 1. the same losses on two hosts as on one
"$fsdp" train --backend cpu --nproc 4 $model --steps 4 --quiet --json "$tmp/one_host.json" \
  >"$tmp/one_host.log" 2>&1 || { cat "$tmp/one_host.log"; fail "the one-host run failed"; }
on_host() {  # on_host NODE_RANK LOG ARGS...: runs node NODE_RANK of 2 in its namespace
  local node=$1 log=$2 ns
  shift 2
  [ "$node" = 0 ] && ns=$ns0 || ns=$ns1
  ip netns exec "$ns" "$fsdp" train --backend cpu --nproc 2 --nnodes 2 --node-rank "$node" \
    --master-addr 10.77.0.1 --master-port 29517 $model "$@" >"$log" 2>&1 &
  pids+=($!)
}
on_host 0 "$tmp/h0.log" --steps 4 --quiet --timeout 30 --json "$tmp/two_hosts.json"
on_host 1 "$tmp/h1.log" --steps 4 --quiet --timeout 30
wait "${pids[0]}"; code0=$?
wait "${pids[1]}"; code1=$?
pids=()
[ "$code0" = 0 ] && [ "$code1" = 0 ] ||
  { cat "$tmp/h0.log" "$tmp/h1.log"; fail "the two-host run failed (exit codes $code0, $code1)"; }
one=$(losses "$tmp/one_host.json") two=$(losses "$tmp/two_hosts.json")
[ -n "$one" ] && [ "$one" = "$two" ] || fail "losses differ: one host $one, two hosts $two"
echo "two hosts, 4 ranks: losses $two, as on one host"

# ---- 2. a rank killed on host 1 ends host 0's ranks, naming it
on_host 0 "$tmp/k0.log" --steps 1000000 --timeout 10 --log-every 1
on_host 1 "$tmp/k1.log" --steps 1000000 --timeout 10
for _ in $(seq 600); do  # until the run is training (step lines from rank 0), 60 s at most
  grep -q "^step 3/" "$tmp/k0.log" 2>/dev/null && break
  sleep 0.1
done
grep -q "^step 3/" "$tmp/k0.log" || { cat "$tmp/k0.log" "$tmp/k1.log"; fail "the run never trained"; }
victim=$(pgrep -o -P "${pids[1]}" -f "$fsdp") || fail "no rank process on host 1"
killed_at=$(date +%s.%N)
kill -9 "$victim"
for _ in $(seq 1200); do  # host 0 must end by itself: 120 s at most (--timeout 10)
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.1
done
kill -0 "${pids[0]}" 2>/dev/null && { cat "$tmp/k0.log"; fail "host 0 still runs 120 s after the kill"; }
ended_in=$(awk -v a="$killed_at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
wait "${pids[0]}"; code0=$?
wait "${pids[1]}"; code1=$?
pids=()
[ "$code0" != 0 ] || fail "host 0 exited 0 after losing a rank"
[ "$code1" != 0 ] || fail "host 1 exited 0 after losing a rank"
grep -Eq "lost rank [23] \(rank [23] was killed by signal 9" "$tmp/k0.log" ||
  { cat "$tmp/k0.log"; fail "host 0's ranks do not name the lost rank"; }
grep -Eq "rank [23] was killed by signal 9" "$tmp/k1.log" ||
  { cat "$tmp/k1.log"; fail "host 1's launcher does not name the lost rank"; }
echo "killed a rank on host 1: host 0 exited with status $code0 within ${ended_in} s (polled every 0.1 s), naming it:"
grep -E "lost rank" "$tmp/k0.log" | head -n 1
exit 0
