#!/bin/sh
# The package under a real systemd: run by `cargo xtask systemd-guest` inside a Debian 12
# guest whose PID 1 is systemd (xtask/src/systemd_guest.rs builds and boots it). Every
# step prints `STEP name` then `PASS name` or `FAIL name: why`; the first failure ends
# the run. The last line is `RESULT 0` (all passed) or `RESULT 1`.
#
# $PAYLOAD holds limiter_*.deb, limiter-allocator_*.deb and upgrade/limiter_*.deb (the
# same package under a later version). Traffic: ICMP echo requests from a namespace over
# a veth pair to 198.18.35.1, metered by one rule (rate 50/s, burst 10); the rule's
# counters say what the program did with every frame.

set -u
PAYLOAD=${PAYLOAD:-/mnt/payload}
IFACE=ltest0
PEER=ltest1
NS=limtest-sender
DST=198.18.35.1
RATE=50
BURST=10
CONF=/etc/limiter/limiter.toml
PINS=/sys/fs/bpf/limiter
STEP=setup

say() { echo "$*"; }
step() { STEP=$1; say "STEP $STEP"; }
pass() { say "PASS $STEP${1:+: $1}"; }
fail() {
    say "FAIL $STEP: $*"
    say "--- systemctl status limiter"
    systemctl --no-pager status limiter 2>&1 | tail -n 20
    say "--- journalctl -u limiter (last 40 lines)"
    journalctl --no-pager -u limiter -n 40 2>&1
    finish 1
}
finish() {
    journalctl --no-pager -b > "$PAYLOAD/journal.txt" 2>&1
    say "RESULT $1"
    sync
    systemctl --no-block poweroff
    exit "$1"
}
# Runs a command; fails the step with its output when it fails.
must() {
    out=$("$@" 2>&1) || fail "\`$*\` failed ($?): $out"
}
prop() { systemctl show -p "$1" --value limiter; }
json_rule() {
    limiter stats --json | jq -r --arg r "$1" --arg f "$2" '.rules[] | select(.name == $r) | .[$f]'
}
xdp_prog() {
    ip -j -d link show dev "$IFACE" | jq -r '.[0].xdp.prog.id // .[0].xdp.progs[0].id // empty'
}
# The bpf_link that holds the program on the interface (bookworm's bpftool shows no
# ifindex for XDP links: found by the program it runs).
link_id() {
    bpftool -j link show | jq -r --arg p "$(xdp_prog)" \
        '[.[] | select(.type == "xdp" and ((.prog_id|tostring) == $p))][0].id // empty'
}
# Waits up to $2 seconds for `$1` (a shell condition) to hold.
wait_for() {
    i=0
    while ! eval "$1"; do
        i=$((i + 1))
        [ "$i" -gt $(($2 * 10)) ] && return 1
        sleep 0.1
    done
}
config() {
    cat > "$CONF" <<EOF
interfaces = ["$IFACE"]
xdp_mode = "native"

[[rules]]
name = "echo"
dst = "$DST/32"
proto = "icmp"
rate = $RATE
burst = $BURST
mode = "enforce"
$1
EOF
}

# Echo requests at 200/s in the background until stop_traffic; the counters at the start.
start_traffic() {
    p0=$(json_rule echo passed_packets)
    d0=$(json_rule echo dropped_packets)
    t0=$(date +%s.%N)
    ip netns exec "$NS" ping -n -q -i 0.005 -w 600 "$DST" > /tmp/ping.out 2>&1 &
    ping_pid=$!
}
# Stops the sender and checks that every frame it sent was metered by the rule (the
# program was on the interface the whole time: a frame through a gap would be counted
# nowhere) and that the rule passed no more than one bucket allows over the time.
stop_traffic() {
    kill -INT "$ping_pid"
    wait "$ping_pid"
    t1=$(date +%s.%N)
    sleep 1
    sent=$(sed -n 's/^\([0-9]*\) packets transmitted.*/\1/p' /tmp/ping.out)
    [ -n "$sent" ] || fail "ping printed no count: $(cat /tmp/ping.out)"
    p1=$(json_rule echo passed_packets)
    d1=$(json_rule echo dropped_packets)
    passed=$((p1 - p0))
    dropped=$((d1 - d0))
    secs=$(echo "$t1 $t0" | awk '{printf "%.2f", $1 - $2}')
    # The bucket may start full (burst) and refills at RATE: the most it admits.
    allowed=$(echo "$t1 $t0" | awk -v r="$RATE" -v b="$BURST" '{printf "%d", ($1 - $2) * r + b + 1}')
    say "traffic: sent $sent in ${secs}s, passed $passed (at most $allowed), dropped $dropped"
    [ $((passed + dropped)) -eq "$sent" ] ||
        fail "sent $sent frames but the rule metered $((passed + dropped)) ($passed passed, $dropped dropped): frames went through unmetered"
    [ "$passed" -le "$allowed" ] ||
        fail "the rule passed $passed frames in ${secs}s, more than rate x time + burst = $allowed: the bucket was reset or enforcement stopped"
    [ "$dropped" -gt 0 ] || fail "nothing was dropped: $sent frames in ${secs}s at rate $RATE"
}

step setup
must mountpoint -q /sys/fs/bpf
say "guest: $(uname -r), $(systemctl --version | head -n 1), PID 1 is $(cat /proc/1/comm)"
[ "$(cat /proc/1/comm)" = systemd ] || fail "PID 1 is $(cat /proc/1/comm), not systemd"
must ip netns add "$NS"
must ip link add "$IFACE" type veth peer name "$PEER" netns "$NS"
must ip addr add "$DST/24" dev "$IFACE"
must ip link set "$IFACE" up
must ip -n "$NS" addr add 198.18.35.2/24 dev "$PEER"
must ip -n "$NS" link set "$PEER" up
must ip -n "$NS" link set lo up
pass

step install
deb=$(ls "$PAYLOAD"/limiter_*.deb)
adeb=$(ls "$PAYLOAD"/limiter-allocator_*.deb)
must dpkg -i "$deb" "$adeb"
for unit in limiter limiter-allocator; do
    state=$(systemctl is-enabled "$unit" 2>&1)
    [ "$state" = disabled ] || fail "$unit.service is $state after installing, not disabled"
    systemctl -q is-active "$unit" && fail "installing started $unit.service"
done
[ -e "$PINS" ] && fail "installing created $PINS"
# --man=no: the guest has no man-db (tests/tests/package.rs renders the pages).
said=$(systemd-analyze verify --man=no /lib/systemd/system/limiter.service \
    /lib/systemd/system/limiter-allocator.service 2>&1) || fail "systemd-analyze verify: $said"
[ -z "$said" ] || fail "systemd-analyze verify: $said"
pass "both packages installed, neither enabled nor started"

step enable-start
config ""
must limiter check --config "$CONF"
must systemctl enable --now limiter
# Type=notify: `systemctl start` returns once READY=1 came, so by now the program is on
# the interface and the control socket answers.
[ "$(prop ActiveState)" = active ] || fail "ActiveState $(prop ActiveState) after enable --now"
[ -n "$(xdp_prog)" ] || fail "enable --now returned before XDP was attached to $IFACE"
must limiter status
status=$(prop StatusText)
case "$status" in
"enforcing 1 rules on $IFACE"*) ;;
*) fail "status line is \"$status\"" ;;
esac
systemctl --no-pager status limiter | grep -q "Status: \"enforcing 1 rules on $IFACE" ||
    fail "systemctl status shows no status line: $(systemctl --no-pager status limiter)"
[ "$(systemctl is-enabled limiter)" = enabled ] || fail "not enabled"
journalctl --no-pager -u limiter -b | grep -q "Started limiter.service" ||
    fail "the journal has no 'Started limiter.service'"
pid1=$(prop MainPID)
pass "active, status \"$status\", pid $pid1"

step enforce
start_traffic
sleep 4
stop_traffic
pass

step reload
config '
[[rules]]
name = "other"
dst = "198.18.35.3/32"
rate = 1000
burst = 100'
must systemctl reload limiter
[ "$(prop MainPID)" = "$pid1" ] || fail "reload changed MainPID from $pid1 to $(prop MainPID)"
[ "$(prop ActiveState)" = active ] || fail "ActiveState $(prop ActiveState) after reload"
[ "$(json_rule other rate)" = 1000 ] || fail "the reloaded rule is not installed: $(limiter stats --json)"
pass

step bad-reload
before=$(limiter stats --json | jq -c '[.rules[] | {name, rate, burst}]')
prog_before=$(xdp_prog)
config 'bogus_key = 1
[[rules]]
name = "other"
dst = "198.18.35.3/32"
rate = 5'
if out=$(systemctl reload limiter 2>&1); then
    fail "systemctl reload of a bad config succeeded: $out"
fi
[ "$(prop ActiveState)" = active ] || fail "ActiveState $(prop ActiveState) after a refused reload"
[ "$(prop MainPID)" = "$pid1" ] || fail "a refused reload changed MainPID"
after=$(limiter stats --json | jq -c '[.rules[] | {name, rate, burst}]')
[ "$after" = "$before" ] || fail "a refused reload changed the rules: $before -> $after"
[ "$(xdp_prog)" = "$prog_before" ] || fail "a refused reload replaced the program"
journalctl --no-pager -u limiter -b | grep -q "bogus_key" ||
    fail "the journal does not name the bad key: $(journalctl --no-pager -u limiter -n 15)"
pass "refused, rules unchanged: $after"
config ""
must systemctl reload limiter

step kill-9
link=$(link_id)
[ -n "$link" ] || fail "no XDP bpf_link on $IFACE: $(bpftool link show)"
restarts=$(prop NRestarts)
start_traffic
sleep 1
must kill -9 "$pid1"
wait_for '[ "$(prop MainPID)" != "$pid1" ] && [ "$(prop MainPID)" != 0 ] && [ "$(prop ActiveState)" = active ]' 180 ||
    fail "no restart after kill -9: $(prop ActiveState), MainPID $(prop MainPID)"
sleep 2
stop_traffic
[ "$(prop NRestarts)" -eq $((restarts + 1)) ] || fail "NRestarts $(prop NRestarts), was $restarts"
[ "$(link_id)" = "$link" ] || fail "the restart made a new link ($(link_id)), not adopting $link"
pid1=$(prop MainPID)
pass "restarted as $pid1 over link $link"

# A config the checker refuses: the restart exits 3 and systemd leaves it down
# (RestartPreventExitStatus=3) while the pinned link keeps enforcing.
step bad-config-exit-3
restarts=$(prop NRestarts)
cp "$CONF" /tmp/good.toml
printf 'interfaces = []\n' > "$CONF"
must kill -9 "$pid1"
wait_for '[ "$(prop ActiveState)" = failed ]' 180 ||
    fail "after kill -9 with a bad config: $(prop ActiveState) (result $(prop Result))"
sleep 3
[ "$(prop ActiveState)" = failed ] || fail "systemd retried: $(prop ActiveState)"
[ "$(prop NRestarts)" -eq $((restarts + 1)) ] ||
    fail "NRestarts $(prop NRestarts): systemd retried the refused config (was $restarts)"
[ "$(prop ExecMainStatus)" = 3 ] || fail "the refused start exited $(prop ExecMainStatus), not 3"
start_traffic
sleep 2
stop_traffic
cp /tmp/good.toml "$CONF"
must systemctl restart limiter
pid1=$(prop MainPID)
pass "exit 3, left down, still enforcing"

step detach
must limiter detach
wait_for '[ "$(prop ActiveState)" != active ] && [ "$(prop ActiveState)" != deactivating ]' 60 ||
    fail "still $(prop ActiveState) after limiter detach"
sleep 3
state=$(prop ActiveState)
[ "$state" = inactive ] || fail "after limiter detach the unit is $state (result $(prop Result)), not inactive"
[ -z "$(xdp_prog)" ] || fail "XDP still attached after detach"
[ -e "$PINS" ] && fail "$PINS still there after detach: $(ls -R $PINS)"
pass

step stop
must systemctl start limiter
must systemctl stop limiter
[ "$(prop ActiveState)" = inactive ] || fail "$(prop ActiveState) after stop"
[ -e /run/limiter ] && fail "/run/limiter left after stop: $(ls -la /run/limiter)"
[ -n "$(xdp_prog)" ] || fail "stop detached the program (it must keep enforcing)"
start_traffic
sleep 2
stop_traffic
pass "inactive, still enforcing through the pinned link"

step upgrade
must systemctl start limiter
pid1=$(prop MainPID)
old=$(dpkg-query -W -f '${Version}' limiter)
start_traffic
sleep 2
must dpkg -i "$PAYLOAD"/upgrade/limiter_*.deb
new=$(dpkg-query -W -f '${Version}' limiter)
[ "$new" != "$old" ] || fail "dpkg -i did not upgrade: $old"
[ "$(prop ActiveState)" = active ] || fail "$(prop ActiveState) after the upgrade"
[ "$(prop MainPID)" != "$pid1" ] || fail "the upgrade did not restart the daemon (MainPID $pid1)"
sleep 2
stop_traffic
[ "$(systemctl is-enabled limiter)" = enabled ] || fail "the upgrade disabled limiter.service"
pass "$old -> $new, restarted (pid $pid1 -> $(prop MainPID)) with no gap"

step security
systemd-analyze security --no-pager limiter.service | tail -n 1
systemd-analyze security --no-pager limiter-allocator.service | tail -n 1
pass

# Removing stops the service and, by design, leaves the pinned program enforcing; purge
# after a detach leaves nothing behind.
step remove
must dpkg -r limiter
[ "$(prop ActiveState)" = inactive ] || fail "$(prop ActiveState) after dpkg -r"
[ -n "$(xdp_prog)" ] || fail "removing detached the program"
[ -e "$CONF" ] || fail "dpkg -r removed the conffile $CONF"
[ -e /usr/bin/limiter ] && fail "/usr/bin/limiter left after dpkg -r"
must dpkg -i "$deb"
must limiter detach
pass "stopped, still enforcing, conffile kept"

step purge
must dpkg --purge limiter limiter-allocator
left=""
for path in "$PINS" /run/limiter /run/limiter-allocator /etc/limiter \
    /etc/systemd/system/multi-user.target.wants/limiter.service \
    /lib/systemd/system/limiter.service /usr/bin/limiter /usr/share/doc/limiter; do
    [ -e "$path" ] && left="$left $path"
done
[ -z "$left" ] || fail "purge left:$left"
[ -z "$(xdp_prog)" ] || fail "XDP still attached after purge"
state=$(systemctl show -p LoadState --value limiter)
[ "$state" = not-found ] || fail "systemd still knows limiter.service: $state"
ls /sys/fs/bpf | grep -q . && fail "bpffs not empty: $(ls /sys/fs/bpf)"
pass "nothing left in bpffs, /run or /etc"

finish 0
