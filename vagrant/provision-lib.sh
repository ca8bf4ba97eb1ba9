# shellcheck shell=bash
# labkit provisioning: the functions vagrant/provision.sh is made of that say
# what went wrong.  Sourced by provision.sh, and by tests/unit/test_vagrant.py
# with fake apt-get/apt-cache/df on PATH.
#
# A failure whose cause is known ends provisioning with ONE line saying what
# to do (die_cause), and leaves that line in $PROVISION_STATUS, where
# `labkit doctor` shows it (labkit/datapath/doctor.py has the same sentences:
# keep them in sync, the unit test compares them).

PROG=${PROG:-labkit-provision}
LOG=${LOG:-/var/log/labkit-provision.log}
QUIET=${QUIET:-0}
APT_UPDATED=${APT_UPDATED:-0}
APT_NET_ERROR=${APT_NET_ERROR:-}
APT_OPTS=(-q -o DPkg::Lock::Timeout=300)
PROVISION_STATUS=${LABKIT_PROVISION_STATUS:-/var/lib/labkit/provision-failed}
#: Free space provisioning wants on / before it installs anything (apt packages,
#: their downloads, kernel headers, JupyterLab and friends in the venv).
PROVISION_NEED_MIB=${PROVISION_NEED_MIB:-1536}
RERUN="provision again (vagrant provision; without a VM: sudo make provision)"

step() { printf '%s: %s: %s\n' "$PROG" "$1" "$2"; }
warn() { printf '%s: warning: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

# The sentence for a known cause: cause network TOOL DETAIL | headers KREL ARCH |
# disk FREE_MIB PATH NEED_MIB WHAT.
cause() {
    case "$1" in
        network) printf 'no network: %s could not reach its package source (%s); check this computer'"'"'s internet connection and proxy, then %s' "$2" "$3" "$RERUN" ;;
        headers) printf 'no kernel headers for the running kernel %s: apt has no linux-headers-%s and no generic headers package could be installed; install the distribution'"'"'s kernel and its headers (sudo apt-get install linux-image-%s linux-headers-%s), boot it (vagrant reload), then %s' "$2" "$2" "$3" "$3" "$RERUN" ;;
        disk) printf 'disk full: %s MiB free on %s, %s needs %s MiB; free space (sudo apt-get clean, remove files) or give the VM a bigger disk, then %s' "$2" "$3" "$5" "$4" "$RERUN" ;;
        *) printf 'unknown cause %s' "$1" ;;
    esac
}

# End provisioning with the sentence for a known cause, and leave it for
# `labkit doctor`.
die_cause() {
    local line
    line="$(cause "$@")"
    if mkdir -p "$(dirname "$PROVISION_STATUS")" 2>/dev/null; then
        printf '%s\n' "$line" >"$PROVISION_STATUS" 2>/dev/null || true
    fi
    die "$line"
}

# An apt step that cannot go on: the network sentence when apt-get update could
# not reach the mirror (that is then the cause), else MESSAGE.
die_apt() {
    [ -n "$APT_NET_ERROR" ] && die_cause network apt-get "$APT_NET_ERROR"
    die "$@"
}

# No headers for the running kernel -- unless the mirror was out of reach, which
# is then the cause to name.
die_headers() {
    [ -n "$APT_NET_ERROR" ] && die_cause network apt-get "$APT_NET_ERROR"
    die_cause headers "$@"
}

provision_ok() { rm -f "$PROVISION_STATUS"; }

# Run a command; with --quiet its output goes to $LOG and only a failure
# shows the log's last lines.
run() {
    if [ "$QUIET" = 1 ]; then
        printf '\n# %s: %s\n' "$(date -Is)" "$*" >>"$LOG"
        if ! "$@" >>"$LOG" 2>&1; then
            echo "$PROG: command failed: $*  (last lines of $LOG:)" >&2
            tail -n 25 "$LOG" >&2
            return 1
        fi
    else
        "$@"
    fi
}

# Free MiB on the file system holding PATH.
free_mib() { df -Pm "$1" 2>/dev/null | awk 'NR == 2 {print $4}'; }

# Stop with the disk sentence when PATH has less than NEED MiB free.
check_disk() {
    local path="$1" need="$2" what="${3:-provisioning}" free
    free="$(free_mib "$path")"
    [[ "$free" =~ ^[0-9]+$ ]] || return 0 # df could not say: let the install speak
    [ "$free" -ge "$need" ] || die_cause disk "$free" "$path" "$need" "$what"
}

# True when apt has an installation candidate for the package.
apt_candidate() {
    local c
    c="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2; exit}')"
    [ -n "$c" ] && [ "$c" != "(none)" ]
}

# The first line of apt-get's (or pip's) output that says the mirror could not be reached,
# trimmed; empty (and status 0, for set -e and pipefail) when there is none.
apt_network_error() {
    { grep -E -m1 "Temporary failure (resolving|in name resolution)|Could not resolve|Could not connect|Failed to connect|Network is unreachable|Connection timed out|No route to host|Unable to connect|Connection refused|NewConnectionError" || true; } |
        sed -E 's/^[[:space:]]*//; s/[[:space:]]+$//' | cut -c1-160
}

apt_update() {
    [ "$APT_UPDATED" = 1 ] && return 0
    APT_UPDATED=1
    local out rc=0
    out="$(apt-get "${APT_OPTS[@]}" update 2>&1)" || rc=$?
    if [ "$QUIET" = 1 ]; then
        printf '\n# %s: apt-get update\n%s\n' "$(date -Is)" "$out" >>"$LOG"
    else
        printf '%s\n' "$out"
    fi
    # apt-get update exits 0 even when every mirror failed (it only warns): read what it said.
    APT_NET_ERROR="$(apt_network_error <<<"$out")"
    if [ -n "$APT_NET_ERROR" ]; then
        warn "apt-get update could not reach the mirror ($APT_NET_ERROR); continuing with the package lists on disk"
    elif [ "$rc" != 0 ]; then
        warn "apt-get update failed; continuing with the package lists on disk"
    fi
}

# One apt-get install; if it fails with lists not refreshed in this run,
# refresh them and try once more (stale lists give 404s).  A failure after the
# mirror could not be reached is the network sentence.
apt_install() {
    if run apt-get "${APT_OPTS[@]}" install -y --no-install-recommends "$@"; then
        return 0
    fi
    if [ "$APT_UPDATED" != 1 ]; then
        apt_update
        run apt-get "${APT_OPTS[@]}" install -y --no-install-recommends "$@" && return 0
    fi
    [ -n "$APT_NET_ERROR" ] && die_cause network apt-get "$APT_NET_ERROR"
    return 1
}

# -- services, the instructors' group, the answer keys ----------------------------------------
# The parts of provision.sh's service and permission steps that decide something; sourced by
# tests/unit/test_vagrant.py with fake systemctl/getent/groupadd on PATH.

#: Where a running systemd leaves its mark (a VM has it; a container or a CI host does not).
SYSTEMD_RUN_DIR=${SYSTEMD_RUN_DIR:-/run/systemd/system}
#: The group whose members (and root) see and touch every user's labs and read the answer keys
#: (labkit/door/owners.py INSTRUCTORS).
INSTRUCTORS_GROUP=${INSTRUCTORS_GROUP:-labkit-instructors}

systemd_running() { [ -d "$SYSTEMD_RUN_DIR" ] && command -v systemctl >/dev/null; }

# Write TEXT and a newline to FILE (mode 0644) unless FILE holds exactly that; true when it wrote.
write_if_changed() {
    local file="$1" text="$2"
    if [ -f "$file" ] && [ "$(cat "$file")" = "$text" ]; then
        return 1
    fi
    mkdir -p "$(dirname "$file")"
    printf '%s\n' "$text" >"$file.new"
    chmod 644 "$file.new"
    mv -f "$file.new" "$file"
}

# labkitd's unit: the template TEMPLATE (vagrant/labkitd.service) for the venv VENV, without the
# CRs a Windows checkout may have given it.
labkitd_unit() { sed -e "s|@VENV@|$2|g" -e 's/\r$//' "$1"; }

# A digest of the Python code under DIR: it changes when any module does, so a service running
# that code (labkitd) is restarted by provisioning after an update and only then.
source_digest() {
    (cd "$1" && find . -name '*.py' -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum) | sha256sum | cut -c1-16
}

# Bring the systemd service NAME up to date and print what that took: "done" when CHANGED=1 (its
# unit or what it runs changed: reload systemd, enable, restart) or when it was not enabled or not
# running (enable, start); "ok" when it was running as it should (nothing is restarted).
service_up() {
    local name="$1" changed="$2"
    # (&&: in a command substitution set -e does not hold, and a failure must be the function's.)
    if [ "$changed" = 1 ]; then
        systemctl daemon-reload && systemctl enable -q "$name" && systemctl restart "$name" || return 1
        echo done
    elif ! systemctl is-enabled -q "$name" || ! systemctl is-active -q "$name"; then
        systemctl enable -q --now "$name" || return 1
        echo done
    else
        echo ok
    fi
}

# The JupyterLab service's unit: run as USER (primary group GROUP, home HOME), serving ROOT on
# IP:$JUPYTER_PORT from $VENV, its token from $JUPYTER_ENV_FILE, after labkitd.  Only a root server
# (a bare host's service) gets --allow-root; the VM's runs as its learner, and so do its kernels,
# with no capabilities: every privileged act of theirs goes through labkitd.
jupyter_unit() {
    local user="$1" group="$2" home="$3" ip="$4" root="$5" allow=""
    [ "$user" = root ] && allow=" --allow-root"
    cat <<EOF
# Written by labkit's vagrant/provision.sh --jupyter-service; edits are overwritten.
[Unit]
Description=labkit JupyterLab (URL: sudo $REPO/vagrant/provision.sh --print-url)
After=network-online.target labkitd.service
Wants=network-online.target labkitd.service

[Service]
Type=simple
User=$user
Group=$group
WorkingDirectory=$root
Environment="HOME=$home"
Environment="PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EnvironmentFile=$JUPYTER_ENV_FILE
ExecStart="$VENV/bin/jupyter" lab --ip=$ip --port=$JUPYTER_PORT --no-browser$allow "--ServerApp.root_dir=$root"
Restart=on-failure
RestartSec=3

[Install]
WantedBy=multi-user.target
EOF
}

# Make the instructors' group (a system group) unless it exists; print done or ok.  No one is
# added to it: the VM's vagrant user is a learner.
ensure_group() {
    local name="${1:-$INSTRUCTORS_GROUP}"
    if getent group "$name" >/dev/null; then
        echo ok
    else
        groupadd --system "$name" || return 1
        echo done
    fi
}

# Print the paths under DIR that are not root:GROUP with directories 0750 and files 0640.
keys_unlocked() {
    local dir="$1" group="$2"
    find "$dir" \( ! -user root -o ! -group "$group" -o \( -type d ! -perm 0750 \) -o \( -type f ! -perm 0640 \) \) -print
}

# Keep the answer keys in DIR (instructor/) from the learner: root:GROUP, directories 0750, files
# 0640 (root and the instructors read them; labkitd, as root, does).  Prints done or ok; fails,
# printing what is still open, when the file system would not take it (a vboxsf share).
lock_answer_keys() {
    local dir="$1" group="${2:-$INSTRUCTORS_GROUP}" open
    if [ -z "$(keys_unlocked "$dir" "$group" | head -n 1)" ]; then
        echo ok
        return 0
    fi
    chown -R "root:$group" "$dir" 2>/dev/null || true
    find "$dir" -type d -exec chmod 0750 {} + 2>/dev/null || true
    find "$dir" -type f -exec chmod 0640 {} + 2>/dev/null || true
    open="$(keys_unlocked "$dir" "$group" | head -n 3)"
    if [ -n "$open" ]; then
        echo "$open" | tr '\n' ' '
        return 1
    fi
    echo done
}
