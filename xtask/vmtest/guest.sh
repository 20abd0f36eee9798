#!/bin/sh
# Runs inside a `cargo xtask vmtest` guest (virtme-ng, the host's root filesystem read-only).
# usage: guest.sh TRACER TESTLOAD OUTDIR [DEMO_DURATION]
# Writes OUTDIR/result.txt (key=value lines) and per-step files beside it. Every step's
# failure is recorded, never fatal: the host judges from result.txt alone.
TRACER=$1
TESTLOAD=$2
OUT=$3
DEMO_DURATION=${4:-3s}
HERE=$(dirname "$0")
R=$OUT/result.txt
: > "$R"
put() { echo "$1=$2" >> "$R"; }

put started "$(date +%s)"
put uname "$(uname -r)"
if [ -e /sys/kernel/btf/vmlinux ]; then put btf yes; else put btf no; fi
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null

# Every step has a deadline, and together they stay inside the host's limit for the guest
# (vmtest --timeout, 480 s by default, boot and power-off included): a step that hangs is then
# named in result.txt (rc 124) instead of the whole guest being cut off. Each step's start
# time is recorded too, so a slow step shows as such.

# 1. doctor
put t_doctor "$(date +%s)"
timeout 40 "$TRACER" doctor > "$OUT/doctor.txt" 2>&1
put doctor_rc $?
# The scheduler programs passed with the counter reads, not loaded again without them.
if grep -q "with the counter reads" "$OUT/doctor.txt"; then put doctor_counters yes; else put doctor_counters no; fi

# 2. exact counts, per probe mode: auto (tp_btf where BTF allows), forced classic, and no BTF
# (a missing BTF file: the classic fallback).
for mode in auto classic nobtf; do
    case $mode in
        auto) extra= ;;
        classic) extra="--probes classic" ;;
        nobtf) extra="--btf /nonexistent/vmlinux" ;;
    esac
    put "t_exact_$mode" "$(date +%s)"
    # shellcheck disable=SC2086 # $extra is words
    timeout 90 python3 "$HERE/exact.py" "$TRACER" "$TESTLOAD" "$OUT/exact-$mode.json" $extra \
        > "$OUT/exact-$mode.log" 2>&1
    put "exact_${mode}_rc" $?
    python3 - "$OUT/exact-$mode.json" "$mode" >> "$R" 2>> "$OUT/exact-$mode.log" <<'PY'
import json, sys
path, mode = sys.argv[1:]
try:
    d = json.load(open(path))
except Exception as e:
    print(f"exact_{mode}=error\nexact_{mode}_error=no result: {e}")
    raise SystemExit
print(f"exact_{mode}={'yes' if d.get('exact') else 'no'}")
print(f"probe_{mode}={d.get('probe_mode') or '-'}")
bad = [f"tid {t['tid']} tracer {t['tracer']} proc {t['proc']}" for t in d.get("threads", []) if not t["ok"]]
err = d.get("error") or "; ".join(bad)
if err:
    print(f"exact_{mode}_error=" + " ".join(str(err).split())[:400])
PY
done

# 3. the cpu-contention demo's verdict (demo.expected_primary says what it must be)
put t_demo "$(date +%s)"
timeout 120 "$TRACER" demo --scenario cpu-contention --duration "$DEMO_DURATION" --json \
    > "$OUT/demo.json" 2> "$OUT/demo.stderr"
put demo_rc $?
python3 - "$OUT/demo.json" >> "$R" 2>> "$OUT/demo.stderr" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"demo_primary=error\ndemo_error=no JSON: {e}")
    raise SystemExit
print(f"demo_primary={d.get('verdict', {}).get('primary')}")
print(f"demo_expected={d.get('demo', {}).get('expected_primary')}")
print(f"demo_correct={'yes' if d.get('demo', {}).get('correct') else 'no'}")
print(f"demo_probe_mode={d.get('probe_mode')}")
PY

put finished "$(date +%s)"
put complete yes
